"""Alignment export from real models (greedy and beam), translate.py --alignments/--plot-dir/
--attribution end to end, the AER command and the faithfulness benchmark on a tiny checkpoint."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import run_shared
import torch

from seq2seq.cli import align
from seq2seq.alignment.links import agreement_matrix, extract_links, parse_pharaoh, read_pharaoh_file
from seq2seq.alignment.matrices import check_layer_heads, merge_to_words
from seq2seq.checkpoint.file import load_checkpoint, save_checkpoint
from seq2seq.config import AlignConfig, ModelConfig, RunConfig
from seq2seq.models import build_model
from seq2seq.training.run import train
from seq2seq.decoding.forced_alignment import BackwardAligner, force_align_words
from seq2seq.decoding.translator import Translator

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ["twenty-one", "three hundred and five", "", "seven thousand and twelve"]




@pytest.fixture(scope="module")
def checkpoint() -> Path:
    """A tiny 2-layer, 2-head Transformer trained for a few steps on the toy corpus (once per test
    run: test_serve and test_viewer use it too)."""
    return run_shared.built_once("align-cli-transformer", _train_checkpoint) / "run" / "best.pt"


def _train_checkpoint(directory: Path) -> None:
    out = directory / "run"
    cfg = RunConfig.from_dict({
        "model": {"arch": "transformer", "d_model": 32, "heads": 2, "ff_size": 64, "layers": 2, "dropout": 0.1},
        "data": {"toy_size": 300, "vocab_size": 120, "max_tokens": 400, "cache_dir": str(out.parent / "cache")},
        "train": {"max_steps": 8, "eval_every": 0, "warmup_steps": 4, "lr": 3e-3, "log_every": 4, "seed": 3,
                  "threads": 1, "device": "cpu"},
    })
    cfg.output_dir = str(out)
    train(cfg, quiet=True)


def translate_main(argv: list[str]) -> int:
    """translate.py's main, run in this process (same code path as the script, no interpreter start)."""
    spec = importlib.util.spec_from_file_location("translate_script", ROOT / "translate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main(argv)


@pytest.mark.parametrize("arch", ["rnn", "transformer"])
@pytest.mark.parametrize("beam", [1, 3])
def test_exported_attention_rows_sum_to_one(tiny_tokenizer, arch, beam):
    torch.manual_seed(0)
    options = (dict(embed_dim=32, hidden_size=32, decoder_hidden_size=32) if arch == "rnn"
               else dict(d_model=32, heads=2, ff_size=64, layers=2))
    model = build_model(ModelConfig(arch=arch, vocab_size=tiny_tokenizer.vocab_size, dropout=0.0, **options))
    translator = Translator(model, tiny_tokenizer)
    results = translator.translate(SOURCES, beam_size=beam, n_best=beam, max_output_ratio=1.0)
    for index, t in enumerate(results):
        for hyp in t.alternatives if t.attention is not None else []:
            assert hyp.attention.shape[-2:] == (len(hyp.tgt_pieces), len(hyp.src_pieces))
            np.testing.assert_allclose(hyp.attention.sum(-1), 1.0, rtol=1e-5)  # before any merge
            words = merge_to_words(hyp.attention, hyp.src_pieces, hyp.tgt_pieces)
            np.testing.assert_allclose(words.sum(-1), 1.0, rtol=1e-5)  # EOS kept: still 1
        if not SOURCES[index]:
            assert t.attention is None
            continue
        record = t.alignment_record(index)
        sure, _ = parse_pharaoh(record.pharaoh_word)
        assert all(i < len(record.src_words) and j < len(record.tgt_words) for i, j in sure)  # no EOS
        assert "</s>" not in record.src_words + record.tgt_words
        with_eos = t.alignment_record(index, include_eos=True)
        assert with_eos.src_words[-1] == with_eos.tgt_words[-1] == "</s>"
        np.testing.assert_allclose(with_eos.words.sum(-1), 1.0, rtol=1e-5)


def test_translate_alignments_plots_and_attribution_end_to_end(checkpoint, tmp_path, capsys):
    src = tmp_path / "in.txt"
    src.write_text("\n".join(SOURCES) + "\n", encoding="utf-8")
    out, plots = tmp_path / "align.jsonl", tmp_path / "plots"
    code = translate_main(["--checkpoint", str(checkpoint), "--input", str(src), "--output", str(tmp_path / "hyp"),
                           "--alignments", str(out), "--plot-dir", str(plots), "--beam-size", "2", "--quiet",
                           "--attribution", "occlusion", "gradient"])
    assert code == 0
    lines = out.read_text(encoding="utf-8").splitlines()
    assert len(lines) == len(SOURCES)  # one record per input line, the empty one included
    npz = np.load(tmp_path / "align.npz")
    for index, line in enumerate(lines):
        rec = json.loads(line)
        assert rec["index"] == index and rec["source"] == SOURCES[index]
        keys = {"src_words", "tgt_words", "word_matrix", "subword_matrix", "pharaoh_word", "attention_shape"}
        assert keys <= rec.keys()
        assert rec["word_shape"] == [len(rec["tgt_words"]), len(rec["src_words"])]
        sure, _ = parse_pharaoh(rec["pharaoh_word"])
        assert all(i < len(rec["src_words"]) and j < len(rec["tgt_words"]) for i, j in sure)
        assert npz[f"s{index}_attention"].shape == tuple(rec["attention_shape"])
        if not SOURCES[index]:
            assert rec["attention_shape"][2:] == [0, 0] and "attribution" not in rec
            continue
        assert rec["attention_shape"][:2] == [2, 2]
        for method in ("occlusion", "gradient"):
            entry = rec["attribution"][method]
            rows, cols = len(rec["tgt_pieces"]) + 1, len(rec["src_pieces"]) + 1
            assert entry["raw_shape"] == [rows, cols] and entry["word_shape"] == rec["word_shape"]
            assert npz[f"s{index}_attr_{method}_raw"].shape == (rows, cols)
            assert npz[f"s{index}_attr_{method}_words"].shape == tuple(rec["word_shape"])
        for name in (f"{index:05d}.png", f"{index:05d}_grid.png", f"{index:05d}_attribution.png"):
            assert (plots / name).stat().st_size > 0, name
    assert not list(tmp_path.rglob(".*.tmp"))
    code = translate_main(["--checkpoint", str(checkpoint), "--input", str(src), "--alignments", str(out),
                           "--precision", "int8", "--attribution", "occlusion", "integrated-gradients", "gradient"])
    assert code == 2  # int8 layers have no gradients: said before anything is translated
    assert "--attribution gradient integrated-gradients differentiates" in capsys.readouterr().err
    assert json.loads(out.read_text(encoding="utf-8").splitlines()[0])["index"] == 0  # the first run's file kept


def test_plot_dir_is_capped_with_a_message(checkpoint, tmp_path, capsys):
    src = tmp_path / "in.txt"
    src.write_text("seven\ntwenty-one\nthree hundred\n", encoding="utf-8")
    plots = tmp_path / "plots"
    assert translate_main(["--checkpoint", str(checkpoint), "--input", str(src), "--output", str(tmp_path / "hyp"),
                           "--alignments", str(tmp_path / "a.jsonl"), "--plot-dir", str(plots), "--max-plots", "2",
                           "--beam-size", "1", "--quiet"]) == 0
    assert sorted(p.name for p in plots.glob("*.png")) == ["00000.png", "00000_grid.png", "00001.png", "00001_grid.png"]
    assert "plotted the first 2 sentences (--max-plots)" in capsys.readouterr().err
    assert len((tmp_path / "a.jsonl").read_text().splitlines()) == 3  # the export still has every sentence


def test_translate_warns_once_when_inputs_with_text_translate_to_nothing(checkpoint, tmp_path, capsys):
    """The shared checkpoint, 8 updates old, translates everything to an empty line (what an undertrained
    model does): one warning at the end with the count of inputs with text (the empty line is not one);
    an output that a --prefix starts is not empty."""
    src, prefixes = tmp_path / "in.txt", tmp_path / "prefixes.txt"
    src.write_text("seven\ntwenty-one\n\nnine hundred\n", encoding="utf-8")
    prefixes.write_text("\nsieben\n\n\n", encoding="utf-8")
    base = ["--checkpoint", str(checkpoint), "--input", str(src), "--beam-size", "2", "--quiet"]
    assert translate_main([*base, "--output", str(tmp_path / "hyp")]) == 0
    assert (tmp_path / "hyp").read_text(encoding="utf-8") == "\n" * 4  # as the test assumes: all empty
    err = capsys.readouterr().err
    warning = "non-empty inputs translated to empty outputs: the model may be undertrained"
    assert err.count(warning) == 1 and f"3 of 3 {warning}" in err, err
    assert translate_main([*base, "--output", str(tmp_path / "prefixed"), "--prefix", str(prefixes)]) == 0
    assert f"2 of 3 {warning}" in capsys.readouterr().err


def test_translate_eos_threshold_and_bad_layer(checkpoint, tmp_path, capsys):
    src = tmp_path / "in.txt"
    src.write_text("twenty-one\n", encoding="utf-8")
    out = tmp_path / "a.jsonl"
    assert translate_main(["--checkpoint", str(checkpoint), "--input", str(src), "--output", str(tmp_path / "hyp"),
                           "--alignments", str(out), "--include-eos", "--align-method", "threshold",
                           "--align-threshold", "0.2", "--align-layer", "1", "--align-heads", "0", "--quiet"]) == 0
    rec = json.loads(out.read_text(encoding="utf-8"))
    assert rec["src_words"][-1] == "</s>" and rec["method"] == "threshold" and rec["threshold"] == 0.2
    assert rec["layer_used"] == 1 and rec["heads"] == [0]
    assert translate_main(["--checkpoint", str(checkpoint), "--input", str(src), "--alignments",
                           str(tmp_path / "b.jsonl"), "--align-layer", "5"]) == 2
    assert "--align-layer 5" in capsys.readouterr().err and not (tmp_path / "b.jsonl").exists()


def _pharaoh(line: str) -> tuple[set[tuple[int, int]], set[tuple[int, int]]]:
    """One Pharaoh line parsed here: (sure links "i-j", possible links "i?j" together with the sure)."""
    sure, possible = set(), set()
    for token in line.split():
        mark = "?" if "?" in token else "-"
        i, j = token.split(mark)
        (possible if mark == "?" else sure).add((int(i), int(j)))
    return sure, possible | sure


@pytest.fixture()
def gold_files(tmp_path) -> dict[str, Path]:
    files = {"src": "twenty-one\nthree hundred and five\nseven\n",
             "tgt": "ein und zwanzig\ndrei hundert fünf\nsieben\n",
             "gold": "0-0 0?1 0-2\n0-0 1-1 3-2 2?2\n0-0\n"}
    paths = {}
    for name, text in files.items():
        paths[name] = tmp_path / name
        paths[name].write_text(text, encoding="utf-8")
    return paths


def test_align_command_scores_and_writes_pharaoh(checkpoint, gold_files, tmp_path, capsys):
    links = tmp_path / "links.txt"
    argv = ["--checkpoint", str(checkpoint), "--source", str(gold_files["src"]), "--target",
            str(gold_files["tgt"]), "--gold", str(gold_files["gold"]), "--json", "--align-method", "argmax"]
    assert align.main(argv + ["--output", str(links)]) == 0
    scores = json.loads(capsys.readouterr().out.splitlines()[-1])
    predicted, _ = read_pharaoh_file(links)  # parses back
    assert [len(p) for p in predicted] == [3, 3, 1]  # argmax: one link per target word
    # The expected scores computed here, not by alignment_error_rate: the written links and the gold
    # parsed by hand (i-j sure, i?j possible; P includes S), then written out
    # AER = 1 - (|A∩S| + |A∩P|) / (|A| + |S|), precision = |A∩P| / |A|, recall = |A∩S| / |S|.
    # Catches a wrong formula (e.g. |P| for |S| in the denominator, precision |A∩S| / |A|), the gold's
    # possible links dropped or read as sure (the expected values no longer use read_pharaoh_file), or
    # scores of other links than the ones written.
    written = [_pharaoh(line)[0] for line in links.read_text(encoding="utf-8").splitlines()]
    gold = [_pharaoh(line) for line in gold_files["gold"].read_text(encoding="utf-8").splitlines()]
    assert [len(s) for s, _ in gold] == [2, 3, 1] and [len(p) for _, p in gold] == [3, 4, 1]  # by hand
    a, s = sum(map(len, written)), sum(len(g) for g, _ in gold)
    a_s = sum(len(links_i & g) for links_i, (g, _) in zip(written, gold))
    a_p = sum(len(links_i & p) for links_i, (_, p) in zip(written, gold))
    assert scores["forward"]["aer"] == pytest.approx(1 - (a_s + a_p) / (a + s), abs=1e-12)
    assert scores["forward"]["precision"] == pytest.approx(a_p / a, abs=1e-12)
    assert scores["forward"]["recall"] == pytest.approx(a_s / s, abs=1e-12)
    # the same model as a "backward" (target->source) one: its links come back as (src, tgt)
    backward = reversed_checkpoint(checkpoint, tmp_path / "backward.pt")
    assert align.main(argv + ["--backward-checkpoint", str(backward), "--output", str(links)]) == 0
    scores = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert set(scores) == {"forward", "backward", "intersection", "grow-diag-final", "grow-diag-final-and",
                           "agreement"}
    both, _ = read_pharaoh_file(links)  # default output: agreement, both models' word attention at once
    n_src, n_tgt = [1, 4, 1], [3, 3, 1]
    for links_i, s, t in zip(both, n_src, n_tgt):
        assert all(i < s and j < t for i, j in links_i)
    translator = Translator.from_checkpoint(checkpoint, device="cpu")
    sources, targets = (gold_files[k].read_text(encoding="utf-8").splitlines() for k in ("src", "tgt"))
    layer, heads = check_layer_heads(AlignConfig.layer, AlignConfig.heads, translator.model)
    forward = force_align_words(translator, sources, targets, layer, heads)
    back = force_align_words(Translator.from_checkpoint(backward, device="cpu"), targets, sources, layer, heads)
    assert both == [extract_links(agreement_matrix(f, b), "argmax") for f, b in zip(forward, back)]
    backward_model = Translator.from_checkpoint(backward, device="cpu")  # the Python API: the same links
    assert BackwardAligner(translator, backward_model, AlignConfig(method="argmax")).aligned(sources, targets) == both
    intersected = BackwardAligner(translator, backward_model, AlignConfig(method="argmax"), "intersection")
    assert intersected.aligned(sources, targets) == read_pharaoh_file(links_of(argv, backward, "intersection"))[0]
    assert scores["intersection"]["predicted"] <= scores["forward"]["predicted"]


def test_align_without_a_predicted_link_reports_precision_as_undefined(checkpoint, gold_files, monkeypatch,
                                                                         capsys):
    """No link read from the attention (e.g. a threshold no weight reaches): precision is 0/0, shown as
    "n/a" in the table and null in the JSON, not 1.0000; recall is 0 and AER 1 (every sure link missed)."""
    monkeypatch.setattr("seq2seq.jobs.align.extract_links", lambda *args, **kwargs: set())
    argv = ["--checkpoint", str(checkpoint), "--source", str(gold_files["src"]), "--target",
            str(gold_files["tgt"]), "--gold", str(gold_files["gold"]), "--json"]
    assert align.main(argv) == 0
    *table, last = capsys.readouterr().out.splitlines()
    scores = json.loads(last)["forward"]
    assert (scores["precision"], scores["recall"], scores["aer"], scores["predicted"]) == (None, 0.0, 1.0, 0)
    [row] = [line for line in table if line.startswith("| forward")]
    assert [cell.strip() for cell in row.strip("|").split("|")][1:4] == ["n/a", "0.0000", "1.0000"]


def links_of(argv: list[str], backward: Path, rule: str) -> Path:
    """``seq2seq align ARGV --backward-checkpoint BACKWARD --symmetrize RULE``'s --output file."""
    out = backward.with_name(f"links-{rule}.txt")
    assert align.main([*argv, "--backward-checkpoint", str(backward), "--symmetrize", rule, "--output", str(out)]) == 0
    return out


def reversed_checkpoint(checkpoint: Path, path: Path) -> Path:
    """The checkpoint's model recorded as trained target->source (its languages swapped): a stand-in
    backward model with the forward model's words and vocabulary."""
    payload = load_checkpoint(checkpoint)
    data = payload["config"]["data"]
    data["src"], data["tgt"] = data["tgt"], data["src"]
    save_checkpoint(path, payload)
    return path


def test_translate_symmetrizes_as_align_does(checkpoint, tmp_path, capsys):
    """The word links ``translate --backward-checkpoint`` exports for its output equal what ``align``
    computes for the same pair with the same two models; a model of the same direction is a named error."""
    sources = ["twenty-one", "three hundred and five", "", "seven thousand and twelve"]
    (tmp_path / "in.txt").write_text("".join(line + "\n" for line in sources), encoding="utf-8")
    backward = reversed_checkpoint(checkpoint, tmp_path / "backward.pt")
    common = ["--checkpoint", str(checkpoint), "--input", str(tmp_path / "in.txt"), "--device", "cpu",
              "--beam-size", "2", "--align-method", "grow"]
    assert translate_main(common + ["--output", str(tmp_path / "out.txt"), "--alignments", str(tmp_path / "a.jsonl"),
                                    "--backward-checkpoint", str(backward)]) == 0
    records = [json.loads(line) for line in (tmp_path / "a.jsonl").read_text(encoding="utf-8").splitlines()]
    outputs = (tmp_path / "out.txt").read_text(encoding="utf-8").splitlines()
    chosen = [i for i, line in enumerate(sources) if line and outputs[i]]
    (tmp_path / "src").write_text("".join(sources[i] + "\n" for i in chosen), encoding="utf-8")
    (tmp_path / "tgt").write_text("".join(outputs[i] + "\n" for i in chosen), encoding="utf-8")
    (tmp_path / "gold").write_text("\n" * len(chosen), encoding="utf-8")
    capsys.readouterr()
    assert align.main(["--checkpoint", str(checkpoint), "--backward-checkpoint", str(backward), "--source",
                       str(tmp_path / "src"), "--target", str(tmp_path / "tgt"), "--gold", str(tmp_path / "gold"),
                       "--align-method", "grow", "--output", str(tmp_path / "links"), "--device", "cpu"]) == 0
    expected = (tmp_path / "links").read_text(encoding="utf-8").splitlines()  # both: agreement, the default
    assert [records[i]["pharaoh_word"] for i in chosen] == expected
    translations = Translator.from_checkpoint(checkpoint, device="cpu").translate(sources, beam_size=2)
    for i in chosen:  # the forward model's own links beside them
        assert records[i]["forward_pharaoh_word"] == translations[i].alignment_record(i, method="grow").pharaoh_word
        assert records[i]["backward_pharaoh_word"] and records[i]["symmetrize"] == "agreement"
    assert records[2]["pharaoh_word"] == "" and "symmetrize" not in records[2]  # the empty line

    code = translate_main(common + ["--output", str(tmp_path / "o2"), "--alignments", str(tmp_path / "b.jsonl"),
                                    "--backward-checkpoint", str(checkpoint)])
    assert code != 0 and "same direction" in capsys.readouterr().err
    assert not (tmp_path / "b.jsonl").exists() and not (tmp_path / "o2").exists()
    code = translate_main(common + ["--output", str(tmp_path / "o3"), "--backward-checkpoint", str(backward)])
    assert code != 0 and "give one of them" in capsys.readouterr().err


def test_align_command_errors(checkpoint, gold_files, tmp_path, capsys):
    short = tmp_path / "short.txt"
    short.write_text("ein und zwanzig\n", encoding="utf-8")
    code = align.main(["--checkpoint", str(checkpoint), "--source", str(gold_files["src"]),
                       "--target", str(short), "--gold", str(gold_files["gold"])])
    err = capsys.readouterr().err
    assert code == 2 and str(short) in err and str(gold_files["src"]) in err and "3 lines" in err and "has 1" in err
    bad = tmp_path / "bad.gold"
    bad.write_text("0-0\n0-9\n0-0\n", encoding="utf-8")
    code = align.main(["--checkpoint", str(checkpoint), "--source", str(gold_files["src"]),
                       "--target", str(gold_files["tgt"]), "--gold", str(bad)])
    assert code == 2 and "line 2" in capsys.readouterr().err


def test_align_writes_links_without_gold_and_adapts_first(checkpoint, gold_files, tmp_path, capsys):
    """Without --gold, align writes the links alone; --adapt-steps reads them from the model adapted to the
    pairs (the Python API's ``adapt`` + ``force_align``, the same seed); neither --gold nor --output, or a
    negative --adapt-steps, is a named error."""
    from seq2seq import adapt
    from seq2seq.decoding.forced_alignment import force_align

    links = tmp_path / "links.txt"
    argv = ["--checkpoint", str(checkpoint), "--source", str(gold_files["src"]), "--target", str(gold_files["tgt"]),
            "--device", "cpu", "--align-method", "argmax"]
    assert align.main([*argv, "--adapt-steps", "3", "--adapt-lr", "3e-3", "--output", str(links)]) == 0
    printed = capsys.readouterr()
    assert "AER" not in printed.out and f"forward links of 3 sentence pairs written to {links}" in printed.err
    sources, targets = (gold_files[k].read_text(encoding="utf-8").splitlines() for k in ("src", "tgt"))
    adapted = adapt(Translator.from_checkpoint(checkpoint, device="cpu"), sources, targets, steps=3, lr=3e-3)
    layer, heads = check_layer_heads(AlignConfig.layer, AlignConfig.heads, adapted.model)
    assert read_pharaoh_file(links)[0] == force_align(adapted, sources, targets,
                                                      AlignConfig(layer=layer, heads=heads, method="argmax"))
    assert align.main([*argv, "--output", str(tmp_path / "plain.txt")]) == 0  # not adapted: its own links
    assert (tmp_path / "plain.txt").read_text(encoding="utf-8").count("\n") == 3

    assert align.main(argv) == 2
    err = capsys.readouterr().err
    assert "--gold" in err and "--output" in err
    assert align.main([*argv, "--output", str(links), "--adapt-steps", "-1"]) == 2
    assert "--adapt-steps" in capsys.readouterr().err


def test_align_adapts_a_copy_to_each_chunk_of_pairs(checkpoint, gold_files, tmp_path, capsys):
    """``--adapt-pairs 2`` on 3 pairs: the links of pairs 1-2 come from a copy adapted to those two, the third's
    from a copy adapted to it alone (as the Python API gives them); the chunks cover every pair once, in order; a
    negative --adapt-pairs is a named error."""
    from seq2seq import adapt
    from seq2seq.decoding.forced_alignment import force_align
    from seq2seq.training.adapt import chunks

    assert chunks(250, 100) == [range(0, 100), range(100, 200), range(200, 250)]
    assert chunks(3, 0) == [range(0, 3)] and chunks(3, 5) == [range(0, 3)] and chunks(0, 0) == [range(0)]
    links = tmp_path / "links.txt"
    argv = ["--checkpoint", str(checkpoint), "--source", str(gold_files["src"]), "--target", str(gold_files["tgt"]),
            "--device", "cpu", "--align-method", "argmax", "--adapt-steps", "3", "--adapt-lr", "3e-3"]
    assert align.main([*argv, "--adapt-pairs", "2", "--output", str(links)]) == 0
    sources, targets = (gold_files[k].read_text(encoding="utf-8").splitlines() for k in ("src", "tgt"))
    translator = Translator.from_checkpoint(checkpoint, device="cpu")
    expected = []
    for chunk in (slice(0, 2), slice(2, 3)):
        adapted = adapt(translator, sources[chunk], targets[chunk], steps=3, lr=3e-3)
        layer, heads = check_layer_heads(AlignConfig.layer, AlignConfig.heads, adapted.model)
        expected += force_align(adapted, sources[chunk], targets[chunk],
                                AlignConfig(layer=layer, heads=heads, method="argmax"))
    assert read_pharaoh_file(links)[0] == expected
    whole = tmp_path / "whole.txt"
    assert align.main([*argv, "--adapt-pairs", "0", "--output", str(whole)]) == 0  # one copy for all three
    adapted = adapt(translator, sources, targets, steps=3, lr=3e-3)
    assert read_pharaoh_file(whole)[0] == force_align(adapted, sources, targets,
                                                      AlignConfig(layer=layer, heads=heads, method="argmax"))
    capsys.readouterr()
    assert align.main([*argv, "--output", str(links), "--adapt-pairs", "-1"]) == 2
    assert "--adapt-pairs" in capsys.readouterr().err
