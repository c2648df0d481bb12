"""What the test processes of one pytest run share: one directory, artifacts built once in it, and
the rule that some tests run alone.

``pytest -n auto`` (pytest-xdist) starts a worker process per core. The controller makes one
directory per run (``RUN_DIR_ENV``) before the workers start; they and every subprocess of a test
inherit it. In it:

- ``built/NAME``: an expensive, read-only fixture (a trained toy model, a checkpoint) built by
  whichever process asks first, under a file lock, and reused by every other file and worker.
  Each is recorded with a hash of its files; :func:`changed_artifacts` tells which a test has
  modified since (``conftest`` checks at the end of each worker's session: a test that needs to
  write into one copies it first).
- ``inductor/``: torch.compile's cache for this run only, so a graph compiled by one test or
  subprocess is reused by the next, and no run is faster because an earlier one warmed the cache.
- ``machine.lock``/``machine.gate``: a readers-writer lock over the machine. Tests marked
  ``serial`` (torchrun's process pairs, a real server timed by its clients) hold it exclusively:
  no other worker runs a test meanwhile; every other test holds it shared.

Written by hand: pytest-xdist offers groups of tests on one worker, not "alone on the machine",
and the lock is two ``flock`` calls.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

RUN_DIR_ENV = "SEQ2SEQ_TEST_RUN_DIR"
BUILT_MANIFEST = ".built.json"


def make_run_dir() -> Path:
    """Create this run's directory and export it to every later process (called once, by the controller)."""
    path = Path(tempfile.mkdtemp(prefix="seq2seq-tests-"))
    os.environ[RUN_DIR_ENV] = str(path)
    return path


def run_dir() -> Path:
    path = os.environ.get(RUN_DIR_ENV)
    if not path:
        raise RuntimeError(f"{RUN_DIR_ENV} is unset: run the tests through pytest (tests/conftest.py sets it)")
    return Path(path)


@contextmanager
def flocked(path: Path, mode: int) -> Iterator[None]:
    """Hold ``flock(mode)`` on ``path`` (created if missing) for the ``with`` block."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, mode)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def file_hashes(root: Path) -> dict[str, str]:
    """sha256 of every file under ``root`` (relative path -> hex), the manifest excluded."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and p.name != BUILT_MANIFEST}


def built_once(name: str, build: Callable[[Path], None]) -> Path:
    """``run_dir()/built/NAME``, made by ``build(that_empty_directory)`` the first time any process of
    the run asks for it (built in place, so paths recorded inside stay true) and returned as is after
    that; the lock keeps others out until it is complete. A failed build leaves nothing behind."""
    root = run_dir() / "built"
    target = root / name
    with flocked(root / f"{name}.lock", fcntl.LOCK_EX):
        if not (target / BUILT_MANIFEST).exists():
            shutil.rmtree(target, ignore_errors=True)
            target.mkdir(parents=True)
            try:
                build(target)
            except BaseException:
                shutil.rmtree(target, ignore_errors=True)
                raise
            (target / BUILT_MANIFEST).write_text(json.dumps(file_hashes(target)), encoding="utf-8")
    return target


def changed_artifacts() -> list[str]:
    """Names of the built artifacts whose files differ from when they were built (added, removed or edited)."""
    root = run_dir() / "built"
    changed = []
    for manifest in sorted(root.glob(f"*/{BUILT_MANIFEST}")):
        if json.loads(manifest.read_text(encoding="utf-8")) != file_hashes(manifest.parent):
            changed.append(manifest.parent.name)
    return changed


@contextmanager
def machine_share(alone: bool) -> Iterator[None]:
    """Run the block sharing the machine with other workers' tests, or ``alone``: writers (alone)
    close the gate first, so a stream of readers cannot starve them."""
    root = run_dir()
    if alone:
        with flocked(root / "machine.gate", fcntl.LOCK_EX), flocked(root / "machine.lock", fcntl.LOCK_EX):
            yield
        return
    with flocked(root / "machine.gate", fcntl.LOCK_SH):
        lock = open(root / "machine.lock", "a")
        fcntl.flock(lock, fcntl.LOCK_SH)
    try:
        yield
    finally:
        fcntl.flock(lock, fcntl.LOCK_UN)
        lock.close()
