"""The models a server serves side by side (``seq2seq serve --model NAME=RUN``, repeated): each a name, its
``Translator`` and what goes with it (the alignment settings read for it, its compiled decoding under way, a
backward model), and the lookup by name that every endpoint does (``"model": NAME``; none: the first).

One worker thread runs them all (``Batcher``: a batch holds one model's sentences, the model is part of the
batch key), so two models never compete for the cores, and the limits (queue, timeout) hold for all together.
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Iterator, Sequence

from fastapi import HTTPException

from ..config import AlignConfig
from ..decoding.forced_alignment import BackwardAligner
from ..decoding.translator import Translator
from ..errors import UserError
from ..models.compiled import BackgroundCompile

#: the name of the model of ``seq2seq serve --checkpoint RUN`` (and of ``create_app(translator)``)
DEFAULT_NAME = "default"
#: what a model's name may be: it travels in JSON and names the model on the page
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,39}")


@dataclass
class ServedModel:
    """One served model. ``align``: how its attention is read as alignments (None: the server's
    ``ServeSettings.align``, checked against it); ``compiling``: its compiled decoding under way (``/health``);
    ``backward``: a target->source model that symmetrizes its alignments (``create_app``)."""

    name: str
    translator: Translator
    align: AlignConfig | None = None
    compiling: BackgroundCompile | None = None
    backward: BackwardAligner | None = None

    @property
    def arch(self) -> str:
        return describe_arch(self.translator.model)


class ServedModels:
    """The served models in order, by name; the first answers requests that name none."""

    def __init__(self, models: Sequence[ServedModel], align: AlignConfig) -> None:
        if not models:
            raise UserError("a server needs a model: give --checkpoint RUN or --model NAME=RUN")
        check_names([model.name for model in models])
        self.models = [model if model.align is not None else dataclasses.replace(model, align=align)
                       for model in models]
        self._by_name = {model.name: model for model in self.models}

    def __iter__(self) -> Iterator[ServedModel]:
        return iter(self.models)

    def __len__(self) -> int:
        return len(self.models)

    @property
    def first(self) -> ServedModel:
        return self.models[0]

    @property
    def names(self) -> list[str]:
        return [model.name for model in self.models]

    def get(self, name: str | None) -> ServedModel:
        """The model called ``name`` (None: the first); 422 naming the served ones for any other name."""
        if name is None:
            return self.first
        model = self._by_name.get(name)
        if model is None:
            raise HTTPException(422, f"unknown model {name!r}: this server serves {', '.join(self.names)} "
                                     "(GET /models)")
        return model


def check_names(names: Sequence[str]) -> None:
    """A UserError for a name that is not ``NAME`` or a name given twice."""
    for name in names:
        if not NAME.fullmatch(name):
            raise UserError(f"model name {name!r}: use 1-40 letters, digits, '.', '_' or '-', starting with a "
                            "letter or digit (--model NAME=RUN)")
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise UserError(f"model name(s) {', '.join(repeated)} given twice: name each --model differently")


def served_models(translator: Translator | Sequence[ServedModel], align: AlignConfig,
                  compiling: BackgroundCompile | None = None, backward: BackwardAligner | None = None) -> ServedModels:
    """``create_app``'s first argument as ``ServedModels``: one ``Translator`` is the model named ``default``
    (with ``compiling`` and ``backward``); ``ServedModel``s bring their own."""
    if not isinstance(translator, (list, tuple)):
        return ServedModels([ServedModel(DEFAULT_NAME, translator, None, compiling, backward)], align)
    if compiling is not None or backward is not None:
        raise ValueError("served_models: ServedModels carry their own compiling and backward")
    return ServedModels(list(translator), align)


def describe_arch(model) -> str:
    """'transformer', 'rnn (bahdanau)', or 'ensemble: rnn (bahdanau) + transformer'."""
    members = getattr(model, "members", None)
    if members is not None:
        return "ensemble: " + " + ".join(describe_arch(member) for member in members)
    cfg = getattr(model, "cfg", None)
    if cfg is None:
        return type(model).__name__
    return f"rnn ({cfg.attention})" if cfg.arch == "rnn" else cfg.arch
