"""Lexical constraints: target phrases every output must contain (terminology), and how far a
hypothesis is through them.

A sentence's constraints are phrases, each a sequence of target token ids. A hypothesis tracks them
with a small immutable ``ConstraintState``: which phrases it has met, and the phrase it is in the
middle of (with how many of its tokens it has produced). Producing the next token of that phrase
advances it; any other token abandons it (its progress is lost) and, if it starts an unmet phrase,
starts that one. A phrase counts as met once all its tokens came out consecutively, whether forced or
produced freely by the model. **Unordered** constraints may be met in any order; **ordered** ones only
in the order given (a phrase can start only once every earlier one is met).

The search (``seq2seq.decoding.constrained``) reads three things of a state: the tokens that make
progress (``progress_tokens``: the only way a hypothesis can still meet its constraints), the tokens
still needed (``needed``: with the length bound, which hypotheses can still finish) and the tokens met
so far (``met_tokens``: the bank of dynamic beam allocation, Post & Vilar 2018).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

Phrase = tuple[int, ...]


@dataclass(frozen=True)
class SentenceConstraints:
    """The phrases of one sentence (token ids, none empty) and whether their order is imposed."""

    phrases: tuple[Phrase, ...]
    ordered: bool = False

    @property
    def total_tokens(self) -> int:
        """Tokens an output needs at least to contain every phrase (no overlaps assumed)."""
        return sum(len(p) for p in self.phrases)

    def token_ids(self) -> set[int]:
        return {token for phrase in self.phrases for token in phrase}

    def start(self) -> "ConstraintState":
        return ConstraintState(self, frozenset(), -1, 0)


@dataclass(frozen=True)
class ConstraintState:
    """How far one hypothesis is: ``met`` (indices of the phrases met), ``current`` (the phrase in
    progress, -1 for none) and ``position`` (its tokens produced so far)."""

    constraints: SentenceConstraints
    met: frozenset
    current: int
    position: int

    @property
    def done(self) -> bool:
        """Every phrase met: the hypothesis may end."""
        return len(self.met) == len(self.constraints.phrases)

    def needed(self) -> int:
        """Tokens still to produce before every phrase is met (the rest of the current phrase, then
        every other unmet phrase in full)."""
        phrases = self.constraints.phrases
        rest = len(phrases[self.current]) - self.position if self.current >= 0 else 0
        return rest + sum(len(p) for i, p in enumerate(phrases) if i not in self.met and i != self.current)

    def met_tokens(self) -> int:
        """Tokens of the constraints produced so far (met phrases and the current one's progress)."""
        return self.constraints.total_tokens - self.needed()

    def _startable(self) -> list[int]:
        """Phrases that may start now: every unmet one, or with ``ordered`` the first unmet one."""
        unmet = [i for i in range(len(self.constraints.phrases)) if i not in self.met]
        return unmet[:1] if self.constraints.ordered else unmet

    def progress_tokens(self) -> set[int]:
        """Tokens that make progress: the next token of the current phrase, or the first token of a
        phrase that may start (abandoning the current one)."""
        phrases = self.constraints.phrases
        tokens = {phrases[i][0] for i in self._startable() if i != self.current}
        if self.current >= 0:
            tokens.add(phrases[self.current][self.position])
        return tokens

    def advance(self, token: int) -> "ConstraintState":
        """The state after producing ``token`` (EOS included: it changes nothing)."""
        phrases = self.constraints.phrases
        if self.current >= 0 and phrases[self.current][self.position] == token:
            return self._moved(self.current, self.position + 1)
        for i in self._startable():  # abandon the current phrase (if any); maybe start another
            if phrases[i][0] == token:
                return self._moved(i, 1)
        if self.current < 0:
            return self
        return ConstraintState(self.constraints, self.met, -1, 0)

    def _moved(self, phrase: int, position: int) -> "ConstraintState":
        if position == len(self.constraints.phrases[phrase]):
            return ConstraintState(self.constraints, self.met | {phrase}, -1, 0)
        return ConstraintState(self.constraints, self.met, phrase, position)


def satisfied(tokens: Sequence[int], constraints: SentenceConstraints) -> bool:
    """Whether an output meets every phrase (in order, for ordered constraints) as the search
    counts it: replaying its tokens through a ``ConstraintState`` ends with every phrase met."""
    state = constraints.start()
    for token in tokens:
        state = state.advance(token)
    return state.done
