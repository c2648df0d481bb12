"""The one atomic writer: all or nothing, and the permissions a plain open() would give."""
from __future__ import annotations

import os
import stat

import pytest

from seq2seq.io_utils import atomic_output, atomic_write_bytes, current_umask


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
