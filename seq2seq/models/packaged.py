"""The Transformer's one-sentence decoding step compiled ahead of time (AOTInductor) into package files kept in
a directory, so that a later process loads the compiled step in a fraction of a second instead of compiling it.

Why: ``torch.compile``'s graphs live as long as their process, and with frozen weights Inductor's caches do not
serve a second one (docs/performance.md): every start of a server paid 30-40 s per graph again. An AOTInductor
package is the compiled step as a shared library with its weights: exported once (``torch.export``, the source
length, the cache length and a shortlist's size dynamic, the caches written in place), compiled with the same
Inductor options as ``models.compiled`` (frozen weights, autotuned linear layers), loaded by the next process
(AOTInductor's C++ loader, ~0.01 s per package: ``load_package``), and called with no Dynamo in between
(measured 16-24% faster per step than ``CompiledStep``: ``benchmarks/bench_aoti_step.py``).

Greedy and beam search of one sentence go further (``PackagedStep.choose``): their package holds the step and the
search's choice after it (``models.fused``: the log-softmax, the banned and forced tokens, the argmax or the best
continuations, the scores, a beam's cache reordered, the next position), so the search makes one call per output
token and reads one small tensor back.

The encoder is packaged the same way (``PackagedEncoder``: one package for every source length of one sentence,
the cross-attention keys and values among its outputs). Both are called through the loader's own entry point
(``boxed_run``: a list of tensors in, a list out), not through the Python wrapper that ``aoti_load_package``
returns, which parses the package's input and output specifications (JSON) at every call.

One package per model (a digest of its structure and weights), torch version, CPU capability, Inductor options,
torch thread count (compiled into the code) and step key (rows, attention or not, shortlist or not, a one-position
source or not; the encoder: ``encode``), named by a digest of all of them. A package is written to a temporary
file and renamed (a killed compile leaves nothing half-written); one that does not load is compiled again. Its
inputs must have the strides they had when exported, so each is made contiguous (the cross-attention keys and
values, views of a fused projection, once per sentence). Should anything fail, a warning names it and the model
decodes eagerly, as with ``models.compiled`` (a failed encoder package leaves only the encoder eager).

Built in a process of its own (``isolated``, as ``BackgroundCompile`` builds them while the model goes on decoding):
``torch.export``'s tracing patches ``torch.nn.Module.__call__`` and ``__getattr__`` for the whole process while it
runs, so a model decoding in another thread meanwhile is traced into the export (which then fails) or fails itself.
A child process (``build_in_child``) exports and compiles a plain copy of the model (``plain_copy``) on the same
example inputs and thread count into the same file; the parent loads it as it loads any package.
"""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any, Callable

import torch

from ..nn.packed import unpacked_copy
from ..runtime import LOGGER, log
from .fused import KINDS, static_choice

#: The attributes by which a model decodes through compiled parts (``models.compiled``).
COMPILED_PARTS = ("compiled_step", "compiled_encode")


def compile_failed(exc: BaseException, on_failure: Callable[[], None]) -> str:
    """A compiled decoding path failed with ``exc``: warn once with its first line (the compiler's own error
    where Dynamo wraps it), log the traceback at debug level, call ``on_failure()`` (the model drops its
    compiled parts and decodes eagerly); returns the reason."""
    cause = getattr(exc, "inner_exception", None) or exc
    reason = f"{type(cause).__name__}: {(str(cause).splitlines() or [''])[0][:200]}"
    warnings.warn(f"compiled decoding failed ({reason}); decoding uncompiled", RuntimeWarning, stacklevel=4)
    LOGGER.debug("compiled decoding failed", exc_info=exc)
    on_failure()
    return reason


class FlatStep(torch.nn.Module):
    """``model.static_step`` with flat tensor inputs, as ``torch.export`` takes them: the source mask, the position,
    the tokens, each layer's cross-attention key and value, each layer's cache key and value, and with
    ``shortlist`` the output layer's rows; returns the logits, and with ``need_attention`` the attention too."""

    def __init__(self, model: torch.nn.Module, need_attention: bool = False, shortlist: bool = False) -> None:
        super().__init__()
        self.model, self.layers = model, len(model.decoder)
        self.need_attention, self.shortlist = need_attention, shortlist

    def forward(self, src_mask: torch.Tensor, position: torch.Tensor, tokens: torch.Tensor, *tensors: torch.Tensor):
        n = self.layers
        cross = [(tensors[2 * i], tensors[2 * i + 1]) for i in range(n)]
        caches = [(tensors[2 * n + 2 * i], tensors[2 * n + 2 * i + 1]) for i in range(n)]
        weight = tensors[4 * n] if self.shortlist else None
        logits, weights = self.model.static_step({"src_mask": src_mask, "cross_kv": cross}, caches, position, tokens,
                                                 self.need_attention, weight)
        return (logits, weights) if self.need_attention else logits


class FlatChoiceStep(torch.nn.Module):
    """``models.fused.static_choice`` of ``kind`` ("greedy" or "beam") with flat tensor inputs: the source mask, the
    position, the tokens, the length bound, the score(s), then each layer's cross-attention key and value and cache
    key and value (``FlatStep``'s order); returns what it returns."""

    def __init__(self, model: torch.nn.Module, kind: str) -> None:
        super().__init__()
        self.model, self.layers, self.kind = model, len(model.decoder), kind

    def forward(self, src_mask: torch.Tensor, position: torch.Tensor, tokens: torch.Tensor, limit: torch.Tensor,
                scores: torch.Tensor, *tensors: torch.Tensor):
        n = self.layers
        cross = [(tensors[2 * i], tensors[2 * i + 1]) for i in range(n)]
        caches = [(tensors[2 * n + 2 * i], tensors[2 * n + 2 * i + 1]) for i in range(n)]
        return static_choice(self.model, self.kind, {"src_mask": src_mask, "cross_kv": cross}, caches, position,
                             tokens, limit, scores)


class FlatEncoder(torch.nn.Module):
    """``model.encode_eager`` with flat outputs, as ``torch.export`` returns them: each decoder layer's
    cross-attention key and value, contiguous (the step's package assumes contiguous inputs)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, src: torch.Tensor, src_mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
        memory = self.model.encode_eager(src, src_mask)
        return tuple(t.contiguous() for kv in memory["cross_kv"] for t in kv)


def load_package(path: Path) -> Callable[[list[torch.Tensor]], list[torch.Tensor]]:
    """The package ``path``'s compiled function as a list of tensors -> a list of tensors: the ``boxed_run`` of
    AOTInductor's own C++ loader (``torch._C._aoti``), made directly: ``aoti_load_package`` makes the same loader
    but imports ``torch._inductor`` first, which takes longer than the loading itself (``seq2seq translate``'s
    second start; docs/performance.md), and wraps it in a Python caller (module docstring: its per-call cost).
    Where a torch has no such loader, ``aoti_load_package``'s wrapper."""
    loader = getattr(getattr(torch._C, "_aoti", None), "AOTIModelPackageLoader", None)
    if loader is not None and hasattr(loader, "boxed_run"):
        return loader(str(path), "model", False, 1, -1).boxed_run  # model name, single-threaded, runners, device
    runner = torch._inductor.aoti_load_package(str(path))

    def wrapped(inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        outputs = runner(*inputs)
        return list(outputs) if isinstance(outputs, (tuple, list)) else [outputs]
    return wrapped


def build_package(module: torch.nn.Module, example: tuple, shapes: Any, path: Path, options: dict) -> None:
    """Export ``module`` on ``example`` inputs with ``shapes`` (``torch.export``'s ``dynamic_shapes``) and compile
    it with Inductor ``options`` into the package ``path``, written to a temporary file and renamed (a killed
    compile leaves nothing half-written)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exported = torch.export.export(module, example, dynamic_shapes=shapes)
        partial = path.with_name(f".{path.stem}.{os.getpid()}.tmp.pt2")  # it must end in .pt2
        try:
            torch._inductor.aoti_compile_and_package(exported, package_path=str(partial), inductor_configs=options)
            os.replace(partial, path)
        finally:
            partial.unlink(missing_ok=True)


def plain_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A deep copy of ``model`` that decodes eagerly on its growing cache, to train or to pickle: plain linear layers
    (``unpacked_copy``), no compiled parts (a loaded package can be neither copied nor pickled)."""
    parts = [part for module in model.modules() for name in COMPILED_PARTS
             if (part := module.__dict__.get(name)) is not None]
    copied = unpacked_copy(model, leave_out=parts)
    for module in copied.modules():
        if hasattr(module, "static_step"):
            module.static_cache = False
    return copied


def build_in_child(packaged: "PackagedStep", key: tuple, example: tuple, path: Path) -> None:
    """Build the package of ``packaged``'s ``key`` into ``path`` as ``PackagedStep._runner`` does in-process, but in
    a child process (module docstring): the task (a plain copy of the model, the example inputs, the key, the
    options) goes through a temporary file; the child's last line of errors becomes this RuntimeError's message."""
    root = str(Path(__file__).resolve().parents[2])  # the directory that holds the seq2seq package
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    with tempfile.TemporaryDirectory(prefix="seq2seq-package-") as scratch:
        task = Path(scratch) / "task.pt"
        torch.save({"model": plain_copy(packaged.model), "encoder": isinstance(packaged, PackagedEncoder),
                    "key": key, "example": example, "path": str(path), "options": packaged.options}, task)
        code = "import sys; from seq2seq.models.packaged import build_task; build_task(sys.argv[1])"
        done = subprocess.run([sys.executable, "-c", code, str(task)], capture_output=True, text=True, env=env)
    if done.returncode != 0:
        lines = [line for line in done.stderr.splitlines() if line.strip()] or [f"exit status {done.returncode}"]
        raise RuntimeError(f"building {path.name} in a child process failed: {lines[-1]}")


def build_task(task_file: str) -> None:
    """The child's side of ``build_in_child``: read the task, build the package on the key's thread count."""
    task = torch.load(task_file, weights_only=False)  # written by build_in_child, just now
    key, model = task["key"], task["model"].eval()
    torch.set_num_threads(key[-1])  # compiled into the package's code: the parent's count
    kind = PackagedEncoder if task["encoder"] else PackagedStep
    module, shapes = kind(model, Path(task["path"]).parent, task["options"], lambda: None, "-")._exportable(key)
    with torch.no_grad():
        build_package(module.eval(), tuple(task["example"]), shapes, Path(task["path"]), task["options"])


#: The version of what the packages compute (``FlatStep``, ``FlatChoiceStep``, ``FlatEncoder`` and the model code
#: they export), part of every package's name: raised when that changes, so that no older package is loaded for it.
GRAPHS = 2


def model_digest(model: torch.nn.Module, options: dict) -> str:
    """What a package depends on besides its step key: the model's structure and weights, torch's version, the
    CPU's capability, the Inductor options and the version of the exported code (``GRAPHS``)."""
    digest = hashlib.sha256(f"graphs {GRAPHS} {model!r}".encode())
    for name, tensor in model.state_dict().items():
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    digest.update(f"{torch.__version__} {torch.backends.cpu.get_cpu_capability()} {sorted(options.items())}".encode())
    return digest.hexdigest()


class PackagedStep:
    """``model.static_step`` through AOTInductor packages in ``directory`` (module docstring): called like
    ``CompiledStep`` (``graphs`` the keys loaded so far, ``failure`` why it failed, if it did); ``options`` the
    Inductor options; ``on_failure()`` (the model drops its compiled parts) when a package cannot be built or
    run, after a warning; ``isolated``: packages built in a child process (module docstring)."""

    def __init__(self, model: torch.nn.Module, directory: str | os.PathLike, options: dict,
                 on_failure: Callable[[], None], identity: str | None = None, isolated: bool = False) -> None:
        self.model, self.directory, self.options, self.on_failure = model, Path(directory), dict(options), on_failure
        self.isolated = isolated  # packages built in a child process (``build_in_child``)
        self.identity = identity or model_digest(model, self.options)  # ``identity``: the model's digest, known
        self.runners: dict[tuple, Any] = {}
        self.graphs: set[tuple] = set()
        self.failure: str | None = None
        self.cross: tuple[Any, list[torch.Tensor]] | None = None  # the last memory's keys and values, contiguous

    def __call__(self, memory: dict, caches: list, position: torch.Tensor, tokens: torch.Tensor,
                 need_attention: bool, output_weight: torch.Tensor | None):
        inputs = [*self._inputs(memory, position, tokens), *self.cross[1], *_flat(caches)]
        if output_weight is not None:
            inputs.append(output_weight.contiguous())
        key = (tokens.size(0), need_attention, output_weight is None, memory["src_mask"].size(1) > 1,
               torch.get_num_threads())
        outputs = self._run(key, inputs)
        if outputs is None:
            return self.model.static_step(memory, caches, position, tokens, need_attention, output_weight)
        return outputs[0], outputs[1] if need_attention else None

    def choose(self, kind: str, memory: dict, caches: list, position: torch.Tensor, tokens: torch.Tensor,
               limit: torch.Tensor, scores: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """``models.fused.static_choice`` of ``kind`` through its package (key ``(kind, rows, long source,
        threads)``): the step and the search's choice in one call."""
        inputs = [*self._inputs(memory, position, tokens), limit.contiguous(), scores.contiguous(), *self.cross[1],
                  *_flat(caches)]
        outputs = self._run((kind, tokens.size(0), memory["src_mask"].size(1) > 1, torch.get_num_threads()), inputs)
        if outputs is None:
            return static_choice(self.model, kind, memory, caches, position, tokens, limit, scores)
        return tuple(outputs)

    def _inputs(self, memory: dict, position: torch.Tensor, tokens: torch.Tensor) -> list[torch.Tensor]:
        """The source mask, position and tokens, contiguous; the memory's cross-attention keys and values made
        contiguous once per sentence (``cross``), not per step."""
        if self.cross is None or self.cross[0] is not memory["cross_kv"]:
            self.cross = (memory["cross_kv"], [t.contiguous() for kv in memory["cross_kv"] for t in kv])
        return [memory["src_mask"].contiguous(), position.contiguous(), tokens.contiguous()]

    def _run(self, key: tuple, inputs: list[torch.Tensor]) -> list[torch.Tensor] | None:
        """The package of ``key`` run on ``inputs`` (loaded or built at its first use); None after a failure (a
        warning, ``on_failure``): the caller computes the step eagerly."""
        try:
            return (self.runners.get(key) or self._runner(key, inputs))(inputs)
        except Exception as exc:  # the exporter's and compiler's errors are of many types; eager is always there
            self.failure = compile_failed(exc, self.on_failure)
            return None

    def path(self, key: tuple) -> Path:
        """The package file of ``key``: (rows, attention, no shortlist, source longer than one, threads), or for the
        step with a search's choice (``choose``) (kind, rows, source longer than one, threads)."""
        name = hashlib.sha256(f"{self.identity} {key}".encode()).hexdigest()[:24]
        return self.directory / f"step-{name}.pt2"

    def _runner(self, key: tuple, inputs: list[torch.Tensor]):
        path = self.path(key)
        if path.is_file():
            try:
                runner = load_package(path)
                log("compiled_step", package=str(path), loaded=True)
                return self._keep(key, runner)
            except Exception as exc:  # a package of another build, or a damaged one: built again
                LOGGER.warning(f"warning: compiled step {path} does not load ({type(exc).__name__}); compiling it "
                               "again")
        with torch.inference_mode(False), torch.no_grad():
            # normal tensors (export writes into the caches) with standard strides: a view's stride over a
            # dimension of size 1 (one row of a padded batch) would otherwise become a guard on its length
            example = tuple(t.clone(memory_format=torch.contiguous_format) for t in inputs)
            if self.isolated:
                build_in_child(self, key, example, path)
            else:
                module, shapes = self._exportable(key)
                build_package(module.eval(), example, shapes, path, self.options)
        log("compiled_step", package=str(path), loaded=False, rows=key[0])
        return self._keep(key, load_package(path))

    def _exportable(self, key: tuple) -> tuple[torch.nn.Module, Any]:
        """The module exported for ``key`` and its dynamic shapes: the source, the cache and a shortlist's size."""
        choice = key[0] in KINDS
        need_attention, full, long_source = (False, True, key[2]) if choice else key[1:4]
        layers = len(self.model.decoder)
        source = torch.export.Dim("source", min=2, max=1 << 16) if long_source else None
        cache = torch.export.Dim("cache", min=2, max=1 << 16)
        vocabulary = [] if full else [{0: torch.export.Dim("shortlist", min=2, max=1 << 20)}]
        tensors = tuple([{2: source} if source else None] * (2 * layers) + [{2: cache}] * (2 * layers) + vocabulary)
        mask = {1: source} if source else None
        if choice:  # the limit and the score(s) besides
            return FlatChoiceStep(self.model, key[0]), (mask, None, None, None, None, tensors)
        return FlatStep(self.model, need_attention, not full), (mask, None, None, tensors)

    def _keep(self, key: tuple, runner):
        self.runners[key] = runner
        self.graphs.add(key)
        return self.runners[key]


def _flat(caches: list) -> list[torch.Tensor]:
    """Each layer's cache key and value, contiguous, in a row."""
    return [t.contiguous() for kv in caches for t in kv]


def source_bound(model: torch.nn.Module) -> int:
    """The longest source the encoder's package takes: what learned positions can encode (``Translator`` cuts
    inputs to that), else 2^16 subwords."""
    return getattr(model, "max_positions", None) or 1 << 16


class PackagedEncoder(PackagedStep):
    """``model.encode_eager`` for one sentence through one AOTInductor package in ``directory`` (every source
    length of two or more subwords; a one-subword source is encoded eagerly), called like ``CompiledEncoder``;
    should it fail, a warning and ``on_failure()`` (the model's encoder goes back to eager)."""

    def __call__(self, src: torch.Tensor, src_mask: torch.Tensor) -> dict:
        if src.size(1) < 2:
            return self.model.encode_eager(src, src_mask)
        outputs = self._run(("encode", torch.get_num_threads()), [src.contiguous(), src_mask.contiguous()])
        if outputs is None:
            return self.model.encode_eager(src, src_mask)
        return {"src_mask": src_mask, "cross_kv": [(outputs[2 * i], outputs[2 * i + 1])
                                                   for i in range(len(outputs) // 2)]}

    def path(self, key: tuple) -> Path:
        name = hashlib.sha256(f"{self.identity} {key}".encode()).hexdigest()[:24]
        return self.directory / f"encode-{name}.pt2"

    def _exportable(self, key: tuple) -> tuple[torch.nn.Module, Any]:
        source = torch.export.Dim("source", min=2, max=source_bound(self.model))
        return FlatEncoder(self.model), ({1: source}, {1: source})
