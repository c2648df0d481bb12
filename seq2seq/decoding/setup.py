"""How a ``Translator`` is set up: the options of building one from checkpoints (``TranslatorSetup``),
where its model came from (``ModelOrigin``), the model built for decoding at a precision
(``build_decoding_model``), and the decoding options of a call (``decode_config``)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..checkpoint.loaded import LoadedCheckpoint
from ..config import DecodeConfig, RunConfig
from ..errors import UserError
from ..models.base import EncoderDecoder
from ..nn.packed import pack_for_decoding

DECODING_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16,
                   "int8": torch.float32}  # int8: fp32 model, linear layers quantized (seq2seq.nn.quantize)


@dataclass(frozen=True)
class TranslatorSetup:
    """How a ``Translator`` is built from checkpoints (``Translator.from_checkpoints`` says what each does):
    where the model runs (``device``, ``precision``), over which output vocabulary (``shortlist``: a file,
    "auto" for the run's, with ``shortlist_sizes``), through which step (``compile``, ``compile_cache``)
    and whose search (``engine``). ``Translator.from_checkpoint(path, device="cpu")`` takes its fields as
    keywords."""

    device: str = "auto"
    precision: str = "fp32"
    shortlist: str | Path | None = None
    shortlist_sizes: tuple[int | None, int | None] | None = None
    compile: bool | None = False
    compile_cache: str | None = None
    engine: str = "seq2seq"


@dataclass(frozen=True)
class ModelOrigin:
    """Where a Translator's model came from: its checkpoint files (an ensemble's members), the (layer,
    heads) that guided alignment trained to align (``GuidedConfig.supervised_attention``, read by default
    by the alignment export, ``seq2seq align`` and ``serve``: ``AlignConfig.for_model``), and the
    (source, target) languages it was trained on (``data.src`` / ``data.tgt``)."""

    checkpoints: tuple[str, ...] = ()
    supervised_attention: tuple[int, list[int]] | None = None
    languages: tuple[str, str] | None = None

    @classmethod
    def of_run(cls, config: RunConfig, checkpoints: tuple[str, ...] = ()) -> "ModelOrigin":
        """The origin of a model trained with ``config`` (a checkpoint's, or a run's while it trains)."""
        return cls(checkpoints, config.guided.supervised_attention(), (config.data.src, config.data.tgt))


def setup_and_decode(setup: TranslatorSetup | None, decode: DecodeConfig | None,
                      options: dict[str, Any]) -> tuple[TranslatorSetup, DecodeConfig]:
    """``setup`` and ``decode`` (defaults: ``TranslatorSetup()``, ``DecodeConfig()``) with ``options`` (the
    field names of either) replaced; checked."""
    setup_fields = {f.name for f in dataclasses.fields(TranslatorSetup)}
    decode_fields = {f.name for f in dataclasses.fields(DecodeConfig)}
    unknown = sorted(set(options) - setup_fields - decode_fields)
    if unknown:
        raise UserError(f"Translator.from_checkpoint(s): unknown option(s) {', '.join(unknown)}; the options are "
                        f"TranslatorSetup's fields ({', '.join(sorted(setup_fields))}) and DecodeConfig's")
    setup = dataclasses.replace(setup or TranslatorSetup(), **{k: v for k, v in options.items() if k in setup_fields})
    return setup, decode_config(decode, {k: v for k, v in options.items() if k in decode_fields})


def input_bound(model: EncoderDecoder) -> int | float:
    """The most source subwords ``model`` can encode: max_positions - 1 (the EOS) with learned positions
    (an ensemble: its smallest), else no bound."""
    positions = getattr(model, "max_positions", None)
    return float("inf") if positions is None else positions - 1


def decode_config(decode: DecodeConfig | None, options: dict[str, Any]) -> DecodeConfig:
    """``decode`` (default: ``DecodeConfig()``) with ``options`` (its field names) replaced; checked."""
    decode = DecodeConfig() if decode is None else decode
    if not options:
        return decode
    unknown = sorted(set(options) - {f.name for f in dataclasses.fields(DecodeConfig)})
    if unknown:
        raise UserError(f"Translator.translate: unknown option(s) {', '.join(unknown)}; the decoding options are "
                        f"DecodeConfig's fields: {', '.join(f.name for f in dataclasses.fields(DecodeConfig))}")
    return dataclasses.replace(decode, **options)


def build_decoding_model(loaded: LoadedCheckpoint, device: torch.device, precision: str) -> EncoderDecoder:
    """The checkpoint's model with its weights, quantized (int8) or cast to ``precision``, on ``device``;
    in fp32 on CPU its linear layers compute on oneDNN-packed weights (``seq2seq.nn.packed``)."""
    model = loaded.build_model()
    if precision == "int8":
        from ..nn.quantize import quantize_for_decoding

        model = quantize_for_decoding(model)
    model = model.to(device, DECODING_DTYPES[precision])
    if device.type == "cpu" and precision == "fp32":
        pack_for_decoding(model)
    return model


def compile_conflict(engine: str) -> UserError:
    """The error of ``--compile`` with an engine whose search is not ours (nothing of ours to compile)."""
    return UserError(f"--compile (and --compile-cache) compiles our engine's decoding step; --engine {engine} runs "
                     "CTranslate2's search instead: drop one of them")
