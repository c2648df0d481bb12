"""The machinery of the README's results tables (``readme_results.py`` declares them): a row is a label, the
record it comes from (a JSON file under ``bench-results/``) and its cells, small functions of the loaded record with
a format; a table renders its caption, who leads and its rows, each linking its record. A row whose record, or a
field it reads, is missing is a ``RecordError`` naming the row, the record and the key.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

START = "<!-- results: written by benchmarks/readme_results.py from the records it cites; do not edit by hand -->"
END = "<!-- /results -->"
RECORDS = "bench-results"


class RecordError(Exception):
    """A row's record, or a field it reads, is missing: the message names the row, the record and the key."""


class MissingField(KeyError):
    """Nothing at a path (``a.b.0.c``) in a record."""


def dig(record: Any, *keys: str | int) -> Any:
    """``record[k1][k2]...``; a missing key or index raises ``MissingField`` with the whole path."""
    value = record
    for depth, key in enumerate(keys):
        try:
            value = value[key]
        except (KeyError, IndexError, TypeError):
            raise MissingField(".".join(map(str, keys[:depth + 1]))) from None
    return value


def at(*keys: str | int) -> Callable[[dict], Any]:
    """A cell's getter: the field at ``keys`` (``dig``)."""
    return lambda record: dig(record, *keys)


def both(*getters: Callable[[dict], Any]) -> Callable[[dict], tuple]:
    """A cell's getter of several fields at once (a format with as many fields writes them)."""
    return lambda record: tuple(get(record) for get in getters)


@dataclass(frozen=True)
class Cell:
    """One cell of a row: ``get`` reads its value (or a tuple of values) from the loaded record, ``fmt`` writes
    it (``str.format``); an ``optional`` cell whose field the record lacks stays blank."""

    get: Callable[[dict], Any]
    fmt: str = "{}"
    optional: bool = False

    def text(self, value: Any) -> str:
        """``value`` written with ``fmt`` (blank for None)."""
        values = () if value is None else value if isinstance(value, tuple) else (value,)
        return self.fmt.format(*values) if values else ""


@dataclass(frozen=True)
class Row:
    """A table row: its label (first column), its record (a JSON path under ``bench-results/``), its cells."""

    label: str
    record: str
    cells: tuple[Cell, ...]


@dataclass(frozen=True)
class Loaded:
    """A row with its record and its cells' raw values by header."""

    row: Row
    record: dict
    values: dict[str, Any]


@dataclass(frozen=True)
class Table:
    """A results table: title and caption (a paragraph before it), headers (the label's first; the record's is
    added), rows, and ``summary``: who leads, generated with dates and links from the loaded rows (and any
    records it loads itself), appended to the caption."""

    title: str
    caption: str
    header: tuple[str, ...]
    rows: tuple[Row, ...]
    summary: Callable[[Path, list[Loaded]], str] | None = None

    def owner(self, row: Row) -> str:
        """How errors and ``--check`` name ``row``."""
        return f"{self.title}, row {row.label!r} ({RECORDS}/{row.record})"


def load_record(root: Path, name: str, owner: str) -> dict:
    """The JSON record ``root/bench-results/name``; a missing or unreadable one is an error naming ``owner``."""
    try:
        return json.loads((root / RECORDS / name).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RecordError(f"{owner}: no record {RECORDS}/{name}") from None
    except (OSError, ValueError) as exc:
        raise RecordError(f"{owner}: cannot read {RECORDS}/{name}: {exc}") from None


def read(owner: str, name: str, record: dict, get: Callable[[dict], Any]) -> Any:
    """``get(record)``; a missing field is a ``RecordError`` naming ``owner``, the record ``name`` and the key."""
    try:
        return get(record)
    except KeyError as exc:
        key = exc.args[0] if exc.args else "?"
        raise RecordError(f"{owner}: {RECORDS}/{name} has no key {key!r}") from None


def load_row(root: Path, table: Table, row: Row) -> Loaded:
    """``row``'s record and the raw values of its cells (None for a missing optional field)."""
    owner = table.owner(row)
    record = load_record(root, row.record, owner)
    values = {}
    for header, cell in zip(table.header[1:], row.cells, strict=True):
        try:
            values[header] = read(owner, row.record, record, cell.get)
        except RecordError:
            if not cell.optional:
                raise
            values[header] = None
    return Loaded(row, record, values)


def link(root: Path, name: str) -> str:
    """A markdown link (relative to the README) to record ``name``: its markdown table beside it, else the JSON."""
    stem = name.removesuffix(".json")
    target = f"{RECORDS}/{stem}.md" if (root / RECORDS / f"{stem}.md").is_file() else f"{RECORDS}/{name}"
    return f"[{stem}]({target})"


def markdown(root: Path, table: Table, loaded: list[Loaded]) -> str:
    """``table``'s markdown table of the ``loaded`` rows: label, cells, a link to the row's record."""
    from seq2seq.io_utils import markdown_table

    def cells(item: Loaded) -> list[str]:
        return [cell.text(item.values[header]) for header, cell in zip(table.header[1:], item.row.cells)]

    return markdown_table([*table.header, "record"],
                          [[item.row.label, *cells(item), link(root, item.row.record)] for item in loaded])


def render_table(root: Path, table: Table) -> str:
    """``table`` in markdown: its caption and who leads (one paragraph), then the table."""
    loaded = [load_row(root, table, row) for row in table.rows]
    summary = f" {table.summary(root, loaded)}".rstrip() if table.summary else ""
    return f"**{table.title}**: {table.caption}{summary}\n{markdown(root, table, loaded)}"


def render_section(root: Path, tables: tuple[Table, ...]) -> str:
    """The README's results section, both markers included: ``tables`` from the records under ``root``."""
    return "\n".join([START, *(render_table(root, table) + "\n" for table in tables), END])
