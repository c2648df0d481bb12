"""Attribution beyond attention: which source tokens does a translation actually depend on?

For a source x = (x_1 .. x_S, EOS) and a chosen output y = (y_1 .. y_T, EOS), every method gives a
``(T+1, S+1)`` matrix in the same layout as attention (target rows incl. EOS, source columns incl.
EOS), so it goes through ``AlignmentRecord.build``, the export and the plots unchanged.
With f_t(x) = log p(y_t | y_<t, x) (teacher forcing, model in eval mode, no dropout):

* ``gradient`` (gradient x input, Shrikumar et al. 2016; Ding et al. 2019 for NMT):
  raw[t, s] = sum_d  df_t/de_{s,d} * e_{s,d}, where e_s is the output of the model's source token
  embedding (before any sqrt(d) scaling / positional encoding: the token's identity, not its
  position). It is the first-order change of f_t when e_s is scaled, d f_t(x; e_s -> (1+eps) e_s)
  / d eps at eps = 0.
* ``integrated-gradients`` (Sundararajan et al. 2017), zero-embedding baseline, midpoint rule:
  raw[t, s] = sum_d e_{s,d} * (1/m) sum_{k=1..m} df_t/de_{s,d} evaluated at ((k - 1/2)/m) * e.
  Completeness: sum_s raw[t, s] ~ f_t(x) - f_t(0 embeddings), exact as m -> inf; the error
  falls as 1/m^2 for smooth models (GRU/LSTM), more slowly with ReLUs (Transformer FFN).
* ``occlusion`` (Zeiler & Fergus 2014; leave-one-out, Li et al. 2016): delete x_s from the
  sequence (source EOS kept, positions after it move up), re-score the same y:
  raw[t, s] = f_t(x) - f_t(x without x_s). The source EOS column is 0: EOS is never removed.
* ``grad-attention`` (gradient-weighted attention, Chefer et al. 2021 "Generic Attention-model
  Explainability", the Transformer analogue of Grad-CAM): for the attention A^{l,h} of decoder
  layer l, head h (an RNN: one layer, one head),
  R^{l,h}[t, s] = max(0, A^{l,h}[t, s] * df_t/dA^{l,h}[t, s]),
  the attention row of step t weighted by how f_t responds to it, positive part. The (T+1, S+1)
  matrix is R averaged over the heads of one layer like attention (``layer`` / ``heads``, i.e.
  ``--align-layer`` / ``--align-heads``: default the penultimate layer, "all" = mean of all
  layers; ``seq2seq.alignment.matrices.aggregate``). Non-negative; 0 wherever A is 0 (masked).
* ``lime`` and ``kernel-shap`` over source words (Ribeiro et al. 2016; Lundberg & Lee 2017),
  through Captum, with deletion as the baseline: ``seq2seq.attribution.perturbation``.

Signs and display. ``raw`` keeps the signed values. ``scores`` are the non-negative importances
used for display, alignment links and ranking: |raw| for the two gradient methods (the sign of
g.e says little about relevance), max(raw, 0) for occlusion, LIME and KernelSHAP (a token whose
removal makes y_t *more* likely does not support it), raw itself for grad-attention (already
non-negative). ``matrix`` = ``scores`` with each row normalized to sum to 1 over all S+1 columns
(like attention; all-zero rows stay 0).

Gradients: the source embedding is found without knowing the architecture: forward hooks on every
``nn.Embedding`` catch the call whose input is the very source tensor passed to the model (a model
may instead expose the module as ``source_embedding``). The T+1 target positions are batched: the
sentence is repeated T+1 times and copy t back-propagates only f_t, so one backward pass gives all
rows (grad-attention batches the same way). Everything runs under ``torch.enable_grad()`` (and
outside inference mode), so it works from inference code; cuDNN is off for the backward pass (cuDNN
RNNs only back-propagate in training mode). The hand-written gradient x input and integrated
gradients equal Captum's ``InputXGradient`` / ``LayerIntegratedGradients`` (tests/test_attribution.py)
and are kept: they find the source embedding by its input, so they also work when source and
target share one embedding table (the default), where a Captum layer hook would catch both.
"""
from __future__ import annotations

from typing import Sequence

from ..config import AlignConfig, AttributionConfig
from ..errors import UserError
from ..models.base import EncoderDecoder
from ..nn.quantize import is_quantized
from ..tokenizer import EOS_ID
from .base import CONTRAST_METHODS, GRADIENT_METHODS, METHODS, Attribution
from .gradients import grad_weighted_attention, gradient_x_input, integrated_gradients
from .perturbation import occlusion

# ----------------------------------------------------------------------------- dispatch


def attribute(model: EncoderDecoder, src_ids: Sequence[int], tgt_ids: Sequence[int], method: str,
              attribution: AttributionConfig | None = None, align: AlignConfig | None = None, *,
              src_pieces: Sequence[str] | None = None, contrast_ids: Sequence[int] | None = None) -> Attribution:
    """Dispatch on ``method`` (one of ``METHODS``). ``src_ids`` end with EOS; ``tgt_ids`` exclude
    BOS/EOS (e.g. ``Translation.src_tokens`` and ``Translation.tokens``).

    Options: ``attribution`` (``AttributionConfig``, default ``AttributionConfig()``; its ``methods`` are not
    read): ``ig_steps`` (integrated gradients), ``samples`` and ``seed`` (LIME, KernelSHAP); ``align``
    (``AlignConfig``, default ``AlignConfig()``): its ``layer`` and ``heads`` (grad-attention, as for
    attention); ``src_pieces`` (LIME, KernelSHAP: the source pieces incl. EOS, grouped into words;
    None = every piece is a word), ``contrast_ids`` (a contrastive target, ids without BOS/EOS: every
    method but grad-attention then explains log p(y_t) - log p(y'_t), ``base.subtract_contrast``)."""
    attribution, align = attribution or AttributionConfig(), align or AlignConfig()
    if not src_ids or src_ids[-1] != EOS_ID:
        raise ValueError("attribute: src_ids must end with EOS (id 3), as the model was trained")
    if method not in METHODS:
        raise UserError(f"unknown attribution method {method!r}; choose from {', '.join(METHODS)}")
    if method in GRADIENT_METHODS and is_quantized(model):
        raise UserError(f"attribution method {method!r} differentiates the model, and int8 layers "
                        "(--precision int8) have no gradients; use occlusion, lime or kernel-shap, "
                        "or --precision fp32")
    if contrast_ids is not None and method not in CONTRAST_METHODS:
        raise UserError(f"attribution method {method!r} has no contrastive form (it weights attention by the "
                        f"gradient of one output); with --contrast use {', '.join(CONTRAST_METHODS)}")
    if method == "gradient":
        return gradient_x_input(model, src_ids, tgt_ids, contrast_ids)
    if method == "integrated-gradients":
        return integrated_gradients(model, src_ids, tgt_ids, attribution.ig_steps, contrast_ids)
    if method == "occlusion":
        return occlusion(model, src_ids, tgt_ids, contrast_ids=contrast_ids)
    if method == "grad-attention":
        return grad_weighted_attention(model, src_ids, tgt_ids, align.layer, align.heads)
    from .perturbation import explain_words

    return explain_words(model, src_ids, tgt_ids, method, attribution.samples, attribution.seed, src_pieces,
                         contrast_ids)


def attribute_translation(translator, translation, method: str, attribution: AttributionConfig | None = None,
                          align: AlignConfig | None = None, *, contrast: str | None = None) -> Attribution:
    """Attribution of a ``Translation`` returned by ``translator.translate`` (``attribution`` and ``align`` as
    ``attribute`` reads them, except that a model trained with guided alignment reads its supervised heads unless
    others were chosen: ``AlignConfig.for_model``; the source pieces come from the translation). ``contrast``: an
    alternative translation (text) to explain the output against, "why this rather than that" (the export records
    it as ``contrast``)."""
    if not translation.src_tokens:
        raise ValueError("attribute_translation: the translation has no source tokens (empty input)")
    contrast_ids = None if contrast is None else translator.tokenizer.encode(contrast.strip())
    align = (align or AlignConfig()).for_model(translator.supervised_attention)  # a guided model: its heads
    result = attribute(translator.model, translation.src_tokens, translation.tokens, method, attribution, align,
                       src_pieces=translation.src_pieces, contrast_ids=contrast_ids)
    if contrast is not None:
        result.settings["contrast"] = contrast.strip()
    return result
