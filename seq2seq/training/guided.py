"""Guided alignment training (Garg et al. 2019): the run's supervised attention and its loss term.

With ``guided.links`` (``--guided-alignment``) the training objective of a batch becomes

    L = sum_t CE_ls(y_t) + lambda * sum_t KL(g_t || a_t)

divided by the step's target tokens (both terms alike, so ranks and accumulation compute the same
update as one process: ``Trainer.train_step``), where a_t is the mean of heads ``guided.heads``
of decoder layer ``guided.layer``'s cross-attention at target position t and g_t the gold row
(``seq2seq.alignment.guided``; the loss: ``seq2seq.nn.alignment_loss``). lambda is
``guided.weight`` (0.05 by default, as in the paper). Only that layer computes its
attention weights explicitly; the others keep the fused kernel where it is used.

With ``--guided-alignment self`` (``SelfGuidance``) g_t comes from the model itself: for the first
``guided.self_warmup`` steps there is no alignment term; after them each batch's gold rows are the
links the model exports for that batch now (its supervised heads, read in a teacher pass without dropout
or gradient, full context where the model has it, grow links: ``alignment.guided.own_gold``), so the
supervision follows the model as it trains, and a resumed run computes the same gold from the same
weights. The loss then sharpens the supervised heads towards their own best links.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..alignment.guided import own_gold, word_start_table
from ..alignment.matrices import head_indices, resolve_layer
from ..config import SELF_GUIDANCE, RunConfig, link_share
from ..data.batching import Batch
from ..errors import UserError
from ..models.base import EncoderDecoder
from ..nn.alignment_loss import binary_link_loss, guided_alignment_loss
from ..tokenizer import EOS_ID, PAD_ID, Tokenizer


@dataclass
class GuidedTraining:
    """The supervised attention of a run: a decoder layer index, its heads and the loss weight."""

    layer: int  # 0 .. layers - 1
    heads: list[int]
    weight: float
    binary: bool = False  # --guided-loss binary: the heads are link classifiers (``binary_link_loss``)

    @classmethod
    def for_run(cls, cfg: RunConfig, model: EncoderDecoder) -> "GuidedTraining | None":
        """None without ``guided.links``; else the layer and heads checked against the model."""
        guided = cfg.guided
        if not guided.links:
            return None
        try:
            layer = resolve_layer(guided.layer, model.attention_layers)
            heads = head_indices(list(guided.heads), model.attention_heads)
        except UserError as exc:
            raise UserError(f"--guided-layer {guided.layer} / --guided-heads "
                            f"{' '.join(map(str, guided.heads))}: {exc}") from None
        return cls(int(layer), heads, guided.weight, guided.link_classifier(cfg.model))

    def loss(self, attention: torch.Tensor | None, gold: torch.Tensor | None, tgt_out: torch.Tensor | None = None,
             src_mask: torch.Tensor | None = None) -> torch.Tensor:
        """sum_t KL(g_t || a_t) of a batch, or with ``binary`` the links' binary cross-entropy (which needs the
        batch's ``tgt_out`` (B, T) and ``src_mask`` (B, S) for the positions it supervises): ``attention``
        (B, 1, H, T, S) from ``forward(..., attention_layer=self.layer)``, ``gold`` the batch's ``guide`` (B, T, S)."""
        if attention is None or gold is None:
            raise ValueError("guided alignment needs the batch's gold (Batch.guide) and the model's attention")
        if not self.binary:
            return guided_alignment_loss(attention[:, 0, self.heads], gold)
        if tgt_out is None or src_mask is None:
            raise ValueError("the binary link loss needs the batch's tgt_out and src_mask")
        rows = (tgt_out != PAD_ID) & (tgt_out != EOS_ID)
        return binary_link_loss(attention[:, 0, self.heads], gold, rows, src_mask)


class SelfGuidance:
    """The gold rows of ``--guided-alignment self``: ``gold(model, batch, step)`` is None during the warm-up,
    then the model's own links of the batch as gold rows (B, T, S), like a file's (``Batch.guide``)."""

    def __init__(self, guided: GuidedTraining, tokenizer: Tokenizer, warmup: int) -> None:
        self.guided, self.warmup = guided, warmup
        self.starts = word_start_table(tokenizer)
        self.share = link_share("grow", None)  # the links ``seq2seq align`` exports by default

    @classmethod
    def for_run(cls, cfg: RunConfig, guided: GuidedTraining | None, tokenizer: Tokenizer) -> "SelfGuidance | None":
        """None unless the run guides itself (``guided.links`` 'self')."""
        if guided is None or cfg.guided.links != SELF_GUIDANCE:
            return None
        return cls(guided, tokenizer, cfg.guided.self_warmup)

    @torch.no_grad()
    def gold(self, model: EncoderDecoder, batch: Batch, step: int) -> torch.Tensor | None:
        """The batch's gold rows on ``batch``'s device, or None before step ``warmup`` (steps count from 0)."""
        if step < self.warmup:
            return None
        training = model.training
        model.eval()  # the links the model exports: no dropout
        try:
            _, weights = model(batch.src, batch.src_mask, batch.tgt_in, False, attention_layer=self.guided.layer,
                               src_lengths=batch.src_lengths)
        finally:
            model.train(training)
        attention = weights[:, 0, self.guided.heads].float().mean(dim=1).cpu().numpy()  # (B, T, S)
        src, tgt = batch.src.cpu().numpy(), batch.tgt_out.cpu().numpy()
        gold = np.zeros(attention.shape, dtype=np.float32)
        for b in range(len(src)):
            src_ids, tgt_ids = src[b][: np.argmax(src[b] == EOS_ID)], tgt[b][: np.argmax(tgt[b] == EOS_ID)]
            rows = own_gold(attention[b], src_ids, tgt_ids, self.starts, self.share)
            gold[b, : rows.shape[0], : rows.shape[1]] = rows
        return torch.from_numpy(gold).to(batch.src.device)
