"""Label-smoothed cross-entropy, fused: the training loss over the whole vocabulary.

For logits z (N, V), targets y and smoothing eps, each non-pad row costs

    l = logsumexp(z) - (1 - eps) z_y - (eps / V) sum_v z_v

(the cross-entropy against the target distribution (1 - eps) onehot(y) + eps / V, as
``F.cross_entropy(..., label_smoothing=eps)`` defines it), and the gradient is

    dl/dz = softmax(z) - (1 - eps) onehot(y) - eps / V.

``F.cross_entropy`` on bf16 logits materialises an fp32 copy, the log-softmax, a zero-filled
gradient and its bf16 cast: five passes over an (N, V) tensor that is the largest activation of
the step (4,000 x 8,000 for a Transformer batch). Here the forward keeps only the (N,) logsumexp
and the backward rebuilds softmax(z) from it in one pass, in row chunks that stay in cache;
the arithmetic is fp32 whatever the logits' dtype. With ``reuse_logits`` (training: nothing reads
the logits after the loss) the gradient is written over the logits instead of a new (N, V) tensor,
which saves that tensor's memory and the page faults of first writing it. Both are faster than
``F.cross_entropy`` in fp32 and bf16 (measurements: docs/performance.md).

Inside ``torch.compile`` (the compiled training step) the same formula runs as plain tensor
operations, which the compiler fuses and differentiates itself: the chunk loop would tie the graph
to the number of rows, and every batch shape would compile again.
"""
from __future__ import annotations

import torch

CHUNK_ROWS = 256  # rows per chunk on CPU: 256 x V fp32 values stay in cache


def chunk_rows(logits: torch.Tensor) -> int:
    """Rows per pass: cache-sized chunks on CPU; one pass on a GPU, where each chunk would cost a
    handful of kernel launches and there is no cache to fit."""
    return CHUNK_ROWS if logits.device.type == "cpu" else max(logits.size(0), 1)


class _LabelSmoothedCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: torch.Tensor, target: torch.Tensor, weight: torch.Tensor, eps: float,
                reuse_logits: bool):
        vocab = logits.size(-1)
        lse = torch.empty(logits.size(0), dtype=torch.float32, device=logits.device)
        total_logit = torch.empty_like(lse)
        chunk = chunk_rows(logits)
        for start in range(0, logits.size(0), chunk):
            rows = logits[start:start + chunk].float()
            lse[start:start + chunk] = rows.logsumexp(-1)
            total_logit[start:start + chunk] = rows.sum(-1)
        target_logit = logits.gather(1, target[:, None])[:, 0].float()
        loss = (lse - (1 - eps) * target_logit - (eps / vocab) * total_logit) * weight
        ctx.save_for_backward(logits, target, weight, lse)
        ctx.eps, ctx.reuse_logits = eps, reuse_logits
        return loss.sum()

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):
        logits, target, weight, lse = ctx.saved_tensors
        eps, vocab = ctx.eps, logits.size(-1)
        grad = logits if ctx.reuse_logits else torch.empty_like(logits)
        scale = weight * grad_output  # (N,)
        in_place = ctx.reuse_logits and logits.dtype == torch.float32  # computed right in the logits
        chunk = chunk_rows(logits)
        for start in range(0, logits.size(0), chunk):
            end = start + chunk
            g = logits[start:end] if in_place else logits[start:end].to(torch.float32, copy=True)
            g.sub_(lse[start:end, None]).exp_()  # softmax(z)
            g.scatter_add_(1, target[start:end, None], g.new_full((g.size(0), 1), -(1 - eps)))
            g.sub_(eps / vocab).mul_(scale[start:end, None])
            if not in_place:
                grad[start:end] = g
        return grad, None, None, None, None


def label_smoothed_cross_entropy(
    logits: torch.Tensor, target: torch.Tensor, label_smoothing: float = 0.0, ignore_index: int | None = None,
    reuse_logits: bool = False,
) -> torch.Tensor:
    """Summed loss of logits (..., V) against target (...); rows whose target is ``ignore_index``
    count zero. Equals ``F.cross_entropy(..., label_smoothing=eps, ignore_index=..., reduction="sum")``.
    ``reuse_logits``: the backward overwrites the logits with their gradient (for callers that do
    not read the logits after it)."""
    logits = logits.reshape(-1, logits.size(-1))
    target = target.reshape(-1)
    weight = (torch.ones_like(target, dtype=torch.float32) if ignore_index is None
              else (target != ignore_index).float())
    safe_target = target if ignore_index is None else target.masked_fill(target == ignore_index, 0)
    if torch.compiler.is_compiling():
        return _traced_loss(logits, safe_target, weight, float(label_smoothing))
    return _LabelSmoothedCrossEntropy.apply(logits, safe_target, weight, float(label_smoothing), reuse_logits)


def _traced_loss(logits: torch.Tensor, target: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The loss as plain differentiable operations, for a compiler to fuse (see the module docstring)."""
    z = logits.float()
    target_logit = z.gather(1, target[:, None])[:, 0]
    loss = z.logsumexp(-1) - (1 - eps) * target_logit - (eps / z.size(-1)) * z.sum(-1)
    return (loss * weight).sum()
