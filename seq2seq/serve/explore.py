"""The JSON endpoints behind the page, each in the API description (``/docs``) like ``/translate``:

    GET  /models        the served models, their attribution methods and costs, the server's options
    POST /alignments    sentences translated by one model, each with everything the page shows: the best
                        translation as one sentence of the alignment viewer's data (every layer and head, both
                        levels, confidence, hard links), the n-best list, the markup, timings
    POST /attribution   a sentence and its translation explained by one method ("why this rather than
                        that" with a contrast), in the viewer's layout

``/alignments`` and ``/attribution`` have the limits of ``/translate`` (sentence count and length, body size,
beam size, queue, timeout, API key) and its error bodies: they go through the same checks (``checks``) and
the same batcher (``waiting``), whose worker runs the model and builds the answer. ``/models`` is open like
``/health``: the page reads it before it has a key.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from fastapi import FastAPI, HTTPException, Request, Response

from ..alignment.links import parse_pharaoh
from ..alignment.viewer import SCALE, viewer_sentence
from ..config import AlignConfig
from ..decoding.markup import mark_translations
from ..decoding.translation import Translation
from ..errors import UserError
from .checks import check_sentences, check_text, checked_decode, parse_markup
from .http import json_bytes
from .models import ServedModel, ServedModels
from .schemas import (
    AlignmentsRequest, AlignmentsResponse, AttributionRequest, AttributionResponse, DecodeOptions, ErrorBody,
    ModelsResponse,
)
from .settings import ServeSettings
from .waiting import submit, wait_for

ERRORS = {code: {"model": ErrorBody, "description": text} for code, text in (
    (400, "the body is not valid JSON"), (401, "the server has an API key and the request did not carry it"),
    (413, "too many sentences, a sentence too long or a body too large"),
    (422, "a field of the wrong type, bad options, an unknown model or method, or a pair it cannot explain"),
    (429, "the queue is full: retry after Retry-After seconds"), (500, "the model call failed"),
    (503, "the server is shutting down"), (504, "no answer within --request-timeout"))}


@dataclass(frozen=True)
class ExplainOptions:
    """The batch key of attribution jobs: one model, one method (items: (source, target, contrast))."""

    model: str
    method: str


@dataclass(frozen=True)
class Refusal:
    """A job the worker could not do for a reason the client can fix (answered 422 with ``message``)."""

    message: str


def install_explore(app: FastAPI, models: ServedModels, settings: ServeSettings) -> None:
    """Add ``/models``, ``/alignments`` and ``/attribution`` to ``app`` (its ``state.batcher`` runs them)."""
    limits = settings.limits
    explain = settings.explain
    methods = {model.name: explain.methods(model.translator.model) if explain is not None else [] for model in models}

    @app.get("/models", response_model=ModelsResponse)
    async def served() -> dict:
        """The served models (the first answers requests that name none), the attribution methods each
        offers with their cost, and the options the page needs."""
        return {"models": [model_info(model, methods[model.name]) for model in models], "markup": settings.markup,
                "api_key": settings.api_key is not None, "limits": dataclasses.asdict(limits),
                "decode": {"beam_size": settings.decode.beam, "n_best": settings.decode.n_best,
                           "length_penalty": settings.decode.length_penalty}}

    @app.post("/alignments", response_model=AlignmentsResponse, responses=ERRORS)
    async def alignments(body: AlignmentsRequest, request: Request) -> Response:
        """Translate ``sentences`` with one model; per sentence the best translation as the alignment viewer
        shows it (attention of every layer and head, word and subword level, confidence, hard links), the
        rest of the n-best list, with ``markup`` the tags carried across, and the request's timings."""
        arrived = time.monotonic()
        check_sentences(body.sentences, limits)
        model = models.get(body.model)
        parsed = parse_markup(body)
        sentences = body.sentences if parsed is None else [text for text, _ in parsed]
        options = DecodeOptions(checked_decode(body, settings), need_attention=True, need_confidence=True,
                                model=model.name)
        batcher = request.app.state.batcher
        finish = partial(alignments_bytes, model=model, markup=parsed, sources=body.sentences,
                         clock=partial(timings, batcher, arrived))
        future = submit(batcher, [(sentence, "", ()) for sentence in sentences], options, finish)
        content = await wait_for(future, request, limits.request_timeout)
        return Response(content, media_type="application/json", status_code=200 if content else 499)

    @app.post("/attribution", response_model=AttributionResponse, responses=ERRORS)
    async def attribution(body: AttributionRequest, request: Request) -> Response:
        """Explain ``target`` as the translation of ``source`` with one of the model's attribution methods
        (``GET /models``), teacher-forced; with ``contrast``, why the target rather than the contrast."""
        arrived = time.monotonic()
        for name in ("source", "target", "contrast"):
            if getattr(body, name) is not None:
                check_text(name, getattr(body, name), limits)
        model = models.get(body.model)
        offered = {entry["method"]: entry for entry in methods[model.name]}
        if not offered:
            raise HTTPException(422, f"this server offers no attribution for model {model.name!r} (seq2seq serve "
                                     "--attribution METHOD ...; gradient methods need one model in fp32 or half "
                                     "precision, lime and kernel-shap need Captum)")
        if body.method not in offered:
            raise HTTPException(422, f"attribution method {body.method!r} is not offered for model {model.name!r}; "
                                     f"this server offers {', '.join(offered)} (GET /models)")
        if body.contrast is not None and body.contrast.strip() and not offered[body.method]["contrast"]:
            raise HTTPException(422, f"attribution method {body.method!r} has no contrastive form; with a contrast "
                                     "use one of " + ", ".join(m for m, e in offered.items() if e["contrast"]))
        batcher = request.app.state.batcher
        finish = partial(attribution_bytes, model=model, clock=partial(timings, batcher, arrived))
        future = submit(batcher, [(body.source, body.target, body.contrast)], ExplainOptions(model.name, body.method),
                        finish)
        content = await wait_for(future, request, limits.request_timeout)
        if isinstance(content, Refusal):
            raise HTTPException(422, content.message)
        return Response(content, media_type="application/json", status_code=200 if content else 499)


def model_info(model: ServedModel, methods: list[dict]) -> dict[str, Any]:
    """A ``ModelInfo`` of ``model`` for ``/models``."""
    translator = model.translator
    languages = translator.languages
    return {"name": model.name, "arch": model.arch, "checkpoints": translator.checkpoints,
            "engine": translator.engine.name if translator.engine is not None else "seq2seq",
            "device": str(translator.device), "layers": translator.model.attention_layers,
            "heads": translator.model.attention_heads, "languages": list(languages) if languages else None,
            "attribution": methods}


def timings(batcher, arrived: float) -> dict[str, float]:
    """A request's ``Timings`` (in the worker, right after its model call: ``Batcher.last_call`` is its own)."""
    started, seconds = batcher.last_call
    return {"queue_ms": round(max(0.0, started - arrived) * 1000, 2), "model_ms": round(seconds * 1000, 2),
            "total_ms": round((time.monotonic() - arrived) * 1000, 2)}


# ----------------------------------------------------------------------------- in the worker thread


def alignments_bytes(translations: list[Translation], model: ServedModel, markup: list[tuple[str, list]] | None,
                     sources: list[str], clock) -> bytes:
    """One ``/alignments`` answer as JSON (``AlignmentsResponse``)."""
    marked = None if markup is None else mark_translations(translations, markup, model.align, model.backward)
    sentences = []
    for i, best in enumerate(translations):
        hypotheses = best.alternatives or [best]
        candidates = [{"translation": t.text, "score": t.score, "log_prob": t.log_prob,
                       **({} if marked is None else {"markup": marked[i][rank]})} for rank, t in enumerate(hypotheses)]
        view = page_sentence(best, i, model.align) if best.attention is not None else None
        sentences.append({**candidates[0], "source": sources[i], "alternatives": candidates[1:], "view": view})
    return json_bytes({"model": model.name, "arch": model.arch, "scale": SCALE, "timings": clock(),
                       "sentences": sentences})


def page_sentence(translation: Translation, index: int, align: AlignConfig) -> dict[str, Any]:
    """``translation`` as one sentence of the alignment viewer's data: its attention (every layer and head,
    both levels) read as the export reads it with ``align``, its confidence, and its hard links per level."""
    record = translation.alignment_record(index, align.layer, align.heads, **align.link_options())
    exported = record.to_json()
    confidence = translation.confidence()
    if confidence is not None:
        exported["confidence"] = confidence
    sentence = viewer_sentence(exported, record.attention)
    attention = sentence["views"]["attention"]  # the server exports nothing: say what the default is here
    attention["note"] = attention["note"].replace("the export's aggregate is", "the hard links are read from")
    sentence["links"] = {level: sorted([i, j] for i, j in parse_pharaoh(links)[0])
                         for level, links in (("word", record.pharaoh_word), ("subword", record.pharaoh_subword))}
    return sentence


def explain_batch(model: ServedModel, settings: ServeSettings, threads: int, items: list,
                  options: ExplainOptions) -> list:
    """The worker's attribution of each (source, target, contrast) item: the explainer's answer, or a
    ``Refusal`` for a pair it cannot explain (the others are still explained)."""
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    out: list = []
    for source, target, contrast in items:
        try:
            out.append(settings.explain(model.translator, model.align, source, target, options.method, contrast))
        except UserError as exc:
            out.append(Refusal(str(exc)))
    return out


def attribution_bytes(outputs: list, model: ServedModel, clock) -> bytes | Refusal:
    """One ``/attribution`` answer as JSON (``AttributionResponse``), or the ``Refusal``."""
    [result] = outputs
    if isinstance(result, Refusal):
        return result
    return json_bytes({"model": model.name, "scale": SCALE, **result, "timings": clock()})
