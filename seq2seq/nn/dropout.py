"""Inverted dropout with a cheaper random draw on CPU.

``F.dropout`` on CPU spends most of its time drawing one random number per element, a large
share of a Transformer training step. Here each 64-bit random draw yields eight 8-bit uniforms,
so the draw is several times cheaper (docs/performance.md).
The price is that the drop probability is quantized to multiples of 1/256: p = 0.1 becomes
26/256 = 0.1016, p = 0.3 becomes 77/256 = 0.3008. Kept elements are scaled by 1 / (1 - p_q), so
the expectation is unchanged. On other devices (CUDA) this is exactly ``F.dropout``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def quantized_probability(p: float) -> int:
    """The drop threshold t in [0, 256]: an element is dropped when its 8-bit uniform is < t."""
    return min(256, max(0, round(p * 256)))


def dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    if not training or p <= 0.0:
        return x
    if x.device.type != "cpu" or p >= 1.0:
        return F.dropout(x, p, training)
    threshold = quantized_probability(p)
    n = x.numel()
    words = torch.randint(-(2**63), 2**63 - 1, ((n + 7) // 8,), dtype=torch.int64, device=x.device)
    uniform8 = words.view(torch.uint8)[:n].view(x.shape)  # eight 8-bit uniforms per 64-bit draw
    keep = (uniform8 >= threshold).to(x.dtype)
    return x * keep.mul_(256.0 / (256 - threshold))


class Dropout(nn.Module):
    """Drop-in for ``nn.Dropout`` using :func:`dropout`."""

    def __init__(self, p: float = 0.1) -> None:
        super().__init__()
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"
