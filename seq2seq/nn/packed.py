"""fp32 linear layers through oneDNN with prepacked weights, for CPU decoding.

PyTorch computes an fp32 ``nn.Linear`` on CPU with MKL's GEMM, which on the AMD EPYCs of this project
runs at a fraction of the machine's speed for the shapes of decoding: 2-4x slower than oneDNN's
inner product on a weight reordered once into oneDNN's blocked layout, at every row count from 5 to
320 (the output layer 8000x256 at 320 rows: 6.2 ms against 2.6 ms; at one row both take the same;
docs/performance.md). PyTorch exposes that kernel as ``torch.ops.mkldnn._linear_pointwise`` (what
Inductor calls for a frozen linear layer of unknown row count); this module routes a decoding model's
linear layers through it. It is the same product in another order of additions: outputs agree with
``F.linear`` to rounding (~1e-6), not bit for bit.

``pack_for_decoding`` keeps each layer's fp32 ``weight`` (the shortlist's ``output_rows``, a tied
embedding and ``keep_float`` readers still read it) and adds the packed copy beside it, so it is for
models that no longer train (``Translator.from_checkpoints``): with autograd on (attribution) or
inside ``torch.compile`` (which does its own packing) a layer computes ``F.linear`` as before.
"""
from __future__ import annotations

import copy
from typing import Any, Iterable

import torch
import torch.nn.functional as F
from torch import nn


def packing_available() -> bool:
    """Whether this PyTorch has oneDNN and the packed linear operators (x86 builds do)."""
    mkldnn = getattr(torch.ops, "mkldnn", None)
    return (torch.backends.mkldnn.is_available() and hasattr(mkldnn, "_reorder_linear_weight")
            and hasattr(mkldnn, "_linear_pointwise"))


class PackedLinear(nn.Linear):
    """An ``nn.Linear`` whose inference-time product runs on its oneDNN-packed weight."""

    packed_weight: torch.Tensor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() or torch.compiler.is_compiling() or x.dtype != torch.float32:
            return F.linear(x, self.weight, self.bias)
        return torch.ops.mkldnn._linear_pointwise(x, self.packed_weight, self.bias, "none", [], "")


def pack_for_decoding(model: nn.Module) -> int:
    """In place: every fp32 CPU ``nn.Linear`` of ``model`` becomes a ``PackedLinear``; returns how
    many (0 where oneDNN is missing)."""
    if not packing_available():
        return 0
    packed = 0
    for module in model.modules():
        if type(module) is nn.Linear and module.weight.dtype == torch.float32 and module.weight.device.type == "cpu":
            with torch.no_grad():
                module.packed_weight = torch.ops.mkldnn._reorder_linear_weight(module.weight.detach())
            module.__class__ = PackedLinear
            packed += 1
    return packed


def unpacked_copy(model: nn.Module, leave_out: Iterable[object] = ()) -> nn.Module:
    """A deep copy of ``model`` whose ``PackedLinear`` layers are plain ``nn.Linear`` again, to train or to pickle
    (the packed weights, oneDNN's opaque tensors, cannot be copied; ``pack_for_decoding`` packs the copy again);
    where ``model`` refers to one of the objects ``leave_out`` (say, a loaded compiled library), the copy refers to
    None."""
    layers = [m for m in model.modules() if isinstance(m, PackedLinear)]
    memo: dict[int, Any] = {id(m.packed_weight): None for m in layers}
    memo.update((id(thing), None) for thing in leave_out)
    copied = copy.deepcopy(model, memo=memo)
    for module in copied.modules():
        if isinstance(module, PackedLinear):
            del module.packed_weight
            module.__class__ = nn.Linear
    return copied
