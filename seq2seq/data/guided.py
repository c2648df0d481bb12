"""Guided alignment data: one Pharaoh line per training pair, carried through cleaning and the cache.

The lines of ``--guided-alignment FILE`` are attached to the raw training split as two columns before
cleaning: ``align`` (the line's text) and ``align_line`` (its 1-based number in the file). A pair
that cleaning drops therefore drops its line with it, and every kept pair keeps the line it came
with and its number (for errors that name the file and line). The encoded corpus keeps both
columns, and the file's content hash is part of the cache key (``prepare.cache_key``), so a cached
corpus never pairs sentences with another file's links. Parsing the lines and mapping word links
to subword pieces happen above this layer (``seq2seq.alignment.guided``).
"""
from __future__ import annotations

import hashlib
from pathlib import Path

from datasets import Dataset

from ..errors import UserError
from ..io_utils import counted, read_lines

FLAG = "--guided-alignment"



def attach_alignment_lines(train: Dataset, path: str | Path) -> Dataset:
    """``train`` (raw, before cleaning) with columns ``align`` and ``align_line`` from ``path``:
    line N belongs to training pair N; a different number of lines is a named error."""
    lines = read_lines(path, FLAG)
    if len(lines) != len(train):
        raise UserError(
            f"{FLAG} {path} has {counted(len(lines), 'line')} but the training data has "
            f"{counted(len(train), 'sentence pair')} "
            "(counted before cleaning); give one Pharaoh line of word links per training pair, in the order "
            "of the training data (an empty line for a pair without links), e.g. as seq2seq wordalign writes "
            f"them for the training files, or use {FLAG} eflomal")
    return train.add_column("align", lines).add_column("align_line", list(range(1, len(lines) + 1)))


def alignment_fingerprint(path: str | Path) -> str:
    """sha256 of the alignment file's bytes (part of the corpus cache key)."""
    digest = hashlib.sha256()
    try:
        with Path(path).open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    except FileNotFoundError:
        raise UserError(f"{FLAG} {path}: no such file") from None
    except OSError as exc:
        raise UserError(f"{FLAG} {path}: cannot read ({exc.strerror or exc})") from None
    return digest.hexdigest()
