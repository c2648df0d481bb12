"""Swap lists: the pairs of group terms (``SwapList``, ``Form``, ``Row``), read from a file of two tab-separated
columns, and the word tokens a swap works on. The format is described in ``seq2seq.jobs.fairness.swaps``."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from ...errors import UserError
from ...io_utils import read_lines

LISTS = Path(__file__).parent / "lists"
TAGS = ("m", "f", "n", "pl")
CASES = ("nom", "acc", "dat", "gen")
TOKEN = re.compile(r"\w+|[^\w\s]")


@dataclass(frozen=True)
class Form:
    """One cell of a swap list: the word, its grammatical gender or number (None: not a noun with
    agreement) and the cases this form is (empty: any)."""

    word: str
    tag: str | None = None
    cases: frozenset[str] = frozenset()

    def allows(self, case: str | None) -> bool:
        return case is None or not self.cases or case in self.cases


@dataclass(frozen=True)
class Row:
    forms: tuple[Form, Form]  # the first group's, the second group's
    line: int


@dataclass
class SwapList:
    """The rows of a swap list, looked up by word (lower case)."""

    language: str
    rows: list[Row]
    groups: tuple[str, str] = ("first", "second")
    path: str = ""
    _index: dict[str, list[tuple[Row, int]]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        for row in self.rows:
            for side, form in enumerate(row.forms):
                self._index.setdefault(form.word.lower(), []).append((row, side))

    @classmethod
    def read(cls, path: str | Path, language: str, flag: str = "--swap-list") -> "SwapList":
        """A swap list file; a line that is not two tab-separated cells, or a cell that is not one word
        with an optional /tag, is a UserError naming the file and line."""
        rows, groups = [], ("first", "second")
        for number, line in enumerate(read_lines(path, flag), 1):
            text = line.strip()
            if text.startswith("# groups:"):
                names = text.removeprefix("# groups:").split()
                if len(names) != 2:
                    raise UserError(f"{flag} {path}, line {number}: '# groups:' names two groups, got {names}")
                groups = (names[0], names[1])
            if not text or text.startswith("#"):
                continue
            cells = line.split("\t")
            if len(cells) != 2 or not all(cell.strip() for cell in cells):
                raise UserError(f"{flag} {path}, line {number}: expected two tab-separated columns (a word of "
                                f"the first group, its counterpart in the second), got {line!r}")
            rows.append(Row((parse_form(cells[0], f"{flag} {path}, line {number}"),
                             parse_form(cells[1], f"{flag} {path}, line {number}")), number))
        if not rows:
            raise UserError(f"{flag} {path}: no word pairs; give lines of two tab-separated words")
        return cls(language, rows, groups, str(path))

    @classmethod
    def shipped(cls, language: str, flag: str = "--src") -> "SwapList":
        path = LISTS / f"{language}.tsv"
        if not path.is_file():
            available = ", ".join(sorted(p.stem for p in LISTS.glob("*.tsv") if len(p.stem) == 2))
            raise UserError(f"{flag} {language}: no swap list is shipped for this language (shipped: {available}); "
                            "give your own with --swap-list FILE (two tab-separated columns)")
        return cls.read(path, language)

    def entries(self, word: str) -> list[tuple[Row, int]]:
        """(row, the group of ``word`` in it) for every row holding ``word``; a capitalized list word (a German
        noun) matches only a capitalized word (Junge, the boy, is not junge, young)."""
        return [(row, side) for row, side in self._index.get(word.lower(), [])
                if word[:1].isupper() or not row.forms[side].word[:1].isupper()]


def parse_form(cell: str, where: str) -> Form:
    word, _, tag = cell.strip().partition("/")
    if not word or len(word.split()) != 1 or not TOKEN.fullmatch(word):
        raise UserError(f"{where}: {cell.strip()!r} is not one word; a cell holds one word and an optional "
                        f"/tag (e.g. Jungen/m.acc.dat)")
    if not tag:
        return Form(word)
    parts = tag.split(".")
    if parts[0] not in TAGS or any(part not in CASES for part in parts[1:]):
        raise UserError(f"{where}: tag {tag!r} of {word!r}: expected one of {', '.join(TAGS)}, then cases "
                        f"({', '.join(CASES)}) joined by dots")
    return Form(word, parts[0], frozenset(parts[1:]))


@dataclass(frozen=True)
class Edit:
    """One change in a sentence: the characters [start, end) of ``old`` become ``new``; ``group`` is the
    group ``old`` belongs to (None for a word changed only to agree: an article, an adjective)."""

    start: int
    end: int
    old: str
    new: str
    group: int | None


@dataclass(frozen=True)
class Token:
    text: str
    start: int
    end: int


def tokens(text: str) -> list[Token]:
    return [Token(m.group(), m.start(), m.end()) for m in TOKEN.finditer(text)]


