"""Compiled decoding: the Transformer's static-shape decoding step and its encoder, and the RNN's decoding
step, for one sentence at a time, through ``torch.compile``.

Why: one decoding step of a sentence is some 20 matrix-vector products and 150 small operations.
Eager PyTorch spends most of the step dispatching them one by one, and its fp32 matrix product
(MKL) is several times slower than the memory it reads allows at a few rows (docs/performance.md).
Inductor turns the whole step into one C++ function: with ``freezing`` the weights are constants
it may lay out as it likes, and with ``max_autotune`` every linear layer is benchmarked between its
own C++ GEMM template (specialised to the shape) and MKL, the faster kept.

Shapes: ``static_step`` has the same shapes at every step of a sentence (the key/value cache is
preallocated, ``TransformerEncoderDecoder.init_state`` with ``max_steps``, for one sentence at a
time: the interactive case; wide batches decode eagerly, as fast there). The source length, the
cache length and a shortlist's size are dynamic dimensions of one graph; the number of decoder
rows is a constant (the GEMM template is specialised to it): one graph for greedy search (1 row)
and one per beam size (k rows); the encoder has one graph for every source length. Each graph
compiles once per process, on first use (15-40 s, most of it autotuning; docs/performance.md);
Inductor keeps its autotuning on disk (``TORCHINDUCTOR_CACHE_DIR``), which halves that in a later
process. Calls with a known graph skip most of Dynamo's guard checks (``CompiledStep``). The RNN's
step (``RNNEncoderDecoder.step_eager``) has fixed shapes already (its state does not grow): the same
keys, one graph per row count, the source length dynamic; its encoder stays eager
(``benchmarks/bench_rnn_step.py`` measures what compiling it gains).

The eager ``static_step`` is the reference: compiled outputs equal it to rounding (a different
order of additions in the matrix products). Should compiling fail (no C++ compiler, say), a
warning names it and decoding goes on uncompiled, on the growing cache (the faster eager path).
"""
from __future__ import annotations

import copy
import threading
import time
import warnings
from typing import Any, Callable

import torch

from ..runtime import log
from .packaged import PackagedEncoder, PackagedStep, compile_failed

#: Inductor options: weights frozen into the graph, linear layers autotuned (C++ template vs MKL).
#: Set while a graph is traced and compiled (Dynamo reads ``freezing`` as it traces, so
#: ``torch.compile(options=...)`` would not do), not for the whole process.
INDUCTOR_OPTIONS = {"freezing": True, "max_autotune": True, "max_autotune_gemm_backends": "CPP,ATEN",
                    "cpp_wrapper": True,  # the graph's calling code in C++ too
                    "autotune_num_choices_displayed": 0, "max_autotune_report_choices_stats": False}  # quiet

#: The ``torch.compile`` backend (tests use "eager": Dynamo's tracing and guards, no code generation).
BACKEND = "inductor"


def compile_pays(device: torch.device, precision: str) -> bool:
    """Whether ``compile_decoding`` is on by default: fp32 on CPU, where it was measured
    (docs/benchmarks.md). Not int8 (the quantized linear layers are opaque to Inductor), not half
    precision (no fast CPU kernels to gain from), not on CUDA (not measured on a GPU yet; CUDA graphs,
    ``mode="reduce-overhead"``, would be the way there)."""
    return device.type == "cpu" and precision == "fp32"


def _members(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The models that decode: an ensemble's members, else the model itself."""
    return list(getattr(model, "members", [model]))


def _attach(member: torch.nn.Module, step: Compiled | None, encode: Compiled | None) -> None:
    """``member`` decodes lone sentences through ``step`` and ``encode`` (a Transformer on preallocated
    caches; an RNN has no compiled encoder) or, with None, None, eagerly (a Transformer on the growing
    cache). The compiled parts first: a sentence that starts in between decodes eagerly on the static
    cache, never half-compiled."""
    member.compiled_step, member.compiled_encode = step, encode
    if hasattr(member, "static_step"):  # a Transformer; an RNN's state has one shape already
        member.static_cache = step is not None  # the eager static step is slower than the growing cache's


def _compiled_parts(member: torch.nn.Module, packages: str | None = None,
                    isolated: bool = False) -> tuple[Any, Compiled | None] | None:
    """A model's compiled step and encoder for one sentence: a Transformer's static step and encoder (with
    ``packages``, a directory: both as AOTInductor packages kept there, ``models.packaged``; ``isolated``: built in
    a child process), an RNN's step (its encoder stays eager), or None."""
    if hasattr(member, "static_step") and packages is not None:
        step = PackagedStep(member, packages, INDUCTOR_OPTIONS, lambda: _attach(member, None, None), None, isolated)
        encoder_failed = lambda: setattr(member, "compiled_encode", None)  # noqa: E731 (the step stays packaged)
        return step, PackagedEncoder(member, packages, INDUCTOR_OPTIONS, encoder_failed, step.identity, isolated)
    if hasattr(member, "static_step"):
        return CompiledStep(member), CompiledEncoder(member)
    if hasattr(member, "step_eager"):
        return CompiledRNNStep(member), None
    return None


def compile_decoding(model: torch.nn.Module, packages: str | None = None) -> bool:
    """Give ``model`` (an ensemble: each member) its compiled parts for one sentence (``_compiled_parts``;
    ``packages``: a directory that keeps a Transformer's compiled step for later processes), so that the search
    decodes a lone sentence through them (a Transformer on preallocated caches). Each graph compiles (or loads)
    at its first call (``BackgroundCompile``: in a thread of its own, while the model decodes eagerly). True if
    any model got them."""
    compiled = False
    for member in _members(model):
        parts = _compiled_parts(member, packages)
        if parts is not None:
            _attach(member, *parts)
            compiled = True
    return compiled


class BackgroundCompile:
    """``compile_decoding`` without the wait: the graphs are compiled in a thread of its own, by
    ``warm_up(view)`` decoding through them on ``view``, a shallow copy of the model that shares its
    parameters and submodules (an ensemble: a copy of each member); meanwhile the model itself goes
    on decoding eagerly (a server answers at once). Once every graph the warm-up asked for compiled,
    they are attached to the model (``status`` "ready"): the next lone sentence uses them. A failure
    leaves the model eager (``status`` "failed", ``error`` says why); a model with nothing to compile
    is "off". ``threads``: the torch threads of the warm-up thread, as the sentences it
    prepares for will run (Dynamo compiles per thread count; the setting is per thread); ``packages`` as
    ``compile_decoding`` takes it, each package built in a child process (``models.packaged``: an export traces
    every module call of its process, the model's own decoding meanwhile too)."""

    def __init__(self, model: torch.nn.Module, warm_up: Callable[[torch.nn.Module], Any],
                 threads: int | None = None, on_ready: Callable[[], None] = lambda: None,
                 packages: str | None = None) -> None:
        self.model, self.warm_up, self.threads, self.on_ready = model, warm_up, threads, on_ready
        self.packages = packages  # ``compile_decoding``'s
        self.status = "compiling"
        self.seconds: float | None = None  # how long it took, once done
        self.error: str | None = None
        self.thread = threading.Thread(target=self._run, name="seq2seq-compile", daemon=True)

    def start(self) -> "BackgroundCompile":
        self.thread.start()
        return self

    def wait(self, timeout: float | None = None) -> str:
        """The status once done (or ``timeout`` seconds have passed)."""
        self.thread.join(timeout)
        return self.status

    def _run(self) -> None:
        start = time.perf_counter()
        try:
            self.status = self._compile()
        except Exception as exc:  # the warm-up's own errors (the compiler's are Compiled's)
            self.status, self.error = "failed", f"{type(exc).__name__}: {exc}"
        self.seconds = time.perf_counter() - start
        log("compiled_decoding", status=self.status, seconds=round(self.seconds, 1),
            **({"error": repr(self.error)} if self.error else {}))
        if self.status == "ready":
            self.on_ready()

    def _compile(self) -> str:
        if self.threads:
            torch.set_num_threads(self.threads)
        view = copy.copy(self.model)
        view_members = _members(view)
        if hasattr(view, "members"):  # an ensemble: a table of submodules of its own
            object.__setattr__(view, "_modules", dict(view._modules))
            view.members = view_members = torch.nn.ModuleList(copy.copy(m) for m in view_members)
        parts = [(member, twin, *compiled) for member, twin in zip(_members(self.model), view_members)
                 if (compiled := _compiled_parts(member, self.packages, isolated=True)) is not None]
        if not parts:
            return "off"
        for _, twin, step, encode in parts:
            _attach(twin, step, encode)
        self.warm_up(view)  # a compiler failure also warns (``Compiled.call``)
        failures = [c.failure for _, _, step, encode in parts for c in (step, encode) if c is not None and c.failure]
        if failures:
            self.error = failures[0]
            return "failed"
        for member, _, step, encode in parts:
            _attach(member, step, encode)
        return "ready"


def _dynamic(tensor: torch.Tensor, dim: int) -> None:
    """Mark a dimension dynamic (one graph for all its sizes); sizes 0 and 1 stay constants, as
    Dynamo specialises them."""
    if tensor.size(dim) > 1 and dim not in getattr(tensor, "_dynamo_dynamic_indices", ()):  # once per tensor
        torch._dynamo.mark_dynamic(tensor, dim)


def _dense(tensor: torch.Tensor) -> torch.Tensor:
    """A small input in one layout whatever view it comes as (else one graph per kind of view: beam
    search's first step passes every k-th token, a mask may be a slice of a batch's)."""
    return tensor.clone(memory_format=torch.contiguous_format)


def _step_key(tokens: torch.Tensor, need_attention: bool, output_weight: torch.Tensor | None,
              src_mask: torch.Tensor) -> tuple:
    """What tells a decoding step's graphs apart (``CompiledStep``): the rows, attention or not, a shortlist
    or not (its size a dynamic dimension, marked here) and a one-position source (Dynamo specialises it)."""
    if output_weight is not None:
        _dynamic(output_weight, 0)
    return tokens.size(0), need_attention, output_weight is None, src_mask.size(1) > 1


class Compiled:
    """``function`` compiled (module docstring), called through ``call``; should compiling fail,
    a warning, ``on_failure()`` (the model drops its compiled parts) and ``function`` itself."""

    def __init__(self, function: Callable[..., Any], on_failure: Callable[[], None]) -> None:
        self.eager, self.on_failure = function, on_failure
        self.function: Callable[..., Any] = torch.compile(function, dynamic=False, backend=BACKEND)
        self.graphs: set[tuple] = set()  # the shapes compiled so far
        self.failure: str | None = None  # why compiling failed, if it did

    def call(self, key: tuple, *args: Any) -> Any:
        key = (*key, torch.get_num_threads())  # Dynamo guards on the thread count too
        try:
            if key in self.graphs:  # only the guards that tell the compiled graphs apart (see CompiledStep)
                try:
                    with torch.compiler.set_stance(skip_guard_eval_unsafe=True):
                        return self.function(*args)
                except RuntimeError as exc:  # a global state the key does not hold changed:
                    if "skip_guard_eval_unsafe" not in str(exc):  # compile for it below
                        raise
            # read while tracing: the first call of a shape. Without duck sizing, equal sizes of
            # different dimensions (a source as long as the cache) are not assumed equal ever after.
            with torch._inductor.config.patch(INDUCTOR_OPTIONS), \
                    torch.fx.experimental._config.patch(use_duck_shape=False), warnings.catch_warnings():
                warnings.simplefilter("ignore")  # Inductor's own deprecation warnings while it compiles
                result = self.function(*args)
            self.graphs.add(key)
            return result
        except Exception as exc:  # the compiler's errors are of many types; the eager path is always there
            self.failure = compile_failed(exc, self.on_failure)
            return self.eager(*args)


class CompiledStep(Compiled):
    """``model.static_step`` compiled: one graph per row count, attention or not, shortlist or not.

    Dynamo checks every input of a call against the guards of its graphs before running one (~90 us
    here, most of a step's overhead: the model's parameters are inputs too). Once a graph exists for
    a call's key, the call skips the guards that all graphs share (``skip_guard_eval_unsafe``): the key
    holds everything that may change between calls (row count, attention, shortlist, a source of one
    position, which Dynamo specialises, and torch's thread count, part of Dynamo's global state) and
    the rest cannot (the model, its dtype and device, the structure of memory and state: fixed for a
    model); should some other global state change, the call compiles a graph for it."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__(model.static_step, lambda: _attach(model, None, None))
        self.mask: tuple[torch.Tensor, torch.Tensor] | None = None  # the last memory's mask, made dense

    def __call__(self, memory: dict, caches: list, position: torch.Tensor, tokens: torch.Tensor,
                 need_attention: bool, output_weight: torch.Tensor | None):
        if self.mask is None or self.mask[0] is not memory["src_mask"]:  # once per sentence, not per step
            self.mask = (memory["src_mask"], _dense(memory["src_mask"]))
            _dynamic(self.mask[1], 1)
        memory = {**memory, "src_mask": self.mask[1]}
        for key, value in memory["cross_kv"] + caches:
            _dynamic(key, 2), _dynamic(value, 2)
        tokens = _dense(tokens)
        return self.call(_step_key(tokens, need_attention, output_weight, memory["src_mask"]), memory, caches,
                         position, tokens, need_attention, output_weight)


class CompiledRNNStep(Compiled):
    """An RNN's ``step_eager`` compiled: one graph per row count (greedy 1, a beam k), attention or not,
    shortlist or not; the source length and a shortlist's size are dynamic dimensions. Its state (hidden
    states, input feeding) has the same shape at every step, so no cache is preallocated; a call with a
    known graph skips the guards all graphs share, as ``CompiledStep`` does (the same key)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__(model.step_eager, lambda: _attach(model, None, None))
        self.memory: tuple[dict, dict] | None = None  # the last sentence's memory, made dense

    def __call__(self, memory: dict, state: dict, tokens: torch.Tensor, need_attention: bool,
                 output_weight: torch.Tensor | None):
        if self.memory is None or self.memory[0] is not memory:  # once per sentence, not per step
            dense = {key: _dense(value) if isinstance(value, torch.Tensor) else value for key, value in memory.items()}
            for key in ("enc", "src_mask", "keys"):
                if key in dense:
                    _dynamic(dense[key], 1)
            self.memory = (memory, dense)
        memory, tokens = self.memory[1], _dense(tokens)
        return self.call(_step_key(tokens, need_attention, output_weight, memory["src_mask"]), memory, state, tokens,
                         need_attention, output_weight)


class CompiledEncoder(Compiled):
    """``model.encode_eager`` compiled for one sentence of any length (one graph)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__(model.encode_eager, lambda: _attach(model, None, None))

    def __call__(self, src: torch.Tensor, src_mask: torch.Tensor) -> dict:
        src, src_mask = _dense(src), _dense(src_mask)
        _dynamic(src, 1), _dynamic(src_mask, 1)
        return self.call((src.size(0), src.size(1) > 1), src, src_mask)
