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
  layers; ``seq2seq.analysis.alignment.aggregate``). Non-negative; 0 wherever A is 0 (masked).
* ``lime`` and ``kernel-shap`` over source words (Ribeiro et al. 2016; Lundberg & Lee 2017),
  through Captum, with deletion as the baseline: ``seq2seq.analysis.perturbation``.

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

import contextlib
from dataclasses import dataclass, field
from typing import Iterator, Sequence

import numpy as np
import torch
from torch import nn

from .alignment import AlignmentRecord, Heads, aggregate, normalize_rows, rounded
from ..errors import UserError
from ..models.base import EncoderDecoder
from ..decoding.quantize import is_quantized
from ..decoding.scoring import eval_mode, model_device, pad_ids, target_tensors, teacher_force
from ..nn.attention import MultiHeadAttention, RecurrentAttention
from ..tokenizer import EOS_ID, PAD_ID

METHODS = ("gradient", "integrated-gradients", "occlusion", "grad-attention", "lime", "kernel-shap")
GRADIENT_METHODS = ("gradient", "integrated-gradients", "grad-attention")  # need autograd: no int8, no ensembles
#: how ``scores`` (display, links, ranking) are read from ``raw``, per method
SCORES = {"gradient": "|raw|", "integrated-gradients": "|raw|", "occlusion": "max(raw, 0)",
          "grad-attention": "raw", "lime": "max(raw, 0)", "kernel-shap": "max(raw, 0)"}


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
               tgt_pieces: Sequence[str], include_eos: bool = False, method: str = "argmax",
               threshold: float = 0.3) -> AlignmentRecord:
        """``matrix`` as an AlignmentRecord (word merge, EOS policy, hard links), like attention."""
        return AlignmentRecord.build(index, source, target, src_pieces, tgt_pieces,
                                     self.matrix[None, None], layer=0, heads="mean",
                                     include_eos=include_eos, method=method, threshold=threshold)

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


# ----------------------------------------------------------------------------- gradients


@contextlib.contextmanager
def _replace_source_embedding(model: nn.Module, src: torch.Tensor, replace) -> Iterator[dict]:
    """While active, the embedding call whose input is ``src`` returns ``replace(output)``.
    Yields a dict counting such calls (``calls``), so a model that never embeds ``src`` directly
    is reported instead of silently giving zeros."""
    seen = {"calls": 0}

    def hook(module, args, output):
        if args and args[0] is src:
            seen["calls"] += 1
            return replace(output)
        return None

    explicit = getattr(model, "source_embedding", None)
    modules = [explicit] if isinstance(explicit, nn.Module) else [
        m for m in model.modules() if isinstance(m, nn.Embedding)]
    handles = [m.register_forward_hook(hook) for m in modules]
    try:
        yield seen
    finally:
        for handle in handles:
            handle.remove()


def _grad_times_input(model: EncoderDecoder, src_ids: Sequence[int], tgt_ids: Sequence[int],
                      alphas: Sequence[float]) -> np.ndarray:
    """(T+1, S+1) signed: mean over alpha of sum_d df_t/dx_{s,d}(alpha e) * e_{s,d}."""
    device = model_device(model)
    rows = len(tgt_ids) + 1
    src = pad_ids([src_ids] * rows, device)  # (T+1, S+1): copy t is used for target position t only
    tgt_in, tgt_out = target_tensors([tgt_ids] * rows, device)
    position = torch.arange(rows, device=device)
    total = torch.zeros(rows, len(src_ids), dtype=torch.float64, device=device)
    for alpha in alphas:
        captured = {}

        def scaled(output: torch.Tensor) -> torch.Tensor:
            captured["e"] = output.detach()
            captured["x"] = (alpha * output.detach()).requires_grad_(True)  # (T+1, S+1, D)
            return captured["x"]

        with _replace_source_embedding(model, src, scaled) as seen:
            logits, _ = model(src, src != PAD_ID, tgt_in)  # (T+1, T+1, V)
        if seen["calls"] != 1:
            raise UserError(
                f"attribution: the model embedded the source {seen['calls']} times (expected once); "
                "give the model a 'source_embedding' attribute naming its source embedding module")
        f = logits.float().log_softmax(-1)[position, position, tgt_out[0]]  # (T+1,) f_t on copy t
        (grad,) = torch.autograd.grad(f.sum(), captured["x"])
        total += (grad * captured["e"]).sum(-1).double()
    return (total / len(alphas)).cpu().numpy()


def gradient_x_input(model: EncoderDecoder, src_ids: Sequence[int], tgt_ids: Sequence[int]) -> Attribution:
    """Gradient x input on the source token embeddings (formula in the module docstring)."""
    with eval_mode(model, grad=True):
        raw = _grad_times_input(model, src_ids, tgt_ids, [1.0])
    return Attribution("gradient", raw, np.abs(raw))


def integrated_gradients(model: EncoderDecoder, src_ids: Sequence[int], tgt_ids: Sequence[int],
                         steps: int = 16) -> Attribution:
    """Integrated gradients from the all-zero source embedding, ``steps`` midpoint samples."""
    if steps < 1:
        raise UserError(f"integrated gradients needs steps >= 1 (--ig-steps), got {steps}")
    with eval_mode(model, grad=True):
        raw = _grad_times_input(model, src_ids, tgt_ids, [(k + 0.5) / steps for k in range(steps)])
    return Attribution("integrated-gradients", raw, np.abs(raw), steps=steps)


# ----------------------------------------------------------------------------- occlusion


def occlusion(model: EncoderDecoder, src_ids: Sequence[int], tgt_ids: Sequence[int],
              batch_size: int = 64) -> Attribution:
    """Leave-one-out: raw[t, s] = f_t(x) - f_t(x without x_s); the EOS column is 0."""
    src_ids = list(src_ids)
    variants = [src_ids[:s] + src_ids[s + 1:] for s in range(len(src_ids) - 1)]  # never drop EOS
    log_probs, _ = teacher_force(model, [src_ids, *variants], [list(tgt_ids)] * (1 + len(variants)),
                                 batch_size=batch_size)
    raw = np.zeros((len(tgt_ids) + 1, len(src_ids)), dtype=np.float64)  # (T+1, S+1)
    for s, lp in enumerate(log_probs[1:]):
        raw[:, s] = log_probs[0].astype(np.float64) - lp
    return Attribution("occlusion", raw, np.maximum(raw, 0.0))


# ----------------------------------------------------------------------------- gradient-weighted attention


@contextlib.contextmanager
def _captured_attention(model: nn.Module) -> Iterator[list[torch.Tensor]]:
    """While active, collects (in call order) the weights every ``seq2seq.nn.attention`` module
    returns: the Transformer's cross-attention per layer (self-attention is called without
    weights), the RNN's attention per step or over all steps at once. In eval mode these are
    the very tensors the contexts were computed from, so gradients with respect to them exist."""
    captured: list[torch.Tensor] = []

    def hook(module, args, output):
        if isinstance(output, tuple) and len(output) == 2 and output[1] is not None:
            captured.append(output[1])

    handles = [m.register_forward_hook(hook) for m in model.modules()
               if isinstance(m, (MultiHeadAttention, RecurrentAttention))]
    try:
        yield captured
    finally:
        for handle in handles:
            handle.remove()


def _as_layers(parts: Sequence[torch.Tensor]) -> torch.Tensor:
    """Captured weights -> (B, L, H, T, S): L Transformer layers of (B, H, T, S), an RNN's one call
    over all steps (B, T, S) or its T calls of one step (B, S)."""
    dims = {p.dim() for p in parts}
    if dims == {4}:
        return torch.stack(list(parts), 1)
    if dims == {3}:
        return torch.stack(list(parts), 1).unsqueeze(2)
    if dims == {2}:
        return torch.stack(list(parts), 1)[:, None, None]
    raise ValueError(f"unexpected attention weight shapes {[tuple(p.shape) for p in parts]}")


def grad_weighted_attention(model: EncoderDecoder, src_ids: Sequence[int], tgt_ids: Sequence[int],
                            layer: int | str = -2, heads: Heads = "mean") -> Attribution:
    """Gradient-weighted attention (formula in the module docstring): max(0, A * df_t/dA) on row t,
    aggregated over ``heads`` of ``layer`` like attention."""
    device = model_device(model)
    rows = len(tgt_ids) + 1
    src = pad_ids([src_ids] * rows, device)  # (T+1, S+1): copy t back-propagates f_t only
    tgt_in, tgt_out = target_tensors([tgt_ids] * rows, device)
    position = torch.arange(rows, device=device)
    with eval_mode(model, grad=True):
        with _captured_attention(model) as parts:
            logits, attention = model(src, src != PAD_ID, tgt_in, need_attention=True)  # (T+1, L, H, T+1, S+1)
        if not parts or not torch.equal(_as_layers(parts), attention):
            raise UserError("attribution method 'grad-attention': the attention this model returns is not "
                            "computed by seq2seq.nn.attention modules, so it cannot be differentiated; "
                            "use another --attribution method")
        f = logits.float().log_softmax(-1)[position, position, tgt_out[0]]  # (T+1,) f_t on copy t
        grads = _as_layers(torch.autograd.grad(f.sum(), parts))  # (T+1, L, H, T+1, S+1)
        relevance = (attention.detach() * grads)[position, :, :, position].clamp(min=0)  # (T+1, L, H, S+1)
    per_head = relevance.permute(1, 2, 0, 3).double().cpu().numpy()  # (L, H, T+1, S+1)
    raw = aggregate(per_head, layer, heads)
    return Attribution("grad-attention", raw, raw.copy(), settings={"layer": layer, "heads": heads})


# ----------------------------------------------------------------------------- dispatch


def attribute(model: EncoderDecoder, src_ids: Sequence[int], tgt_ids: Sequence[int], method: str,
              steps: int = 16, *, samples: int | None = None, seed: int = 0, layer: int | str = -2,
              heads: Heads = "mean", src_pieces: Sequence[str] | None = None) -> Attribution:
    """Dispatch on ``method`` (one of ``METHODS``). ``src_ids`` end with EOS; ``tgt_ids`` exclude
    BOS/EOS (e.g. ``Translation.src_tokens`` and ``Translation.tokens``).

    Options: ``steps`` (integrated gradients), ``samples`` and ``seed`` (LIME, KernelSHAP; samples
    None = ``perturbation.DEFAULT_SAMPLES``), ``layer`` and ``heads`` (grad-attention, as for
    attention), ``src_pieces`` (LIME, KernelSHAP: the source pieces incl. EOS, grouped into words;
    None = every piece is a word)."""
    if not src_ids or src_ids[-1] != EOS_ID:
        raise ValueError("attribute: src_ids must end with EOS (id 3), as the model was trained")
    if method not in METHODS:
        raise UserError(f"unknown attribution method {method!r}; choose from {', '.join(METHODS)}")
    if method in GRADIENT_METHODS and is_quantized(model):
        raise UserError(f"attribution method {method!r} differentiates the model, and int8 layers "
                        "(--precision int8) have no gradients; use occlusion, lime or kernel-shap, "
                        "or --precision fp32")
    if method == "gradient":
        return gradient_x_input(model, src_ids, tgt_ids)
    if method == "integrated-gradients":
        return integrated_gradients(model, src_ids, tgt_ids, steps)
    if method == "occlusion":
        return occlusion(model, src_ids, tgt_ids)
    if method == "grad-attention":
        return grad_weighted_attention(model, src_ids, tgt_ids, layer, heads)
    from .perturbation import DEFAULT_SAMPLES, explain_words

    return explain_words(model, src_ids, tgt_ids, method, DEFAULT_SAMPLES if samples is None else samples,
                         seed, src_pieces)


def attribute_translation(translator, translation, method: str, steps: int = 16, **options) -> Attribution:
    """Attribution of a ``Translation`` returned by ``translator.translate`` (``options``: those of
    ``attribute`` but ``src_pieces``, which come from the translation)."""
    if not translation.src_tokens:
        raise ValueError("attribute_translation: the translation has no source tokens (empty input)")
    return attribute(translator.model, translation.src_tokens, translation.tokens, method, steps,
                     src_pieces=translation.src_pieces, **options)
