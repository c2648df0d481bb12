"""Local corpora: ``{split}.{lang}`` plain-text files (Multi30k layout), TSV and JSONL files.

Files are read as strict UTF-8 by us (not by ``datasets``' text builder) so that a bad byte is
reported with its file and line, and lines are split on ``\\n`` only (``str.splitlines`` would also
split on U+2028 etc. and silently misalign parallel files). A final newline, a UTF-8 BOM and
``\\r`` line endings are accepted.
"""
from __future__ import annotations

import json
import logging
from itertools import chain, zip_longest
from pathlib import Path
from typing import Iterable, Iterator

from datasets import DatasetDict

from ..errors import UserError
from ..io_utils import iter_lines, read_lines, read_parallel
from .schema import SPLIT_FLAGS, empty_pairs, pairs_dataset

log = logging.getLogger(__name__)

DEFAULT_TEXT_SPLITS = {"train": "train", "validation": "val", "test": "test_2016_flickr"}
TSV_SUFFIXES = (".tsv", ".tab")
JSONL_SUFFIXES = (".jsonl", ".ndjson")


def parallel_line_pairs(src_path: str, tgt_path: str) -> Iterator[dict]:
    """``{"src", "tgt"}`` of each line of two parallel files, lazily; UserError if their lengths differ."""
    pairs = zip_longest(iter_lines(Path(src_path)), iter_lines(Path(tgt_path)))
    for number, (source, target) in enumerate(pairs, start=1):
        if source is None or target is None:
            shorter = src_path if source is None else tgt_path
            raise UserError(f"{shorter} ends at line {number - 1} but its parallel file goes on; parallel "
                            "files need exactly one sentence per line, aligned line by line")
        yield {"src": source, "tgt": target}


def table_pairs(path: str, src: str, tgt: str, flag: str = "--train-file") -> Iterator[dict]:
    """``{"src", "tgt"}`` of each row of a TSV or JSONL file, lazily."""
    for source, target in iter_table(Path(path), src, tgt, flag):
        yield {"src": source, "tgt": target}


def _listing(directory: Path, limit: int = 30) -> str:
    names = sorted(p.name for p in directory.iterdir() if p.is_file())
    if not names:
        return "(no files)"
    return ", ".join(names[:limit]) + (f", ... ({len(names)} files)" if len(names) > limit else "")


def load_text_dir(
    data_dir: str | Path, src: str, tgt: str, splits: dict[str, str] | None = None, skip_train: bool = False
) -> DatasetDict:
    """Read ``{stem}.{src}`` / ``{stem}.{tgt}`` for each split; ``splits`` maps split -> file stem
    (keys not given keep ``DEFAULT_TEXT_SPLITS``: train, val, test_2016_flickr).

    The train files are required. A validation or test split whose two files are both absent is
    left empty (with a warning); one file without the other is an error. ``skip_train`` leaves the
    train split empty (streaming reads it separately) but still checks that its files exist.
    """
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        raise UserError(f"--data-dir {data_dir}: no such directory")
    if src == tgt:
        raise UserError(f"--src and --tgt are both {src!r}; give the two language codes (file suffixes)")
    splits = {**DEFAULT_TEXT_SPLITS, **(splits or {})}
    out = {}
    for split, stem in splits.items():
        paths = (data_dir / f"{stem}.{src}", data_dir / f"{stem}.{tgt}")
        missing = [p for p in paths if not p.is_file()]
        if len(missing) == 2 and split != "train":
            log.warning("data: no %s or %s in %s; the %s split is empty", paths[0].name, paths[1].name,
                        data_dir, split)
            out[split] = empty_pairs()
            continue
        if missing:
            raise UserError(
                f"--data-dir: {missing[0]}: no such file (the {split} split needs {paths[0].name} and "
                f"{paths[1].name}). Files in {data_dir}: {_listing(data_dir)}. "
                f"Fix --src/--tgt or {SPLIT_FLAGS[split]} to match the file names."
            )
        if skip_train and split == "train":
            out[split] = empty_pairs()
            continue
        src_lines, tgt_lines = read_parallel(paths[0], paths[1], "", "", allow_empty=True)
        out[split] = pairs_dataset(src_lines, tgt_lines)
    return DatasetDict(out)


def load_table_files(
    train_file: str | Path,
    valid_file: str | Path | None = None,
    test_file: str | Path | None = None,
    src: str = "src",
    tgt: str = "tgt",
    skip_train: bool = False,
) -> DatasetDict:
    """Read TSV (``.tsv``/``.tab``) or JSONL (``.jsonl``/``.ndjson``) files; absent valid/test -> empty.
    ``skip_train`` leaves the train split empty (streaming reads it separately)."""
    files = {"train": (train_file, "--train-file"), "validation": (valid_file, "--valid-file"),
             "test": (test_file, "--test-file")}
    out = {}
    for split, (path, flag) in files.items():
        if path is None or str(path) == "":
            if split == "train":
                raise UserError("--train-file is required (a .tsv or .jsonl file of sentence pairs)")
            out[split] = empty_pairs()
            continue
        if skip_train and split == "train":
            table_format(Path(path), flag)  # fail early on a wrong suffix
            out[split] = empty_pairs()
            continue
        out[split] = pairs_dataset(*read_table(Path(path), src, tgt, flag))
    return DatasetDict(out)


def table_format(path: Path, flag: str = "") -> str:
    """'tsv' or 'jsonl', from the file suffix."""
    suffix = path.suffix.lower()
    if suffix in TSV_SUFFIXES:
        return "tsv"
    if suffix in JSONL_SUFFIXES:
        return "jsonl"
    raise UserError(f"{flag} {path}: unknown format {suffix or '(no suffix)'!r}; use a "
                    f"{'/'.join(TSV_SUFFIXES)} file (src<TAB>tgt) or a {'/'.join(JSONL_SUFFIXES)} file")


def read_table(path: Path, src: str, tgt: str, flag: str = "") -> tuple[list[str], list[str]]:
    """Source and target columns of one TSV or JSONL file, chosen by its suffix."""
    table_format(path, flag)
    sources, targets = [], []
    for source, target in table_rows(read_lines(path, flag), path, src, tgt, flag):
        sources.append(source)
        targets.append(target)
    return sources, targets


def iter_table(path: Path, src: str, tgt: str, flag: str = "") -> Iterator[tuple[str, str]]:
    """``read_table`` one pair at a time (constant memory)."""
    table_format(path, flag)
    return table_rows(iter_lines(path, flag), path, src, tgt, flag)


def table_rows(lines: Iterable[str], path: Path, src: str, tgt: str, flag: str) -> Iterator[tuple[str, str]]:
    """(source, target) of each non-blank line of a TSV or JSONL file, by the file's suffix."""
    rows = _tsv_rows if table_format(path, flag) == "tsv" else _jsonl_rows
    return rows(iter(lines), path, src, tgt, flag)


def _tsv_rows(lines: Iterator[str], path: Path, src: str, tgt: str, flag: str) -> Iterator[tuple[str, str]]:
    """Two columns src<TAB>tgt, or any columns under a header row naming ``src``/``tgt`` (or the
    language codes). Blank lines are skipped; a tab inside a sentence is an error."""
    first_line = next(lines, None)
    header = first_line.split("\t") if first_line is not None else []
    names = next(((s, t) for s, t in ((src, tgt), ("src", "tgt")) if s in header and t in header), None)
    if names:
        i_src, i_tgt, width, first = header.index(names[0]), header.index(names[1]), len(header), 1
    else:
        i_src, i_tgt, width, first = 0, 1, 2, 0
        lines = chain([first_line] if first_line is not None else [], lines)
    for number, line in enumerate(lines, start=first + 1):
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) != width:
            layout = "the header" if names else f"'{src}<TAB>{tgt}'"
            raise UserError(f"{flag} {path}, line {number}: found {len(fields)} tab-separated columns, "
                            f"expected {width} as in {layout}; sentences must not contain tabs")
        yield fields[i_src], fields[i_tgt]


def _jsonl_rows(lines: Iterator[str], path: Path, src: str, tgt: str, flag: str) -> Iterator[tuple[str, str]]:
    """One JSON object per line with keys src/tgt or the language codes, or WMT style
    ``{"translation": {lang: text}}``. Blank lines are skipped."""
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{flag} {path}, line {number}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UserError(f"{where}: invalid JSON ({exc.msg} at column {exc.colno})") from None
        if isinstance(obj, dict) and isinstance(obj.get("translation"), dict):
            obj = obj["translation"]
        if not isinstance(obj, dict):
            raise UserError(f"{where}: expected a JSON object like {{\"{src}\": ..., \"{tgt}\": ...}}")
        pair = []
        for lang, generic in ((src, "src"), (tgt, "tgt")):
            key = lang if lang in obj else generic
            if key not in obj:
                raise UserError(f"{where}: no key {lang!r} or {generic!r}; keys found: "
                                f"{', '.join(map(str, obj)) or '(none)'} (fix --src/--tgt)")
            if not isinstance(obj[key], str):
                raise UserError(f"{where}: value of {key!r} must be a string, got {type(obj[key]).__name__}")
            pair.append(obj[key])
        yield pair[0], pair[1]
