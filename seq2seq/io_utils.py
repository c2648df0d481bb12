"""Small I/O helpers: atomic output files and chunked line streams."""
from __future__ import annotations

import os
import sys
import tempfile
from contextlib import contextmanager
from itertools import islice
from pathlib import Path
from typing import IO, Iterable, Iterator, TypeVar

T = TypeVar("T")


@contextmanager
def atomic_output(path: str | Path | None, mode: str = "w") -> Iterator[IO]:
    """Yield a file that appears at ``path`` only if the block succeeds; '-' or None is stdout."""
    if path in (None, "-"):
        yield sys.stdout if "b" not in mode else sys.stdout.buffer
        return
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as handle:
            yield handle
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def chunks(items: Iterable[T], size: int) -> Iterator[list[T]]:
    """Consecutive lists of at most ``size`` items."""
    iterator = iter(items)
    while chunk := list(islice(iterator, size)):
        yield chunk
