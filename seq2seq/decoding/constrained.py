"""Lexically constrained beam search with dynamic beam allocation (Post & Vilar 2018; the banks of
Hu et al. 2019): every output contains every constraint phrase of its sentence
(``seq2seq.decoding.constraints``).

It is beam search (``beam.Beams``: the same decoder calls, state reordering, finished sentences
leaving the batch, GNMT length penalty) with another choice of the k hypotheses kept at each step.
The candidates of a sentence are, for each of its live beams, its 2k best next tokens and every token
that makes progress on its constraints (``ConstraintState.progress_tokens``), with their scores
(raw sum of log-probabilities, the model's own). A candidate is dropped when it can no longer meet its
constraints before the length bound (the tokens it still needs exceed the steps left), and EOS is
allowed only to a hypothesis that met them all. So when the steps left equal the tokens still needed,
only the progress tokens survive, and every output that reaches the bound has met its constraints:
every output meets every constraint.

**Dynamic beam allocation.** The kept candidates are grouped into banks by the constraint tokens they
have produced (0 .. C). The k beam slots are filled round-robin over the banks, the most advanced bank
first, each time with the best remaining candidate of that bank: hypotheses that met more constraints
are not pushed out by unconstrained ones that score higher, and unconstrained ones keep their share.
As in plain beam search, candidates that end in EOS among the k best by score become finished
hypotheses (the k best are kept); a sentence is done at its length bound, when no hypothesis is left
alive, or once no live one can end above its n-best finished ones (``Beams.settled``).

The bookkeeping is on the host, per sentence and beam (a few Python operations per candidate): the
cost is measured in docs/benchmarks.md.
"""
from __future__ import annotations

import math
from typing import Sequence

import torch

from ..config import DecodeConfig
from ..errors import UserError
from ..models.base import EncoderDecoder
from ..tokenizer import BOS_ID, EOS_ID
from .beam import Beams, run_beams
from .constraints import ConstraintState, SentenceConstraints
from .generator import Generator, Hypothesis, SearchBatch
from .scoring import eval_mode


def constrained_beam_search(model: EncoderDecoder, batch: SearchBatch, constraints: Sequence[SentenceConstraints],
                            decode: DecodeConfig, need_attention: bool = True) -> list[list[Hypothesis]]:
    """Beam search in which every output of sentence i contains every phrase of ``constraints[i]``
    (see the module docstring), searched as ``decode`` says (not sampling); ``decode.n_best``
    hypotheses per sentence, best first. Beam 1 is a greedy search that meets the constraints. A
    sentence whose constraints (with its target prefix) need more tokens than its length bound raises
    ``ConstraintTooLong`` (its index in the batch)."""
    if decode.sample:  # Translator names this to the user before any work
        raise ValueError("constrained_beam_search searches; a DecodeConfig with sample=True is translate_batch's")
    if len(constraints) != len(batch):
        raise ValueError(f"constrained_beam_search: {len(constraints)} constraint sets for {len(batch)} sentences")
    with eval_mode(model, inference=True):
        generator = Generator(model, batch, decode, width=decode.beam)
        prefix_steps = ([0] * len(constraints) if batch.prefixes is None
                        else batch.prefixes.lengths(generator.limit.device).tolist())
        for i, (bound, sentence) in enumerate(zip(generator.limit.tolist(), constraints)):
            if sentence.total_tokens + prefix_steps[i] > bound:
                raise ConstraintTooLong(i, sentence.total_tokens, bound)
        return run_beams(_ConstrainedBeams(generator, decode, constraints), need_attention, batch)


class ConstraintTooLong(UserError):
    """Sentence ``index`` of a batch needs ``needed`` target tokens for its constraints, more than its
    length bound ``bound`` allows."""

    def __init__(self, index: int, needed: int, bound: int) -> None:
        super().__init__(f"the constraints of sentence {index} need {needed} target pieces, more than its "
                         f"length bound of {bound}")
        self.index, self.needed, self.bound = index, needed, bound


class _ConstrainedBeams(Beams):
    """``Beams`` whose hypotheses carry a ``ConstraintState`` and their tokens on the host, and whose
    step keeps k hypotheses by dynamic beam allocation (module docstring)."""

    def __init__(self, generator: Generator, decode: DecodeConfig,
                 constraints: Sequence[SentenceConstraints]) -> None:
        super().__init__(generator, decode)
        k = self.k
        # per active sentence, per beam: (state, tokens so far), None for an empty slot
        self.beams: list[list[tuple[ConstraintState, list[int]] | None]] = [
            [(c.start(), [])] + [None] * (k - 1) for c in constraints]
        ids = None if generator.output.ids is None else generator.output.ids.tolist()
        self.column = None if ids is None else {token: c for c, token in enumerate(ids)}
        self.token_of = (lambda c: c) if ids is None else ids.__getitem__

    def advance(self, t: int) -> bool:
        """One step for every active sentence (``Beams.advance``'s contract); False once none is left."""
        k, output = self.k, self.generator.output
        log_p = self.generator.log_probs(self.tokens, t)  # (n * k, V')
        slots = [slot for beams in self.beams for slot in beams]
        may_end = torch.tensor([slot is not None and slot[0].done for slot in slots], device=log_p.device)
        log_p[:, output.eos] = log_p[:, output.eos].masked_fill(~may_end, float("-inf"))
        best, columns = log_p.topk(min(2 * k, log_p.size(1)))  # (n * k, m)
        progress = self._progress(slots)  # [(row, column, token)]
        progress_lp = log_p[[r for r, _, _ in progress], [c for _, c, _ in progress]].tolist() if progress else []
        best, columns, scores = best.tolist(), columns.tolist(), self.scores.tolist()
        extra: dict[int, list[tuple[int, float]]] = {}
        for (row, _, token), lp in zip(progress, progress_lp):
            extra.setdefault(row, []).append((token, lp))
        origins, chosen_tokens, kept_scores, finished, new_beams = [], [], [], [], []
        for i, sentence in enumerate(self.host_rows):
            candidates = self._candidates(i, scores[i], best, columns, extra)
            self._finish_candidates(sentence, self.beams[i], candidates)
            kept = self._allocate(candidates, self.beams[i], self.host_limit[sentence] - (t + 1))
            beams = [(state, self.beams[i][j][1] + [token]) for j, token, _, state in kept]
            beams += [None] * (k - len(kept))
            origins.append([i * k + j for j, _, _, _ in kept] + [i * k] * (k - len(kept)))
            chosen_tokens.append([token for _, token, _, _ in kept] + [BOS_ID] * (k - len(kept)))
            kept_scores.append([total for _, _, total, _ in kept] + [float("-inf")] * (k - len(kept)))
            finished.append(t >= self.host_limit[sentence] or not kept
                            or self.settled(sentence, max(total for _, _, total, _ in kept), t))
            new_beams.append(beams)
        device = log_p.device
        origin = torch.tensor(origins, dtype=torch.long, device=device)  # (n, k)
        token = torch.tensor(chosen_tokens, dtype=torch.long, device=device)
        self.scores = torch.tensor(kept_scores, device=device)
        self.beams = new_beams
        if any(finished):
            live = [i for i, f in enumerate(finished) if not f]
            self.beams = [self.beams[i] for i in live]
            self._drop(live)
            origin, token = origin[live], token[live]
            if not live:
                return False
        self.generator.reorder(origin.view(-1))
        self.tokens = token.view(-1)
        return True

    def _progress(self, slots: list) -> list[tuple[int, int, int]]:
        """(row, column, token) of every token that makes progress on a live hypothesis's constraints
        (and that the output vocabulary contains)."""
        found = []
        for row, slot in enumerate(slots):
            if slot is None:
                continue
            for token in slot[0].progress_tokens():
                column = token if self.column is None else self.column.get(token)
                if column is not None:
                    found.append((row, column, token))
        return found

    def _candidates(self, i: int, scores: list[float], best: list, columns: list,
                    extra: dict) -> list[tuple[int, int, float]]:
        """(beam, token, total log-probability) of sentence ``i``'s finite candidates, best first."""
        k, seen, candidates = self.k, set(), []
        for j in range(k):
            if self.beams[i][j] is None or scores[j] == float("-inf"):
                continue
            row = i * k + j
            pairs = [(self.token_of(c), lp) for c, lp in zip(columns[row], best[row])] + extra.get(row, [])
            for token, lp in pairs:
                total = scores[j] + lp
                if (j, token) in seen or not math.isfinite(total):
                    continue
                seen.add((j, token))
                candidates.append((j, token, total))
        candidates.sort(key=lambda c: -c[2])
        return candidates

    def _finish_candidates(self, sentence: int, beams: list, candidates: list[tuple[int, int, float]]) -> None:
        """Candidates among the k best that end in EOS become finished hypotheses of ``sentence``
        (EOS reaches only hypotheses that met every constraint); ``beams`` its (state, tokens)."""
        for j, token, total in candidates[: self.k]:
            if token == EOS_ID:
                self._keep(sentence, list(beams[j][1]), total)

    def _allocate(self, candidates: list[tuple[int, int, float]], beams: list, steps_left: int) -> list:
        """Up to k (beam, token, total, state) continuations: the candidates that do not end and can still
        meet their constraints in ``steps_left`` tokens, taken round-robin over the banks of constraint
        tokens met, the most advanced bank first, best first within a bank."""
        banks: dict[int, list] = {}
        for j, token, total in candidates:
            if token == EOS_ID:
                continue
            state = beams[j][0].advance(token)
            if state.needed() > steps_left:
                continue
            banks.setdefault(state.met_tokens(), []).append((j, token, total, state))
        kept, order = [], sorted(banks, reverse=True)
        while len(kept) < self.k and any(banks[b] for b in order):
            for bank in order:
                if banks[bank] and len(kept) < self.k:
                    kept.append(banks[bank].pop(0))
        return kept
