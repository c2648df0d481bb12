"""Shared fixtures: a tiny parallel corpus and a SentencePiece model trained on it (fast)."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

from seq2seq.tokenizer import Tokenizer
from seq2seq.toy import toy_corpus

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))  # the benchmark scripts

import run_shared  # noqa: E402  (tests/ is on sys.path: pytest's rootdir-relative conftest import)

# Subprocesses of a test (training, serving, benchmarks) use one thread like the tests themselves:
# with a worker per core (pytest -n auto) more threads only fight each other for the cores.
os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = "1"


def pytest_configure(config):
    """One directory per run, shared by the xdist workers and every subprocess (tests/run_shared.py):
    built-once fixtures, this run's torch.compile cache, the machine lock. Made by the first process
    (the controller, or a lone pytest), which removes it at the end; a nested pytest reuses it."""
    if os.environ.get(run_shared.RUN_DIR_ENV) is None:
        config._seq2seq_run_dir = run_shared.make_run_dir()
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(run_shared.run_dir() / "inductor")


def pytest_unconfigure(config):
    made = getattr(config, "_seq2seq_run_dir", None)
    if made is not None:
        import shutil

        shutil.rmtree(made, ignore_errors=True)
        del os.environ[run_shared.RUN_DIR_ENV]


def pytest_collection_modifyitems(config, items):
    """Tests marked ``serial`` first, then those marked ``slow``, then the rest, each group in file
    order. Under ``pytest -n`` a serial test waits for the test running on every other worker, so it
    should meet short ones; long tests started early leave short ones to balance the workers at the
    end. (The order is also a check that no test depends on running after another.)"""
    def group(item) -> int:
        return 0 if item.get_closest_marker("serial") else 1 if item.get_closest_marker("slow") else 2

    items[:] = sorted(items, key=group)  # stable: file order within a group


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """With several workers, a test marked ``serial`` runs while no other test does."""
    workers = getattr(item.config, "workerinput", {}).get("workercount", 1)  # a nested pytest has none
    if workers < 2:
        yield
        return
    with run_shared.machine_share(alone=item.get_closest_marker("serial") is not None):
        yield


@pytest.fixture(autouse=True, scope="session")
def _built_fixtures_stay_unchanged():
    """A test that writes into a shared built fixture fails the run (copy it first)."""
    yield
    changed = run_shared.changed_artifacts()
    assert not changed, f"tests modified these shared fixtures (copy one before writing into it): {changed}"

TINY_TEXTS = [
    "Zwei junge weiße Männer sind im Freien in der Nähe vieler Büsche.",
    "Two young, white males are outside near many bushes.",
    "Ein Mädchen (7 Jahre alt) läuft über die Straße!",
    "A girl (7 years old) runs across the street!",
    "Größere Hunde spielen am Fluss; 3 Kinder schauen zu.",
    "Bigger dogs play by the river; 3 children watch.",
    "Der Preis beträgt 12,50 Euro – oder 15 Dollar?",
    "The price is 12.50 euros - or 15 dollars?",
]


@pytest.fixture(scope="session")
def toy_dd():
    """A small toy corpus (English -> German number words)."""
    return toy_corpus(n_train=300, n_valid=20, n_test=20, seed=3)


@pytest.fixture(scope="session")
def tiny_tokenizer(toy_dd) -> Tokenizer:
    """A joint model over the toy corpus plus a few German/English sentences."""
    texts = list(toy_dd["train"]["src"]) + list(toy_dd["train"]["tgt"]) + TINY_TEXTS * 5
    return Tokenizer.train(texts, vocab_size=200, model_type="unigram")


@pytest.fixture(scope="module")
def batch():
    """Six reversal-task sources of 1-6 symbols (+ EOS), padded: (src, mask) for the search tests."""
    from test_models import reverse_batch

    src, mask, _, _ = reverse_batch(6, torch.Generator().manual_seed(7), 1, 6)
    return src, mask


REAL_CUDA_AVAILABLE = torch.cuda.is_available
VISIBLE_DEVICES = os.environ.get("CUDA_VISIBLE_DEVICES")  # as the suite was started


def _hide_cuda(patch: pytest.MonkeyPatch) -> None:
    patch.setattr(torch.cuda, "is_available", lambda: False)
    patch.setenv("CUDA_VISIBLE_DEVICES", "")  # for subprocesses


@pytest.fixture(autouse=True, scope="module")
def _cpu_unless_marked_cuda(request):
    """On a machine with a GPU, every test not marked ``cuda`` runs as on one without: ``device auto``
    and the GPU defaults (batch sizes, bf16, the compiled step) would otherwise change what it tests
    and how long it takes. Module-wide (module-scoped fixtures train too), unless the module is marked
    ``cuda`` (test_cuda.py, the CPU tests of the GPU paths); ``_cuda_for_marked_tests`` shows the GPU
    again to a test marked on its own. Subprocesses inherit an empty ``CUDA_VISIBLE_DEVICES``."""
    if request.node.get_closest_marker("cuda") is not None or not REAL_CUDA_AVAILABLE():
        yield
        return
    with pytest.MonkeyPatch.context() as patch:
        _hide_cuda(patch)
        yield


@pytest.fixture(autouse=True)
def _cuda_for_marked_tests(request, monkeypatch):
    if request.node.get_closest_marker("cuda") is not None and REAL_CUDA_AVAILABLE():
        monkeypatch.setattr(torch.cuda, "is_available", REAL_CUDA_AVAILABLE)
        if VISIBLE_DEVICES is None:
            monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
        else:
            monkeypatch.setenv("CUDA_VISIBLE_DEVICES", VISIBLE_DEVICES)


@pytest.fixture(autouse=True, scope="session")
def _one_thread():
    """Tests use tiny tensors: one thread is fastest and does not fight other processes for cores."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def run_main(argv: list[str], stdin: str = "", monkeypatch=None) -> tuple[int, str, str]:
    """``seq2seq ARGV`` in this process (no Python + torch start-up): exit status, stdout, stderr.
    argparse's usage errors exit via SystemExit: its code is the status. For the real start-up and
    traceback behaviour keep one subprocess test per command."""
    import contextlib
    import io
    import sys

    from seq2seq.cli import main

    out, err = io.StringIO(), io.StringIO()
    stream = io.TextIOWrapper(io.BytesIO(stdin.encode("utf-8")), encoding="utf-8")
    saved = sys.stdin
    sys.stdin = stream
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(argv)
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
    finally:
        sys.stdin = saved
    return code, out.getvalue(), err.getvalue()


def interrupt_at(monkeypatch, call: int) -> None:
    """The ``call``-th training step (counted from now) raises KeyboardInterrupt, as Ctrl-C would; the
    trainer then writes a resumable ``last.pt``. ``monkeypatch.undo()`` restores the real step."""
    from seq2seq.training.trainer import Trainer

    original, calls = Trainer.train_step, {"n": 0}

    def step(self, group):
        calls["n"] += 1
        if calls["n"] == call:
            raise KeyboardInterrupt
        return original(self, group)

    monkeypatch.setattr(Trainer, "train_step", step)
