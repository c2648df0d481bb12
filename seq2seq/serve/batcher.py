"""Dynamic batching: many small requests, few wide model calls.

Requests are queued as jobs (a list of sentences, a key, a future). One worker thread takes the
oldest job and every later job with the same key (the same decoding options: one model call runs one
search), up to ``max_batch`` sentences, waiting at most ``max_wait_s`` after the oldest job arrived
for more to come; then it makes one call on the combined list and resolves each job's future with
its slice of the outputs. Why: every decoding step reads all the decoder's weights however few rows
it has, so one call on 32 sentences costs far less than 32 calls on one (docs/performance.md).

The model runs only in the worker thread (torch releases the GIL while it computes), so an asyncio
server stays responsive; ``submit`` only takes a lock. A job whose future was cancelled before its
batch starts (a client that timed out or went away) is dropped without being translated; one
cancelled later is translated and its result is discarded. Nothing here knows about HTTP or models.
"""
from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Sequence

#: ``run(items, key) -> outputs``: one model call; ``len(outputs) == len(items)``, in order.
RunFn = Callable[[list, Hashable], Sequence]


class QueueFull(Exception):
    """The job would take the queue past ``max_queue`` items (an HTTP server answers 429)."""


class BatcherClosed(Exception):
    """``close`` was called: no new jobs (an HTTP server answers 503)."""


@dataclass
class _Job:
    items: list
    key: Hashable
    finish: Callable[[list], Any] | None  # outputs -> the future's result, run in the worker thread
    future: Future = field(default_factory=Future)
    enqueued: float = field(default_factory=time.monotonic)


@dataclass
class BatchStats:
    """Counters since start: how well requests were merged (``items / model_calls`` is the mean batch)."""

    model_calls: int = 0
    items: int = 0  # sentences translated
    jobs: int = 0  # requests answered (or failed) by a model call
    dropped_jobs: int = 0  # cancelled before their batch started: never translated
    largest_batch: int = 0
    failed_calls: int = 0


class Batcher:
    """Queue + one worker thread; see the module docstring. ``start`` is implicit on first ``submit``."""

    def __init__(self, run: RunFn, max_batch: int, max_wait_s: float, max_queue: int) -> None:
        self.run, self.max_batch, self.max_wait_s, self.max_queue = run, max_batch, max_wait_s, max_queue
        self.stats = BatchStats()
        self._pending: list[_Job] = []
        self._queued = 0  # items in _pending
        self._in_flight = 0  # items in the model call under way
        self._cond = threading.Condition()
        self._closing = False
        self._thread: threading.Thread | None = None
        #: (monotonic start, seconds) of the last model call; a job's ``finish`` runs in the worker right
        #: after its own call, so it reads that call's timing here (the page's timings)
        self.last_call: tuple[float, float] = (0.0, 0.0)

    # ------------------------------------------------------------------ the caller's side

    def submit(self, items: Sequence, key: Hashable = None, finish: Callable[[list], Any] | None = None) -> Future:
        """Queue ``items`` for a model call with ``key``; the future's result is their outputs in
        order, or ``finish(outputs)``. Raises ``QueueFull`` or ``BatcherClosed``; never blocks on the model."""
        job = _Job(list(items), key, finish)
        with self._cond:
            if self._closing:
                raise BatcherClosed("the server is shutting down")
            self._drop_cancelled()  # a cancelled job frees its place at once, not when the worker wakes
            if self._queued + len(job.items) > self.max_queue:
                raise QueueFull(f"{self._queued} sentences are queued; {len(job.items)} more would exceed "
                                f"the limit of {self.max_queue}")
            self._start_locked()
            self._pending.append(job)
            self._queued += len(job.items)
            self._cond.notify()
        return job.future

    def start(self) -> None:
        with self._cond:
            self._start_locked()

    def close(self, timeout: float | None = None) -> None:
        """Refuse new jobs, translate every queued one, then stop the worker (graceful shutdown)."""
        with self._cond:
            self._closing = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def queued(self) -> tuple[int, int]:
        """(jobs, items) waiting for a model call."""
        with self._cond:
            self._drop_cancelled()
            return len(self._pending), self._queued

    @property
    def closing(self) -> bool:
        """True once ``close`` was called."""
        return self._closing

    @property
    def in_flight(self) -> int:
        """Items in the model call under way (0 when idle)."""
        return self._in_flight

    # ------------------------------------------------------------------ the worker

    def _start_locked(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name="seq2seq-batcher", daemon=True)
            self._thread.start()

    def _work(self) -> None:
        while (jobs := self._next_batch()) is not None:
            self._run(jobs)

    def _next_batch(self) -> list[_Job] | None:
        """The next batch (the oldest job and compatible later ones), once it is full, the oldest
        has waited ``max_wait_s``, or the batcher is closing; None when closed and drained."""
        with self._cond:
            while True:
                self._drop_cancelled()
                if not self._pending:
                    if self._closing:
                        return None
                    self._cond.wait()
                    continue
                first = self._pending[0]
                batch, size, compatible = [], 0, 0
                for job in self._pending:
                    if job.key != first.key:
                        continue
                    compatible += len(job.items)
                    if not batch or size + len(job.items) <= self.max_batch:
                        batch.append(job)
                        size += len(job.items)
                wait = first.enqueued + self.max_wait_s - time.monotonic()
                if compatible >= self.max_batch or wait <= 0 or self._closing:
                    taken = set(map(id, batch))
                    self._pending = [job for job in self._pending if id(job) not in taken]
                    self._queued -= size
                    self._in_flight = size
                    return batch
                self._cond.wait(wait)

    def _drop_cancelled(self) -> None:
        """Forget the queued jobs whose future was cancelled (the lock is held)."""
        cancelled = [job for job in self._pending if job.future.cancelled()]
        if cancelled:
            self._pending = [job for job in self._pending if not job.future.cancelled()]
            self._queued -= sum(len(job.items) for job in cancelled)
            self.stats.dropped_jobs += len(cancelled)

    def _run(self, jobs: list[_Job]) -> None:
        """One model call for ``jobs``; every live job's future gets its slice (or the error)."""
        live = [job for job in jobs if job.future.set_running_or_notify_cancel()]
        with self._cond:
            self.stats.dropped_jobs += len(jobs) - len(live)
        items = [item for job in live for item in job.items]
        try:
            if not live:
                return
            try:
                started = time.monotonic()
                outputs = self.run(items, live[0].key)
                self.last_call = (started, time.monotonic() - started)
                if len(outputs) != len(items):
                    raise RuntimeError(f"the batch function returned {len(outputs)} outputs for {len(items)} inputs")
            except Exception as exc:  # the server answers 500; the worker lives on
                self.stats.failed_calls += 1
                for job in live:
                    job.future.set_exception(exc)
                return
            self.stats.model_calls += 1
            self.stats.items += len(items)
            self.stats.jobs += len(live)
            self.stats.largest_batch = max(self.stats.largest_batch, len(items))
            offset = 0
            for job in live:
                part = list(outputs[offset: offset + len(job.items)])
                offset += len(job.items)
                try:
                    job.future.set_result(job.finish(part) if job.finish else part)
                except Exception as exc:
                    job.future.set_exception(exc)
        finally:
            self._in_flight = 0
