"""Prepare the next items of an iterator in a background thread while the consumer works.

The training loop on a GPU uses it to collate and pin (page-lock) the next batches while the
current step runs, so that the copy to the GPU (``Batch.to(non_blocking=True)``) neither waits for
the host nor blocks it. Written here rather than through ``torch.utils.data.DataLoader``: the
batches come from a generator that resumes mid-epoch and streams, which a DataLoader would only
pin in its main thread (``num_workers=0``) or pickle into worker processes; a thread and a bounded
queue are all this needs.
"""
from __future__ import annotations

import queue
import threading
from typing import Callable, Iterable, Iterator, TypeVar

T = TypeVar("T")
_DONE = object()


class _Failure:
    def __init__(self, error: BaseException) -> None:
        self.error = error


def prefetch(items: Iterable[T], prepare: Callable[[T], T], depth: int = 2) -> Iterator[T]:
    """``prepare(item)`` for each item, in order, computed up to ``depth`` items ahead in a thread.

    An exception in the iterator or in ``prepare`` is raised in the consumer at that position.
    Closing the generator early (a ``break`` in the consumer) stops the thread after the item it
    is preparing; nothing it prepared beyond what was consumed is used.
    """
    if depth < 1:
        raise ValueError("prefetch depth must be >= 1")
    ready: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def offer(value: object) -> bool:
        while not stop.is_set():
            try:
                ready.put(value, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for item in items:
                if not offer(prepare(item)):
                    return
        except BaseException as error:  # handed to the consumer, raised there
            offer(_Failure(error))
            return
        offer(_DONE)

    worker = threading.Thread(target=produce, name="seq2seq-prefetch", daemon=True)
    worker.start()
    try:
        while True:
            value = ready.get()
            if value is _DONE:
                return
            if isinstance(value, _Failure):
                raise value.error
            yield value
    finally:
        stop.set()
        worker.join()
