"""Multi-process training with PyTorch's DistributedDataParallel, as started by ``torchrun``.

``torchrun`` sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` and the rendezvous address; ``process_group``
joins the group they describe (NCCL on CUDA, gloo on CPU). Without them, or with one process, every
helper here is a no-op that returns its input, so single-process runs take exactly the old paths.

Small CPU values (token counts, stop decisions, validation scores, RNG states, barriers) travel on
a separate gloo group with a long timeout, because rank 0 may prepare a corpus (tokenizer training,
encoding) for a long time while the other ranks wait; DDP's gradient all-reduce uses the default group.
"""
from __future__ import annotations

import datetime
import gc
import logging
import os
from contextlib import contextmanager, nullcontext
from typing import Any, Callable, Iterable, Iterator, TypeVar

import torch
import torch.distributed as dist

T = TypeVar("T")
WAIT_TIMEOUT = datetime.timedelta(hours=6)  # longest a rank waits for another (e.g. corpus preparation)
_cpu_group: Any = None  # gloo group for CPU values; None = the default group (already gloo)


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def rank() -> int:
    return dist.get_rank() if is_distributed() else 0


def world_size() -> int:
    return dist.get_world_size() if is_distributed() else 1


def is_main() -> bool:
    """Rank 0 writes checkpoints, logs, metrics, plots and the summary, and validates."""
    return rank() == 0


def local_device(device: torch.device) -> torch.device:
    """On CUDA each process of a node drives the GPU numbered by its ``LOCAL_RANK``."""
    if device.type == "cuda" and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return device


@contextmanager
def process_group(device: torch.device) -> Iterator[bool]:
    """Join torchrun's process group for the body (yields True if this call created it), then leave."""
    global _cpu_group
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or dist.is_initialized():
        yield False
        return
    device = local_device(device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
        dist.init_process_group("nccl")
        _cpu_group = dist.new_group(backend="gloo", timeout=WAIT_TIMEOUT)
    else:
        dist.init_process_group("gloo", timeout=WAIT_TIMEOUT)
    if not is_main():
        _silence_secondary_rank()
    try:
        yield True
        # leave together: a rank tearing the group down while rank 0 still writes its summary and
        # tests the best checkpoint was seen to abort in gloo ("terminate called without an active
        # exception", once in a CI run); after an error no barrier, the others may be gone. Before
        # that, free the run's objects (the DDP wrapper holds the group) while the group is alive: freed
        # later, at interpreter exit, gloo's threads abort the same way (seen again 2026-11-26).
        gc.collect()
        dist.barrier(group=_cpu_group)
    finally:
        _cpu_group = None
        dist.destroy_process_group()


def _silence_secondary_rank() -> None:
    """Only rank 0 talks: other ranks keep errors but drop warnings and progress bars."""
    import datasets

    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    logging.getLogger("seq2seq").setLevel(logging.ERROR)


def barrier() -> None:
    if is_distributed():
        dist.barrier(group=_cpu_group)


def main_first(fn: Callable[[], T]) -> T:
    """Run ``fn`` on rank 0, then on the other ranks (e.g. prepare a cache once, then load it)."""
    if not is_distributed():
        return fn()
    if is_main():
        result = fn()
        barrier()
        return result
    barrier()
    return fn()


def all_reduce_sum(values: list[float]) -> list[float]:
    """Element-wise sum over ranks (float64: integers stay exact up to 2**53)."""
    if not is_distributed():
        return values
    tensor = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(tensor, group=_cpu_group)
    return tensor.tolist()


def broadcast(obj: T) -> T:
    """Rank 0's ``obj`` on every rank (a picklable value; the others pass anything, e.g. None)."""
    if not is_distributed():
        return obj
    holder = [obj]
    dist.broadcast_object_list(holder, src=0, group=_cpu_group)
    return holder[0]


def broadcast_flag(flag: bool) -> bool:
    """Rank 0's decision on every rank (one tiny collective; cheaper than ``broadcast``)."""
    if not is_distributed():
        return flag
    tensor = torch.tensor([int(flag)], dtype=torch.int64)
    dist.broadcast(tensor, src=0, group=_cpu_group)
    return bool(tensor.item())


def gather(obj: T) -> list[T] | None:
    """Every rank's ``obj`` in rank order on rank 0, None elsewhere; None when not distributed."""
    if not is_distributed():
        return None
    out = [None] * world_size() if is_main() else None
    dist.gather_object(obj, out, dst=0, group=_cpu_group)
    return out


def lockstep(items: Iterable[T], count: Callable[[T], int]) -> Iterator[tuple[T, int]]:
    """``(item, total)`` where ``total`` sums ``count(item)`` over all ranks' current items; ends for
    every rank as soon as one rank runs out, so all ranks take the same number of steps.

    One all-reduce per item (a rank that has run out contributes zeros once, then stops).
    """
    if not is_distributed():
        for item in items:
            yield item, count(item)
        return
    iterator = iter(items)
    while True:
        item = next(iterator, None)
        total, present = all_reduce_sum([count(item) if item is not None else 0, item is not None])
        if present < world_size():
            return
        yield item, int(total)


def wrap_model(model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """``DistributedDataParallel(model)`` when distributed (gradients averaged over ranks), else ``model``."""
    if not is_distributed():
        return model
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)


def no_sync(wrapped: torch.nn.Module, sync: bool):
    """Skip DDP's gradient all-reduce in this backward unless ``sync`` (accumulation micro-batches)."""
    if sync or not is_distributed():
        return nullcontext()
    return wrapped.no_sync()


class StopRequests:
    """Ctrl-C (SIGINT) and SIGTERM under torchrun, turned into a request to stop at a step boundary.

    A signal that interrupts a rank inside a collective (DDP's gradient all-reduce, a barrier) would
    leave the others waiting in it for a partner that never comes: the NCCL watchdog then aborts, or
    the teardown hangs, after the checkpoint. So while training runs distributed, a signal only sets
    ``requested``; the training loop shares the flags of all ranks at the end of every step
    (``agree``) and every rank stops after the same step, where ``last.pt`` is written together.
    A terminal's Ctrl-C reaches a worker twice (from the terminal and again from torchrun); both
    only set the flag. A rank that never reaches the next step boundary is ended by torchrun, which
    kills its workers after its own grace period. In a single process nothing is installed: Ctrl-C
    raises ``KeyboardInterrupt`` as usual, and the loop saves the state after the last whole step.
    """

    SIGNALS = ("SIGINT", "SIGTERM")

    def __init__(self) -> None:
        self.requested = False
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame: Any) -> None:
        self.requested = True

    def __enter__(self) -> "StopRequests":
        import signal

        if is_distributed():
            for name in self.SIGNALS:
                number = getattr(signal, name)
                self._previous[number] = signal.signal(number, self._handle)
        return self

    def __exit__(self, *exc: Any) -> None:
        import signal

        for number, previous in self._previous.items():
            signal.signal(number, previous)
        self._previous.clear()


def agree(flags: list[bool], clock: float = 0.0) -> tuple[list[bool], float]:
    """For each position, whether any rank's flag is set, and rank 0's ``clock`` (one small all-reduce;
    identity alone)."""
    if not is_distributed():
        return [bool(flag) for flag in flags], clock
    *totals, main_clock = all_reduce_sum([float(bool(flag)) for flag in flags] + [clock if is_main() else 0.0])
    return [total > 0 for total in totals], main_clock


@contextmanager
def ignore_interrupts() -> Iterator[None]:
    """Let a save finish: under torchrun Ctrl-C reaches a worker twice (terminal, then torchrun)."""
    import signal

    if not is_distributed():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
