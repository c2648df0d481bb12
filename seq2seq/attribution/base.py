"""What an attribution is: methods, their scores and the ``Attribution`` record (no torch here)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from ..config import AlignConfig
from ..alignment.matrices import normalize_rows
from ..alignment.records import AlignmentRecord, rounded

METHODS = ("gradient", "integrated-gradients", "occlusion", "grad-attention", "lime", "kernel-shap")
GRADIENT_METHODS = ("gradient", "integrated-gradients", "grad-attention")  # need autograd: no int8, no ensembles
#: how ``scores`` (display, links, ranking) are read from ``raw``, per method
SCORES = {"gradient": "|raw|", "integrated-gradients": "|raw|", "occlusion": "max(raw, 0)",
          "grad-attention": "raw", "lime": "max(raw, 0)", "kernel-shap": "max(raw, 0)"}


#: what a contrastive attribution explains (Yin & Neubig 2022; Inseq's ``contrast_prob_diff``)
CONTRAST_METHODS = ("gradient", "integrated-gradients", "occlusion", "lime", "kernel-shap")


def subtract_contrast(log_p: np.ndarray, contrast_log_p: np.ndarray) -> np.ndarray:
    """Contrastive target scores, "why y_t rather than y'_t": f_t = log p(y_t | y_<t, x) - log p(y'_t |
    y'_<t, x) at the positions both outputs have (the target's T+1 rows incl. EOS, the contrast's C+1);
    rows past the contrast's end keep log p(y_t | y_<t, x). Works on the last axis (..., T+1)."""
    out = np.array(log_p, dtype=np.float64, copy=True)
    n = min(out.shape[-1], contrast_log_p.shape[-1])
    out[..., :n] -= np.asarray(contrast_log_p, dtype=np.float64)[..., :n]
    return out


@dataclass
class Attribution:
    """One method's ``(T+1, S+1)`` attribution of one translation (see the module docstring)."""

    method: str
    raw: np.ndarray  # (T+1, S+1) signed values
    scores: np.ndarray  # (T+1, S+1) non-negative importances
    steps: int | None = None  # integrated gradients only
    settings: dict = field(default_factory=dict)  # the other options that shaped it (samples, seed, layer...)

    @property
    def matrix(self) -> np.ndarray:
        """``scores`` with rows normalized to sum to 1 over the S+1 source columns (for display)."""
        return normalize_rows(self.scores)

    def record(self, index: int, source: str, target: str, src_pieces: Sequence[str],
               tgt_pieces: Sequence[str], include_eos: bool = AlignConfig.include_eos, method: str = AlignConfig.method,
               threshold: float | None = AlignConfig.threshold) -> AlignmentRecord:
        """``matrix`` as an AlignmentRecord (word merge, EOS policy, hard links), like attention."""
        return AlignmentRecord.build(index, source, target, src_pieces, tgt_pieces, self.matrix[None, None],
                                     AlignConfig(layer=0, heads="mean", method=method, threshold=threshold,
                                                 include_eos=include_eos))

    def record_for(self, translation, index: int, **options) -> AlignmentRecord:
        """``record`` labelled with a ``Translation``'s texts and pieces (options: include_eos,
        method, threshold)."""
        return self.record(index, translation.source, translation.text, translation.src_pieces,
                           translation.tgt_pieces, **options)

    def to_json(self, record: AlignmentRecord) -> dict:
        """The export entry: ``record`` is ``self.record(...)`` (labels are the attention's)."""
        return {
            "method": self.method, "steps": self.steps, **self.settings,
            "normalization": f"rows of {SCORES.get(self.method, '|raw|')}",
            "raw_matrix": rounded(self.raw), "raw_shape": list(self.raw.shape),
            "subword_matrix": rounded(record.subword), "word_matrix": rounded(record.words),
            "subword_shape": list(record.subword.shape), "word_shape": list(record.words.shape),
            "pharaoh_subword": record.pharaoh_subword, "pharaoh_word": record.pharaoh_word,
        }
