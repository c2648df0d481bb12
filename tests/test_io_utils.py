"""The one atomic writer: all or nothing, and the permissions a plain open() would give; a count with its noun."""
from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from conftest import run_main

from seq2seq.errors import UserError
from seq2seq.io_utils import atomic_output, atomic_write_bytes, counted, current_umask
from seq2seq.metrics import corpus_scores

PRE_TIERS = Path(__file__).parent / "data" / "pre-tiers"  # checkpoints committed with the tests


@pytest.fixture
def umask():
    """Set the process umask for one test (restored afterwards)."""
    previous = os.umask(0o022)
    os.umask(previous)
    yield lambda mask: os.umask(mask)
    os.umask(previous)


@pytest.mark.parametrize("mask, expected", [(0o022, 0o644), (0o002, 0o664), (0o077, 0o600), (0o027, 0o640)])
def test_atomic_files_get_the_permissions_of_a_plain_open(tmp_path, umask, mask, expected):
    umask(mask)
    assert current_umask() == mask and current_umask() == mask  # reading it leaves it unchanged
    with atomic_output(tmp_path / "text.txt") as handle:
        handle.write("hello\n")
    atomic_write_bytes(tmp_path / "data.bin", b"\x00\x01")
    with open(tmp_path / "plain.txt", "w") as handle:  # the reference
        handle.write("x")
    for name in ("text.txt", "data.bin", "plain.txt"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == expected, name


def test_a_failed_block_leaves_neither_the_file_nor_a_temp(tmp_path):
    target = tmp_path / "out.txt"
    target.write_text("old\n")
    with pytest.raises(RuntimeError):
        with atomic_output(target) as handle:
            handle.write("new, half")
            raise RuntimeError("boom")
    assert target.read_text() == "old\n"  # the previous content is untouched
    assert [p.name for p in tmp_path.iterdir()] == ["out.txt"]


def test_a_count_of_one_takes_the_singular(tmp_path):
    """``counted`` and the messages that use it: "has 1 line", never "has 1 lines"."""
    assert [counted(n, "line") for n in (0, 1, 2, 12000)] == ["0 lines", "1 line", "2 lines", "12,000 lines"]
    assert [counted(n, "hypothesis", "hypotheses") for n in (1, 3)] == ["1 hypothesis", "3 hypotheses"]
    with pytest.raises(UserError, match=r"^1 hypothesis but 2 references: "):
        corpus_scores(["a"], ["a", "b"])
    source, target = tmp_path / "one.de", tmp_path / "two.en"
    source.write_text("eins\n", encoding="utf-8")
    target.write_text("one\ntwo\n", encoding="utf-8")
    code, _, err = run_main(["shortlist", "--checkpoint", str(PRE_TIERS / "rnn.pt"), "--source", str(source),
                             "--target", str(target), "--output", str(tmp_path / "shortlist.npz")])
    assert code == 2 and f"--source {source} has 1 line but --target {target} has 2;" in err
