"""Compiled decoding: the Transformer's static-shape decoding step through ``torch.compile``.

Why: one decoding step of a sentence is some 20 matrix-vector products and 150 small operations.
Eager PyTorch spends most of the step dispatching them one by one, and its fp32 matrix product
(MKL) is several times slower than the memory it reads allows at a few rows (docs/performance.md).
Inductor turns the whole step into one C++ function: with ``freezing`` the weights are constants
it may lay out as it likes, and with ``max_autotune`` every linear layer is benchmarked between its
own C++ GEMM template (specialised to the shape) and MKL, the faster kept.

Shapes: ``static_step`` has the same shapes at every step of a batch (the key/value cache is
preallocated, ``TransformerEncoderDecoder.init_state`` with ``max_steps``). The source length,
the cache length and a shortlist's size are dynamic dimensions of one graph; the number of decoder
rows is compiled as a constant (the GEMM template is specialised to it) up to ``STATIC_ROWS``
rows, one graph per row count (1 and 5 for batch-1 greedy and beam-5 search), and as one more
dynamic dimension above it. Each graph compiles once per process, on first use (seconds: measured
in docs/benchmarks.md); Inductor keeps what it compiled on disk (``TORCHINDUCTOR_CACHE_DIR``), so
a second process loads it in a fraction of that.

The eager ``static_step`` is the reference: compiled outputs equal it to rounding (a different
order of additions in the matrix products). Should compiling fail (no C++ compiler, say), a
warning names it and decoding goes on uncompiled, on the growing cache (the faster eager path).
"""
from __future__ import annotations

import warnings
from typing import Any, Callable

import torch

from ..runtime import LOGGER

#: row counts compiled as constants (one graph each); wider batches share one dynamic-row graph
STATIC_ROWS = 8

#: Inductor options: weights frozen into the graph, linear layers autotuned (C++ template vs MKL).
#: Set while a graph is traced and compiled (Dynamo reads ``freezing`` as it traces, so
#: ``torch.compile(options=...)`` would not do), not for the whole process.
INDUCTOR_OPTIONS = {"freezing": True, "max_autotune": True, "max_autotune_gemm_backends": "CPP,ATEN"}


def compile_pays(device: torch.device, dtype: torch.dtype, quantized: bool) -> bool:
    """Whether ``compile_decoding`` is on by default: fp32 on CPU, where it was measured
    (docs/benchmarks.md). Not int8 (Inductor does not compile the quantized linear layers' dynamic
    quantization), not half precision (no fast CPU kernels to gain from), not on CUDA (CUDA graphs
    through ``mode="reduce-overhead"`` need the cache writes outside the graph; not measured yet)."""
    return device.type == "cpu" and dtype == torch.float32 and not quantized


def compile_decoding(model: torch.nn.Module) -> bool:
    """Give ``model`` (a Transformer; an ensemble: each Transformer member) a compiled static step,
    so that the search decodes on preallocated caches through it. True if any model got one."""
    members = getattr(model, "members", [model])
    compiled = False
    for member in members:
        if hasattr(member, "static_step"):
            member.compiled_step = CompiledStep(member)
            member.static_cache = compiled = True
    return compiled


def _dynamic(tensor: torch.Tensor, dim: int) -> None:
    """Mark a dimension dynamic (one graph for all its sizes); sizes 0 and 1 stay constants, as
    Dynamo specialises them."""
    if tensor.size(dim) > 1:
        torch._dynamo.mark_dynamic(tensor, dim)


class CompiledStep:
    """``model.static_step`` compiled (module docstring), called as it is."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.function: Callable[..., Any] = torch.compile(model.static_step, dynamic=False)
        self.graphs: set[tuple] = set()  # shapes compiled so far (rows, attention, shortlist)

    def __call__(self, memory: dict, caches: list, position: torch.Tensor, tokens: torch.Tensor,
                 need_attention: bool, output_weight: torch.Tensor | None):
        wide = tokens.size(0) > STATIC_ROWS
        for key, value in memory["cross_kv"]:
            _dynamic(key, 2), _dynamic(value, 2)
            if wide:
                _dynamic(key, 0), _dynamic(value, 0)
        _dynamic(memory["src_mask"], 1)
        for key, value in caches:
            _dynamic(key, 2), _dynamic(value, 2)
            if wide:
                _dynamic(key, 0), _dynamic(value, 0)
        if wide:
            _dynamic(memory["src_mask"], 0), _dynamic(tokens, 0)
        if output_weight is not None:
            _dynamic(output_weight, 0)
        key = ("wide" if wide else tokens.size(0), need_attention, output_weight is None)
        try:
            if key in self.graphs:
                return self.function(memory, caches, position, tokens, need_attention, output_weight)
            with torch._inductor.config.patch(INDUCTOR_OPTIONS):  # read while tracing: the first call of a shape
                result = self.function(memory, caches, position, tokens, need_attention, output_weight)
            self.graphs.add(key)
            return result
        except Exception as exc:  # the compiler's errors are of many types; the eager step is always there
            warnings.warn(f"compiled decoding failed ({type(exc).__name__}: {str(exc).splitlines()[0][:200]}); "
                          "decoding uncompiled (--no-compile skips the attempt)", RuntimeWarning, stacklevel=2)
            LOGGER.debug("compiled decoding failed", exc_info=True)
            self.model.compiled_step = None
            return self.model.static_step(memory, caches, position, tokens, need_attention, output_weight)
