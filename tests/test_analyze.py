"""seq2seq analyze: the statistics' identities, head masking, AER per head, the report end to end on a
tiny RNN and Transformer, and every bad input refused before anything is written."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from seq2seq.alignment.links import argmax_alignment
from seq2seq.jobs.analyze import (
    CLASSES, RowStatistics, SourceMass, cross_attention_layers, diagonal_distance, entropy, function_words, gini,
    head_aer, masked_heads, normalized_entropy, piece_classes, pruning_order,
)
from seq2seq.cli.analyze import main
from seq2seq.config import ModelConfig, RunConfig
from seq2seq.models import build_model
from seq2seq.toy import toy_corpus
from seq2seq.training.run import train

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


# ----------------------------------------------------------------------------- statistics


@pytest.mark.parametrize("size", [2, 5, 17])
def test_entropy_of_uniform_attention_is_log_s(size):
    uniform = np.full((3, size), 1.0 / size)
    np.testing.assert_allclose(entropy(uniform), math.log(size))
    np.testing.assert_allclose(normalized_entropy(uniform), 1.0)
    np.testing.assert_allclose(gini(uniform), 0.0, atol=1e-12)
    one_hot = np.eye(size)
    np.testing.assert_allclose(entropy(one_hot), 0.0)
    np.testing.assert_allclose(gini(one_hot), 1.0)


def test_identity_alignment_is_on_the_diagonal():
    np.testing.assert_allclose(diagonal_distance(np.eye(6)), 0.0)
    assert diagonal_distance(np.eye(6)[::-1]).mean() > 0.4  # reversed order: far from it
    stats = RowStatistics(1, 2)
    stats.add(np.stack([np.eye(4), np.full((4, 4), 0.25)])[None], np.array([4, 4, 1, 0]))
    means = stats.means()
    np.testing.assert_allclose(means["diagonal_distance"][0, 0], 0.0)
    np.testing.assert_allclose(means["entropy"][0], [0.0, math.log(4)])
    np.testing.assert_allclose(means["eos_share"][0], [0.25, 0.25])  # one of four rows / a quarter each
    np.testing.assert_allclose(sum(means[f"{c}_share"] for c in CLASSES), 1.0)


def test_piece_classes_and_function_words():
    words = function_words(["Der Hund und der Ball .", "die Katze und 3 Hunde", "der Mann"], 2)
    assert words == ["der", "und"]  # numbers and punctuation never count
    pieces = ["▁Der", "▁Hund", ".", "▁12", ",", "50", "▁spiel", "t", "</s>"]
    names = [CLASSES[c] for c in piece_classes(pieces, set(words))]
    assert names == ["function", "other", "punctuation", "number", "punctuation", "number", "other", "other", "eos"]


def test_source_mass_shares():
    mass = SourceMass()
    pieces = ["▁der", "▁Hund", "</s>"]
    mass.add(np.array([[0.5, 0.5, 0.0], [0.0, 0.5, 0.5]]), pieces, piece_classes(pieces, {"der"}), {"der"})
    classes = mass.classes()
    assert classes["other"]["attention_share"] == pytest.approx(0.5)
    assert classes["eos"]["token_share"] == pytest.approx(1 / 3)
    assert classes["number"]["ratio"] is None
    assert [w["word"] for w in mass.top_words(2)] == ["Hund", "der"]


def test_aer_of_gold_equal_to_argmax_is_zero():
    rng = np.random.default_rng(0)
    words = [rng.dirichlet(np.ones(n), size=(2, 3, n + 1)) for n in (3, 5, 4)]  # (L, H, Tw, Sw)
    gold = [argmax_alignment(w[1, 2]) for w in words]
    aer = head_aer(words, gold, gold, method="argmax")
    assert aer[1, 2] == 0.0
    assert aer.shape == (2, 3) and (aer >= 0).all()


def test_pruning_order_least_important_first():
    assert pruning_order(np.array([[0.3, -0.1], [0.0, 0.3]])) == [(0, 1), (1, 0), (0, 0), (1, 1)]


# ----------------------------------------------------------------------------- head masking


def tiny_model(arch: str, vocab: int = 40):
    torch.manual_seed(0)
    options = (dict(embed_dim=16, hidden_size=16, decoder_hidden_size=16) if arch == "rnn"
               else dict(d_model=16, heads=4, ff_size=32, layers=2))
    return build_model(ModelConfig(arch=arch, vocab_size=vocab, dropout=0.0, **options)).eval()


def test_masking_a_head_removes_only_that_heads_contribution():
    model = tiny_model("transformer")
    mha = cross_attention_layers(model)[1]
    torch.manual_seed(1)
    query, memory = torch.randn(2, 3, 16), torch.randn(2, 5, 16)
    with torch.no_grad():
        full, weights = mha(query, memory, memory, need_weights=True)
        with masked_heads(model, [(1, 2)]):
            masked, masked_weights = mha(query, memory, memory, need_weights=True)
        _, v = mha.project_kv(memory)  # (B, H, S, d_k)
        context = weights[:, 2] @ v[:, 2]  # (B, T, d_k): head 2's context
        contribution = context @ mha.out_proj.weight[:, 2 * mha.d_k:3 * mha.d_k].T  # (B, T, D)
    torch.testing.assert_close(masked, full - contribution)
    torch.testing.assert_close(masked_weights, weights)  # every head still attends as before


def test_masked_heads_leave_the_model_unchanged_when_empty_or_done():
    model = tiny_model("transformer")
    src = torch.tensor([[5, 6, 7, 3], [8, 9, 3, 0]])
    tgt = torch.tensor([[2, 10, 11], [2, 12, 0]])
    with torch.no_grad():
        logits, attention = model(src, src != 0, tgt, need_attention=True)
        with masked_heads(model, []):
            same, _ = model(src, src != 0, tgt, need_attention=True)
        with masked_heads(model, [(1, 0), (1, 3)]):
            changed, changed_attention = model(src, src != 0, tgt, need_attention=True)
        after, _ = model(src, src != 0, tgt)
    assert torch.equal(same, logits) and torch.equal(after, logits)
    assert not torch.allclose(changed, logits)
    torch.testing.assert_close(changed_attention[:, 0], attention[:, 0])  # below the masked layer: as before
    assert cross_attention_layers(tiny_model("rnn")) is None
    with pytest.raises(ValueError, match="no cross-attention heads"):
        with masked_heads(tiny_model("rnn"), [(0, 0)]):
            pass


# ----------------------------------------------------------------------------- end to end


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """A tiny RNN and a 2-layer, 2-head Transformer, trained a few steps on the toy corpus."""
    root = tmp_path_factory.mktemp("analyze_runs")
    result = {}
    for arch in ("rnn", "transformer"):
        cfg = RunConfig.from_dict({
            "model": {"arch": arch, "d_model": 32, "heads": 2, "ff_size": 64, "layers": 2, "embed_dim": 32,
                      "hidden_size": 32, "decoder_hidden_size": 32, "dropout": 0.1},
            "data": {"toy_size": 300, "vocab_size": 120, "max_tokens": 400, "cache_dir": str(root / "cache")},
            "train": {"max_steps": 8, "eval_every": 0, "warmup_steps": 4, "lr": 3e-3, "log_every": 4, "seed": 3,
                      "threads": 1, "device": "cpu"},
        })
        cfg.output_dir = str(root / arch)
        result[arch] = train(cfg, quiet=True).output_dir
    return result


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict[str, Path]:
    """12 toy pairs (one empty source line) and gold links word k - word k."""
    root = tmp_path_factory.mktemp("analyze_corpus")
    data = toy_corpus(n_train=300, n_valid=20, n_test=12, seed=3)["test"]
    src, tgt = list(data["src"]), list(data["tgt"])
    src[4] = tgt[4] = ""
    gold = [" ".join(f"{k}-{k}" for k in range(min(len(s.split()), len(t.split())))) for s, t in zip(src, tgt)]
    files = {"input": root / "test.en", "reference": root / "test.de", "gold": root / "gold.talp"}
    for key, lines in (("input", src), ("reference", tgt), ("gold", gold)):
        files[key].write_text("\n".join(lines) + "\n", encoding="utf-8")
    return files


def analyze_args(checkpoints, out: Path, *extra: str) -> list[str]:
    return ["--checkpoint", *map(str, checkpoints), "--output-dir", str(out), "--beam-size", "2",
            "--bleu-sentences", "2", "--device", "cpu", "--quiet", *extra]


def test_report_end_to_end(runs, corpus, tmp_path):
    out = tmp_path / "report"
    args = analyze_args([runs["rnn"], runs["transformer"]], out, "--input", str(corpus["input"]), "--reference",
                        str(corpus["reference"]), "--gold-alignments", str(corpus["gold"]), "--names", "rnn", "tf",
                        "--align-method", "argmax")
    assert main(args) == 0
    report = json.loads((out / "report.json").read_text(encoding="utf-8"))
    markdown = (out / "report.md").read_text(encoding="utf-8")
    rnn, tf = report["models"]
    assert report["settings"]["sentences"] == 11 and report["settings"]["attention_from"] == "reference"
    assert (rnn["layers"], rnn["heads"], tf["layers"], tf["heads"]) == (1, 1, 2, 2)
    assert rnn["importance"] is None and "single attention" in rnn["importance_note"]
    assert np.array(tf["per_head"]["entropy"]).shape == (2, 2) and np.array(tf["aer"]).shape == (2, 2)
    # Gold links are k-k for k < min(source words, reference words); argmax gives one link per reference
    # word (EOS dropped). Counted here from the files, the empty pair (line 4) not analysed.
    sources = corpus["input"].read_text(encoding="utf-8").splitlines()
    references = corpus["reference"].read_text(encoding="utf-8").splitlines()
    kept = [k for k, line in enumerate(sources) if line.strip()]
    sure = sum(min(len(sources[k].split()), len(references[k].split())) for k in kept)
    reference_words = sum(len(references[k].split()) for k in kept)
    for entry in (rnn, tf):
        assert sum(c["attention_share"] for c in entry["classes"].values()) == pytest.approx(1.0)
        scores = entry["aggregate_aer"]
        # catches gold links misread (|S|), links to EOS or several per word (|A|), other sentences
        assert (scores["sentences"], scores["sure"], scores["possible"], scores["predicted"]) == (
            11, sure, sure, reference_words)
        a, s, a_s, a_p = scores["predicted"], scores["sure"], scores["predicted_sure"], scores["predicted_possible"]
        assert a_s == a_p <= min(a, s)  # P = S: the gold file has sure links only
        # AER = 1 - (|A∩S| + |A∩P|) / (|A| + |S|), precision |A∩P| / |A|, recall |A∩S| / |S|, written out:
        # catches a wrong formula, e.g. recall |A∩S| / |A| (with P = S here a mix-up of |P| and |S| cannot
        # show: test_align_cli's gold has possible links)
        assert scores["aer"] == pytest.approx(1 - (a_s + a_p) / (a + s), abs=1e-12)
        assert (scores["precision"], scores["recall"]) == pytest.approx((a_p / a, a_s / s), abs=1e-12)
    importance = tf["importance"]
    assert [p["k"] for p in importance["pruning"]] == [0, 1, 2, 3, 4]
    assert importance["pruning"][0]["loss"] == pytest.approx(tf["loss"], rel=1e-4)
    assert np.array(importance["delta_bleu"]).shape == (2, 2)
    plots = [rnn["plots"]["heads"], tf["plots"]["heads"], report["plots"]["classes"], *report["plots"]["pruning"]]
    for plot in plots:
        assert (out / plot).read_bytes()[:8] == PNG_MAGIC
        assert f"]({plot})" in markdown
    assert "## rnn" in markdown and "importance and pruning are skipped" in markdown and "Pruning" in markdown
    assert not list(tmp_path.glob(".report.*"))  # no staging directory left


def test_report_on_own_translations(runs, corpus, tmp_path):
    out = tmp_path / "own"
    assert main(analyze_args([runs["transformer"]], out, "--input", str(corpus["input"]), "--beam-size", "1",
                             "--max-pruned", "1")) == 0
    report = json.loads((out / "report.json").read_text(encoding="utf-8"))
    assert report["settings"]["attention_from"] == "translations (beam 1)"
    (model,) = report["models"]
    assert model["aer"] is None and len(model["importance"]["pruning"]) == 2
    assert all(p["bleu"] is not None for p in model["importance"]["pruning"])  # against its own output


def test_the_job_takes_one_decode_config_from_the_flags(monkeypatch, tmp_path):
    """analyze's ``AnalyzeJob.decode`` is the ``DecodeConfig`` of --beam-size and --batch-size (built and checked by
    ``cli.common.decode_config``: a bad value is a named error before anything runs), not loose fields."""
    import seq2seq.jobs.analyze as analyze_module
    from seq2seq.config import DecodeConfig

    jobs = []
    monkeypatch.setattr(analyze_module, "analyze", jobs.append)
    base = ["--checkpoint", "run", "--input", "in.txt", "--output-dir", str(tmp_path / "report")]
    assert main([*base, "--beam-size", "3", "--batch-size", "7"]) == 0
    assert main(base) == 0
    assert [job.decode for job in jobs] == [DecodeConfig(beam_size=3, batch_size=7), DecodeConfig(beam_size=5)]
    assert main([*base, "--beam-size", "0"]) == 2 and main([*base, "--batch-size", "0"]) == 2 and len(jobs) == 2


def write(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


@pytest.mark.parametrize("case", ["gold-count", "gold-index", "empty", "reference-count", "missing-input",
                                  "missing-reference", "missing-gold", "gold-without-reference"])
def test_bad_input_is_refused_and_writes_nothing(case, runs, corpus, tmp_path, capsys):
    files = {"--input": corpus["input"], "--reference": corpus["reference"], "--gold-alignments": corpus["gold"]}
    lines = corpus["gold"].read_text(encoding="utf-8").splitlines()
    expected = {"gold-count": "gold.talp has 11 lines for 12 sentence pairs",
                "gold-index": "line 2: link 99-0 is outside",
                "empty": "has no non-empty line",
                "reference-count": "has 3 lines but --input",
                "missing-input": "nope.en: no such file",
                "missing-reference": "nope.de: no such file",
                "missing-gold": "nope.talp: no such file",
                "gold-without-reference": "needs --reference"}[case]
    if case == "gold-count":
        files["--gold-alignments"] = write(tmp_path / "gold.talp", lines[:-1])
    elif case == "gold-index":
        files["--gold-alignments"] = write(tmp_path / "gold.talp", [lines[0], "99-0", *lines[2:]])
    elif case == "empty":
        files = {"--input": write(tmp_path / "empty.en", ["", "  "])}
    elif case == "reference-count":
        files["--reference"] = write(tmp_path / "short.de", ["a", "b", "c"])
    elif case.startswith("missing"):
        flag = {"input": "--input", "reference": "--reference", "gold": "--gold-alignments"}[case.split("-")[1]]
        files[flag] = tmp_path / f"nope{Path(files[flag]).suffix}"
    else:
        del files["--reference"]
    out = tmp_path / "report"
    argv = analyze_args([runs["transformer"]], out, *[str(x) for pair in files.items() for x in pair])
    assert main(argv) == 2
    assert expected in capsys.readouterr().err
    assert not out.exists() and not list(tmp_path.glob(".report*"))
