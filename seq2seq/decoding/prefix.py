"""Target prefixes: outputs forced to start with given text (interactive post-editing, a fixed opening).

A prefix is tokenized like any target; the search is forced through its pieces, so every output
starts with the prefix text verbatim. A prefix that does not end in whitespace may end inside a word:
its last piece is only a lower bound, and the search may complete it with any piece that extends it
("Ein Hu" can become "Ein Hund"). A prefix that ends in whitespace ends a word: the first free step
must start a new word (or end the output). An empty prefix constrains nothing.
"""
from __future__ import annotations

from typing import Sequence

import torch

from ..tokenizer import BOS_ID, EOS_ID, PAD_ID, Tokenizer

WORD_START = "\u2581"  # SentencePiece's word-start mark


class Prefixes:
    """Target prefixes the search is forced through: per sentence, the tokens allowed at each of its
    first steps (``steps[i][t]``: a 1-d tensor of token ids; one id = that token is forced). After a
    sentence's steps the search is free. The allowed tokens depend on the sentence and the step only,
    never on the hypothesis, so every beam and sample of a sentence shares them; a chosen token's
    log-probability is the model's own (the search masks after the softmax)."""

    def __init__(self, steps: Sequence[Sequence[torch.Tensor]], vocab_size: int) -> None:
        self.steps, self.vocab_size = [list(s) for s in steps], vocab_size
        self.longest = max((len(s) for s in self.steps), default=0)

    def lengths(self, device: torch.device) -> torch.Tensor:
        """Steps constrained per sentence (B,): the search's length bound must leave room for them."""
        return torch.tensor([len(s) for s in self.steps], device=device)

    def token_ids(self) -> torch.Tensor:
        """Every token some step allows (a shortlist must keep them)."""
        ids = [ids for steps in self.steps for ids in steps]
        return torch.unique(torch.cat(ids)) if ids else torch.zeros(0, dtype=torch.long)

    def allowed(self, t: int, sentences: Sequence[int], device: torch.device) -> torch.Tensor | None:
        """(len(sentences), V) bool: what each of these sentences may produce at step ``t``; None when
        none of them is constrained there (the common case: no cost)."""
        if t >= self.longest or not any(t < len(self.steps[s]) for s in sentences):
            return None
        mask = torch.ones(len(sentences), self.vocab_size, dtype=torch.bool)
        for row, sentence in enumerate(sentences):
            if t < len(self.steps[sentence]):
                mask[row] = False
                mask[row, self.steps[sentence][t]] = True
        return mask.to(device)


class PrefixSpeller:
    """Turns prefix text into the search's allowed tokens per step, for one tokenizer."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.pieces = tokenizer.pieces(range(tokenizer.vocab_size))
        specials = {PAD_ID, BOS_ID, EOS_ID}
        self.word_starts = torch.tensor([i for i, p in enumerate(self.pieces)
                                         if p.startswith(WORD_START) and i not in specials] + [EOS_ID])
        self.specials = specials

    def steps(self, text: str) -> list[torch.Tensor]:
        """The allowed token ids at each step of an output that starts with ``text``."""
        words = text.strip()
        if not words:
            return []
        ids = self.tokenizer.encode(words)
        steps = [torch.tensor([i]) for i in ids[:-1]]
        if text[-1].isspace():  # the prefix ends a word: its last piece as it is, then a new word
            return steps + [torch.tensor([ids[-1]]), self.word_starts]
        last = self.pieces[ids[-1]]
        extending = [i for i, p in enumerate(self.pieces) if p.startswith(last) and i not in self.specials]
        return steps + [torch.tensor(extending)]
