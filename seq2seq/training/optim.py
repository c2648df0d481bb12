"""The optimizer, the learning-rate schedule and the training loss of a run: Adam/AdamW; warmup +
inverse square root for the Transformer, plateau decay (on validation loss) for the RNN;
label-smoothed cross-entropy over target tokens."""
from __future__ import annotations

import math

import torch

from ..config import RunConfig
from ..errors import UserError
from ..nn.loss import label_smoothed_cross_entropy
from ..tokenizer import PAD_ID


def default_lr(cfg: RunConfig) -> float:
    """Peak learning rate: ``--lr`` (checkpoints written before it had a default stored 0 = 1e-3)."""
    return cfg.train.lr if cfg.train.lr > 0 else 1e-3


def schedule_kind(cfg: RunConfig) -> str:
    """The resolved schedule; 'auto' (older checkpoints) means the architecture's."""
    if cfg.train.schedule not in (None, "auto"):
        return cfg.train.schedule
    return "inverse-sqrt" if cfg.model.arch == "transformer" else "plateau"


def build_optimizer(model: torch.nn.Module, cfg: RunConfig) -> torch.optim.Optimizer:
    """Adam or AdamW over ``model``'s parameters (built on their device): fused on CUDA, PyTorch's
    default (foreach) elsewhere, so CPU runs keep their numbers."""
    kinds = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW}
    if cfg.train.optimizer not in kinds:
        raise UserError(f"--optimizer must be adam or adamw, got {cfg.train.optimizer!r}")
    on_cuda = all(p.is_cuda for p in model.parameters())
    return kinds[cfg.train.optimizer](
        model.parameters(), lr=default_lr(cfg), betas=tuple(cfg.train.betas),
        weight_decay=cfg.train.weight_decay,
        fused=on_cuda or None,  # CUDA: one kernel per group, and fp16's overflow check stays on the device
    )


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: RunConfig):
    """inverse-sqrt: lr(t) = lr * min(t / warmup, sqrt(warmup / t)); plateau: halve on no
    validation-loss improvement for ``plateau_patience`` evaluations; constant."""
    kind = schedule_kind(cfg)
    if kind == "inverse-sqrt":
        warmup = max(1, cfg.train.warmup_steps)
        return torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda step: min((step + 1) / warmup, math.sqrt(warmup / (step + 1)))
        )
    if kind == "plateau":
        return torch.optim.lr_scheduler.ReduceLROnPlateau(
            optimizer, mode="min", factor=cfg.train.plateau_factor, patience=cfg.train.plateau_patience
        )
    if kind == "constant":
        return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    raise UserError(f"--schedule must be auto, inverse-sqrt, plateau or constant, got {kind!r}")


def sequence_loss(logits: torch.Tensor, target: torch.Tensor, label_smoothing: float = 0.0,
                  reuse_logits: bool = False) -> torch.Tensor:
    """Summed label-smoothed cross-entropy over non-pad target tokens (fused: see ``loss.py``;
    ``reuse_logits``: its backward writes the gradient over the logits)."""
    return label_smoothed_cross_entropy(logits, target, label_smoothing, ignore_index=PAD_ID,
                                        reuse_logits=reuse_logits)
