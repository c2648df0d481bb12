"""The training objective of one batch, as one function of the batch's tensors: what a compiled
step (``compiled.py``) compiles whole, forward, loss terms and all.

For a batch with target positions t (padding excluded) the objective is

    J = sum_t CE_ls(y_t)                                   label-smoothed cross-entropy (``nn.loss``)
        + w * sum_t mean_heads H(a_t)                      --attention-entropy-weight w (``attention_entropy``)
        + lambda * sum_t KL(g_t || a'_t)                   --guided-alignment-weight lambda (``guided``;
                                                           --guided-loss binary: the links' cross-entropy)

summed, not averaged (a batch without gold rows, in self-guidance's warm-up, has no alignment term): the
trainer divides it by the step's target tokens over every micro-batch and
rank, so accumulation and several processes give the update of one large batch. Each term is also
returned on its own (detached) for the metrics; a term that is off is an exact zero.
"""
from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Callable, NamedTuple

import torch

from .attention_entropy import EntropyPenalty, entropy_sum
from .guided import GuidedTraining
from .optim import sequence_loss


class LossTerms(NamedTuple):
    """0-dim sums over the batch's target positions: ``objective`` (to backpropagate) and, detached,
    its cross-entropy, the guided alignment term (unweighted) and the attention entropy (nats)."""

    objective: torch.Tensor
    cross_entropy: torch.Tensor
    guided: torch.Tensor
    entropy: torch.Tensor


class Objective:
    """J of a batch for a model's teacher-forced ``forward``; ``__call__`` takes tensors only, so that
    ``torch.compile`` can trace it whole."""

    def __init__(self, forward: Callable, label_smoothing: float, guided: GuidedTraining | None,
                 entropy: EntropyPenalty, autocast: Callable[[], AbstractContextManager]) -> None:
        self.forward, self.label_smoothing, self.guided, self.entropy = forward, label_smoothing, guided, entropy
        self.autocast = autocast  # around the forward only: the loss terms compute in fp32

    @property
    def attention_options(self) -> tuple[bool, int | None]:
        """(need_attention, attention_layer) of the forward: every layer for the entropy penalty
        (it may read several), else the supervised layer alone (guided), else none."""
        if self.entropy.active:
            return True, None
        return False, None if self.guided is None else self.guided.layer

    def __call__(self, src: torch.Tensor, src_mask: torch.Tensor, tgt_in: torch.Tensor, tgt_out: torch.Tensor,
                 guide: torch.Tensor | None = None, src_lengths: torch.Tensor | None = None) -> LossTerms:
        every_layer, layer = self.attention_options
        with self.autocast():
            logits, weights = self.forward(src, src_mask, tgt_in, every_layer, attention_layer=layer,
                                           src_lengths=src_lengths)
        cross_entropy = sequence_loss(logits, tgt_out, self.label_smoothing, reuse_logits=True)
        objective, zero = cross_entropy, cross_entropy.new_zeros((), dtype=torch.float32)
        entropy = guided = zero
        if self.entropy.active:
            entropy = entropy_sum(weights, tgt_out, self.entropy.layer)
            objective = objective + self.entropy.weight * entropy
        if self.guided is not None and guide is not None:  # None: self-guidance's warm-up
            supervised = weights[:, self.guided.layer:self.guided.layer + 1] if every_layer else weights
            guided = self.guided.loss(supervised, guide, tgt_out, src_mask)
            objective = objective + self.guided.weight * guided
        return LossTerms(objective, cross_entropy.detach(), guided.detach(), entropy.detach())
