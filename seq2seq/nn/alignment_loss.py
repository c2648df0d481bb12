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

With ``--guided-loss binary`` the supervised heads are link classifiers instead (``binary_link_loss``): p_ts, the
mean of their link probabilities (a sigmoid each, ``MultiHeadAttention.link_probabilities``), against y_ts = 1 where
the gold links target piece t to source piece s (g_ts > 0), else 0:

    BCE = - sum_(t, s) [ y_ts log p_ts + (1 - y_ts) log (1 - p_ts) ]

over the real target pieces (EOS and padding excluded) and real source positions of every pair that has gold
links: a target word without a link is a row of zeros to learn, not a row left out, so a word can end with zero,
one or several links where a softmax row must choose.
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


def binary_link_loss(probabilities: torch.Tensor, gold: torch.Tensor, rows: torch.Tensor,
                     columns: torch.Tensor) -> torch.Tensor:
    """sum of BCE(p_ts, [g_ts > 0]) over the supervised pairs (t, s), in fp32. ``probabilities`` (B, heads, T, S):
    the supervised heads' link probabilities, averaged here; ``gold`` (B, T, S) as for the KL loss (a pair whose
    gold is all zero, without links or not mapped to pieces, adds nothing); ``rows`` (B, T) the target positions
    to supervise, ``columns`` (B, S) the real source positions. The logarithms are clamped at the smallest normal
    float: a probability that rounds to exactly 0 or 1 costs a finite loss (and passes no gradient)."""
    p = probabilities.float().mean(dim=1)  # (B, T, S)
    links = (gold > 0).float()
    pairs = links.flatten(1).any(dim=1)  # (B,)
    weight = ((rows & pairs[:, None])[:, :, None] & columns[:, None, :]).float()
    tiny = torch.finfo(torch.float32).tiny
    log_link, log_none = torch.log(p.clamp_min(tiny)), torch.log((1 - p).clamp_min(tiny))
    return -(weight * (links * log_link + (1 - links) * log_none)).sum()
