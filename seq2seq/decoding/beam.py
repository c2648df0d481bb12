"""Beam search, batched over sentences x beams: the strategy that keeps the k best hypotheses of each
sentence (``Beams``), on the model calls of a ``Generator``.

Beams compete on raw log-probability; a hypothesis ending in EOS among the top k candidates is
finished with score log P / lp(Y) (GNMT, ``length_penalty_gnmt``), and a sentence keeps its k best
finished hypotheses (a better one replaces the worst). A sentence is done only when it reaches its
length bound (where EOS is forced on every beam) or no live beam can end above its n-th best finished
hypothesis any more (``Beams.settled``: exact, the outputs are those of searching on to the bound).
Having k finished hypotheses is not enough: on a small vocabulary early EOS endings fill the top k
while a live beam still scores far above them (issue 64). The 2k best continuations of a sentence are
among the 2k best tokens of each of its beams.
"""
from __future__ import annotations

import math

import torch

from ..config import DecodeConfig
from ..models.base import EncoderDecoder
from ..nn.next_token import beam_choice
from ..tokenizer import BOS_ID, EOS_ID
from .generator import Generator, Hypothesis, SearchBatch, attach_attention, fused, length_penalty_gnmt
from .scoring import eval_mode


def beam_search(model: EncoderDecoder, batch: SearchBatch, decode: DecodeConfig,
                need_attention: bool = True) -> list[list[Hypothesis]]:
    """Beam search of width ``decode.beam`` with GNMT penalty ``decode.length_penalty``; the
    ``decode.n_best`` best hypotheses per sentence, best first (module docstring)."""
    with eval_mode(model, inference=True):
        generator = Generator(model, batch, decode, width=decode.beam)
        beams = FusedBeams if fused(model, generator) else Beams
        return run_beams(beams(generator, decode), need_attention, batch)


def run_beams(beams: "Beams", need_attention: bool, batch: SearchBatch) -> list[list[Hypothesis]]:
    """Advance ``beams`` step by step to their length bound or until every sentence is done; the
    ``n_best`` finished hypotheses of each sentence, best first (with their attention if asked for)."""
    for t in range(beams.generator.steps):
        if not beams.advance(t):
            break
    hyps = [sorted(done, key=lambda h: -h.score)[:beams.n_best] for done in beams.finished]
    if need_attention:
        attach_attention(beams.generator.model, batch.src, batch.src_mask, hyps)
    return hyps


class Beams:
    """The beam strategy's state for the active sentences: row n * k + j of the decoder is beam j of
    sentence n; ``finished[s]`` holds sentence s's k best finished hypotheses so far.

    The step interface of every beam strategy (``run_beams`` drives it): ``advance(t)`` takes step t
    for every active sentence and returns False once none is left. A strategy subclasses it and
    overrides ``advance`` (lexically constrained search: ``constrained._ConstrainedBeams``), reusing
    ``settled``, ``_keep`` and ``_drop``: a sentence is done at its length bound or once ``settled``."""

    def __init__(self, generator: Generator, decode: DecodeConfig) -> None:
        sentences, device = len(generator.host_sentence), generator.sentence.device
        self.generator, self.k, self.alpha, self.n_best = generator, decode.beam, decode.length_penalty, decode.n_best
        self.exact = decode.beam_stop == "exact"
        self.host_limit = generator.limit.tolist()  # each sentence's bound on the host (no syncs)
        self.scores = torch.full((sentences, self.k), float("-inf"), device=device)  # raw sum log-prob
        self.scores[:, 0] = 0.0  # only one live beam at the start
        self.prefix = torch.zeros(sentences * self.k, 0, dtype=torch.long, device=device)  # tokens so far
        self.tokens = torch.full((sentences * self.k,), BOS_ID, device=device)
        self.finished: list[list[Hypothesis]] = [[] for _ in range(sentences)]

    @property
    def host_rows(self) -> list[int]:
        """The sentence (batch index) of each active sentence."""
        return self.generator.host_sentence

    def advance(self, t: int) -> bool:
        """One decoding step for every active beam; False once no sentence is left."""
        n, k, output = len(self.host_rows), self.k, self.generator.output
        log_p = self.generator.log_probs(self.tokens, t)  # (n * k, V')
        top, beam, column, self.scores, live_beam, live_column = beam_choice(log_p, self.scores, output.eos)
        self._finish(top[:, :k], beam[:, :k], output.token_ids(column[:, :k]), column[:, :k] == output.eos)
        beam, token = live_beam, output.token_ids(live_column)  # the k best candidates that did not end go on
        origin = beam if n == 1 else torch.arange(n, device=beam.device).unsqueeze(1) * k + beam  # (n, k) previous row
        best_live = self.scores[:, 0].tolist()  # the best live beam of each sentence (kept best first)
        finished = [t >= self.host_limit[r] or self.settled(r, best, t) for r, best in zip(self.host_rows, best_live)]
        if any(finished):
            live = [i for i, f in enumerate(finished) if not f]
            self._drop(live)
            origin, token = origin[live], token[live]
            if not live:
                return False
        self.generator.reorder(origin.view(-1))
        self.prefix = torch.cat([self.prefix[origin.view(-1)], token.view(-1, 1)], 1)
        self.tokens = token.view(-1)
        return True

    def settled(self, sentence: int, best_live: float, t: int) -> bool:
        """Whether no live beam of ``sentence`` (the best of them at raw log-probability ``best_live``
        after step ``t``) can end above its ``n_best``-th best finished hypothesis. Log-probabilities
        only fall as tokens are added, so a live beam ends at log P <= best_live, with a length from
        t + 2 (its t + 1 tokens and EOS) to the bound + 1: its score is at most best_live / the largest
        lp over those lengths (log P <= 0). Stopping there changes no output (``beam_stop`` "exact").

        With ``beam_stop`` "likely" only the length it would have now counts (lp(t + 2), Hugging Face's
        ``early_stopping=False``): with a length penalty > 0 a live beam could still win by growing
        longer, which it rarely does, and the search stops sooner."""
        done = self.finished[sentence]
        if len(done) < self.n_best or best_live == float("-inf"):
            return len(done) >= self.n_best  # no live beam at all: nothing can come
        nth_best = sorted((h.score for h in done), reverse=True)[self.n_best - 1]
        longest = self.host_limit[sentence] + 1 if self.exact else t + 2
        largest_lp = max(length_penalty_gnmt(t + 2, self.alpha), length_penalty_gnmt(longest, self.alpha))
        return nth_best >= best_live / largest_lp

    def _finish(self, top: torch.Tensor, beam: torch.Tensor, token: torch.Tensor, ended: torch.Tensor) -> None:
        """Record candidates (among the top k) that end in EOS (``ended``) as finished hypotheses."""
        index = (ended & top.isfinite()).nonzero()  # (ended, 2): the one wait per step
        if not len(index):
            return
        n, j = index.unbind(1)
        prefixes = self.prefix[n * self.k + beam[n, j]].tolist()  # one copy each, not one per hypothesis
        for (row, _), words, log_prob in zip(index.tolist(), prefixes, top[n, j].tolist()):
            self._keep(self.host_rows[row], words, log_prob)

    def _keep(self, sentence: int, words: list[int], log_prob: float) -> None:
        """Add a finished hypothesis (``words`` without EOS, raw log P with EOS) to ``sentence``'s k
        best: appended while there are fewer than k, else it replaces the worst if it scores above it."""
        score = log_prob / length_penalty_gnmt(len(words) + 1, self.alpha)
        done, hypothesis = self.finished[sentence], Hypothesis(words, score, log_prob)
        if len(done) < self.k:
            done.append(hypothesis)
        elif score > min(h.score for h in done):
            done[min(range(len(done)), key=lambda i: done[i].score)] = hypothesis

    def _drop(self, live: list[int]) -> None:
        """Remove finished sentences (all their beams) from the active batch; ``live`` (host positions)
        the others."""
        self.generator.keep_sentences(live)
        self.scores = self.scores[live]


class FusedBeams(Beams):
    """``Beams`` for one sentence on the model's step with beam search's choice compiled in (``model.beam_step``,
    ``generator.fused``): one call per step computes the logits, the best continuations and the reordered cache
    (``models.fused.static_beam_step``, ``beam_choice`` as ``Beams.advance`` calls it); one host read brings back
    what the bookkeeping needs. The prefixes are host lists; the same outputs as ``Beams``."""

    def __init__(self, generator: Generator, decode: DecodeConfig) -> None:
        super().__init__(generator, decode)
        self.words: list[list[int]] = [[] for _ in range(self.k)]  # each beam's tokens so far

    def advance(self, t: int) -> bool:
        generator, k, sentence = self.generator, self.k, self.host_rows[0]
        self.tokens, self.scores, chosen, generator.state = generator.model.beam_step(
            generator.memory, generator.state, self.tokens, generator.limit, self.scores)
        values = chosen.tolist()  # the one wait per step
        top, beam, token, best_live = values[:k], values[k:2 * k], values[2 * k:3 * k], values[3 * k]
        for j in range(k):  # the finished among the k best: they end in EOS (as ``_finish``)
            if token[j] == EOS_ID and math.isfinite(top[j]):
                self._keep(sentence, self.words[int(beam[j])], top[j])
        if t >= self.host_limit[sentence] or self.settled(sentence, best_live, t):
            return False
        self.words = [self.words[int(b)] + [int(w)] for b, w in zip(values[3 * k + 1:4 * k + 1], values[4 * k + 1:])]
        return True
