"""The guided alignment loss (Garg et al. 2019): supervised cross-attention against gold alignments.

For a target position t with a gold distribution g_t over the source (``seq2seq.alignment.guided``:
uniform over the pieces of the linked source words) and the supervised attention a_t (the mean of
the supervised heads of one decoder layer), the loss is the Kullback-Leibler divergence

    KL(g_t || a_t) = sum_s g_ts (log g_ts - log a_ts) = CE(g_t, a_t) - H(g_t) >= 0,

zero exactly when a_t = g_t. It differs from Garg et al.'s cross-entropy -sum_s g_ts log a_ts only by
the gold's entropy, a constant: the gradient is the same, and the minimum is 0. Rows with no gold
(all-zero g_t: unaligned target pieces, EOS, padding) add nothing. The sum over rows is returned; the
trainer divides it by the step's target tokens like the translation loss (fairseq's normalisation
of Garg et al.'s loss) and weighs it by lambda (``--guided-alignment-weight``, 0.05 in the paper).
"""
from __future__ import annotations

import torch


def guided_alignment_loss(attention: torch.Tensor, gold: torch.Tensor) -> torch.Tensor:
    """sum over rows t of KL(g_t || a_t), in fp32. ``attention`` (B, heads, T, S): the supervised heads'
    weights, averaged here; ``gold`` (B, T, S): rows summing to 1 (supervised) or all zero."""
    mean = attention.float().mean(dim=1)  # (B, T, S)
    log_attention = torch.log(mean.clamp_min(torch.finfo(torch.float32).tiny))
    gold = gold.float()
    return (torch.xlogy(gold, gold) - gold * log_attention).sum()
