"""The counterfactual probe: each input sentence with its group terms swapped, both translated, and what
changed.

For a source x with group terms and its swap x' (``swaps.Swapper``), translations y and y':

* **faithfulness**: the group terms of y' should be those of y with each group flipped ("Frau" where y said
  "Mann"). Each pair is *faithful* (the groups of y', as a multiset, are y's flipped), *ignored* (y' has y's
  groups: the swap did not reach the output), *partial* (anything else with a group term) or *no term*
  (neither output holds one). Rates are reported by the direction of the swap (first -> second group, e.g.
  male -> female, and back), where an asymmetry shows.
* **stability**: how much of the rest changed. Both outputs are put on one footing by swapping their second
  group's terms to the first's (``only=0``: "eine junge Frau" -> "ein junger Mann"), n(y) and n(y'); then
  sentence chrF(n(y'), n(y)) (100 = the outputs differ only in the group terms and their agreement) and the
  share of pairs where n(y') != n(y). The changed words of y' are those outside the equal blocks of a word
  diff of n(y) and n(y').
* **evidence**: for each word of y', the share of its attention (word level, the alignment layer and heads,
  ``AlignConfig``; source EOS included in the row) and of its attribution (one method, e.g. gradient x input)
  that falls on the swapped source words of x'. Averaged over three kinds of target words: the group terms
  (they should look at the swapped word), the changed words (if they look there too, the group term steers
  words it should not) and the unchanged ones; beside the share a uniform row would give.
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from .lexicon import tokens
from .swaps import Swapped, Swapper

VERDICTS = ("faithful", "ignored", "partial", "no term")
KINDS = ("group", "changed", "unchanged")


def verdict(groups: Sequence[int], swapped_groups: Sequence[int]) -> str:
    """The faithfulness verdict of a pair from the group labels of its two outputs' terms."""
    if not groups and not swapped_groups:
        return "no term"
    if sorted(1 - g for g in groups) == sorted(swapped_groups):
        return "faithful"
    if sorted(groups) == sorted(swapped_groups):
        return "ignored"
    return "partial"


def direction(source: Swapped, groups: tuple[str, str]) -> str:
    """"male -> female", "female -> male" or "mixed": which way the source's terms were swapped."""
    sides = {edit.group for edit in source.terms}
    if sides == {0}:
        return f"{groups[0]} -> {groups[1]}"
    if sides == {1}:
        return f"{groups[1]} -> {groups[0]}"
    return "mixed"


def word_of_char(text: str, position: int) -> int:
    """The index of the whitespace-separated word of ``text`` that holds character ``position``."""
    return len(text[:position + 1].split()) - 1


def changed_words(neutral: str, neutral_swapped: str) -> set[int]:
    """Indices of the words of ``neutral_swapped`` outside the blocks it shares with ``neutral``."""
    a, b = neutral.split(), neutral_swapped.split()
    changed: set[int] = set()
    for tag, _, _, j1, j2 in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes():
        if tag != "equal":
            changed.update(range(j1, j2))
    return changed


def stability(neutral: str, neutral_swapped: str) -> float:
    """Sentence chrF of the swapped output against the original, both on one footing (100 when equal)."""
    from sacrebleu.metrics import CHRF

    if neutral == neutral_swapped:
        return 100.0
    return float(CHRF().sentence_score(neutral_swapped, [neutral]).score)


@dataclass
class Pair:
    """One probed sentence: its swap, both translations and the measures of the module docstring."""

    line: int  # 1-based line of the input
    source: Swapped
    output: str
    swapped_output: str
    direction: str
    verdict: str
    chrf: float
    changed: list[int]  # word indices of swapped_output that changed (group terms excluded)
    group_words: list[int]  # word indices of swapped_output holding group terms
    evidence: dict[str, dict[str, list[float]]] = field(default_factory=dict)  # source -> kind -> shares

    def as_json(self) -> dict:
        words = self.swapped_output.split()
        return {"line": self.line, "source": self.source.source, "swapped_source": self.source.text,
                "output": self.output, "swapped_output": self.swapped_output, "direction": self.direction,
                "verdict": self.verdict, "chrf": round(self.chrf, 2),
                "changed_words": [words[i] for i in self.changed if i < len(words)],
                "evidence": {source: {kind: round(float(np.mean(v)), 4) if v else None for kind, v in kinds.items()}
                             for source, kinds in self.evidence.items()}}


def measure(line: int, source: Swapped, outputs: tuple[str, str], target: Swapper, groups: tuple[str, str]) -> Pair:
    """A ``Pair`` from a swapped source and its two outputs (``target``: the output language's swapper)."""
    output, swapped_output = outputs
    out_groups = [group for _, _, group in target.terms(output)]
    swapped_terms = target.terms(swapped_output)
    neutral, neutral_swapped = target.swap(output, only=0).text, target.swap(swapped_output, only=0).text
    toks = tokens(swapped_output)
    group_words = sorted({word_of_char(swapped_output, toks[i].start) for i, _, _ in swapped_terms})
    changed: list[int] = []
    if len(neutral_swapped.split()) == len(swapped_output.split()):  # agreement kept the word count
        changed = sorted(changed_words(neutral, neutral_swapped) - set(group_words))
    return Pair(line, source, output, swapped_output, direction(source, groups),
                verdict(out_groups, [group for _, _, group in swapped_terms]), stability(neutral, neutral_swapped),
                changed, group_words)


def add_evidence(pair: Pair, name: str, words: np.ndarray, src_words: Sequence[str], tgt_words: Sequence[str]) -> None:
    """The shares of ``words`` (a word-level (target words + EOS, source words + EOS) matrix of the swapped
    translation: attention or attribution) on the swapped source words, by kind of target word. Skipped when
    the matrix's words are not the sentences' whitespace words (a normalisation of SentencePiece)."""
    source_words = {word_of_char(pair.source.text, span.start) for span in _new_spans(pair.source)}
    if len(src_words) != len(pair.source.text.split()) or len(tgt_words) != len(pair.swapped_output.split()):
        return
    rows = np.asarray(words, dtype=np.float64)[: len(tgt_words)]
    totals = rows.sum(axis=1)
    shares = rows[:, sorted(source_words)].sum(axis=1) / np.where(totals > 0, totals, 1.0)
    kinds = pair.evidence.setdefault(name, {kind: [] for kind in KINDS})
    for j, share in enumerate(shares):
        kind = "group" if j in pair.group_words else "changed" if j in pair.changed else "unchanged"
        kinds[kind].append(float(share))


def _new_spans(swapped: Swapped) -> list:
    """The swapped terms' character spans in the swapped sentence (edits move later text by their length
    change)."""
    spans, shift = [], 0
    for edit in swapped.edits:
        start = edit.start + shift
        if edit.group is not None:
            spans.append(type(edit)(start, start + len(edit.new), edit.old, edit.new, edit.group))
        shift += len(edit.new) - (edit.end - edit.start)
    return spans


def uniform_share(pair: Pair) -> float:
    """The share of a row spread evenly over the source words and EOS that the swapped words would get."""
    words = len(pair.source.text.split())
    swapped = len({word_of_char(pair.source.text, edit.start) for edit in _new_spans(pair.source)})
    return swapped / (words + 1)


def summary(pairs: Sequence[Pair], groups: tuple[str, str]) -> dict:
    """Corpus-level numbers of the probe: verdict rates by direction, stability, evidence by kind."""
    directions = [f"{groups[0]} -> {groups[1]}", f"{groups[1]} -> {groups[0]}", "mixed"]
    faithfulness = {}
    for way in directions + ["all"]:
        chosen = [p for p in pairs if way in ("all", p.direction)]
        if chosen:
            faithfulness[way] = {"pairs": len(chosen), **{v: 100.0 * sum(p.verdict == v for p in chosen) / len(chosen)
                                                           for v in VERDICTS}}
    evidence = {}
    for source in sorted({name for p in pairs for name in p.evidence}):
        shares = {kind: [s for p in pairs for s in p.evidence.get(source, {}).get(kind, [])] for kind in KINDS}
        evidence[source] = {kind: {"words": len(v), "mean_share": float(np.mean(v)) if v else None}
                            for kind, v in shares.items()}
        with_evidence = [p for p in pairs if source in p.evidence]
        uniform = [uniform_share(p) for p in with_evidence]
        evidence[source]["uniform"] = float(np.mean(uniform)) if uniform else None
    chrfs = [p.chrf for p in pairs]
    return {"pairs": len(pairs), "faithfulness": faithfulness,
            "stability": {"chrf": float(np.mean(chrfs)) if chrfs else None,
                          "changed_elsewhere": 100.0 * sum(p.chrf < 100.0 for p in pairs) / max(len(pairs), 1)},
            "evidence": evidence}
