"""Sampling (temperature, top-k, nucleus): what may be drawn, with which probabilities, reproducibly."""
import math

import pytest
import torch

from seq2seq.config import DecodeConfig, check_decoding
from seq2seq.decoding.generator import SearchBatch, max_lengths
from seq2seq.decoding.sampling import Sampling
from seq2seq.decoding.search import greedy_search, sample_search, translate_batch
from seq2seq.errors import UserError
from test_models import BOS, EOS, PAD, VOCAB, make_model, trained_once, single

ARCHS = ["bahdanau", "transformer-pre"]


@pytest.fixture(scope="module", params=ARCHS)
def model(request):
    """Briefly trained (not converged): peaked but not one-hot next-token distributions."""
    steps = {"bahdanau": 25, "transformer-pre": 40}[request.param]
    return trained_once(request.param, steps, 1e-2)


def _step_log_probs(model, src, mask, tokens, limit):
    """Teacher-forced log p of every step of ``tokens`` + EOS, (len + 1, V), with what the search
    forbids at -inf: PAD and BOS, and every token but EOS at the length bound."""
    with torch.no_grad():
        logits, _ = model.eval()(src, mask, torch.tensor([[BOS] + tokens]))
    log_p = logits[0].log_softmax(-1)
    log_p[:, [PAD, BOS]] = float("-inf")
    if len(tokens) >= limit:
        keep = log_p[limit, EOS].item()
        log_p[limit:] = float("-inf")
        log_p[limit:, EOS] = keep
    return log_p


def _sample(model, batch: SearchBatch, n: int = 1, need_attention: bool = True, **sampling):
    """``n`` samples per sentence of ``batch``, drawn as ``sampling`` (``DecodeConfig``'s sampling fields) says."""
    return sample_search(model, batch, DecodeConfig(sample=True, n_best=n, **sampling), need_attention)


def _allowed(log_p, temperature, top_k, top_p, slack=1e-4):
    """Boolean mask (V,) of the tokens sampling may draw from one step's log p (with a rounding slack)."""
    q = (log_p.double() / temperature).softmax(-1)
    allowed = q > 0
    if top_k:
        kth = q.topk(top_k).values[-1]
        allowed &= q >= kth * (1 - slack)
        q = q * allowed
        q = q / q.sum()
    if top_p < 1:
        before = torch.tensor([q[q > q[y]].sum() for y in range(len(q))])  # mass of the more probable tokens
        allowed &= before < top_p + slack
    return allowed


@pytest.mark.parametrize("shortlist", [False, True])
def test_top_k_one_and_temperature_zero_are_greedy_exactly(model, batch, shortlist):
    vocabulary = torch.tensor([EOS, 4, 5, 6, 7, 8, 9]) if shortlist else None
    greedy = greedy_search(model, SearchBatch(*batch, vocabulary=vocabulary))
    for sampling in (dict(top_k=1, seed=5), dict(temperature=0.0), dict(top_k=1, top_p=0.3, seed=1)):
        sampled = _sample(model, SearchBatch(*batch, vocabulary=vocabulary), **sampling)
        for (g,), (s,) in zip(greedy, sampled):
            assert s.tokens == g.tokens and s.log_prob == g.log_prob and s.score == g.score
            torch.testing.assert_close(s.attention, g.attention, rtol=0, atol=0)


@pytest.mark.parametrize("temperature, top_k, top_p", [(2.0, 3, 1.0), (1.5, 0, 0.6), (3.0, 4, 0.7), (0.5, 2, 1.0)])
def test_samples_stay_inside_top_k_and_the_nucleus(model, batch, temperature, top_k, top_p):
    """Every drawn token, re-scored by teacher forcing its prefix, is among the k best and inside the
    nucleus of that step (top-k first, then top-p over the renormalised k best); and the reported
    log-probability is the model's own (temperature 1, untruncated) log p of the sample."""
    src, mask = batch
    hyps = _sample(model, SearchBatch(src, mask), 8, False, top_k=top_k, top_p=top_p, temperature=temperature, seed=11)
    limits = max_lengths(model, mask, DecodeConfig())
    drawn = set()
    for i, samples in enumerate(hyps):
        assert len(samples) == 8 and [h.score for h in samples] == sorted((h.score for h in samples), reverse=True)
        for h in samples:
            log_p = _step_log_probs(model, *single(src, mask, i), h.tokens, int(limits[i]))
            for t, y in enumerate(h.tokens + [EOS]):
                assert _allowed(log_p[t], temperature, top_k, top_p)[y], (i, h.tokens, t)
                drawn.add((t, y))
            rescored = log_p.gather(1, torch.tensor([h.tokens + [EOS]]).T).sum().item()
            assert h.log_prob == pytest.approx(rescored, abs=1e-4) and h.score == h.log_prob
    assert len(drawn) > 20  # the samples do vary


def test_choose_draws_each_token_with_its_reshaped_probability():
    """Inverse-CDF drawing over an even grid of uniform numbers: every token is drawn a share of
    the grid equal to its probability after temperature, top-k and top-p (to one grid cell)."""
    torch.manual_seed(0)
    log_p = torch.randn(3, 12).log_softmax(-1)
    log_p[:, 2] = float("-inf")  # banned (BOS)
    grid = (torch.arange(20000, dtype=torch.float64) + 0.5) / 20000
    for temperature, top_k, top_p in ((1.0, 0, 1.0), (0.7, 0, 1.0), (2.0, 5, 1.0), (1.3, 0, 0.8), (1.3, 6, 0.5)):
        sampling = Sampling(top_k=top_k, top_p=top_p, temperature=temperature)
        for row in log_p:
            drawn = sampling.choose(row.expand(len(grid), -1), grid).squeeze(1)
            q = (row.double() / temperature).softmax(-1) * _allowed(row, temperature, top_k, top_p, slack=0)
            q = q / q.sum()
            share = torch.bincount(drawn, minlength=12).double() / len(grid)
            torch.testing.assert_close(share, q, atol=1.5 / len(grid), rtol=0)
            assert share[2] == 0


@pytest.mark.parametrize("temperature", [0.7, 2.0])
def test_first_token_frequencies_match_softmax_of_logits_over_temperature(temperature):
    """Chi-square goodness of fit of 20,000 first tokens against softmax(z / T) (PAD and BOS
    banned). The seed is fixed, so the test cannot flip; the bound (p ~ 1e-6 for the degrees of
    freedom here) would hold for almost every seed anyway."""
    model = make_model("transformer-pre").eval()  # untrained: a flat, many-token distribution
    src = torch.tensor([[5, 9, 7, EOS]])
    n = 20000
    hyps = sample_search(model, SearchBatch(src, src != PAD),  # bound: ceil(4 x 0.25) + 0 = 1 token
                         DecodeConfig(sample=True, n_best=n, temperature=temperature, seed=2024, max_output_ratio=0.25,
                                      max_output_offset=0), need_attention=False)[0]
    counts = torch.bincount(torch.tensor([h.tokens[0] if h.tokens else EOS for h in hyps]), minlength=VOCAB).double()
    with torch.no_grad():
        memory = model.encode(src, src != PAD)
        logits, _, _ = model.decode_step(memory, model.init_state(memory), torch.tensor([BOS]))
    logits = logits[0].double() / temperature
    logits[[PAD, BOS]] = float("-inf")
    expected = logits.softmax(-1) * n
    assert counts[PAD] == counts[BOS] == 0
    used = expected > 0
    chi2 = ((counts[used] - expected[used]) ** 2 / expected[used]).sum().item()
    dof = int(used.sum()) - 1
    assert expected[used].min() > 50  # every cell large enough for the chi-square approximation
    assert chi2 < dof + 8 * math.sqrt(2 * dof), (chi2, dof)


def test_same_seed_same_samples_whatever_the_batch_and_different_seeds_differ(model, batch):
    src, mask = batch
    hot = dict(temperature=3.0)
    first = _sample(model, SearchBatch(src, mask), 3, False, seed=7, **hot)
    again = _sample(model, SearchBatch(src, mask), 3, False, seed=7, **hot)
    other = _sample(model, SearchBatch(src, mask), 3, False, seed=8, **hot)
    tokens = [[h.tokens for h in s] for s in first]
    assert tokens == [[h.tokens for h in s] for s in again]
    assert tokens != [[h.tokens for h in s] for s in other]
    for i in (0, 3, 5):  # alone in its batch, under its own sentence id: the same samples
        alone = _sample(model, SearchBatch(*single(src, mask, i), sentence_ids=[i]), 3, False, seed=7, **hot)[0]
        assert [h.tokens for h in alone] == tokens[i]
        # fp32 sums of ~40 log-probabilities in another batch: relative error ~1e-7 (AMX kernels: 1.9e-7 at -81)
        assert [h.log_prob for h in alone] == pytest.approx([h.log_prob for h in first[i]], rel=2e-6, abs=1e-5)
    one = _sample(model, SearchBatch(src, mask), 1, False, seed=7, **hot)
    for (h,), samples in zip(one, tokens):  # sample 0 of n is the sample of n = 1
        assert h.tokens in samples


def test_sampling_over_a_shortlist_draws_only_its_tokens_and_a_full_list_changes_nothing(model, batch):
    src, mask = batch
    sampling = dict(temperature=3.0, seed=3)
    subset = torch.tensor([EOS, 4, 6, 8, 10])
    for sentence in _sample(model, SearchBatch(src, mask, vocabulary=subset), 4, False, **sampling):
        for h in sentence:
            assert set(h.tokens) <= {4, 6, 8, 10}
    full = _sample(model, SearchBatch(src, mask, vocabulary=torch.arange(VOCAB)), 2, **sampling)  # sorted ids
    plain = _sample(model, SearchBatch(src, mask), 2, **sampling)
    assert [[h.tokens for h in s] for s in full] == [[h.tokens for h in s] for s in plain]


def test_translate_batch_dispatches_and_bounds_the_length(model, batch):
    src, mask = batch
    decode = DecodeConfig(sample=True, n_best=2, temperature=5.0, seed=1, max_output_ratio=0.5)
    hyps = translate_batch(model, SearchBatch(src, mask), decode)
    for i, sentence in enumerate(hyps):
        assert len(sentence) == 2
        for h in sentence:
            assert len(h.tokens) <= math.ceil(int(mask[i].sum()) * 0.5) + decode.max_output_offset
            assert not {PAD, BOS, EOS} & set(h.tokens)
            assert h.attention.shape[2] == len(h.tokens) + 1


@pytest.mark.parametrize("options, message", [
    (dict(sample=True, top_k=-1), "--top-k must be >= 0"),
    (dict(sample=True, top_p=0.0), "--top-p must be in (0, 1]"),
    (dict(sample=True, top_p=1.5), "--top-p must be in (0, 1]"),
    (dict(sample=True, top_p=float("nan")), "--top-p must be in (0, 1]"),
    (dict(sample=True, temperature=-0.5), "--temperature must be a finite number >= 0"),
    (dict(sample=True, temperature=float("inf")), "--temperature must be a finite number >= 0"),
    (dict(sample=True, beam_size=4), "--sample draws every token at random and has no beam"),
    (dict(sample=True, n_best=0), "--n-best (samples per input) must be >= 1"),
    (dict(top_p=0.9), "--top-p: sampling option(s), used only with --sample"),
    (dict(seed=3, temperature=0.5), "--temperature, --seed: sampling option(s)"),
    (dict(beam_size=2, n_best=3), "need 1 <= --n-best (3) <= --beam-size (2)"),
])
def test_bad_options_are_named_errors_before_any_work(options, message):
    from seq2seq.decoding.translator import Translator

    with pytest.raises(UserError) as caught:
        bare = object.__new__(Translator)  # no model: nothing runs
        bare.decode = DecodeConfig()
        Translator.translate(bare, ["Ein Hund."], **options)
    assert message in str(caught.value)


def test_sampling_defaults_and_errors_at_the_search_level(model, batch):
    assert check_decoding(None, 1) == 5 and check_decoding(None, 3, sample=True) == 1
    assert check_decoding(1, 1, sample=True, top_k=3, top_p=0.5, temperature=0.0, seed=1) == 1
    with pytest.raises(UserError, match="--top-p"):
        Sampling(top_p=0.0)
    with pytest.raises(UserError, match="has no beam"):
        DecodeConfig(beam_size=3, n_best=1, sample=True, seed=1)
