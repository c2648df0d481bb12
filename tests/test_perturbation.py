"""LIME and KernelSHAP over source words (seq2seq.attribution.perturbation): KernelSHAP's efficiency
and its convergence to the Shapley values, one word, seeds, words spread over their pieces,
the sample budget, a missing Captum; and the faithfulness benchmark on two tiny checkpoints."""
from __future__ import annotations

import importlib.util
import itertools
import json
import math
import sys

import numpy as np
import pytest
import torch

from seq2seq.attribution.attribute import attribute
from seq2seq.attribution.perturbation import explain_words, min_samples
from seq2seq.config import AttributionConfig, ModelConfig
from seq2seq.decoding.scoring import teacher_force
from seq2seq.errors import UserError
from seq2seq.models import build_model

needs_captum = pytest.mark.skipif(importlib.util.find_spec("captum") is None,
                                  reason="Captum is not installed (pip install 'seq2seq[explain]')")
PAD, EOS = 0, 3
SRC = [5, 6, 7, 8, 9, EOS]
PIECES = ["▁a", "b", "▁c", "▁d", "e", "</s>"]  # 3 words: ab | c | de
SPANS = [(0, 2), (2, 3), (3, 5)]
TGT = [4, 10, 11, 6]
ARCHS = {
    "rnn": dict(arch="rnn", attention="bahdanau", embed_dim=16, hidden_size=16, decoder_hidden_size=24),
    "transformer": dict(arch="transformer", d_model=32, heads=2, ff_size=64, layers=2),
}


def make(arch: str, **extra):
    torch.manual_seed(0)
    return build_model(ModelConfig(vocab_size=12, dropout=0.0, **ARCHS[arch], **extra)).eval()


def coalition_scores(model, src, spans, tgt=TGT) -> dict[tuple[int, ...], np.ndarray]:
    """f(z) = (T+1,) log-probs of every coalition z of words (absent words deleted, EOS kept)."""
    coalitions = list(itertools.product([0, 1], repeat=len(spans)))
    sources = [[t for w, (a, b) in enumerate(spans) if z[w] for t in src[a:b]] + [EOS] for z in coalitions]
    log_probs, _ = teacher_force(model, sources, [tgt] * len(sources))
    return {z: lp.astype(np.float64) for z, lp in zip(coalitions, log_probs)}


def word_values(raw: np.ndarray, spans=SPANS) -> np.ndarray:
    """(T+1, M): a word's value is the sum over its pieces (what the word merge computes)."""
    return np.stack([raw[:, a:b].sum(1) for a, b in spans], 1)


@needs_captum
@pytest.mark.parametrize("arch", list(ARCHS))
def test_kernel_shap_is_efficient_and_tends_to_the_shapley_values(arch):
    """Per target token the word attributions sum to f(x) - f(EOS only); a word's pieces share its
    value equally; with 200 samples the values are near the exact Shapley values (enumerated)."""
    model = make(arch)
    f = coalition_scores(model, SRC, SPANS)
    m = len(SPANS)
    shapley = np.zeros((len(TGT) + 1, m))
    for i in range(m):
        for z in f:
            if not z[i]:
                with_i = tuple(1 if w == i else z[w] for w in range(m))
                weight = math.factorial(sum(z)) * math.factorial(m - sum(z) - 1) / math.factorial(m)
                shapley[:, i] += weight * (f[with_i] - f[z])
    a = attribute(model, SRC, TGT, "kernel-shap", AttributionConfig(samples=200, seed=0), src_pieces=PIECES)
    words = word_values(a.raw)
    np.testing.assert_allclose(words.sum(1), f[(1, 1, 1)] - f[(0, 0, 0)], atol=1e-4)  # efficiency
    assert a.raw[:, 0].tolist() == a.raw[:, 1].tolist() and (a.raw[:, -1] == 0).all()
    assert np.abs(words - shapley).max() < 0.1 * np.abs(shapley).max()
    few = word_values(explain_words(model, SRC, TGT, "kernel-shap", samples=8, seed=0, src_pieces=PIECES).raw)
    np.testing.assert_allclose(few.sum(1), f[(1, 1, 1)] - f[(0, 0, 0)], atol=1e-4)  # at any sample count


def test_kernel_shap_of_one_word_is_its_effect():
    """M = 1: the one Shapley value is f(x) - f(EOS only), computed directly (no Captum needed)."""
    model = make("transformer")
    one = explain_words(model, [7, 8, EOS], TGT, "kernel-shap", samples=4, src_pieces=["▁a", "b", "</s>"])
    f = coalition_scores(model, [7, 8, EOS], [(0, 2)])
    np.testing.assert_allclose(one.raw[:, :2].sum(1), f[(1,)] - f[(0,)], atol=1e-6)
    assert one.raw[:, 0].tolist() == one.raw[:, 1].tolist()


@needs_captum
def test_lime_is_reproducible_with_a_seed_and_leaves_the_callers_random_stream_alone():
    model = make("rnn")
    torch.manual_seed(123)
    before = torch.rand(3)
    torch.manual_seed(123)
    first = explain_words(model, SRC, TGT, "lime", samples=30, seed=1, src_pieces=PIECES)
    assert torch.equal(torch.rand(3), before)  # the caller's stream is untouched
    again = explain_words(model, SRC, TGT, "lime", samples=30, seed=1, src_pieces=PIECES)
    other = explain_words(model, SRC, TGT, "lime", samples=30, seed=2, src_pieces=PIECES)
    np.testing.assert_array_equal(first.raw, again.raw)
    assert np.abs(first.raw - other.raw).max() > 1e-4
    np.testing.assert_array_equal(first.scores, np.maximum(first.raw, 0))
    assert first.raw[:, 3].tolist() == first.raw[:, 4].tolist() and (first.raw[:, -1] == 0).all()
    assert first.settings == {"samples": 30, "seed": 1, "words": 3}


def test_too_few_samples_for_the_source_is_a_user_error():
    model = make("rnn")
    assert min_samples(3) == 8
    for method in ("lime", "kernel-shap"):
        with pytest.raises(UserError, match=r"3 words.*--attribution-samples >= 2 \(words \+ 1\) = 8.*got 7"):
            attribute(model, SRC, TGT, method, AttributionConfig(samples=7), src_pieces=PIECES)
    empty = explain_words(model, [EOS], TGT, "lime", samples=2)  # no words: nothing to explain
    assert empty.raw.shape == (len(TGT) + 1, 1) and not empty.raw.any()


def test_missing_captum_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "captum", None)  # import captum -> ImportError
    monkeypatch.setitem(sys.modules, "captum.attr", None)
    for method in ("lime", "kernel-shap"):
        with pytest.raises(UserError, match=r"need Captum.*pip install 'seq2seq\[explain\]'"):
            attribute(make("rnn"), SRC, TGT, method, AttributionConfig(samples=20))
    assert attribute(make("rnn"), SRC, TGT, "occlusion").raw.shape == (len(TGT) + 1, len(SRC))  # others still work


# ----------------------------------------------------------------------------- the faithfulness benchmark


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, tiny_tokenizer):
    """Untrained tiny RNN and Transformer checkpoints sharing the tiny tokenizer."""
    from seq2seq.config import RunConfig
    from seq2seq.checkpoint.file import save_checkpoint
    from seq2seq.checkpoint.parts import bytes_to_tensor

    out = tmp_path_factory.mktemp("faithfulness")
    paths = []
    for arch, options in ARCHS.items():
        config = RunConfig(model=ModelConfig(vocab_size=tiny_tokenizer.vocab_size, dropout=0.0, **options)).resolved()
        torch.manual_seed(0)
        path = out / f"{arch}.pt"
        save_checkpoint(path, {"config": config.to_dict(), "model": build_model(config.model).state_dict(),
                               "tokenizer": bytes_to_tensor(tiny_tokenizer.to_bytes())})
        paths.append(str(path))
    return paths


@needs_captum
def test_faithfulness_benchmark_record_table_and_plot(checkpoints, tmp_path, capsys):
    import bench_faithfulness

    src = tmp_path / "src.txt"
    src.write_text("three hundred and five\n\nseven thousand and twelve\n", encoding="utf-8")
    out = tmp_path / "bench" / "faith.json"
    argv = ["--checkpoint", *checkpoints, "--source", str(src), "--max-words", "2", "--ig-steps", "2",
            "--attribution-samples", "16", "--batch-size", "8", "--out", str(out), "--quiet", "--device", "cpu"]
    assert bench_faithfulness.main(argv) == 0
    record = json.loads(out.read_text(encoding="utf-8"))
    assert record["settings"]["sentences_read"] == 2 and record["settings"]["max_words"] == 2
    assert [m["label"] for m in record["models"]] == ["rnn-bahdanau", "transformer"]
    assert {"torch", "seq2seq"} <= record["machine"]["versions"].keys()
    for m in record["models"]:
        assert set(m["methods"]) == set(bench_faithfulness.METHODS) and m["sentences_used"] == 2
        for r in m["methods"].values():
            for curve in ("deletion", "insertion"):
                assert np.isfinite(r[curve]["aopc"]) and len(r[curve]["curve"]) == 2 and r[curve]["sentences"] == 2
                assert r[curve]["aopc"] == pytest.approx(np.mean(r[curve]["curve"]))
            assert r["seconds_per_sentence"] >= 0
    table = capsys.readouterr().out
    assert "| transformer | kernel-shap |" in table and "deletion AOPC" in table
    assert out.with_suffix(".md").is_file() and out.with_suffix(".png").stat().st_size > 0
    assert bench_faithfulness.main(["--checkpoint", *checkpoints, "--source", str(src), "--out",
                                    str(tmp_path / "x.md")]) == 2  # the JSON path is asked for
    assert "give the JSON path" in capsys.readouterr().err
