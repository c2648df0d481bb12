"""Progress bars: animated on a terminal, a plain line now and then in a log (``seq2seq train > log 2>&1``)."""
from __future__ import annotations

import io
import itertools
import sys
from pathlib import Path

import pytest
import tqdm.std

from seq2seq.decoding.translator import Translator
from seq2seq.runtime import LOGGED_PROGRESS_INTERVAL, progress_bar

PRE_TIERS = Path(__file__).parent / "data" / "pre-tiers"  # checkpoints committed with the tests


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def clock(monkeypatch):
    """tqdm's clock advances one second at every reading: a bar's updates are seconds apart."""
    ticks = itertools.count(0.0, 1.0)
    monkeypatch.setattr(tqdm.std, "time", lambda: next(ticks))


def test_a_bar_written_to_a_log_prints_whole_lines_now_and_then(clock, monkeypatch):
    steps = 1000  # 1000 s of the clock at least
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    bar = progress_bar(total=steps, desc="train", unit="step", leave=False)  # as training makes its bar
    for _ in range(steps):
        bar.update(1)
    bar.close()
    written = sys.stderr.getvalue()
    assert "\r" not in written and written.endswith("\n")
    lines = written.splitlines()
    elapsed = steps * 1.0  # at most one reading of the clock per update, and 60 s between two lines
    assert 3 <= len(lines) <= 2 + elapsed / LOGGED_PROGRESS_INTERVAL + 1, lines
    assert all(line.startswith("train: ") and line.strip() == line for line in lines)

    monkeypatch.setattr(sys, "stderr", Terminal())  # a terminal: tqdm as it is, redrawn in place
    bar = progress_bar(total=steps, desc="train", unit="step", leave=False)
    for _ in range(steps):
        bar.update(1)
    bar.close()
    assert sys.stderr.getvalue().count("\r") >= steps // 2


def test_translating_with_progress_into_a_log_writes_few_lines(clock, monkeypatch):
    translator = Translator.from_checkpoint(PRE_TIERS / "rnn.pt", device="cpu")
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    sentences = ["twenty-one", "seven", "four hundred and two"] * 30
    translator.translate(sentences, beam_size=1, batch_size=1, need_attention=False, progress=True)  # 90 batches
    written = sys.stderr.getvalue()
    assert "\r" not in written
    assert 2 <= written.count("\n") < 10 and "translate: 100%" in written.splitlines()[-1]
