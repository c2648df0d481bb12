"""A request's work on the batcher: queued (429 when the queue is full, 503 while shutting down) and awaited
(504 after ``--request-timeout``; nothing when the client went away, and the job is cancelled either way, so
the worker drops it if it has not started it). Every endpoint that runs a model goes through here."""
from __future__ import annotations

import asyncio
from concurrent.futures import Future
from typing import Any, Callable, Hashable, Sequence

from fastapi import HTTPException, Request

from ..runtime import LOGGER
from .batcher import Batcher, BatcherClosed, QueueFull


def submit(batcher: Batcher, items: Sequence, key: Hashable, finish: Callable[[list], Any]) -> Future:
    """``batcher.submit``, its refusals as HTTP errors (429 with Retry-After, 503)."""
    try:
        return batcher.submit(items, key, finish)
    except QueueFull as exc:
        raise HTTPException(429, f"the server is busy: {exc} (--max-queue-sentences); retry after "
                                 "Retry-After seconds", headers={"Retry-After": "1"}) from None
    except BatcherClosed:
        raise HTTPException(503, "the server is shutting down; send the request to another instance") from None


async def wait_for(future: Future, request: Request, timeout: float) -> Any:
    """The job's answer; 504 after ``timeout`` seconds; b"" when the client went away first. Either
    way the job is cancelled, so the worker drops it if it has not started it."""
    result = asyncio.wrap_future(future)
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        done, _ = await asyncio.wait({result, gone}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not result.done():
            result.cancel()
    if result in done:
        try:
            return result.result()
        except Exception as exc:
            LOGGER.error(f"serve error=translation_failed exception={type(exc).__name__}: {exc}")
            raise HTTPException(500, f"translation failed: {type(exc).__name__}: {exc}") from None
    if gone in done:
        return b""
    raise HTTPException(504, f"no translation within {timeout:g} s (--request-timeout): the server is overloaded; "
                             "retry later or send fewer sentences")


async def _disconnected(request: Request) -> None:
    """Returns when the client has disconnected (the body has been read: the next ASGI message is that)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
