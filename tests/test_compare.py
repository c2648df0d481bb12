"""The comparison report: two tiny trained systems (RNN, Transformer) on the toy corpus."""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import run_shared

from seq2seq.cli.compare import job_from_args, main, parse_args
from seq2seq.jobs.compare import (
    at_budgets, budget_summary, check_sentence_ids, crossings, compare, forced_attention, length_buckets,
    pick_sentences, significance, input_files,
)
from seq2seq.config import RunConfig
from seq2seq.errors import UserError
from seq2seq.alignment.plotting import plot_grouped_bars, plot_learning_curves
from seq2seq.toy import toy_corpus
from seq2seq.training.run import train
from seq2seq.decoding.translator import Translator


PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
QUALITY_HEADER = ["system", "model", "parameters", "BLEU", "p BLEU (BS / AR)", "chrF", "p chrF (BS / AR)",
                  "TER ↓", "p TER (BS / AR)", "training time", "train tgt tok/s", "greedy sent/s",
                  "beam 2 sent/s", "peak RSS (train)"]
SAMPLES = ["--bootstrap", "100", "--ar-trials", "100"]


def tiny_config(out: Path, arch: str) -> RunConfig:
    cfg = RunConfig.from_dict({
        "model": {"arch": arch, "d_model": 32, "heads": 2, "ff_size": 64, "layers": 2, "embed_dim": 32,
                  "hidden_size": 32, "decoder_hidden_size": 48, "dropout": 0.1},
        "data": {"toy_size": 300, "vocab_size": 120, "max_tokens": 400, "cache_dir": str(out.parent / "cache")},
        "train": {"max_steps": 30, "eval_every": 10, "warmup_steps": 5, "lr": 3e-3, "log_every": 5,
                  "eval_max_sentences": 8, "seed": 3, "threads": 1, "device": "cpu"},
    })
    cfg.output_dir = str(out)
    return cfg


@pytest.fixture(scope="module")
def runs() -> dict[str, Path]:
    def build(root: Path) -> None:
        for arch in ("rnn", "transformer"):
            train(tiny_config(root / arch, arch), quiet=True)

    root = run_shared.built_once("compare-runs", build)
    return {arch: root / arch for arch in ("rnn", "transformer")}


@pytest.fixture(scope="module")
def test_set(tmp_path_factory) -> dict[str, Path]:
    """20 toy pairs as text files, and a gold file linking word k to word k."""
    root = tmp_path_factory.mktemp("test_set")
    data = toy_corpus(n_train=300, n_valid=20, n_test=20, seed=3)["test"]
    src, tgt = list(data["src"]), list(data["tgt"])
    gold = [" ".join(f"{k}-{k}" for k in range(min(len(s.split()), len(t.split())))) for s, t in zip(src, tgt)]
    files = {"source": root / "test.en", "reference": root / "test.de", "gold": root / "gold.talp"}
    for key, lines in (("source", src), ("reference", tgt), ("gold", gold)):
        files[key].write_text("\n".join(lines) + "\n", encoding="utf-8")
    return files


def compare_args(runs: list[Path], test_set: dict[str, Path], out: Path, *extra: str) -> list[str]:
    return [*map(str, runs), "--source", str(test_set["source"]), "--reference", str(test_set["reference"]),
            "--output", str(out), "--beam-size", "2", "--device", "cpu", "--quiet", *SAMPLES, *extra]


@pytest.fixture(scope="module")
def report_dir(runs, test_set, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("reports") / "rnn-vs-transformer"
    args = compare_args([runs["rnn"], runs["transformer"]], test_set, out, "--names", "rnn", "transformer",
                        "--sentences", "2", "--gold", str(test_set["gold"]), "--length-buckets", "3", "6")
    assert main(args) == 0
    return out


@pytest.fixture(scope="module")
def report(report_dir) -> dict:
    return json.loads((report_dir / "report.json").read_text(encoding="utf-8"))


def markdown_table(markdown: str, heading: str) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the first table after ``heading``."""
    lines = markdown.split(heading, 1)[1].splitlines()
    start = next(k for k, line in enumerate(lines) if line.startswith("|"))
    block = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        block.append([cell.strip() for cell in line.strip().strip("|").split(" | ")])
    return block[0], block[2:]  # block[1] is the |---| line


def assert_plot(path: Path) -> None:
    data = path.read_bytes()
    assert data.startswith(PNG_MAGIC) if path.suffix == ".png" else b"<svg" in data[:2000], path


# ----------------------------------------------------------------------------- the report


def test_report_links_point_at_plots_inside_the_directory(report_dir):
    markdown = (report_dir / "report.md").read_text(encoding="utf-8")
    links = re.findall(r"\]\(([^)]+)\)", markdown)
    pngs = [link for link in links if link.endswith(".png")]
    assert len(pngs) >= 3 + 2 * 2  # length buckets, 2 learning curves, 2 sentences x (own, forced)
    for link in links:
        assert not Path(link).is_absolute()
        assert (report_dir / link).is_file(), link
        if link.endswith((".png", ".svg")):
            assert_plot(report_dir / link)
    for png in report_dir.glob("plots/*.png"):
        assert png.with_suffix(".svg").is_file()
    assert not [p for p in report_dir.parent.iterdir() if p.name.startswith(".")]  # no temp dirs left


def test_quality_table_has_one_row_per_system_and_all_columns(report_dir, report):
    header, rows = markdown_table((report_dir / "report.md").read_text(encoding="utf-8"), "## Quality and cost")
    assert header == QUALITY_HEADER
    assert [row[0] for row in rows] == ["rnn", "transformer"]
    assert all(len(row) == len(header) for row in rows)
    rnn, transformer = rows
    assert rnn[1].startswith("rnn (bahdanau") and transformer[1].startswith("transformer (2 layers")
    assert rnn[4] == rnn[6] == rnn[8] == "baseline"
    for cell in (rnn[3], transformer[3], rnn[5], transformer[7]):
        assert re.fullmatch(r"\d+\.\d\d ± \d+\.\d\d", cell), cell
    assert re.fullmatch(r"\S+ / \S+( \((equal|identical)\))?", transformer[4]), transformer[4]
    for row in rows:  # summary.json figures are there
        assert "steps" in row[9] and row[10] != "—" and row[13] != "—"
        assert float(row[11].replace(",", "")) > 0 and float(row[12].replace(",", "")) > 0
    entry = report["systems"][1]
    assert entry["parameters"] > 0 and entry["training"]["steps"] == 30


def test_significance_comes_from_sacrebleu(report_dir, report, test_set):
    from sacrebleu.metrics import BLEU, CHRF, TER
    from sacrebleu.significance import PairedTest

    quality = report["quality"]
    assert "bs:100" in quality["signatures"]["bs"]["BLEU"] and "ar:100" in quality["signatures"]["ar"]["TER"]
    baseline, other = quality["systems"]
    assert baseline["scores"]["BLEU"]["p_bs"] is None
    for metric in ("BLEU", "chrF", "TER"):
        for key in ("p_bs", "p_ar"):
            assert 0.0 <= other["scores"][metric][key] <= 1.0
        assert all(s["scores"][metric]["ci"] >= 0 for s in quality["systems"])
    # the same numbers sacrebleu gives for the saved hypotheses
    hyps = [(report_dir / e["hypotheses"]).read_text(encoding="utf-8").splitlines() for e in report["systems"]]
    refs = test_set["reference"].read_text(encoding="utf-8").splitlines()
    assert hyps[0] != hyps[1]
    _, results = PairedTest(list(zip(["rnn", "transformer"], hyps)), {"BLEU": BLEU(), "chrF": CHRF(), "TER": TER()},
                            [refs], test_type="ar", n_samples=100)()
    tested = 0
    for metric, key in (("BLEU", "BLEU"), ("chrF", "chrF2"), ("TER", "TER")):
        ours = other["scores"][metric]
        assert ours["score"] == pytest.approx(results[key][1].score)
        if not ours["equal_to_baseline"]:  # an equal score gets p = 1 instead (see below)
            assert ours["p_ar"] == pytest.approx(results[key][1].p_value)
            tested += 1
    assert tested  # different outputs: at least one metric differs


def test_significance_wrapper_on_known_systems():
    refs = [f"a man rides a {animal} near the {place}" for animal in ("horse", "bike", "camel", "dog")
            for place in ("river", "lake", "road", "sea", "hill")]
    good = list(refs)
    bad = [f"the {k} person" for k in range(len(refs))]
    result = significance(["good", "copy", "bad"], [good, list(good), bad], refs, bootstrap=200, ar_trials=200)
    copy, worse = result["systems"][1:]
    assert copy["identical_to_baseline"]
    assert all(s["p_bs"] == s["p_ar"] == 1.0 and s["equal_to_baseline"] for s in copy["scores"].values())
    assert all(s["p_bs"] < 0.05 and s["p_ar"] < 0.05 for s in worse["scores"].values())
    assert worse["scores"]["TER"]["score"] > result["systems"][0]["scores"]["TER"]["score"]


def test_bleu_by_source_length(report_dir, report, test_set):
    buckets = report["length_buckets"]
    assert [b["label"] for b in buckets] == ["1-3", "4-6", "7+"]
    sources = test_set["source"].read_text(encoding="utf-8").splitlines()
    assert sum(b["sentences"] for b in buckets) == len(sources)
    header, rows = markdown_table((report_dir / "report.md").read_text(encoding="utf-8"), "## BLEU by source length")
    assert header == ["source words", "sentences", "rnn", "transformer", "best"]
    assert [row[0] for row in rows] == ["1-3", "4-6", "7+"]


def test_learning_curves_and_alignments(report, runs, test_set):
    for entry in report["systems"]:
        assert [point["step"] for point in entry["validation_curve"]] == [10, 20, 30]
    assert len(report["examples"]) == 2
    for example in report["examples"]:
        assert set(example["translations"]) == {"rnn", "transformer"}
    # The AER recomputed here: the gold links k-k from the files, one argmax link per reference word
    # taken with np.argmax from each system's force-decoded word attention, and
    # AER = 1 - (|A∩S| + |A∩P|) / (|A| + |S|) with P = S (the gold file has sure links only).
    # Catches a wrong formula, misread gold links, links to EOS or the wrong argmax axis, other sentences.
    from seq2seq.jobs.compare.stats import forced_attentions

    sources = test_set["source"].read_text(encoding="utf-8").splitlines()
    references = test_set["reference"].read_text(encoding="utf-8").splitlines()
    sure = [{(k, k) for k in range(min(len(s.split()), len(t.split())))} for s, t in zip(sources, references)]
    assert set(report["aer"]) == {"rnn", "transformer"}
    for name, scores in report["aer"].items():
        translator = Translator.from_checkpoint(runs[name] / "best.pt", device="cpu")
        words = [record.words for record in forced_attentions(translator, sources, references)]
        assert [w.shape for w in words] == [(len(t.split()), len(s.split())) for s, t in zip(sources, references)]
        predicted = [{(int(np.argmax(row)), j) for j, row in enumerate(w)} for w in words]
        a, s = sum(map(len, predicted)), sum(map(len, sure))
        a_s = sum(len(links & gold) for links, gold in zip(predicted, sure))
        assert (scores["sentences"], scores["predicted"], scores["sure"]) == (20, a, s)
        assert a == sum(len(t.split()) for t in references)
        assert scores["aer"] == pytest.approx(1 - (a_s + a_s) / (a + s), abs=1e-12)
    # runs of seconds reach none of the default budgets (5 ... 90 minutes): no budget table
    assert report["budgets"]["minutes"] == [5, 10, 20, 40, 90]
    assert all(cell is None for row in report["budgets"]["systems"].values() for cell in row.values())


def test_crossings_of_two_curves():
    rising, flat = [(0, 0.0), (10, 10.0)], [(0, 5.0), (10, 5.0)]
    assert crossings(flat, rising) == [{"x": 5.0, "leader": "b"}]  # the rising curve b overtakes at 5
    assert crossings(rising, flat) == [{"x": 5.0, "leader": "a"}]  # the same, seen from the other side
    # b passes a between 2 and 4 and falls back between 6 and 8; points out of order, other x grids
    a = [(8, 18.0), (0, 10.0), (4, 14.0)]  # a(x) = 10 + x
    b = [(0, 0.0), (3, 15.0), (5, 25.0), (7, 16.0)]
    found = crossings(a, b)
    assert [c["leader"] for c in found] == ["b", "a"]
    assert found[0]["x"] == pytest.approx(2.5)  # a(2.5) = 12.5 = b(2.5)
    assert found[1]["x"] == pytest.approx(5 + 20 / 11)  # from x = 5: 25 - 4.5 t = 15 + t
    assert found[1]["x"] <= 7  # only where both curves have points
    touching = [(0, 1.0), (1, 1.0), (2, 1.0)]
    assert crossings([(0, 0.0), (1, 1.0), (2, 0.0)], touching) == []  # a touch is no crossing
    assert crossings([(0, 0.0)], touching) == [] and crossings([(0, 0.0), (1, 0.0)], [(5, 1.0), (6, 0.0)]) == []


def test_budgets_read_the_validation_nearest_each_budget_and_only_within_the_run():
    curve = [{"step": 100 * k, "elapsed": 150.0 * k + 4, "bleu": float(k)} for k in range(1, 9)]  # 2.5 ... 20 min
    found = at_budgets(curve, (5, 10, 20, 40))
    assert [found[m]["step"] for m in (5, 10, 20)] == [200, 400, 800] and found[40] is None
    summary = budget_summary(["rnn", "transformer"], [curve, [{**r, "bleu": 9 - r["bleu"]} for r in curve]],
                             (5, 10))
    assert summary["systems"]["rnn"]["10"] == {"bleu": 4.0, "elapsed": 604.0, "step": 400}
    [crossed] = summary["crossings"]
    assert crossed["system"] == "transformer" and crossed["baseline"] == "rnn"
    assert [c["leader"] for c in crossed["minutes"]] == ["a"] and crossed["steps"][0]["x"] == pytest.approx(450)
    from seq2seq.jobs.compare.render import budgets_section

    lines = "\n".join(budgets_section({"budgets": summary}))
    assert "| rnn | 2.00 (5.1 min, 200 steps) | 4.00 (10.1 min, 400 steps) |" in lines
    assert "rnn goes ahead at 11.3 minutes" in lines and "rnn goes ahead at 450 updates" in lines


def test_identical_systems_are_not_significantly_different(runs, test_set, tmp_path):
    bare = tmp_path / "bare"  # a lone checkpoint: no summary.json, no metrics.jsonl beside it
    bare.mkdir()
    shutil.copy(runs["rnn"] / "best.pt", bare / "model.pt")
    out = tmp_path / "same"
    assert main(compare_args([runs["rnn"], bare / "model.pt"], test_set, out, "--sentence-ids", "4")) == 0
    report = json.loads((out / "report.json").read_text(encoding="utf-8"))
    other = report["quality"]["systems"][1]
    assert other["identical_to_baseline"]
    for metric in ("BLEU", "chrF", "TER"):
        assert other["scores"][metric]["p_bs"] >= 0.05 and other["scores"][metric]["p_ar"] >= 0.05
    markdown = (out / "report.md").read_text(encoding="utf-8")
    _, rows = markdown_table(markdown, "## Quality and cost")
    assert [row[0] for row in rows] == ["rnn", "bare/model"]
    assert rows[1][9] == rows[1][10] == rows[1][13] == "—"  # no summary.json
    assert "No validation lines for: bare/model" in markdown
    assert_plot(out / "plots" / "valid_bleu_vs_time.png")
    assert [e["id"] for e in report["examples"]] == [4]


# ----------------------------------------------------------------------------- pieces


def test_forced_attention_covers_the_reference_words(runs):
    translator = Translator.from_checkpoint(runs["transformer"] / "best.pt", device="cpu")
    record = forced_attention(translator, "forty-five thousand and seven", "fünf und vierzig tausend sieben")
    assert record.tgt_words == ["fünf", "und", "vierzig", "tausend", "sieben"]
    assert record.src_words == ["forty-five", "thousand", "and", "seven"]
    assert record.words.shape == (5, 4)
    assert np.all(record.words.sum(-1) <= 1 + 1e-5)


def test_length_buckets_and_sentence_choice():
    sources = ["a b", "", "a b c d e", "a " * 40]
    buckets = length_buckets(sources, [2, 5])
    assert [(b.label, b.ids) for b in buckets] == [("1-2", [0]), ("3-5", [2]), ("6+", [3])]
    chrf = {"x": [10.0, 0.0, 50.0, 20.0], "y": [10.0, 90.0, 10.0, 40.0]}
    assert pick_sentences(chrf, sources, 2) == [2, 3]  # the empty line 1 is never picked
    with pytest.raises(UserError, match="empty source"):
        check_sentence_ids([1], sources)


def test_learning_curve_plot_without_validation_lines(tmp_path):
    [png] = plot_learning_curves({"a": ([], []), "b": ([], [])}, "step", "BLEU", tmp_path / "c.png")
    assert_plot(png)
    [png] = plot_grouped_bars(["1-10", "11+"], {"a": [1.0, None], "b": [2.0, 3.0]}, "words", "BLEU",
                              tmp_path / "bars.png")
    assert_plot(png)


# ----------------------------------------------------------------------------- user errors


def test_bad_inputs_are_user_errors(runs, test_set, tmp_path, capsys):
    out = tmp_path / "report"
    with pytest.raises(UserError, match="nope.pt: no such checkpoint"):
        compare(job_from_args(parse_args(compare_args([runs["rnn"], tmp_path / "nope.pt"], test_set, out))))
    short = tmp_path / "short.de"
    short.write_text("eins\n", encoding="utf-8")
    args = compare_args([runs["rnn"]], test_set, out)
    args[args.index("--reference") + 1] = str(short)
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "--reference" in err and "20 lines" in err and "Traceback" not in err
    assert main(compare_args([runs["rnn"], runs["rnn"]], test_set, out, "--names", "one")) == 2
    assert "--names gives 1 name for 2 systems" in capsys.readouterr().err
    assert main(compare_args([runs["rnn"]], test_set, out, "--sentence-ids", "99")) == 2
    assert "0-based line numbers, 0..19" in capsys.readouterr().err
    bad_gold = tmp_path / "bad.talp"
    bad_gold.write_text("0-0\n" * 19 + "0-99\n", encoding="utf-8")
    assert main(compare_args([runs["rnn"]], test_set, out, "--gold", str(bad_gold))) == 2
    assert "line 20: link 0-99 is outside" in capsys.readouterr().err
    assert not out.exists()  # nothing half-written
    (tmp_path / "precious").mkdir()
    (tmp_path / "precious" / "notes.txt").write_text("keep me")
    assert main(compare_args([runs["rnn"]], test_set, tmp_path / "precious")) == 2
    assert "not a comparison report" in capsys.readouterr().err


def test_the_job_decodes_as_its_decode_config_says():
    """compare takes one ``DecodeConfig`` (``CompareJob.decode``, built from --beam-size and --batch-size by
    ``cli.common.decode_config``, checked there): the scored translations run it whole, the greedy ones it at beam 1
    (catches a beam, batch size or other field dropped on the way); beam 1 decodes once."""
    from types import SimpleNamespace

    from seq2seq.config import DecodeConfig
    from seq2seq.jobs.compare.decode import decode_system

    job = job_from_args(parse_args(["run", "--output", "r", "--beam-size", "3", "--batch-size", "7"]))
    assert job.decode == DecodeConfig(beam_size=3, batch_size=7)
    assert job_from_args(parse_args(["run", "--output", "r"])).decode == DecodeConfig(beam_size=5)
    with pytest.raises(UserError, match="--beam-size"):
        job_from_args(parse_args(["run", "--output", "r", "--beam-size", "0"]))
    with pytest.raises(UserError, match="--batch-size"):
        job_from_args(parse_args(["run", "--output", "r", "--batch-size", "0"]))
    calls = []

    def translate(sources, decode, **options):
        calls.append(decode)
        return [SimpleNamespace(text=f"{s} {decode.beam}") for s in sources]

    system = SimpleNamespace(translator=SimpleNamespace(translate=translate))
    decode = DecodeConfig(beam_size=3, batch_size=7, length_penalty=0.6, max_input_tokens=40)
    decoded = decode_system(system, ["a", "b"], decode, quiet=True)
    assert calls == [decode, DecodeConfig(beam_size=1, batch_size=7, length_penalty=0.6, max_input_tokens=40), decode]
    assert decoded.greedy == ["a 1", "b 1"] and decoded.beam == ["a 3", "b 3"]
    calls.clear()
    assert decode_system(system, ["a"], DecodeConfig(beam_size=1), quiet=True).beam == ["a 1"] and len(calls) == 2


def test_data_dir_shortcut_names_the_split_files(tmp_path):
    args = parse_args(["run", "--data-dir", str(tmp_path), "--src", "de", "--tgt", "en", "--output", "r"])
    assert input_files(job_from_args(args)) == (tmp_path / "test_2016_flickr.de", tmp_path / "test_2016_flickr.en")
    args = parse_args(["run", "--data-dir", str(tmp_path), "--src", "de", "--source", "x", "--output", "r"])
    with pytest.raises(UserError, match="not both"):
        input_files(job_from_args(args))
    with pytest.raises(UserError, match="give --source and --reference"):
        input_files(job_from_args(parse_args(["run", "--source", "x", "--output", "r"])))
