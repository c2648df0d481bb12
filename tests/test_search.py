"""Greedy and beam search: identities that must hold for any EncoderDecoder."""
import itertools
import math

import pytest
import torch

from seq2seq.config import DecodeConfig
from seq2seq.errors import UserError
from seq2seq.models.base import EncoderDecoder
from seq2seq.decoding.beam import beam_search
from seq2seq.decoding.generator import SearchBatch, length_penalty_gnmt, max_lengths
from seq2seq.decoding.search import greedy_search, translate_batch
from test_models import BOS, EOS, PAD, VOCAB, make_model, trained_once, single

ARCHS = ["bahdanau", "luong-no-feeding", "transformer-pre"]


def _gnmt(length, alpha):
    """The GNMT length penalty written out (Wu et al. 2016, eq. 14): ((5 + |Y|) / 6)^alpha, |Y| counting
    the EOS. Written here, not imported, so that a change in ``length_penalty_gnmt`` cannot also change
    what the search tests expect."""
    return ((5 + length) / 6) ** alpha


@pytest.mark.parametrize("length, alpha, expected", [
    (1, 0.6, 1.0),              # (5 + 1) / 6 = 1: a one-token hypothesis is never penalised
    (7, 1.0, 2.0),              # (5 + 7) / 6 = 2
    (13, 0.5, math.sqrt(3.0)),  # (5 + 13) / 6 = 3, 3^0.5
    (3, 2.0, 16 / 9),           # (5 + 3) / 6 = 4/3, squared
    (10, 0.0, 1.0),             # alpha 0: no penalty
])
def test_gnmt_length_penalty_hand_computed(length, alpha, expected):
    # Catches a changed constant, e.g. ((6 + length) / 6) ** alpha or ((5 + length) / 5) ** alpha.
    assert length_penalty_gnmt(length, alpha) == pytest.approx(expected, rel=1e-12)


@pytest.fixture(scope="module", params=ARCHS)
def model(request):
    """Briefly trained (not converged): hypotheses end at different lengths, some by EOS, some by the bound."""
    steps = {"bahdanau": 25, "luong-no-feeding": 25, "transformer-pre": 40}[request.param]
    return trained_once(request.param, steps, 1e-2)


def _rescore(model, src, mask, tokens):
    """Teacher-forced sum of log-probabilities of tokens + EOS."""
    tgt_in = torch.tensor([[BOS] + tokens])
    with torch.no_grad():
        logits, _ = model(src, mask, tgt_in)
    return logits.log_softmax(-1)[0].gather(1, torch.tensor([tokens + [EOS]]).T).sum().item()


def test_beam_size_one_equals_greedy(model, batch):
    greedy = greedy_search(model, SearchBatch(*batch))
    beam = beam_search(model, SearchBatch(*batch), DecodeConfig(beam_size=1))
    for (g,), (b,) in zip(greedy, beam):
        assert g.tokens == b.tokens
        assert g.log_prob == pytest.approx(b.log_prob, abs=1e-4)
    lengths = {len(g.tokens) for (g,) in greedy}
    assert len(lengths) > 1  # the fixture model is meant to end hypotheses at different steps


@pytest.mark.parametrize("alpha", [0.0, 1.0])
def test_beam_scores_sorted_and_equal_rescoring(model, batch, alpha):
    src, mask = batch
    hyps = beam_search(model, SearchBatch(src, mask), DecodeConfig(beam_size=4, n_best=3, length_penalty=alpha),
                       need_attention=False)
    for i, sentence in enumerate(hyps):
        assert len(sentence) == 3
        scores = [h.score for h in sentence]
        assert scores == sorted(scores, reverse=True)
        assert len({tuple(h.tokens) for h in sentence}) == 3
        for h in sentence:
            log_prob = _rescore(model, *single(src, mask, i), h.tokens)
            assert h.log_prob == pytest.approx(log_prob, abs=1e-4)
            # Expected score from the formula written out: a changed GNMT constant fails here (alpha 1).
            assert h.score == pytest.approx(log_prob / _gnmt(len(h.tokens) + 1, alpha), abs=1e-4)
            assert h.attention is None and EOS not in h.tokens and BOS not in h.tokens and PAD not in h.tokens


def _reference_beam(model, src, mask, k, alpha, limit):
    """Textbook beam search for one sentence: every prefix re-scored by a full teacher-forced
    forward pass, candidates ranked in Python. Same rules as ``beam_search``: beams compete on
    raw log P; an EOS among the k best candidates finishes a hypothesis, of which the k best by
    score are kept; the k best non-EOS candidates go on; searched on to the length bound (EOS
    forced) whatever has finished (``beam_search`` may stop earlier only where that changes nothing)."""
    beams, finished = [([], 0.0)], []
    for t in range(limit + 1):
        candidates = []
        for tokens, log_prob in beams:
            with torch.no_grad():
                logits, _ = model(src, mask, torch.tensor([[BOS] + tokens]))
            logp = logits[0, -1].log_softmax(-1)
            for y in range(VOCAB):
                if y not in (PAD, BOS) and (t < limit or y == EOS):
                    candidates.append((log_prob + float(logp[y]), tokens, y))
        candidates.sort(key=lambda c: -c[0])
        for score, tokens, y in candidates[:k]:
            if y == EOS:
                finished.append((tokens, score, score / _gnmt(len(tokens) + 1, alpha)))
        finished = sorted(finished, key=lambda f: -f[2])[:k]
        beams = [(tokens + [y], score) for score, tokens, y in candidates[: 2 * k] if y != EOS][:k]
    return finished


@pytest.mark.parametrize("alpha", [0.0, 1.0])
def test_beam_search_equals_textbook_beam_search(model, batch, alpha):
    """The batched search (finished sentences dropped, candidates pruned per beam before ranking,
    log-probabilities normalised only where chosen) finds exactly the textbook hypotheses."""
    src, mask = batch
    decode = DecodeConfig(beam_size=3, n_best=3, length_penalty=alpha, max_output_offset=2)
    limits = max_lengths(model, mask, decode)
    hyps = beam_search(model, SearchBatch(src, mask), decode, need_attention=False)
    for i, sentence in enumerate(hyps):
        expected = _reference_beam(model.eval(), *single(src, mask, i), 3, alpha, int(limits[i]))
        assert [h.tokens for h in sentence] == [tokens for tokens, _, _ in expected]
        for h, (_, log_prob, score) in zip(sentence, expected):
            assert h.log_prob == pytest.approx(log_prob, abs=1e-4) and h.score == pytest.approx(score, abs=1e-4)


class _Bigram(EncoderDecoder):
    """A scripted model: the next token's distribution depends on the previous token only, given as a
    table of probabilities (rows: previous token, columns: next token); the source is ignored."""

    def __init__(self, table: dict[int, dict[int, float]]) -> None:
        super().__init__()
        self.anchor = torch.nn.Parameter(torch.zeros(1))  # a device for the scoring helpers
        probs = torch.full((VOCAB, VOCAB), 1e-6)
        for previous, row in table.items():
            for token, p in row.items():
                probs[previous, token] = p
        self.register_buffer("log_p", (probs / probs.sum(1, keepdim=True)).log())

    def encode(self, src, src_mask):
        return {"rows": src_mask[:, :1].float()}

    def init_state(self, memory, max_steps=None):
        return {}

    def decode_step(self, memory, state, tokens, need_attention=True, output_weight=None):
        return self.log_p[tokens], state, None

    def forward(self, src, src_mask, tgt_in, need_attention=False, attention_layer=None, src_lengths=None):
        return self.log_p[tgt_in], None


def test_a_sentence_is_not_done_while_a_live_beam_scores_above_its_finished_ones():
    """Early EOS endings fill the k best candidates (p(EOS) = 0.1 after every word) while the live beam
    goes on to 4 5 6 EOS at log P = 3 log 0.85 + log 0.95. Stopping once k hypotheses have finished
    (the old rule) returned the empty output or "4" (log P -2.3, -2.5); the search must find greedy's
    output, whose score is far above them."""
    rest = lambda *tokens: {t: 0.05 / len(tokens) for t in tokens}  # noqa: E731
    model = _Bigram({BOS: {4: 0.85, EOS: 0.1, **rest(5, 6, 7)}, 4: {5: 0.85, EOS: 0.1, **rest(4, 6, 7)},
                     5: {6: 0.85, EOS: 0.1, **rest(4, 5, 7)}, 6: {EOS: 0.95, **rest(4, 5, 7)},
                     7: {EOS: 0.5, 7: 0.4, **rest(4, 5, 6)}}).eval()
    src = torch.tensor([[4, 5, 6, EOS]])
    expected = 3 * math.log(0.85) + math.log(0.95)
    (greedy,), = greedy_search(model, SearchBatch(src, src != PAD), need_attention=False)
    assert greedy.tokens == [4, 5, 6] and greedy.log_prob == pytest.approx(expected, abs=1e-4)
    for k, alpha, stop in itertools.product((2, 3, 5), (0.0, 1.0), ("exact", "likely")):
        best = beam_search(model, SearchBatch(src, src != PAD),
                           DecodeConfig(beam_size=k, n_best=k, length_penalty=alpha, beam_stop=stop),
                           need_attention=False)[0]
        assert best[0].tokens == [4, 5, 6], (k, alpha, stop, [h.tokens for h in best])
        assert best[0].score == pytest.approx(expected / _gnmt(4, alpha), abs=1e-4)
        scores = [h.score for h in best]  # the k best finished, a better ending replacing a worse
        assert len(best) == k and scores == sorted(scores, reverse=True)


def test_beam_not_worse_than_greedy(model, batch):
    greedy = greedy_search(model, SearchBatch(*batch), need_attention=False)
    beam = beam_search(model, SearchBatch(*batch), DecodeConfig(beam_size=5, length_penalty=0.0), need_attention=False)
    for (g,), (b,) in zip(greedy, beam):
        assert b.score >= g.score - 1e-4


@pytest.mark.parametrize("beam_size", [1, 3])
def test_batch_decodes_like_each_sentence_alone(model, batch, beam_size):
    src, mask = batch
    decode = DecodeConfig(beam_size=beam_size, n_best=beam_size)
    together = translate_batch(model, SearchBatch(src, mask), decode)
    for i, hyps in enumerate(together):
        alone = translate_batch(model, SearchBatch(*single(src, mask, i)), decode)[0]
        assert [h.tokens for h in hyps] == [h.tokens for h in alone]
        for h, a in zip(hyps, alone):
            assert h.score == pytest.approx(a.score, abs=1e-4)
            torch.testing.assert_close(h.attention, a.attention, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("beam_size", [1, 3])
def test_attention_shapes_and_rows(model, batch, beam_size):
    src, mask = batch
    hyps = translate_batch(model, SearchBatch(src, mask), DecodeConfig(beam_size=beam_size, n_best=beam_size))
    layers, heads = model.attention_layers, model.attention_heads
    for i, sentence in enumerate(hyps):
        for h in sentence:
            assert h.attention.shape == (layers, heads, len(h.tokens) + 1, int(mask[i].sum()))
            torch.testing.assert_close(h.attention.sum(-1), torch.ones(h.attention.shape[:-1]))


def test_attention_is_what_decoding_saw(model, batch):
    """The attention attached to a hypothesis equals decode_step's attention along its path."""
    src, mask = single(*batch, 1)
    (hyp,) = greedy_search(model, SearchBatch(src, mask))[0]
    with torch.no_grad():
        memory = model.encode(src, mask)
        state, rows = model.init_state(memory), []
        for token in [BOS] + hyp.tokens:
            _, state, attention = model.decode_step(memory, state, torch.tensor([token]))
            rows.append(attention[0])  # (layers, heads, src_len)
    torch.testing.assert_close(hyp.attention, torch.stack(rows, 2), atol=1e-5, rtol=1e-4)


def test_transformer_attention_per_layer_and_head(batch):
    model = make_model("transformer-post").eval()
    (hyp,) = greedy_search(model, SearchBatch(*batch), DecodeConfig(beam_size=1, max_output_offset=2))[0]
    assert hyp.attention.shape[:2] == (2, 4)
    assert not torch.allclose(hyp.attention[0, 0], hyp.attention[1, 1])


def test_each_sentence_has_its_own_length_bound(batch):
    model = make_model("luong-dot").eval()  # untrained: rarely emits EOS by itself
    src, mask = batch
    for beam_size in (1, 3):
        hyps = translate_batch(model, SearchBatch(src, mask),
                               DecodeConfig(beam_size=beam_size, max_output_ratio=0.5, max_output_offset=1),
                               need_attention=False)
        for i, (h, *_) in enumerate(hyps):
            assert len(h.tokens) <= math.ceil(int(mask[i].sum()) * 0.5) + 1


def test_learned_positions_bound_the_output_length():
    model = make_model("transformer-learned").eval()  # max_positions 16
    src = torch.tensor([[5, 6, 7, 8, 9, 10, 11, 4, 5, 6, 7, EOS]])
    for beam_size in (1, 2):
        (h, *_), = translate_batch(model, SearchBatch(src, src != PAD),
                                   DecodeConfig(beam_size=beam_size, max_output_ratio=3.0))
        assert len(h.tokens) <= 15


def test_search_restores_training_mode_and_checks_arguments(batch):
    model = make_model("bahdanau", dropout=0.3).train()
    first = greedy_search(model, SearchBatch(*batch), need_attention=False)
    assert model.training
    second = greedy_search(model, SearchBatch(*batch), need_attention=False)  # no dropout while searching
    assert [h.tokens for (h,) in first] == [h.tokens for (h,) in second]
    with pytest.raises(UserError, match="n-best"):
        DecodeConfig(beam_size=2, n_best=3)
    with pytest.raises(UserError):
        DecodeConfig(beam_size=0)


@pytest.mark.parametrize("alpha, n_best", [(0.0, 1), (0.0, 2), (1.0, 1), (-0.5, 1)])
def test_a_sentence_stops_once_no_live_beam_can_win_with_the_same_outputs(model, batch, alpha, n_best, monkeypatch):
    """``Beams.settled`` ends a sentence as soon as its n-best finished hypotheses cannot be beaten:
    the n-best lists equal those of searching on to the length bound, decoding fewer rows."""
    from seq2seq.decoding import beam

    steps = []
    decode_step = model.decode_step
    monkeypatch.setattr(model, "decode_step", lambda m, s, tokens, **kw: steps.append(len(tokens)) or decode_step(
        m, s, tokens, **kw))
    src, mask = batch
    decode = DecodeConfig(beam_size=4, n_best=n_best, length_penalty=alpha)
    pruned = beam_search(model, SearchBatch(src, mask), decode, need_attention=False)
    pruned_rows = sum(steps)
    monkeypatch.setattr(beam.Beams, "settled", lambda self, sentence, best, t: False)
    steps.clear()
    full = beam_search(model, SearchBatch(src, mask), decode, need_attention=False)
    for a, b in zip(pruned, full):
        assert [h.tokens for h in a] == [h.tokens for h in b]
        assert [h.score for h in a] == pytest.approx([h.score for h in b], abs=1e-5)
    assert pruned_rows <= sum(steps)


def test_settled_bounds_what_a_live_beam_can_still_score():
    """A live beam at log P = -1.5 ends at log P <= -1.5, its score at most -1.5 / lp(longest): with
    alpha 0 it cannot beat a finished -1.0, with alpha 1 and 10 tokens to go it might (-1.5 / (16/6))."""
    from seq2seq.decoding.beam import Beams
    from seq2seq.decoding.generator import Hypothesis

    beams = object.__new__(Beams)
    beams.finished, beams.host_limit, beams.n_best, beams.exact = [[Hypothesis([5], -1.0, -1.0)]], [10], 1, True
    beams.alpha = 0.0
    assert beams.settled(0, -1.5, 3) and not beams.settled(0, -0.5, 3)
    beams.alpha = 1.0
    assert not beams.settled(0, -1.5, 3) and beams.settled(0, -3.0, 3)  # -3 / (16 / 6) = -1.125
    beams.n_best = 2  # one finished hypothesis is not enough for a 2-best list
    assert not beams.settled(0, -30.0, 3)
    assert not beams.settled(0, float("-inf"), 3)  # no live beam, too few finished: on to the bound
    beams.n_best = 1
    assert beams.settled(0, float("-inf"), 3)  # no live beam and enough finished: done
    # beam_stop "likely": only the length it would have now, 3 + 2 (lp 10/6): -2 / (10/6) = -1.2 < -1.0
    assert not beams.settled(0, -2.0, 3)  # exact: -2 / (16/6) = -0.75 might still win
    beams.exact = False
    assert beams.settled(0, -2.0, 3) and not beams.settled(0, -1.5, 3)  # -1.5 / (10/6) = -0.9
