"""Attention normalizers: scores -> a probability distribution over the keys, with a mask.

Every normalizer maps a row of scores z (one query against S keys) to weights a >= 0 with
sum_j a_j = 1; masked keys get exactly 0, and a row with nothing to attend to gives all zeros
(never NaN). ``masks`` are boolean with True = may attend.

* ``softmax``:  a_j = exp(z_j) / sum_k exp(z_k): dense, every key gets some weight.
* ``sparsemax`` (Martins & Astudillo 2016, "From Softmax to Sparsemax"): the Euclidean projection
  of z onto the probability simplex, a = argmin_{p in simplex} ||p - z||^2, which is
  a_j = [z_j - tau]_+ with the threshold tau such that sum_j a_j = 1. Keys scoring more than 1
  below the top score get exactly 0 (tau >= max z - 1, since no weight exceeds 1).
* ``entmax15`` (Peters, Niculae & Martins 2019, "Sparse Sequence-to-Sequence Models"): alpha-entmax
  with alpha = 1.5, a = argmax_{p in simplex} p.z + H^T_alpha(p) with the Tsallis entropy
  H^T_alpha(p) = sum_j (p_j - p_j^alpha) / (alpha (alpha - 1)), which is
  a_j = [(alpha - 1) z_j - tau]_+^(1 / (alpha - 1)) = [z_j / 2 - tau]_+^2. Between softmax
  (alpha -> 1) and sparsemax (alpha = 2): smoother, still with exact zeros, for keys scoring more
  than 2 below the top (tau >= max z / 2 - 1).

The sparse ones come from the ``entmax`` package (exact sort-based solvers with their own
backward), an optional extra: ``pip install 'seq2seq[sparse]'``. They run in fp32 whatever the
scores' dtype (the thresholds come from cumulative sums, which bf16 would blur) and return the
scores' dtype. Masked scores are not set to -inf (the solvers would compute inf - inf) but to the
row's top real score minus ``MASK_MARGIN``: far enough below the threshold that their weight is
exactly 0 by the bounds above, and finite; then they are set to 0 once more, so that the contract
holds whatever the solver's rounding.
"""
from __future__ import annotations

from typing import Callable

import torch

from ..config import ENTMAX_MISSING
from ..errors import UserError

NORMALIZERS = ("softmax", "sparsemax", "entmax15")
MASK_MARGIN = 1e3
"""Masked scores sit this far below the row's top real score: zero weight under sparsemax (which
zeroes anything 1 below the top) and 1.5-entmax (2 below), for fp32 scores of magnitude up to ~1e8."""

Normalizer = Callable[[torch.Tensor, "torch.Tensor | None"], torch.Tensor]


def masked_softmax(scores: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Softmax over the last dim; masked entries get exactly 0, fully masked rows all 0 (no NaN)."""
    if mask is None:
        return scores.softmax(dim=-1)
    scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    return scores.softmax(dim=-1).masked_fill(~mask, 0.0)


def masked_sigmoid(scores: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """A sigmoid per entry (independent link probabilities, not a distribution); masked entries get exactly 0."""
    probabilities = torch.sigmoid(scores)
    return probabilities if mask is None else probabilities.masked_fill(~mask, 0.0)


def _entmax():
    """The ``entmax`` package, or a UserError saying how to install it."""
    try:
        import entmax
    except ImportError:
        raise UserError(ENTMAX_MISSING) from None
    return entmax


def _masked_sparse(solve: Callable[..., torch.Tensor], scores: torch.Tensor,
                   mask: torch.Tensor | None) -> torch.Tensor:
    """``solve`` (entmax's sparsemax / entmax15) over the last dim of ``scores`` with ``mask``."""
    z = scores.float()
    if mask is None:
        return solve(z, dim=-1).to(scores.dtype)
    mask = mask.expand_as(z)
    with torch.no_grad():  # where the masked scores go; they get no weight and so no gradient
        top = z.masked_fill(~mask, -torch.inf).amax(-1, keepdim=True)  # (..., 1), -inf: nothing to attend
        floor = torch.where(top.isfinite(), top - MASK_MARGIN, torch.zeros_like(top))
    weights = solve(torch.where(mask, z, floor), dim=-1)
    return weights.masked_fill(~mask, 0.0).to(scores.dtype)


def masked_sparsemax(scores: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Sparsemax over the last dim (module docstring); masked entries and fully masked rows 0."""
    return _masked_sparse(_entmax().sparsemax, scores, mask)


def masked_entmax15(scores: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """1.5-entmax over the last dim (module docstring); masked entries and fully masked rows 0."""
    return _masked_sparse(_entmax().entmax15, scores, mask)


_BY_NAME: dict[str, Normalizer] = {"softmax": masked_softmax, "sparsemax": masked_sparsemax,
                                   "entmax15": masked_entmax15}


def get_normalizer(name: str) -> Normalizer:
    """The masked normalizer called ``name`` (one of ``NORMALIZERS``); the sparse ones check here
    that ``entmax`` is installed, so a model that needs it fails when built, not mid-training."""
    if name not in _BY_NAME:
        raise UserError(f"--attention-normalizer must be one of {', '.join(NORMALIZERS)}, got {name!r}")
    if name != "softmax":
        _entmax()
    return _BY_NAME[name]
