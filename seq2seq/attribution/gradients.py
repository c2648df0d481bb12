"""Gradient methods: gradient x input, integrated gradients, gradient-weighted attention."""
from __future__ import annotations

import contextlib
from typing import Iterator, Sequence

import numpy as np
import torch
from torch import nn

from ..alignment.matrices import Heads, aggregate
from ..decoding.scoring import eval_mode, model_device, pad_ids, target_tensors
from ..config import AlignConfig, AttributionConfig
from ..io_utils import counted
from ..errors import UserError
from ..models.base import EncoderDecoder
from ..nn.attention import MultiHeadAttention, RecurrentAttention
from ..tokenizer import PAD_ID
from .base import Attribution

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
                      alphas: Sequence[float], contrast_ids: Sequence[int] | None = None) -> np.ndarray:
    """(T+1, S+1) signed: mean over alpha of sum_d df_t/dx_{s,d}(alpha e) * e_{s,d}; with
    ``contrast_ids`` f_t is contrastive (``base.subtract_contrast``: both outputs are scored on the
    same source embedding, one leaf, so the gradient is that of the difference)."""
    device = model_device(model)
    rows = len(tgt_ids) + 1
    src = pad_ids([src_ids] * rows, device)  # (T+1, S+1): copy t is used for target position t only
    tgt_in, tgt_out = target_tensors([tgt_ids] * rows, device)
    position = torch.arange(rows, device=device)
    if contrast_ids is not None:
        shared = min(rows, len(contrast_ids) + 1)  # positions both outputs have
        contrast_in, contrast_out = target_tensors([contrast_ids] * rows, device)
    total = torch.zeros(rows, len(src_ids), dtype=torch.float64, device=device)
    for alpha in alphas:
        captured = {}

        def scaled(output: torch.Tensor) -> torch.Tensor:
            if "x" not in captured:  # a contrastive pass embeds the same source again: the same leaf
                captured["e"] = output.detach()
                captured["x"] = (alpha * output.detach()).requires_grad_(True)  # (T+1, S+1, D)
            return captured["x"]

        with _replace_source_embedding(model, src, scaled) as seen:
            logits, _ = model(src, src != PAD_ID, tgt_in)  # (T+1, T+1, V)
            if contrast_ids is not None:
                contrast_logits, _ = model(src, src != PAD_ID, contrast_in)  # (T+1, C+1, V)
        expected = 1 if contrast_ids is None else 2
        if seen["calls"] != expected:
            raise UserError(
                f"attribution: the model embedded the source {counted(seen['calls'], 'time')} (expected {expected}); "
                "give the model a 'source_embedding' attribute naming its source embedding module")
        f = logits.float().log_softmax(-1)[position, position, tgt_out[0]]  # (T+1,) f_t on copy t
        if contrast_ids is not None:
            p = position[:shared]
            versus = contrast_logits.float().log_softmax(-1)[p, p, contrast_out[0][:shared]]  # (shared,)
            f = f - torch.cat([versus, versus.new_zeros(rows - shared)])
        (grad,) = torch.autograd.grad(f.sum(), captured["x"])
        total += (grad * captured["e"]).sum(-1).double()
    return (total / len(alphas)).cpu().numpy()


def gradient_x_input(model: EncoderDecoder, src_ids: Sequence[int], tgt_ids: Sequence[int],
                     contrast_ids: Sequence[int] | None = None) -> Attribution:
    """Gradient x input on the source token embeddings (formula in the module docstring)."""
    with eval_mode(model, grad=True):
        raw = _grad_times_input(model, src_ids, tgt_ids, [1.0], contrast_ids)
    return Attribution("gradient", raw, np.abs(raw))


def integrated_gradients(model: EncoderDecoder, src_ids: Sequence[int], tgt_ids: Sequence[int],
                         steps: int = AttributionConfig.ig_steps,
                         contrast_ids: Sequence[int] | None = None) -> Attribution:
    """Integrated gradients from the all-zero source embedding, ``steps`` midpoint samples."""
    if steps < 1:
        raise UserError(f"integrated gradients needs steps >= 1 (--ig-steps), got {steps}")
    with eval_mode(model, grad=True):
        raw = _grad_times_input(model, src_ids, tgt_ids, [(k + 0.5) / steps for k in range(steps)], contrast_ids)
    return Attribution("integrated-gradients", raw, np.abs(raw), steps=steps)


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
                            layer: int | str = AlignConfig.layer, heads: Heads = AlignConfig.heads) -> Attribution:
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
