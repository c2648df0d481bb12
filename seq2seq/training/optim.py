"""The optimizer, the learning-rate schedule and the training loss of a run: Adam/AdamW; warmup +
inverse square root for the Transformer, plateau decay (on validation loss) for the RNN, or warmup + a
linear decay to zero at the end of the run's budget; label-smoothed cross-entropy over target tokens."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch

from ..config import RunConfig
from ..errors import UserError
from ..nn.loss import label_smoothed_cross_entropy
from ..tokenizer import PAD_ID


def default_lr(cfg: RunConfig) -> float:
    """Peak learning rate: ``--lr`` (checkpoints written before it had a default stored 0 = 1e-3)."""
    return cfg.optim.lr if cfg.optim.lr > 0 else 1e-3


def schedule_kind(cfg: RunConfig) -> str:
    """The resolved schedule; 'auto' (older checkpoints) means the architecture's."""
    if cfg.schedule.kind not in (None, "auto"):
        return cfg.schedule.kind
    return "inverse-sqrt" if cfg.model.arch == "transformer" else "plateau"


@dataclass(frozen=True)
class OptimizerSettings:
    """What ``build_optimizer`` makes: Adam or AdamW with its learning rate, betas, weight decay and eps (a run's
    from its config, ``of_run``; adapting's its own, ``training.adapt``)."""

    kind: str
    lr: float
    betas: tuple[float, float]
    weight_decay: float = 0.0
    eps: float = 1e-8  # PyTorch's

    @classmethod
    def of_run(cls, cfg: RunConfig) -> OptimizerSettings:
        """A run's optimizer (``cfg`` resolved): ``--optimizer``, ``--lr``, ``--betas``, ``--weight-decay``."""
        return cls(cfg.optim.kind, default_lr(cfg), tuple(cfg.optim.betas), cfg.optim.weight_decay)


def build_optimizer(model: torch.nn.Module, settings: OptimizerSettings) -> torch.optim.Optimizer:
    """Adam or AdamW over ``model``'s parameters (built on their device): fused on CUDA, PyTorch's
    default (foreach) elsewhere, so CPU runs keep their numbers."""
    kinds = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW}
    if settings.kind not in kinds:
        raise UserError(f"--optimizer must be adam or adamw, got {settings.kind!r}")
    on_cuda = all(p.is_cuda for p in model.parameters())
    return kinds[settings.kind](
        model.parameters(), lr=settings.lr, betas=settings.betas, eps=settings.eps,
        weight_decay=settings.weight_decay,
        fused=on_cuda or None,  # CUDA: one kernel per group, and fp16's overflow check stays on the device
    )


def budget_used(step: int, seconds: float, cfg: RunConfig) -> float:
    """The share of the run's budget spent after ``step`` updates and ``seconds`` of its clock: the larger
    of step / ``max_steps`` and seconds / ``max_minutes`` (those set), at most 1."""
    tc = cfg.train
    shares = [step / tc.max_steps] if tc.max_steps else []
    shares += [seconds / (60 * tc.max_minutes)] if tc.max_minutes else []
    return min(1.0, max(shares))


def check_schedule(cfg: RunConfig) -> None:
    """A UserError for a schedule the run cannot follow: ``linear`` without a budget to decay over."""
    if schedule_kind(cfg) == "linear" and not (cfg.train.max_steps or cfg.train.max_minutes):
        raise UserError("--schedule linear (the transformer-align preset's) decays to zero at the end of the run's "
                        "budget: give --max-minutes and/or --max-steps (or choose --schedule inverse-sqrt)")


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: RunConfig, clock: Callable[[], float] = lambda: 0.0):
    """inverse-sqrt: lr(t) = lr * min(t / warmup, sqrt(warmup / t)); linear: lr(t) = lr * min(t / warmup, 1)
    * (1 - budget used), zero where the budget (``max_steps`` and/or ``max_minutes`` of the run's
    ``clock``, in seconds: whichever ends first) ends (``budget_used``); plateau: halve on no
    validation-loss improvement for ``plateau_patience`` evaluations; constant.

    Linear decay to zero is the schedule that trains best for a fixed budget (Li et al. 2020, "Budgeted
    training"): the rate stays high while the model moves far, and the last updates settle it. With a
    time budget the rate at each update follows the clock, so two runs differ as their speeds do."""
    kind = schedule_kind(cfg)
    warmup = max(1, cfg.schedule.warmup_steps or 0)
    if kind == "inverse-sqrt":
        return torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda step: min((step + 1) / warmup, math.sqrt(warmup / (step + 1)))
        )
    if kind == "linear":
        check_schedule(cfg)
        return torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda step: min((step + 1) / warmup, 1.0) * (1.0 - budget_used(step, clock(), cfg))
        )
    if kind == "plateau":
        return torch.optim.lr_scheduler.ReduceLROnPlateau(
            optimizer, mode="min", factor=cfg.schedule.plateau_factor, patience=cfg.schedule.plateau_patience
        )
    if kind == "constant":
        return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    raise UserError(f"--schedule must be auto, inverse-sqrt, linear, plateau or constant, got {kind!r}")


def sequence_loss(logits: torch.Tensor, target: torch.Tensor, label_smoothing: float = 0.0,
                  reuse_logits: bool = False) -> torch.Tensor:
    """Summed label-smoothed cross-entropy over non-pad target tokens (fused: see ``loss.py``;
    ``reuse_logits``: its backward writes the gradient over the logits)."""
    return label_smoothed_cross_entropy(logits, target, label_smoothing, ignore_index=PAD_ID,
                                        reuse_logits=reuse_logits)
