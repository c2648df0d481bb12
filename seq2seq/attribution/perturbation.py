"""LIME and KernelSHAP over source words, through Captum (``pip install 'seq2seq[explain]'``).

Features are the M source words (``alignment.word_spans`` over the source pieces, EOS excluded;
without pieces every piece is a word). A coalition z in {0, 1}^M keeps the words with z_i = 1 and
deletes the others, the baseline of occlusion (their pieces removed, later positions move up, the
source EOS kept), so z = 0 is the source "EOS" alone. The explained outputs are
f_t(z) = log p(y_t | y_<t, x_z) for the T target tokens and EOS, scored by the one teacher-forced
path (``seq2seq.decoding.scoring.teacher_force``) in batches of perturbed sources.

* ``lime`` (Ribeiro et al. 2016): n coalitions z_k ~ Bernoulli(1/2)^M, weighted by Captum's
  default kernel pi_k = exp(-d_k^2 / 2), d_k = 1 - cos(z_k, 1) over the pieces; raw[t, i] = w_i of
  the weighted ridge regression
      min_{w, b}  sum_k pi_k (f_t(z_k) - b - w . z_k)^2 + alpha |w|^2,   alpha = 1
  (the reference LIME implementation's ridge; the intercept b is not penalized).
* ``kernel-shap`` (Lundberg & Lee 2017): coalitions drawn with p(|z| = j) ~ (M - 1) / (j (M - j)),
  uniformly among those of size j (the Shapley kernel as a sampling distribution), plus z = 1 and
  z = 0 with weight 10^6 (all others 1); raw[t, i] = w_i of that weighted least squares (alpha = 0).
  As n grows, w tends to the Shapley values of f_t; the heavy end points give
  sum_i w_i = f_t(x) - f_t(EOS only) (efficiency) at any n. With M = 1 that difference is the
  one Shapley value, computed directly.

Captum explains one scalar output per call, so a sentence takes T+1 calls (``target=t``) over the
same coalitions: every call starts from the same seed (torch's generator, forked, so the caller's
stream is untouched) and the forward scores each distinct coalition once, keeping all T+1
log-probabilities. A sentence thus costs at most n teacher-forced sources and T+1 regressions;
Captum's per-sample Python loop is the rest of the time (the faithfulness benchmark records the
seconds per sentence). Captum's default surrogate models need scikit-learn; a closed-form weighted
least squares in float64 replaces them (exact, no further dependency).

Layout: a word's w_i is split evenly over its pieces, so the word merge (which sums a word's source
pieces) gives back w_i, and the ``(T+1, S+1)`` matrix goes through the export, plots and benchmark
like every other method. The source EOS column is 0 (EOS is never removed).

Budget: the regression has M + 1 unknowns, so ``samples`` must be at least 2 (M + 1)
(``min_samples``); a longer source is a UserError naming --attribution-samples and the value needed.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from ..alignment.matrices import word_spans
from ..decoding.scoring import teacher_force
from ..config import AttributionConfig
from ..errors import UserError
from ..models.base import EncoderDecoder
from ..tokenizer import EOS_ID
from .base import Attribution, subtract_contrast

METHODS = ("lime", "kernel-shap")
DEFAULT_SAMPLES = AttributionConfig.samples
RIDGE = {"lime": 1.0, "kernel-shap": 0.0}  # alpha of the surrogate regression


def min_samples(words: int) -> int:
    """The fewest samples for a source of ``words`` words: 2 (M + 1), twice the unknowns."""
    return 2 * (words + 1)


def explain_words(model: EncoderDecoder, src_ids: Sequence[int], tgt_ids: Sequence[int], method: str,
                  samples: int = DEFAULT_SAMPLES, seed: int = 0, src_pieces: Sequence[str] | None = None,
                  contrast_ids: Sequence[int] | None = None) -> Attribution:
    """LIME or KernelSHAP (``method``) of every target token over the source words (see the module
    docstring); ``src_pieces`` are the source pieces incl. EOS (None: every piece is a word)."""
    if method not in METHODS:
        raise ValueError(f"explain_words: method must be one of {METHODS}, got {method!r}")
    src_ids, tgt_ids = list(src_ids), list(tgt_ids)
    n_pieces = len(src_ids) - 1  # EOS is never removed
    if src_pieces is None:
        spans = [(i, i + 1) for i in range(n_pieces)]
    elif len(src_pieces) != len(src_ids):
        raise ValueError(f"explain_words: {len(src_pieces)} source pieces for {len(src_ids)} source ids")
    else:
        spans = word_spans(list(src_pieces[:-1]))
    need = min_samples(len(spans))
    if samples < need:
        raise UserError(f"--attribution {method}: this source has {len(spans)} words, and {method} fits "
                        f"words + 1 unknowns from --attribution-samples >= 2 (words + 1) = {need} samples, "
                        f"got {samples}; raise --attribution-samples")
    raw = np.zeros((len(tgt_ids) + 1, len(src_ids)), dtype=np.float64)  # (T+1, S+1)
    if spans:
        scorer = _Scorer(model, src_ids, tgt_ids, contrast_ids)
        if method == "kernel-shap" and len(spans) == 1:  # Captum's size distribution needs M >= 2
            both = scorer(torch.tensor([[1.0] * n_pieces, [0.0] * n_pieces]))  # (2, T+1)
            coefs = (both[0] - both[1]).numpy()[:, None]  # (T+1, 1)
        else:
            coefs = _fit_rows(method, scorer, spans, len(tgt_ids) + 1, samples, seed)  # (T+1, M)
        for i, (start, end) in enumerate(spans):
            raw[:, start:end] = coefs[:, i:i + 1] / (end - start)
    settings = {"samples": samples, "seed": seed, "words": len(spans)}
    return Attribution(method, raw, np.maximum(raw, 0.0), settings=settings)


def _captum_explainers() -> dict:
    """Captum's explainer classes, imported only when asked for."""
    try:
        from captum.attr import KernelShap, Lime
    except ImportError:
        raise UserError("--attribution lime / kernel-shap need Captum, which is not installed: "
                        "pip install 'seq2seq[explain]'") from None
    return {"lime": Lime, "kernel-shap": KernelShap}


def _fit_rows(method: str, scorer: "_Scorer", spans: list[tuple[int, int]], rows: int, samples: int,
              seed: int) -> np.ndarray:
    """(rows, M) surrogate weights: one Captum call per target row over the same seeded coalitions."""
    explainer = _captum_explainers()[method](scorer)
    explainer.interpretable_model = _WeightedLeastSquares(RIDGE[method])
    presence = torch.ones(1, spans[-1][1])  # (1, S) pieces; Captum sets those of absent words to 0
    feature_mask = torch.tensor([[w for w, (start, end) in enumerate(spans) for _ in range(start, end)]])  # (1, S)
    coefs = np.zeros((rows, len(spans)), dtype=np.float64)
    for t in range(rows):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            coefs[t] = explainer.attribute(presence, baselines=0.0, target=t, feature_mask=feature_mask,
                                           n_samples=samples, perturbations_per_eval=samples,
                                           return_input_shape=False).flatten().numpy()
    return coefs


class _Scorer:
    """Captum's forward: piece-presence rows (k, S) -> log p of every target token and EOS (k, T+1)
    of the source with the absent pieces deleted (EOS kept), contrastive with ``contrast_ids``
    (``base.subtract_contrast``); each distinct row is scored once."""

    def __init__(self, model: EncoderDecoder, src_ids: list[int], tgt_ids: list[int],
                 contrast_ids: Sequence[int] | None = None) -> None:
        self.model, self.src_ids, self.tgt_ids = model, src_ids, tgt_ids
        self.contrast_ids = None if contrast_ids is None else list(contrast_ids)
        self.cache: dict[bytes, torch.Tensor] = {}

    def __call__(self, presence: torch.Tensor) -> torch.Tensor:
        keep = presence.detach().cpu().numpy() > 0.5  # (k, S)
        keys = [row.tobytes() for row in keep]
        new = {key: row for key, row in zip(keys, keep) if key not in self.cache}
        if new:
            pieces = self.src_ids[:-1]
            sources = [[token for token, kept in zip(pieces, row) if kept] + [EOS_ID] for row in new.values()]
            log_probs, _ = teacher_force(self.model, sources, [self.tgt_ids] * len(sources))
            if self.contrast_ids is not None:
                versus, _ = teacher_force(self.model, sources, [self.contrast_ids] * len(sources))
                log_probs = [subtract_contrast(lp, c) for lp, c in zip(log_probs, versus)]
            self.cache.update((key, torch.from_numpy(lp.astype(np.float64))) for key, lp in zip(new, log_probs))
        return torch.stack([self.cache[key] for key in keys])  # (k, T+1)


class _WeightedLeastSquares:
    """Captum surrogate model (``fit`` / ``representation``): the w of
    min_{w, b} sum_k pi_k (y_k - b - w . z_k)^2 + alpha |w|^2, in float64, as ordinary least squares
    on rows scaled by sqrt(pi_k), the ridge as M extra rows sqrt(alpha) e_i (b unpenalized)."""

    def __init__(self, ridge: float) -> None:
        self.ridge = ridge
        self.coef: torch.Tensor | None = None

    def fit(self, train_data, **kwargs) -> None:
        z, y, pi = (t.double() for t in next(iter(train_data)))  # Captum passes all samples as one batch
        root = pi.flatten().sqrt()
        x = torch.cat([torch.ones(len(z), 1, dtype=z.dtype), z], 1) * root[:, None]  # (n, M+1)
        target = y.flatten() * root
        if self.ridge:
            features = z.size(1)
            x = torch.cat([x, self.ridge ** 0.5 * torch.eye(features + 1, dtype=z.dtype)[1:]])
            target = torch.cat([target, target.new_zeros(features)])
        self.coef = torch.linalg.lstsq(x, target[:, None], driver="gelsd").solution[1:, 0]  # (M,)

    def representation(self) -> torch.Tensor:
        return self.coef


# ----------------------------------------------------------------------------- occlusion


def occlusion(model: EncoderDecoder, src_ids: Sequence[int], tgt_ids: Sequence[int],
              batch_size: int = 64, contrast_ids: Sequence[int] | None = None) -> Attribution:
    """Leave-one-out: raw[t, s] = f_t(x) - f_t(x without x_s); the EOS column is 0 (f_t contrastive
    with ``contrast_ids``: ``base.subtract_contrast``)."""
    src_ids = list(src_ids)
    variants = [src_ids[:s] + src_ids[s + 1:] for s in range(len(src_ids) - 1)]  # never drop EOS
    log_probs, _ = teacher_force(model, [src_ids, *variants], [list(tgt_ids)] * (1 + len(variants)),
                                 batch_size=batch_size)
    if contrast_ids is not None:
        versus, _ = teacher_force(model, [src_ids, *variants], [list(contrast_ids)] * (1 + len(variants)),
                                  batch_size=batch_size)
        log_probs = [subtract_contrast(lp, c) for lp, c in zip(log_probs, versus)]
    raw = np.zeros((len(tgt_ids) + 1, len(src_ids)), dtype=np.float64)  # (T+1, S+1)
    for s, lp in enumerate(log_probs[1:]):
        raw[:, s] = log_probs[0].astype(np.float64) - lp
    return Attribution("occlusion", raw, np.maximum(raw, 0.0))
