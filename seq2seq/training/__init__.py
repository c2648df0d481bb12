"""Training: the trainer (loop, schedule, precision, evaluation, resume), checkpoints, torchrun /
DDP plumbing and the run's corpus. ``train`` and ``TrainResult`` are imported on first use, so
that decoding can read checkpoints without loading the training loop or ``datasets``."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["TrainResult", "train"]

if TYPE_CHECKING:
    from .trainer import TrainResult, train


def __getattr__(name: str) -> Any:
    if name in __all__:
        from . import trainer

        return getattr(trainer, name)
    raise AttributeError(f"module 'seq2seq.training' has no attribute {name!r}")
