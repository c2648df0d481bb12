"""Guided alignment training (Garg et al. 2019): the run's supervised attention and its loss term.

With ``data.guided_alignment`` the training objective of a batch becomes

    L = sum_t CE_ls(y_t) + lambda * sum_t KL(g_t || a_t)

divided by the step's target tokens (both terms alike, so ranks and accumulation compute the same
update as one process: ``Trainer.train_step``), where a_t is the mean of heads ``train.guided_heads``
of decoder layer ``train.guided_layer``'s cross-attention at target position t and g_t the gold row
(``seq2seq.alignment.guided``; the loss: ``seq2seq.nn.alignment_loss``). lambda is
``train.guided_alignment_weight`` (0.05 by default, as in the paper). Only that layer computes its
attention weights explicitly; the others keep the fused kernel where it is used.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..alignment.matrices import head_indices, resolve_layer
from ..config import RunConfig
from ..errors import UserError
from ..models.base import EncoderDecoder
from ..nn.alignment_loss import guided_alignment_loss


@dataclass
class GuidedTraining:
    """The supervised attention of a run: a decoder layer index, its heads and the loss weight."""

    layer: int  # 0 .. layers - 1
    heads: list[int]
    weight: float

    @classmethod
    def for_run(cls, cfg: RunConfig, model: EncoderDecoder) -> "GuidedTraining | None":
        """None without ``data.guided_alignment``; else the layer and heads checked against the model."""
        if not cfg.data.guided_alignment:
            return None
        try:
            layer = resolve_layer(cfg.train.guided_layer, model.attention_layers)
            heads = head_indices(list(cfg.train.guided_heads), model.attention_heads)
        except UserError as exc:
            raise UserError(f"--guided-layer {cfg.train.guided_layer} / --guided-heads "
                            f"{' '.join(map(str, cfg.train.guided_heads))}: {exc}") from None
        return cls(int(layer), heads, cfg.train.guided_alignment_weight)

    def loss(self, attention: torch.Tensor | None, gold: torch.Tensor | None) -> torch.Tensor:
        """sum_t KL(g_t || a_t) of a batch: ``attention`` (B, 1, H, T, S) from ``forward(...,
        attention_layer=self.layer)``, ``gold`` the batch's ``guide`` (B, T, S)."""
        if attention is None or gold is None:
            raise ValueError("guided alignment needs the batch's gold (Batch.guide) and the model's attention")
        return guided_alignment_loss(attention[:, 0, self.heads], gold)
