"""Process-level set-up shared by training and translation: device, seeding, threads, precision, logging."""
from __future__ import annotations

import json
import logging
import os
import random
import sys
import time
from contextlib import contextmanager, nullcontext
from typing import Any

import numpy as np
import torch

from .errors import UserError


def env_rank() -> int:
    """This process's rank as torchrun announced it (0 without torchrun), known before the group exists."""
    return int(os.environ.get("RANK", "0"))


def resolve_device(name: str) -> torch.device:
    """``auto`` picks CUDA when present, else CPU; ``cuda`` without a GPU is a user error.

    ``cuda:N`` also makes GPU N the current device, so that everything created on "cuda" without an
    index (kernels' workspaces, the gradient scaler, libraries) lands there too, not on GPU 0."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name != "cpu" and not (name == "cuda" or name.startswith("cuda:") and name[5:].isdigit()):
        raise UserError(f"--device must be auto, cpu, cuda or cuda:N, got {name!r}")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise UserError(f"--device {name}: no CUDA device is available; use --device cpu or auto")
    device = torch.device(name)
    if device.index is not None:
        if device.index >= torch.cuda.device_count():
            raise UserError(f"--device {name}: this machine has {torch.cuda.device_count()} CUDA device(s), "
                            f"numbered from 0 (CUDA_VISIBLE_DEVICES renumbers them)")
        torch.cuda.set_device(device)
    return device


def allow_tf32(enabled: bool) -> None:
    """TF32 (10-bit mantissa) for fp32 matmuls and cuDNN convolutions/RNNs on Ampere or newer GPUs
    (``--tf32``): several times faster fp32 on those GPUs, relative error ~1e-3. Off, fp32 means
    IEEE fp32 on every backend: PyTorch's own default leaves TF32 on for cuDNN. CPU kernels are
    untouched either way (these switches name CUDA backends only). The ``allow_tf32`` switches, not
    the newer per-backend ``fp32_precision`` ones: ``torch.backends.cudnn.flags`` (used around
    attribution's RNN backward) reads the old switch and fails once the new ones were set."""
    torch.backends.cuda.matmul.allow_tf32 = enabled
    torch.backends.cudnn.allow_tf32 = enabled


@contextmanager
def ieee_fp32():
    """TF32 off for the block (``allow_tf32(False)``: fp32 means IEEE fp32, for cuDNN's RNNs too) and
    the switches as they were afterwards: decoding and scoring inside a process that trains with
    ``--tf32``, or a Python caller's own setting, are left alone."""
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    allow_tf32(False)
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


@contextmanager
def torch_threads(threads: int | None):
    """torch's intra-op threads (this thread's setting) for the block, as before afterwards; None:
    unchanged."""
    before = torch.get_num_threads()
    if threads is not None and threads != before:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)


def synchronize(device: torch.device) -> None:
    """Wait for the work queued on a CUDA ``device`` (for timing); nothing elsewhere."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def seed_everything(seed: int) -> None:
    """The one seed function: python, numpy and torch (CPU and CUDA)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def set_threads(threads: int) -> None:
    if threads > 0:
        torch.set_num_threads(threads)


def autocast(device: torch.device, precision: str):
    """Autocast context for ``--precision``: fp32 (none), bf16 (CPU or CUDA), fp16 (CUDA only)."""
    if precision == "fp32":
        return nullcontext()
    if precision == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    if precision == "fp16":
        if device.type != "cuda":
            raise UserError("--precision fp16 needs a CUDA device; on CPU use --precision bf16 or fp32")
        return torch.autocast("cuda", dtype=torch.float16)
    raise UserError(f"--precision must be fp32, bf16 or fp16, got {precision!r}")


def cpu_has_native_bf16() -> bool:
    """True when oneDNN runs bf16 matrix products natively on this CPU (AVX512-BF16 or AMX).

    Without them PyTorch emulates bf16 on the CPU, far slower than fp32 (docs/performance.md)."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):  # private probe gone: fall back to the ISA level
        return "AVX512" in torch.backends.cpu.get_cpu_capability()


def resolve_precision(device: torch.device, precision: str) -> str:
    """``auto``: bf16 where ``device`` runs it natively (a CUDA GPU with bf16, a CPU with AVX512-BF16
    or AMX), else fp32; any other value is returned as given."""
    if precision != "auto":
        return precision
    if device.type == "cuda":
        native = torch.cuda.get_device_capability(device) >= (8, 0)
    else:
        native = device.type == "cpu" and cpu_has_native_bf16()
    return "bf16" if native else "fp32"


def precision_warning(device: torch.device, precision: str) -> str | None:
    """Why ``--precision`` will be slow on ``device``, or None (validates it too)."""
    autocast(device, precision)
    if precision == "bf16" and device.type == "cuda" and torch.cuda.get_device_capability(device) < (8, 0):
        major, minor = torch.cuda.get_device_capability(device)
        return (f"--precision bf16: {torch.cuda.get_device_name(device)} (compute capability {major}.{minor}) "
                "has no bf16 tensor cores (they start at 8.0, Ampere), so bf16 runs emulated and slower "
                "than fp32; use --precision fp16 on this GPU")
    if precision == "bf16" and device.type == "cpu" and not cpu_has_native_bf16():
        return ("--precision bf16: this CPU has no native bf16 support (no AVX512-BF16 / AMX), so "
                "PyTorch emulates it and training and decoding run many times slower than fp32; "
                "use --precision fp32 here")
    return None


class _CurrentStderr(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is when a record is emitted (redirected or captured stderr
    included), from rank 0 only under torchrun."""

    def __init__(self) -> None:
        super().__init__()
        self.addFilter(lambda record: env_rank() == 0)

    @property
    def stream(self):  # noqa: D401 - the current stderr, looked up at every emit
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass


#: The one logger: every module logs under ``seq2seq.*`` and every line reaches stderr through this
#: one handler as its bare message. ``log`` writes the ``event key=value`` lines; library modules
#: use ``logging.getLogger(__name__)``. Progress bars (``progress_bar``) are separate and silenced by --quiet.
LOGGER = logging.getLogger("seq2seq")
if not any(isinstance(h, _CurrentStderr) for h in LOGGER.handlers):
    _handler = _CurrentStderr()
    _handler.setFormatter(logging.Formatter("%(message)s"))
    LOGGER.addHandler(_handler)
    LOGGER.setLevel(logging.INFO)


#: Seconds between two updates of a progress bar written to a file or pipe (``seq2seq train > log 2>&1``):
#: now and then a whole line, not an animation of one line per step.
LOGGED_PROGRESS_INTERVAL = 60.0


class _ProgressLines:
    """A progress bar's stream when stderr is no terminal: each update tqdm draws (``\\r`` + the bar) is
    written as one whole line, and the blank redraws that clear a bar are dropped."""

    def __init__(self, stream) -> None:
        self.stream = stream

    def write(self, text: str) -> None:
        for part in text.replace("\r", "\n").split("\n"):
            if part.strip():
                self.stream.write(part.rstrip() + "\n")

    def flush(self) -> None:
        self.stream.flush()


def is_terminal(stream=None) -> bool:
    """Whether ``stream`` (default: stderr, where progress goes) is a terminal, not a file or a pipe."""
    stream = sys.stderr if stream is None else stream
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or closed
        return False


def progress_bar(iterable: Any = None, **options: Any):
    """The one way to make a progress bar (tqdm) on stderr, with tqdm's options (``desc``, ``unit``,
    ``total``, ``disable``, ...). On a terminal it animates as tqdm does; written to a file or a pipe it
    prints one plain line every ``LOGGED_PROGRESS_INTERVAL`` seconds (and when it ends, if ``leave``)."""
    from tqdm import tqdm

    stream = options.pop("file", None) or sys.stderr
    if not is_terminal(stream):
        stream = _ProgressLines(stream)
        options.update(mininterval=LOGGED_PROGRESS_INTERVAL, maxinterval=LOGGED_PROGRESS_INTERVAL,
                       dynamic_ncols=False)  # maxinterval: tqdm's monitor would redraw every 10 s
    return tqdm(iterable, file=stream, **options)


def log(event: str, quiet: bool = False, **fields: Any) -> None:
    """One plain ``event key=value ...`` line on stderr, easy to grep and parse (rank 0 only under
    torchrun); ``warning`` events at warning level."""
    if quiet:
        return
    parts = [event]
    for key, value in fields.items():
        if isinstance(value, float):
            value = f"{value:.6g}"
        parts.append(f"{key}={value}")
    LOGGER.log(logging.WARNING if event == "warning" else logging.INFO, " ".join(parts))


class JsonlLog:
    """Append-only metrics log, one JSON object per line (flushed, so a killed run keeps its lines)."""

    def __init__(self, path: str | os.PathLike, enabled: bool = True) -> None:
        self.path = path
        self.enabled = enabled  # False on the secondary ranks of a distributed run
        self.start = time.time()
        self._whole = False  # the file is known to end with a whole line (checked at the first write)

    def write(self, record: dict[str, Any]) -> None:
        """Append ``record`` as one line. A refusal of the disk is an ``OutputError`` naming the file
        (the lines before are intact); a line a failed write left half-written is cut off before the
        next one is appended, so every line of the log stays one JSON object."""
        if not self.enabled:
            return
        from .io_utils import output_error

        try:
            if not self._whole:  # an earlier process may have failed mid-line; this one raises if it does
                self._cut_partial_line()
                self._whole = True
            with open(self.path, "a", encoding="utf-8") as handle:
                handle.write(json.dumps(record, ensure_ascii=False) + "\n")
        except OSError as exc:
            self._whole = False  # the failed write may have left half a line
            raise output_error(exc, f"appending to {self.path}", "the lines before are intact") or exc from None

    def _cut_partial_line(self) -> None:
        try:
            with open(self.path, "rb+") as handle:
                size = handle.seek(0, os.SEEK_END)
                if size == 0:
                    return
                handle.seek(max(size - 65536, 0))
                tail = handle.read()
                if tail.endswith(b"\n"):
                    return
                cut = size - len(tail) + tail.rfind(b"\n") + 1  # 0 when no line was complete
                handle.truncate(cut)
                log("warning", message=f"{self.path}: cut off a half-written last line ({size - cut} bytes)")
        except FileNotFoundError:
            return


def peak_rss_mb() -> float:
    """Peak resident memory of this process in MB (Linux/macOS)."""
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 1024 if sys.platform != "darwin" else peak / 2**20


def peak_cuda_memory_mb(device: torch.device | str) -> float | None:
    """Peak memory that tensors of this process held on the CUDA ``device`` (PyTorch's caching
    allocator, ``torch.cuda.max_memory_allocated``) in MB; None for a device that is not CUDA."""
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    return torch.cuda.max_memory_allocated(device) / 2**20
