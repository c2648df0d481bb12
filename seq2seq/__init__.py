"""seq2seq: attention-based neural machine translation, RNN and Transformer side by side.

    from seq2seq import Translator, RunConfig, train
    cfg = RunConfig.from_preset("rnn-bahdanau", data={"data_dir": "multi30k", "src": "de", "tgt": "en"})
    result = train(cfg)                     # = seq2seq train --preset rnn-bahdanau --data-dir ...
    translator = Translator.from_checkpoint(result.best_checkpoint)
    print(translator.translate(["Ein Hund rennt."])[0].text)   # beam 5, as seq2seq translate

Names are imported on first use (PEP 562), so ``from seq2seq import Translator`` loads neither
the training loop nor ``datasets``.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .version import __version__ as __version__  # noqa: F401  (re-exported)

_EXPORTS = {
    "DataConfig": "config", "DecodeConfig": "config", "ModelConfig": "config", "RunConfig": "config",
    "TrainConfig": "config", "OptimConfig": "config", "ScheduleConfig": "config", "EvalConfig": "config",
    "CheckpointConfig": "config", "GuidedConfig": "config", "PRESETS": "config",
    "UserError": "errors",
    "build_model": "models",
    "TrainResult": "training.run", "train": "training.run",
    "Translation": "decoding.translator", "Translator": "decoding.translator",
    "BackwardAligner": "decoding.forced_alignment",
    "adapt": "training.adapt",
}
__all__ = ["BackwardAligner", "CheckpointConfig", "DataConfig", "DecodeConfig", "EvalConfig", "GuidedConfig",
           "ModelConfig", "OptimConfig", "PRESETS", "RunConfig", "ScheduleConfig", "TrainConfig", "TrainResult",
           "Translation", "Translator", "UserError", "adapt", "build_model", "train"]  # = _EXPORTS (tested)

if TYPE_CHECKING:  # for type checkers and IDEs; at run time __getattr__ imports on demand
    from .config import (
        PRESETS, CheckpointConfig, DataConfig, DecodeConfig, EvalConfig, GuidedConfig, ModelConfig, OptimConfig,
        RunConfig, ScheduleConfig, TrainConfig,
    )
    from .errors import UserError
    from .models import build_model
    from .training.adapt import adapt
    from .training.run import TrainResult, train
    from .decoding.forced_alignment import BackwardAligner
    from .decoding.translator import Translation, Translator


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'seq2seq' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
