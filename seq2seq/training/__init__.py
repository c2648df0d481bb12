"""Training: ``run`` (``train()`` and the run directory), ``trainer`` (the loop: schedule, precision,
evaluation, resume), ``rng`` (generator states), ``distributed`` (torchrun / DDP plumbing), ``corpus``
(the run's batches) and ``tensorboard``. ``train`` and ``TrainResult`` are imported on first use, so
that decoding can read checkpoints without loading the training loop or ``datasets``."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["TrainResult", "train"]

if TYPE_CHECKING:
    from .run import TrainResult, train


def __getattr__(name: str) -> Any:
    if name in __all__:
        from . import run

        return getattr(run, name)
    raise AttributeError(f"module 'seq2seq.training' has no attribute {name!r}")
