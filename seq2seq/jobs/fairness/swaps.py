"""Swap lists and the counterfactual swap: a sentence with its group terms exchanged.

A swap list is a file of two tab-separated columns, a word of the first group and its counterpart in the
second ("man<TAB>woman"); each row is swapped both ways, as whole words, the case of the sentence's word
kept. ``#`` starts a comment; a ``# groups: NAME NAME`` line names the groups (default: first, second).
The lists shipped for English and German (``lists/en.tsv``, ``lists/de.tsv``) pair male and female
person nouns, pronouns and possessives. A German noun may carry its grammatical gender or number and its
cases after a slash (``Jungen/m.acc.dat.gen``): swapping it then makes the article and the adjectives of
its noun phrase agree (``seq2seq.jobs.fairness.german``). Words with several counterparts ("her": "his"
or "him") are chosen by the language's rule, else the first row wins.

Written by hand: the grammar of a swap is the product itself (no library swaps German noun phrases).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from . import english, german
from .lexicon import Edit, Row, SwapList, Token, tokens

#: the rules of a language: choose() among several counterparts; agreement() of a swapped noun's phrase
RULES = {"de": german, "en": english}


@dataclass
class Swapped:
    """A sentence and its counterfactual: ``text`` is ``source`` with ``edits`` applied."""

    source: str
    text: str
    edits: list[Edit]

    @property
    def terms(self) -> list[Edit]:
        """The edits of group terms (not of agreement)."""
        return [edit for edit in self.edits if edit.group is not None]


def match_case(template: str, word: str) -> str:
    """``word`` in the case of ``template``: ALL CAPS, Capitalized or lower; a capitalized list word (a German
    noun) stays capitalized."""
    if len(template) > 1 and template.isupper():
        return word.upper()
    if template[:1].isupper() or word[:1].isupper():
        return word[:1].upper() + word[1:]
    return word.lower()


class Swapper:
    """Swaps the group terms of sentences in one language, with its agreement and choice rules."""

    def __init__(self, swap_list: SwapList) -> None:
        self.swap_list = swap_list
        self.rules = RULES.get(swap_list.language)

    def terms(self, text: str) -> list[tuple[int, str, int]]:
        """(token index, word, group) of every group term of ``text`` (ambiguous words as the language's rule
        reads them)."""
        toks = tokens(text)
        found = []
        for i, tok in enumerate(toks):
            choice = self._choose(toks, i, None)
            if choice is not None:
                found.append((i, tok.text, choice[1]))
        return found

    def swap(self, text: str, only: int | None = None) -> Swapped:
        """``text`` with its group terms exchanged (``only``: swap only the terms of that group, 0 or 1: e.g.
        every female term made male, which puts two outputs on one footing before they are compared). The
        terms are swapped first, then their phrases made to agree (a swapped possessive is declined as such)."""
        toks = tokens(text)
        choices = [self._choose(toks, i, only) for i in range(len(toks))]
        swapped, edits = list(toks), {}
        for i, (tok, choice) in enumerate(zip(toks, choices)):
            if choice is not None:
                row, side = choice
                swapped[i] = Token(match_case(tok.text, row.forms[1 - side].word), tok.start, tok.end)
                if swapped[i].text != tok.text:
                    edits[(tok.start, tok.end)] = Edit(tok.start, tok.end, tok.text, swapped[i].text, side)
        for i, choice in enumerate(choices):
            if choice is None or self.rules is None or not hasattr(self.rules, "agreement"):
                continue
            row, side = choice
            for edit in self.rules.agreement(swapped, i, row.forms[side], row.forms[1 - side]):
                earlier = edits.get((edit.start, edit.end))
                edits[(edit.start, edit.end)] = Edit(edit.start, edit.end, text[edit.start:edit.end], edit.new,
                                                     earlier.group if earlier else None)
        kept = apply_edits(text, list(edits.values()))
        return Swapped(text, kept, sorted(edits.values(), key=lambda e: e.start))

    def _choose(self, toks: list[Token], i: int, only: int | None) -> tuple[Row, int] | None:
        candidates = [(row, side) for row, side in self.swap_list.entries(toks[i].text)
                      if only is None or side == 1 - only]
        if not candidates:
            return None
        if self.rules is not None:
            return self.rules.choose(toks, i, candidates, self.swap_list)
        return candidates[0]


def apply_edits(text: str, edits: Sequence[Edit]) -> str:
    """``text`` with non-overlapping character edits applied (a later edit of the same span wins)."""
    by_start = {}
    for edit in edits:
        by_start[(edit.start, edit.end)] = edit
    out, at = [], 0
    for (start, end), edit in sorted(by_start.items()):
        if start < at:
            continue
        out.append(text[at:start] + edit.new)
        at = end
    return "".join(out) + text[at:]


def swapper_for(language: str, swap_list: str | None = None, flag: str = "--src") -> Swapper:
    """The swapper of ``language``: the user's ``swap_list`` file, else the shipped list."""
    if swap_list:
        return Swapper(SwapList.read(swap_list, language))
    return Swapper(SwapList.shipped(language, flag))
