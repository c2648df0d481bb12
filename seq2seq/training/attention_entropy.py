"""The attention entropy penalty (``--attention-entropy-weight``): sharper cross-attention.

For a cross-attention distribution a_t over the source at target position t,

    H(a_t) = -sum_j a_tj log a_tj   (nats; 0 log 0 = 0),

0 when a_t is one-hot and log S when it is uniform over S real source positions. The training
objective becomes

    loss = CE + w * (1 / N) sum_{t real} mean_{heads h (and layers l with 'all')} H(a^{l,h}_t)

over the N real target positions of the step (those the cross-entropy counts: padding excluded,
EOS included), so with w > 0 the model is pushed towards attention on few source positions, the
trade-off between interpretable (peaked) attention and accuracy. Like the cross-entropy it is a
sum over target tokens divided by the step's tokens, so gradient accumulation and several ranks
give the update of one large batch.

Which layer: by default ``attention_entropy_layer`` -2, the penultimate decoder layer, which is
the layer alignments are read from (``AlignConfig.layer``; Garg et al. 2019 found it aligns best);
an RNN, and a one-layer Transformer, have one layer and use it. The top layer's cross-attention
feeds the output directly and often spreads on purpose (over a source word's pieces, or onto the
source EOS); sharpening only the layer that is read leaves the others free, which costs less
accuracy than sharpening every layer. ``'all'`` penalizes the mean over every layer.

Each head's entropy counts (the mean of the heads' entropies, not the entropy of their mean), so
every head of the layer sharpens. With sparsemax / 1.5-entmax attention the zeros cost nothing and
their gradient is finite.
"""
from __future__ import annotations

import torch

from ..alignment.matrices import resolve_layer
from ..errors import UserError
from ..tokenizer import PAD_ID


def attention_entropy(weights: torch.Tensor) -> torch.Tensor:
    """H(a) = -sum_j a_j log a_j over the last dim, in fp32 (..., S) -> (...). Zero weights add 0,
    and the gradient stays finite there (log is taken of max(a, tiny)), so rows with exact zeros
    (masks, sparsemax) train without NaN."""
    a = weights.float()
    return -(a * a.clamp_min(torch.finfo(torch.float32).tiny).log()).sum(-1)


def entropy_sum(attention: torch.Tensor, target: torch.Tensor, layer: int | str) -> torch.Tensor:
    """Sum over real target positions of the mean over heads (and layers with ``'all'``) of
    H(a_t): attention (B, L, H, T, S) from ``model(..., need_attention=True)``, target (B, T) the
    gold output ids (PAD = not a position) -> a 0-dim fp32 tensor."""
    used = resolve_layer(layer, attention.size(1))
    chosen = attention if used == "all" else attention[:, used : used + 1]  # (B, L', H, T, S)
    per_position = attention_entropy(chosen).mean(dim=(1, 2))  # (B, T)
    return (per_position * (target != PAD_ID)).sum()


class EntropyPenalty:
    """The penalty's settings, checked: weight w and the layer(s) it reads. Inactive (no attention
    asked for, nothing added) when w = 0. The objective (``objective.py``) adds w * ``entropy_sum``."""

    def __init__(self, weight: float, layer: int | str, num_layers: int) -> None:
        if weight < 0:
            raise UserError(f"--attention-entropy-weight must be >= 0 (0 = off), got {weight}")
        try:
            resolve_layer(layer, num_layers)
        except UserError as exc:
            raise UserError(f"--attention-entropy-layer {layer}: {exc}") from None
        self.weight, self.layer = weight, layer

    @property
    def active(self) -> bool:
        """Whether the model must return its attention (only then: it may cost the fused kernel)."""
        return self.weight > 0
