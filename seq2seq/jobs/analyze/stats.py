"""The numbers of the corpus analysis: row statistics of attention, source-piece classes, and their
corpus-level accumulation per layer and head.

An attention matrix ``a`` is ``(..., T, S)``: a row per target position (subwords + EOS), a column
per source position (subwords + the source EOS), each row a distribution. For one row a = (a_1..a_S):

* entropy            H(a) = -sum_j a_j log a_j (nats): log S for uniform attention, 0 for one-hot;
* normalized entropy H(a) / log S, in [0, 1] (0 when S = 1), comparable across sentence lengths;
* top-1 share        max_j a_j, the mass on the row's most attended source position;
* Gini               G(a) = sum_k (2k - S - 1) a_(k) / ((S - 1) sum_j a_j), a_(1) <= ... <= a_(S):
                     the Gini coefficient scaled by S / (S - 1), so 0 for uniform and 1 for one-hot
                     attention at any length (0 when S = 1);
* diagonal distance  D_i = sum_j a_ij |(j + 1/2) / S - (i + 1/2) / T| for row i of T: the expected
                     distance from the diagonal, positions scaled to [0, 1] (cell centres, EOS
                     included on both sides). 0 for a monotone one-to-one alignment of equal
                     lengths (the identity), about 1/3 for uniform attention on a square;
* class share        sum_{j in c} a_j for each source-piece class c (``piece_classes``).

Corpus figures are means over every target row of every sentence (token-weighted), kept per
layer and head by ``RowStatistics``.
"""
from __future__ import annotations

import unicodedata
from collections import Counter
from dataclasses import dataclass, field
from typing import Iterable, Sequence

import numpy as np

from ...config import AlignConfig
from ...io_utils import counted
from ...alignment.links import alignment_error_rate, extract_links
from ...alignment.matrices import EOS, WORD_START, word_spans, words_from_pieces

CLASSES = ("eos", "punctuation", "number", "function", "other")
ROW_STATISTICS = ("entropy", "normalized_entropy", "top1_share", "gini", "diagonal_distance")


# ----------------------------------------------------------------------------- rows


def entropy(a: np.ndarray) -> np.ndarray:
    """H(a) = -sum_j a_j log a_j over the last axis (0 log 0 = 0): (..., S) -> (...)."""
    a = np.asarray(a, dtype=np.float64)
    logs = np.log(np.where(a > 0, a, 1.0))
    return -(a * logs).sum(-1)


def normalized_entropy(a: np.ndarray) -> np.ndarray:
    """H(a) / log S, 0 when S = 1: (..., S) -> (...)."""
    size = np.asarray(a).shape[-1]
    return entropy(a) / np.log(size) if size > 1 else np.zeros(np.asarray(a).shape[:-1])


def gini(a: np.ndarray) -> np.ndarray:
    """Gini coefficient scaled to [0, 1] (see the module docstring): (..., S) -> (...)."""
    a = np.sort(np.asarray(a, dtype=np.float64), axis=-1)
    size = a.shape[-1]
    if size < 2:
        return np.zeros(a.shape[:-1])
    weights = 2 * np.arange(1, size + 1) - size - 1  # (S,)
    total = a.sum(-1)
    return np.divide((a * weights).sum(-1), (size - 1) * total, out=np.zeros_like(total), where=total > 0)


def diagonal_distance(a: np.ndarray) -> np.ndarray:
    """D_i = sum_j a_ij |(j + 1/2)/S - (i + 1/2)/T| per row: (..., T, S) -> (..., T)."""
    a = np.asarray(a, dtype=np.float64)
    rows, cols = a.shape[-2:]
    offset = np.abs((np.arange(cols) + 0.5) / cols - ((np.arange(rows) + 0.5) / rows)[:, None])  # (T, S)
    return (a * offset).sum(-1)


def row_statistics(a: np.ndarray) -> dict[str, np.ndarray]:
    """Every row statistic of ``ROW_STATISTICS`` for (..., T, S) -> (..., T) each."""
    a = np.asarray(a, dtype=np.float64)
    return {"entropy": entropy(a), "normalized_entropy": normalized_entropy(a), "top1_share": a.max(-1),
            "gini": gini(a), "diagonal_distance": diagonal_distance(a)}


# ----------------------------------------------------------------------------- classes


def is_punctuation(text: str) -> bool:
    """Non-empty and every character is Unicode punctuation (P*) or a symbol (S*)."""
    return bool(text) and all(unicodedata.category(ch)[0] in "PS" for ch in text)


def is_number(text: str) -> bool:
    """A digit and otherwise only digits and punctuation ("7", "12,50", "1990.")."""
    return any(ch.isdigit() for ch in text) and all(ch.isdigit() or is_punctuation(ch) for ch in text)


def normalize_word(word: str) -> str:
    """Lowercased, leading and trailing punctuation removed: the key of the function-word list."""
    start, end = 0, len(word)
    while start < end and is_punctuation(word[start]):
        start += 1
    while end > start and is_punctuation(word[end - 1]):
        end -= 1
    return word[start:end].lower()


def function_words(sources: Iterable[str], count: int) -> list[str]:
    """The ``count`` most frequent source words (whitespace tokens through ``normalize_word``;
    numbers and pure punctuation left out), most frequent first, ties in order of appearance:
    a tagger-free stand-in for function words (articles, prepositions, conjunctions, pronouns),
    which dominate the top of any frequency list (Zipf)."""
    counts: Counter[str] = Counter()
    for line in sources:
        counts.update(w for w in map(normalize_word, line.split()) if w and not is_number(w))
    return [word for word, _ in counts.most_common(count)] if count > 0 else []


def word_class(word: str, functional: frozenset[str] | set[str]) -> str:
    """Class of a source word: eos, punctuation, number, function (in ``functional``) or other."""
    if word == EOS:
        return "eos"
    if is_punctuation(word):
        return "punctuation"
    if is_number(word):
        return "number"
    return "function" if normalize_word(word) in functional else "other"


def piece_classes(pieces: Sequence[str], functional: frozenset[str] | set[str]) -> np.ndarray:
    """Class index (into ``CLASSES``) of every source piece (``</s>`` included): eos for the EOS
    piece; punctuation or number when the piece's own text (without '▁') is; else function or
    other by the word the piece belongs to (``word_spans``). So "Hund." is the word "Hund" (its
    class) plus a punctuation piece "."."""
    classes = np.empty(len(pieces), dtype=np.int64)
    words = words_from_pieces(pieces)
    for (start, end), word in zip(word_spans(pieces), words):
        whole = word_class(word, functional)
        for k in range(start, end):
            text = pieces[k].replace(WORD_START, "")
            if pieces[k] == EOS:
                name = "eos"
            elif is_punctuation(text):
                name = "punctuation"
            elif is_number(text):
                name = "number"
            else:  # a piece with letters (or a lone '▁'): the class of its word
                name = whole
            classes[k] = CLASSES.index(name)
    return classes


# ----------------------------------------------------------------------------- accumulation


@dataclass
class RowStatistics:
    """Sums of the row statistics and class shares over target rows, per (layer, head); ``means``
    gives the corpus means. Feed one sentence's (L, H, T, S) attention at a time."""

    layers: int
    heads: int
    sums: dict[str, np.ndarray] = field(default_factory=dict)
    rows: int = 0

    def add(self, attention: np.ndarray, classes: np.ndarray) -> None:
        """attention (L, H, T, S); classes (S,) indices into ``CLASSES``."""
        a = np.asarray(attention, dtype=np.float64)
        if a.shape[:2] != (self.layers, self.heads) or a.shape[-1] != len(classes):
            raise ValueError(f"attention {a.shape} does not fit {counted(self.layers, 'layer')} x "
                             f"{counted(self.heads, 'head')} and {counted(len(classes), 'source piece')}")
        values = {name: v.sum(-1) for name, v in row_statistics(a).items()}  # (L, H) each
        one_hot = np.eye(len(CLASSES))[classes]  # (S, C)
        shares = (a @ one_hot).sum(-2)  # (L, H, C)
        values.update({f"{name}_share": shares[..., c] for c, name in enumerate(CLASSES)})
        for name, value in values.items():
            self.sums[name] = self.sums.get(name, 0.0) + value
        self.rows += a.shape[-2]

    def means(self) -> dict[str, np.ndarray]:
        """name -> (L, H) corpus mean per target row (empty before the first ``add``)."""
        return {name: total / self.rows for name, total in self.sums.items()} if self.rows else {}


@dataclass
class SourceMass:
    """Where the attention mass goes over a corpus: per class (attention share against the share
    of source pieces in that class) and per source word (mass = sum over target rows of the
    attention on the word's pieces, i.e. how many target positions' worth of attention it gets)."""

    class_mass: np.ndarray = field(default_factory=lambda: np.zeros(len(CLASSES)))
    class_pieces: np.ndarray = field(default_factory=lambda: np.zeros(len(CLASSES)))
    word_mass: Counter = field(default_factory=Counter)
    word_count: Counter = field(default_factory=Counter)
    word_classes: dict[str, str] = field(default_factory=dict)

    def add(self, matrix: np.ndarray, pieces: Sequence[str], classes: np.ndarray,
            functional: frozenset[str] | set[str]) -> None:
        """matrix (T, S) one sentence's attention; pieces / classes label its S columns."""
        column = np.asarray(matrix, dtype=np.float64).sum(0)  # (S,) mass per source piece
        self.class_mass += np.bincount(classes, weights=column, minlength=len(CLASSES))
        self.class_pieces += np.bincount(classes, minlength=len(CLASSES))
        for (start, end), word in zip(word_spans(pieces), words_from_pieces(pieces)):
            self.word_mass[word] += float(column[start:end].sum())
            self.word_count[word] += 1
            self.word_classes.setdefault(word, word_class(word, functional))

    def classes(self) -> dict[str, dict[str, float | None]]:
        """class -> attention share, share of source pieces, and their ratio (> 1: attracts
        more attention than its frequency; None when the class has no pieces)."""
        mass, pieces = self.class_mass / max(self.class_mass.sum(), 1e-300), self.class_pieces / max(
            self.class_pieces.sum(), 1)
        return {name: {"attention_share": float(mass[c]), "token_share": float(pieces[c]),
                       "ratio": float(mass[c] / pieces[c]) if pieces[c] > 0 else None}
                for c, name in enumerate(CLASSES)}

    def top_words(self, count: int) -> list[dict[str, object]]:
        """The ``count`` words with the most total mass (ties: earlier seen first)."""
        total = sum(self.word_mass.values()) or 1.0
        ranked = sorted(self.word_mass, key=lambda w: -self.word_mass[w])[:count]
        return [{"word": w, "class": self.word_classes[w], "mass_share": self.word_mass[w] / total,
                 "occurrences": self.word_count[w], "mass_per_occurrence": self.word_mass[w] / self.word_count[w]}
                for w in ranked]


def head_aer(word_attention: Sequence[np.ndarray], sure: Sequence[set], possible: Sequence[set],
             method: str = AlignConfig.method, threshold: float | None = AlignConfig.threshold) -> np.ndarray:
    """AER (Och & Ney 2003, ``alignment_error_rate``) of every (layer, head)'s hard links
    (``extract_links`` by ``method``) against gold sure / possible links, from one word-level
    (L, H, Tw, Sw) array per sentence (EOS dropped) -> (L, H)."""
    if not word_attention:
        raise ValueError("head_aer needs at least one sentence")
    layers, heads = np.asarray(word_attention[0]).shape[:2]
    aer = np.zeros((layers, heads))
    for layer in range(layers):
        for head in range(heads):
            links = [extract_links(np.asarray(w)[layer, head], method, threshold) for w in word_attention]
            aer[layer, head] = alignment_error_rate(links, sure, possible).aer
    return aer
