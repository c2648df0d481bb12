"""What every endpoint checks before it queues work, with the same limits and messages for all: the sentence
count and length (413), text that is not Unicode (422), the decoding options over the server's defaults (422),
markup the xml mode cannot read (422). Nothing here runs a model."""
from __future__ import annotations

import dataclasses
from typing import Any

from fastapi import HTTPException

from ..config import DecodeConfig
from ..decoding.markup import parse
from ..errors import UserError
from .settings import Limits, ServeSettings


def check_sentences(sentences: list[str], limits: Limits) -> None:
    """413 for too many sentences or a sentence too long, naming the limit and its flag; 422 for a
    string that is not text (a lone surrogate escape, which JSON allows and the tokenizer cannot take)."""
    if len(sentences) > limits.max_request_sentences:
        raise HTTPException(413, f"{len(sentences)} sentences in one request; this server takes at most "
                                 f"{limits.max_request_sentences} (--max-request-sentences): split the request")
    for index, sentence in enumerate(sentences):
        check_text(f"sentence {index}", sentence, limits)


def check_text(name: str, text: str, limits: Limits) -> None:
    """``check_sentences`` for one text called ``name`` (``"sentence 3"``, ``"target"``): 413 if longer
    than ``--max-sentence-chars``, 422 if not valid Unicode."""
    if len(text) > limits.max_sentence_chars:
        raise HTTPException(413, f"{name} has {len(text)} characters; this server takes at most "
                                 f"{limits.max_sentence_chars} (--max-sentence-chars): split it")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise HTTPException(422, f"{name} is not valid Unicode text (a lone surrogate such as "
                                 "\\ud800); send UTF-8 text") from None


def checked_decode(body: Any, settings: ServeSettings) -> DecodeConfig:
    """The request's ``beam_size``, ``n_best``, ``length_penalty`` (and ``ordered_constraints`` where it has
    them) over the server's defaults (``settings.decode``), checked where the ``DecodeConfig`` is built, as
    for ``seq2seq translate`` (422)."""
    asked = {"beam_size": body.beam_size, "n_best": body.n_best, "length_penalty": body.length_penalty}
    try:
        return settings.limits.allowed(dataclasses.replace(
            settings.decode, ordered_constraints=getattr(body, "ordered_constraints", False),
            **{name: value for name, value in asked.items() if value is not None}))
    except UserError as exc:
        raise HTTPException(422, str(exc).replace("--n-best", "n_best").replace("--beam-size", "beam_size")) from None


def parse_markup(body: Any) -> list[tuple[str, list]] | None:
    """Each of ``body.sentences``' plain text and elements (``decoding.markup.parse``) with ``body.markup``;
    422 naming the sentence for markup the xml mode cannot read."""
    if body.markup is None:
        return None
    try:
        return [parse(sentence, body.markup, f"sentence {i}") for i, sentence in enumerate(body.sentences)]
    except UserError as exc:
        raise HTTPException(422, str(exc).replace("--markup html", '"markup": "html"')) from None
