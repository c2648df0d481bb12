"""What every search mode reports about its outputs is what the model says about them.

For greedy, beam, n-best, constrained, prefixed, ensemble and sampled outputs: a hypothesis's
``log_prob`` equals the teacher-forced sum of log p(y_t | y_<t, x) over its tokens and EOS
(``scoring.forced_pass``, the one teacher-forced path), and its ``score`` equals that sum divided by
the GNMT length penalty written out here (beam searches) or the sum itself (greedy and sampling).
A search that finished a sentence early, scored a hypothesis it did not output, or mixed up
beams when reordering fails here.
"""
from __future__ import annotations

import pytest
import torch

from seq2seq.config import DecodeConfig
from seq2seq.decoding.constraints import SentenceConstraints
from seq2seq.decoding.ensemble import EnsembleModel
from seq2seq.decoding.prefix import Prefixes
from seq2seq.decoding.scoring import eval_mode, forced_pass
from seq2seq.decoding.generator import SearchBatch
from seq2seq.decoding.search import translate_batch
from test_models import VOCAB, single, trained_once


def _gnmt(length: int, alpha: float) -> float:
    """((5 + |Y|) / 6)^alpha with |Y| counting EOS, written out (not imported from the search)."""
    return ((5 + length) / 6) ** alpha


@pytest.fixture(scope="module", params=["bahdanau", "transformer-pre"])
def model(request):
    steps = {"bahdanau": 25, "transformer-pre": 40}[request.param]
    return trained_once(request.param, steps, 1e-2)


def _check(model, src, mask, hyps, alpha: float | None) -> int:
    """Each sentence's hypotheses against teacher forcing; ``alpha`` None: no length penalty."""
    checked = 0
    for i, sentence in enumerate(hyps):
        assert sentence, f"sentence {i}: no hypothesis"
        one_src, one_mask = single(src, mask, i)
        with eval_mode(model, inference=True):
            scores, _ = forced_pass(model, one_src.repeat(len(sentence), 1), one_mask.repeat(len(sentence), 1),
                                    [h.tokens for h in sentence])
        for h, forced in zip(sentence, scores):
            log_prob = float(forced.sum())
            assert h.log_prob == pytest.approx(log_prob, abs=1e-4), (i, h.tokens)
            expected = log_prob if alpha is None else log_prob / _gnmt(len(h.tokens) + 1, alpha)
            assert h.score == pytest.approx(expected, abs=1e-4), (i, h.tokens)
            checked += 1
    return checked


@pytest.mark.parametrize("mode", ["greedy", "beam", "n-best", "n-best-no-penalty", "sampled"])
def test_reported_scores_are_the_teacher_forced_scores(model, batch, mode):
    decode = {"greedy": DecodeConfig(beam_size=1),
              "beam": DecodeConfig(beam_size=5, length_penalty=1.0),
              "n-best": DecodeConfig(beam_size=4, n_best=4, length_penalty=0.6),
              "n-best-no-penalty": DecodeConfig(beam_size=3, n_best=3, length_penalty=0.0),
              "sampled": DecodeConfig(sample=True, n_best=3, temperature=1.5, seed=11)}[mode]
    hyps = translate_batch(model, SearchBatch(*batch), decode, need_attention=False)
    alpha = None if mode in ("greedy", "sampled") else decode.length_penalty
    assert _check(model, *batch, hyps, alpha) == len(hyps) * decode.n_best


def test_prefixed_outputs_are_scored_by_the_model(model, batch):
    """Forced prefix tokens count with the model's own log-probability (not 0, not renormalised)."""
    src, mask = batch
    prefixes = Prefixes([[torch.tensor([7])], [], [torch.tensor([5]), torch.tensor([8, 9, 10])], [], [],
                         [torch.tensor([11])]], VOCAB)
    for decode, alpha in ((DecodeConfig(beam_size=1), None), (DecodeConfig(beam_size=3, n_best=2), 1.0)):
        hyps = translate_batch(model, SearchBatch(src, mask, prefixes=prefixes), decode, need_attention=False)
        assert hyps[0][0].tokens[:1] == [7] and hyps[2][0].tokens[:1] == [5]
        _check(model, src, mask, hyps, alpha)


def test_constrained_outputs_are_scored_by_the_model(model, batch):
    src, mask = batch
    constraints = [SentenceConstraints(((6,),), False), SentenceConstraints((), False),
                   SentenceConstraints(((9, 10),), True), SentenceConstraints(((4,), (11,)), False),
                   SentenceConstraints((), False), SentenceConstraints(((5,),), False)]
    for decode in (DecodeConfig(beam_size=1), DecodeConfig(beam_size=4, n_best=2, length_penalty=1.0)):
        hyps = translate_batch(model, SearchBatch(src, mask), decode, need_attention=False, constraints=constraints)
        _check(model, src, mask, hyps, decode.length_penalty)


def test_ensemble_outputs_are_scored_by_the_ensemble(batch):
    """The ensemble's score is its own: log of the members' mean probability, teacher-forced."""
    ensemble = EnsembleModel([trained_once("bahdanau", 25, 1e-2), trained_once("transformer-pre", 40, 1e-2)])
    for decode in (DecodeConfig(beam_size=1), DecodeConfig(beam_size=3, n_best=3, length_penalty=1.0)):
        hyps = translate_batch(ensemble, SearchBatch(*batch), decode, need_attention=False)
        _check(ensemble, *batch, hyps, None if decode.beam == 1 else 1.0)
