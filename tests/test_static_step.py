"""The Transformer's static-shape decoding step (a preallocated key/value cache written in place) equals
the growing cache's step, for every position encoding and through every search; compiled, it equals
the eager step (``seq2seq.models.compiled``)."""
import threading
import warnings

import pytest
import torch

from seq2seq.config import DecodeConfig
from seq2seq.decoding.constrained import constrained_beam_search
from seq2seq.decoding.constraints import SentenceConstraints
from seq2seq.decoding.ensemble import EnsembleModel
from seq2seq.decoding.prefix import Prefixes
from seq2seq.decoding.beam import beam_search
from seq2seq.decoding.generator import SearchBatch
from seq2seq.decoding.search import greedy_search, sample_search
from seq2seq.models.base import select_batch
from seq2seq.models import compiled
from seq2seq.models.compiled import compile_decoding
from seq2seq.models.fused import static_choice
from seq2seq.models.transformer import CACHE_BUCKET
from test_models import BOS, EXTRA, VARIANTS, VOCAB, make_model, reverse_batch, single, trained_once

TRANSFORMERS = [v for v in list(VARIANTS) + list(EXTRA) if v.startswith("transformer")]


def _sentence(seed: int = 0, length: int = 6):
    src, mask, tgt_in, _ = reverse_batch(1, torch.Generator().manual_seed(seed), length, length)
    return src, mask, tgt_in


@pytest.mark.parametrize("variant", TRANSFORMERS)
def test_the_static_step_equals_the_growing_cache_under_beam_reordering(variant):
    """k rows of one sentence, reordered between steps as beam search does: logits and attention of
    every step agree with the growing cache's, and the fast path (no attention) too."""
    model, k = make_model(variant).eval(), 3
    src, mask, tgt_in = _sentence()
    generator = torch.Generator().manual_seed(1)
    with torch.inference_mode():
        memory = model.encode(src, mask)
        growing = select_batch(model.init_state(memory, 9), torch.zeros(k, dtype=torch.long))
        model.static_cache = True
        static = select_batch(model.init_state(memory, 9), torch.zeros(k, dtype=torch.long))
        assert static["self_kv"][0][0].size(2) == CACHE_BUCKET and "step" not in growing
        rows = torch.randint(4, VOCAB, (k, 9), generator=generator)
        for t in range(9):
            logits, growing, weights = model.decode_step(memory, growing, rows[:, t])
            fast, _, none = model.decode_step(memory, {"self_kv": [tuple(c.clone() for c in kv)
                                                                   for kv in static["self_kv"]],
                                                       "step": static["step"]}, rows[:, t], need_attention=False)
            static_logits, static, static_weights = model.decode_step(memory, static, rows[:, t])
            torch.testing.assert_close(static_logits, logits, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(static_weights, weights, atol=1e-6, rtol=1e-5)
            torch.testing.assert_close(fast, logits, atol=1e-5, rtol=1e-5)
            assert none is None and static["step"].tolist() == [t + 1] * k
            order = torch.randint(0, k, (k,), generator=generator)  # beams die and split
            growing, static = select_batch(growing, order), select_batch(static, order)


def test_only_one_sentence_at_a_time_gets_a_static_cache():
    model = make_model("transformer-pre").eval()
    model.static_cache = True
    src, mask, _, _ = reverse_batch(2, torch.Generator().manual_seed(0))
    with torch.inference_mode():
        assert "step" not in model.init_state(model.encode(src, mask), 12)  # wide batches: growing cache
        assert "step" not in model.init_state(model.encode(src[:1], mask[:1]))  # no bound: growing cache
        state = model.init_state(model.encode(src[:1], mask[:1]), CACHE_BUCKET + 1)
    assert state["self_kv"][0][0].size(2) == 2 * CACHE_BUCKET  # rounded up to the bucket


@pytest.fixture(scope="module")
def trained():
    """A Transformer that reverses sequences (so that searches have something to find)."""
    return trained_once("transformer-pre", 150, 1e-2)

BEAM_3 = DecodeConfig(beam_size=3)


def _greedy_and_beam(model, sentence):
    batch = SearchBatch(*sentence)
    return greedy_search(model, batch, need_attention=False), beam_search(model, batch, BEAM_3)


def _searches(model):
    """Every search, one sentence at a time: name -> function(src, mask) -> hypotheses."""
    constraints = [SentenceConstraints(((5, 6),))]
    prefixes = Prefixes([[torch.tensor([7]), torch.tensor([8, 9])]], VOCAB)
    vocabulary = torch.tensor([0, 1, 2, 3, 4, 5, 6, 7, 8])
    return {
        "greedy": lambda s, m: greedy_search(model, SearchBatch(s, m), need_attention=False),
        "beam": lambda s, m: beam_search(model, SearchBatch(s, m), DecodeConfig(beam_size=4, n_best=4),
                                         need_attention=False),
        "shortlist": lambda s, m: beam_search(model, SearchBatch(s, m, vocabulary=vocabulary),
                                              BEAM_3, need_attention=False),
        "prefix": lambda s, m: beam_search(model, SearchBatch(s, m, prefixes=prefixes), DecodeConfig(beam_size=3),
                                           need_attention=False),
        "constraints": lambda s, m: constrained_beam_search(model, SearchBatch(s, m), constraints,
                                                            BEAM_3, need_attention=False),
        "sampling": lambda s, m: sample_search(model, SearchBatch(s, m), DecodeConfig(sample=True, seed=3),
                                               need_attention=False),
        "attention": lambda s, m: beam_search(model, SearchBatch(s, m), DecodeConfig(beam_size=2)),
    }


def _assert_same(got, want):
    for hyps, reference in zip(got, want):
        assert [h.tokens for h in hyps] == [h.tokens for h in reference]
        for h, r in zip(hyps, reference):
            assert abs(h.score - r.score) <= 1e-5
            if r.attention is not None:
                torch.testing.assert_close(h.attention, r.attention, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("search", list(_searches(None)))
def test_every_search_decodes_the_same_on_the_static_cache(trained, search):
    src, mask, _, _ = reverse_batch(6, torch.Generator().manual_seed(5))
    run = _searches(trained)[search]
    sentences = [single(src, mask, i) for i in range(6)]
    trained.static_cache = False
    want = [run(*sentence)[0] for sentence in sentences]
    trained.static_cache = True
    try:
        got = [run(*sentence)[0] for sentence in sentences]
    finally:
        trained.static_cache = False
    for g, w in zip(got, want):
        _assert_same([g], [w])


class _FusedStandIn:
    """A compiled step that is the eager one, with the fused steps counted (``PackagedStep``'s interface)."""

    def __init__(self, model):
        self.model, self.calls = model, {"greedy": 0, "beam": 0}

    def __call__(self, *args):
        return self.model.static_step(*args)

    def choose(self, kind, *args):
        self.calls[kind] += 1
        return static_choice(self.model, kind, *args)


@pytest.mark.parametrize("bound", [None, 2])
def test_searches_through_the_fused_step_decode_like_the_step_by_step_loop(trained, bound):
    """A model whose step comes with the search's choice (``greedy_step`` / ``beam_step``, as a packaged Transformer
    has them) decodes a lone sentence with one call per output token: greedy and beam search (n-best, length
    penalty) give the same tokens, scores and attention as step by step on the growing cache, also where the length
    bound forces EOS (``bound``: at most 2 tokens); several sentences at once, a shortlist and sampling keep the
    step-by-step loop."""
    limits = {} if bound is None else {"max_output_ratio": 0.01, "max_output_offset": bound - 1}
    greedy, beam = DecodeConfig(beam_size=1, **limits), DecodeConfig(beam_size=3, n_best=3, **limits)
    src, mask, _, _ = reverse_batch(4, torch.Generator().manual_seed(8))
    sentences = [single(src, mask, i) for i in range(4)]

    def run():
        return ([greedy_search(trained, SearchBatch(*s), greedy) for s in sentences],
                [beam_search(trained, SearchBatch(*s), beam) for s in sentences])

    want = run()
    stand_in = _FusedStandIn(trained)
    trained.compiled_step, trained.static_cache = stand_in, True
    try:
        assert trained.fused_search
        got = run()
        calls = dict(stand_in.calls)
        wide = greedy_search(trained, SearchBatch(src, mask), greedy, need_attention=False)
        sample_search(trained, SearchBatch(*sentences[0]), DecodeConfig(sample=True, seed=3), need_attention=False)
        beam_search(trained, SearchBatch(*sentences[0], vocabulary=torch.arange(9)), beam, need_attention=False)
    finally:
        trained.compiled_step, trained.static_cache = None, False
    for g, w in zip(got[0] + got[1], want[0] + want[1]):
        _assert_same(g, w)
    assert calls["greedy"] == sum(len(g[0][0].tokens) + 1 for g in got[0])  # one call per token and EOS
    assert calls["beam"] >= max(len(h.tokens) + 1 for g in got[1] for h in g[0])
    assert stand_in.calls == calls  # the batch of 4, the sampling and the shortlist did not use them
    assert [h[0].tokens for h in wide] == [g[0][0].tokens for g in want[0]]
    if bound is not None:
        assert max(len(h.tokens) for g in got[0] + got[1] for h in g[0]) == bound


def test_an_ensemble_decodes_the_same_on_static_caches(trained):
    other = make_model("transformer-rope", seed=1).eval()
    ensemble = EnsembleModel([trained, other])
    src, mask, _, _ = reverse_batch(4, torch.Generator().manual_seed(6))
    sentences = [single(src, mask, i) for i in range(4)]
    want = [beam_search(ensemble, SearchBatch(*s), BEAM_3, need_attention=False) for s in sentences]
    trained.static_cache = other.static_cache = True
    try:
        got = [beam_search(ensemble, SearchBatch(*s), BEAM_3, need_attention=False) for s in sentences]
    finally:
        trained.static_cache = other.static_cache = False
    for g, w in zip(got, want):
        _assert_same(g, w)


@pytest.mark.slow  # three graphs compiled
def test_the_compiled_step_decodes_like_the_eager_one(trained, monkeypatch):
    """Greedy and beam search through the compiled step (one graph each) give the eager outputs;
    skipped where torch.compile cannot compile (no C++ compiler). Without autotuning the linear
    layers, which chooses kernels, not results, and costs half of this test's time (the full options
    are measured, outputs compared, by benchmarks/bench_ctranslate2.py)."""
    monkeypatch.setattr(compiled, "INDUCTOR_OPTIONS", {k: v for k, v in compiled.INDUCTOR_OPTIONS.items()
                                                       if "autotune" not in k})
    model = make_model("transformer-pre").eval()
    model.load_state_dict(trained.state_dict())
    src, mask, _, _ = reverse_batch(5, torch.Generator().manual_seed(7))
    sentences = [single(src, mask, i) for i in range(5)]
    want = [_greedy_and_beam(model, s) for s in sentences]
    assert compile_decoding(model) and model.static_cache
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = [_greedy_and_beam(model, s) for s in sentences]
    if model.compiled_step is None:
        pytest.skip(f"torch.compile unavailable here: {[str(w.message) for w in caught]}")
    threads = torch.get_num_threads()  # keys: rows, attention, no shortlist, source > 1, threads
    assert model.compiled_step.graphs == {(1, False, True, True, threads), (3, False, True, True, threads)}
    assert model.compiled_encode.graphs == {(1, True, threads)}
    for (greedy, beam), (greedy_want, beam_want) in zip(got, want):
        _assert_same(greedy, greedy_want)
        _assert_same(beam, beam_want)
    assert all(greedy[0][0].tokens for greedy, _ in got)  # a trained model: real outputs, not empty ones
    bos = torch.tensor([BOS])
    with torch.inference_mode():
        memory = model.encode(*sentences[0])
        state = model.init_state(memory, 4)
        assert "step" in state
        logits, state, _ = model.decode_step(memory, state, bos, need_attention=False)
    assert logits.shape == (1, VOCAB) and state["step"].tolist() == [1]


# ----------------------------------------------------------------------------- compiling in the background


def _decode_all(model, sentences):
    return [_greedy_and_beam(model, s) for s in sentences]


def test_a_background_compile_keeps_the_model_eager_until_its_graphs_are_ready(trained, monkeypatch):
    """While the warm-up thread compiles (Dynamo's tracing and guards; the "eager" backend generates
    no code), the model decodes eagerly on the growing cache with the same outputs; once ready, lone
    sentences decode through the graphs the warm-up compiled, on its thread count."""
    monkeypatch.setattr(compiled, "BACKEND", "eager")
    model = make_model("transformer-pre").eval()
    model.load_state_dict(trained.state_dict())
    src, mask, _, _ = reverse_batch(3, torch.Generator().manual_seed(7))
    sentences = [single(src, mask, i) for i in range(3)]
    want = _decode_all(model, sentences)
    warmed, release = threading.Event(), threading.Event()

    def warm_up(view):
        assert view is not model and view.static_cache and view.compiled_step is not None
        assert list(view.parameters())[0] is list(model.parameters())[0]  # the same weights
        _decode_all(view, sentences[:1])
        warmed.set()
        assert release.wait(60)

    job = compiled.BackgroundCompile(model, warm_up, threads=1).start()
    try:
        assert warmed.wait(60)
        assert job.status == "compiling" and model.compiled_step is None and not model.static_cache
        for got, expected in zip(_decode_all(model, sentences), want):  # meanwhile: eager
            _assert_same(got[0], expected[0]), _assert_same(got[1], expected[1])
    finally:
        release.set()
    assert job.wait(60) == "ready" and job.seconds > 0 and job.error is None
    assert model.static_cache and model.compiled_step.graphs == {(1, False, True, True, 1), (3, False, True, True, 1)}
    for got, expected in zip(_decode_all(model, sentences), want):
        _assert_same(got[0], expected[0]), _assert_same(got[1], expected[1])


def test_a_failed_background_compile_leaves_the_model_eager_and_says_why(trained, monkeypatch):
    def no_compiler(graph, inputs):
        raise RuntimeError("no C++ compiler found")

    monkeypatch.setattr(compiled, "BACKEND", no_compiler)
    model = make_model("transformer-pre").eval()
    model.load_state_dict(trained.state_dict())
    src, mask, _, _ = reverse_batch(1, torch.Generator().manual_seed(7))
    sentence = single(src, mask, 0)
    want = greedy_search(model, SearchBatch(*sentence), need_attention=False)
    job = compiled.BackgroundCompile(model, lambda view: greedy_search(view, SearchBatch(*sentence),
                                                                       need_attention=False))
    assert job.start().wait(60) == "failed" and "no C++ compiler found" in job.error
    assert model.compiled_step is None and not model.static_cache
    _assert_same(greedy_search(model, SearchBatch(*sentence), need_attention=False), want)


def test_a_background_compile_of_an_ensemble_compiles_every_member(trained, monkeypatch):
    """A Transformer and an RNN member each get their compiled parts, attached only when all are ready; a model
    with nothing to compile is "off" (its warm-up never runs)."""
    monkeypatch.setattr(compiled, "BACKEND", "eager")
    rnn, transformer = make_model("bahdanau").eval(), make_model("transformer-pre").eval()
    ensemble = EnsembleModel([rnn, transformer])
    src, mask, _, _ = reverse_batch(1, torch.Generator().manual_seed(7))
    sentence = single(src, mask, 0)
    seen = []

    def warm_up(view):
        seen.append([getattr(m, "compiled_step", None) is not None for m in getattr(view, "members", [view])])
        assert transformer.compiled_step is None and rnn.compiled_step is None  # untouched until ready
        beam_search(view, SearchBatch(*sentence), DecodeConfig(beam_size=2))

    assert compiled.BackgroundCompile(ensemble, warm_up).start().wait(60) == "ready"
    assert seen == [[True, True]] and list(ensemble.members) == [rnn, transformer]
    assert transformer.static_cache and transformer.compiled_step.graphs
    assert not hasattr(rnn, "static_cache") and rnn.compiled_encode is None and rnn.compiled_step.graphs == {
        (rows, False, True, True, torch.get_num_threads()) for rows in (1, 2)}  # beam 2: its first step, then 2 rows
    assert compiled.BackgroundCompile(torch.nn.Linear(2, 2), warm_up).start().wait(60) == "off" and len(seen) == 1


@pytest.mark.parametrize("variant", ["bahdanau", "luong-general", "bahdanau-lstm-2layer", "luong-no-feeding"])
def test_the_compiled_rnn_step_decodes_every_search_like_the_eager_one(variant, monkeypatch):
    """Every search of lone sentences through the RNN's compiled step (Dynamo's graphs and guards; the
    "eager" backend generates no code, so outputs are equal) gives the eager outputs; one graph per row count,
    attention and shortlist; a batch of sentences stays eager. What Inductor's
    code changes is measured by benchmarks/bench_rnn_step.py (logits within 3e-7)."""
    monkeypatch.setattr(compiled, "BACKEND", "eager")
    model = make_model(variant).eval()
    src, mask, _, _ = reverse_batch(3, torch.Generator().manual_seed(5))
    sentences = [single(src, mask, i) for i in range(3)]
    runs = _searches(model)
    want = {name: [run(*s)[0] for s in sentences] for name, run in runs.items()}
    batch = beam_search(model, SearchBatch(src, mask), BEAM_3, need_attention=False)
    assert compile_decoding(model) and model.compiled_step is not None and not hasattr(model, "static_cache")
    for name, run in runs.items():
        _assert_same([run(*s)[0] for s in sentences], want[name])
    threads = torch.get_num_threads()
    # greedy, beam 4, a shortlist's beam 3 (attention comes from a teacher-forced pass after the search)
    assert {(1, False, True, True, threads), (4, False, True, True, threads), (3, False, False, True, threads)} <= \
        model.compiled_step.graphs
    graphs = set(model.compiled_step.graphs)
    again = beam_search(model, SearchBatch(src, mask), BEAM_3, need_attention=False)  # three sentences: eager
    assert model.compiled_step.graphs == graphs
    for got, expected in zip(again, batch):
        _assert_same([got], [expected])
