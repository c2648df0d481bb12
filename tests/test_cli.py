"""train.py and translate.py as a user runs them: subprocesses, exit codes, stdin/stdout, files."""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import run_shared
from conftest import run_main

from seq2seq.cli import COMMANDS

ROOT = Path(__file__).resolve().parents[1]


def run(script: str, *args: str, stdin: str | None = None, cwd: Path = ROOT,
        umask: int = 0o022) -> subprocess.CompletedProcess:
    source = {"input": stdin} if stdin is not None else {"stdin": subprocess.DEVNULL}  # never the terminal's
    return subprocess.run([sys.executable, str(ROOT / script), *args], capture_output=True, text=True, cwd=cwd,
                          timeout=300, preexec_fn=lambda: os.umask(umask), **source)


TINY = ["--toy-size", "300", "--vocab-size", "120", "--d-model", "32", "--heads", "2", "--ff-size", "64",
        "--layers", "1", "--max-steps", "8", "--eval-every", "4", "--eval-max-sentences", "8", "--quiet",
        "--device", "cpu", "--cache-dir", str(run_shared.run_dir() / "cache")]  # this run's, not the repository's


@pytest.fixture(scope="module")
def checkpoint() -> Path:
    """``train.py`` as a user runs it (a subprocess), once per test run."""
    def build(directory: Path) -> None:
        proc = run("train.py", *TINY, "--output-dir", str(directory / "run"))
        assert proc.returncode == 0, proc.stderr
        assert "test BLEU" in proc.stdout

    return run_shared.built_once("cli-train-py", build) / "run" / "best.pt"


def test_training_written_to_a_log_file_has_no_carriage_returns(tmp_path):
    """``seq2seq train > log 2>&1``: neither the training bar nor the data preparation's bars redraw
    with carriage returns (one line per step flooded such logs); the log still says what happened."""
    flags = [a for a in TINY if a != "--quiet"]
    flags[flags.index("--cache-dir") + 1] = str(tmp_path / "cache")  # the corpus prepared anew: its bars too
    proc = subprocess.run([sys.executable, str(ROOT / "train.py"), *flags, "--output-dir", str(tmp_path / "run"),
                           "--no-final-test"], capture_output=True, cwd=ROOT, timeout=300)  # bytes: \r kept
    assert proc.returncode == 0, proc.stderr.decode()
    assert b"\r" not in proc.stderr, proc.stderr[:500]
    assert b"start arch=transformer" in proc.stderr


def test_translate_is_a_stdin_stdout_filter_keeping_order_and_empty_lines(checkpoint):
    lines = ["twenty-one", "", "three hundred and five", "   ", "seven"]
    proc = run("translate.py", "--checkpoint", str(checkpoint), "--beam-size", "2", "--quiet",
               stdin="\n".join(lines) + "\n")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.split("\n")[:-1]
    assert len(out) == len(lines)
    assert out[1] == "" and out[3] == ""
    single = run("translate.py", "--checkpoint", str(checkpoint), "--beam-size", "2", stdin="seven\n")
    assert single.stdout.strip() == out[4]


def test_very_long_input_is_cut_with_a_warning(checkpoint):
    long_line = " ".join(["nine hundred and ninety-nine thousand"] * 60)
    proc = run("translate.py", "--checkpoint", str(checkpoint), "--beam-size", "1",
               "--max-input-tokens", "40", stdin=long_line + "\n")
    assert proc.returncode == 0, proc.stderr
    assert "input line 1" in proc.stderr and "first 40" in proc.stderr
    assert len(proc.stdout.split("\n")) == 2


def test_output_file_reference_scores_and_nbest(checkpoint, tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("twenty-one\nseven\n", encoding="utf-8")
    ref = tmp_path / "ref.txt"
    ref.write_text("einundzwanzig\nsieben\n", encoding="utf-8")
    out = tmp_path / "out.txt"
    code, _, err = run_main(["translate", "--checkpoint", str(checkpoint), "--input", str(src), "--output", str(out),
                             "--reference", str(ref)])  # in process: the real start-up is the filter test's
    assert code == 0, err
    assert len(out.read_text(encoding="utf-8").splitlines()) == 2
    assert "BLEU" in err and "chrF2" in err and "nrefs:1" in err
    code, nbest, err = run_main(["translate", "--checkpoint", str(checkpoint), "--beam-size", "3", "--n-best", "3"],
                                stdin="seven\n")
    rows = nbest.splitlines()
    assert code == 0 and len(rows) == 3 and all(r.startswith("0 ||| ") for r in rows), err
    export = tmp_path / "nbest.jsonl"
    code, listed, err = run_main(["translate", "--checkpoint", str(checkpoint), "--beam-size", "3", "--n-best", "3",
                                  "--alignments", str(export)], stdin="three hundred and four\n")
    assert code == 0, err
    [record] = [json.loads(line) for line in export.read_text(encoding="utf-8").splitlines()]
    alternatives = record["alternatives"]
    assert [a["rank"] for a in alternatives] == [2, 3]
    texts = [line.split(" ||| ")[1] for line in listed.splitlines()]
    assert [record["target"]] + [a["target"] for a in alternatives] == texts  # the n-best list, in order
    arrays = np.load(export.with_suffix(".npz"))
    from seq2seq.decoding.translator import Translator

    [best] = Translator.from_checkpoint(checkpoint, device="cpu").translate(["three hundred and four"], beam_size=3,
                                                                            n_best=3)
    for alternative, expected in zip(alternatives, best.alternatives[1:]):  # each with its own attention
        assert alternative["tgt_pieces"] + ["</s>"] == expected.tgt_pieces  # EOS dropped (no --include-eos)
        assert alternative["subword_shape"] == [len(expected.tgt_pieces) - 1, len(record["src_pieces"])]
        np.testing.assert_allclose(arrays[f"s0_alt{alternative['rank']}_attention"], expected.attention, atol=1e-6)


def test_shortlist_written_by_training_used_by_translate_and_rebuilt_by_its_cli(checkpoint, tmp_path):
    assert (checkpoint.parent / "shortlist.npz").is_file()  # train.py wrote the run's shortlist
    lines = "twenty-one\nseven\nthree hundred and five\n"
    code, out, err = run_main(["translate", "--checkpoint", str(checkpoint), "--shortlist"], stdin=lines)
    assert code == 0 and len(out.splitlines()) == 3, err  # in process; the subprocess runs below keep int8's
    for extra in ([], ["--shortlist"]):  # int8 linear layers, alone and with the shortlist
        int8 = run("translate.py", "--checkpoint", str(checkpoint), "--precision", "int8", "--beam-size", "2",
                   *extra, stdin=lines)
        assert int8.returncode == 0 and len(int8.stdout.splitlines()) == 3, int8.stderr
        assert "Warning" not in int8.stderr  # PyTorch's deprecation notices are not passed on
    src, tgt = tmp_path / "train.src", tmp_path / "train.tgt"
    src.write_text(lines, encoding="utf-8")
    tgt.write_text("einundzwanzig\nsieben\ndreihundertfünf\n", encoding="utf-8")
    built = tmp_path / "other.npz"
    code, _, err = run_main(["shortlist", "--checkpoint", str(checkpoint), "--source", str(src), "--target", str(tgt),
                             "--output", str(built)])
    assert code == 0 and built.is_file(), err
    code, out, err = run_main(["translate", "--checkpoint", str(checkpoint), "--shortlist", str(built),
                               "--shortlist-sizes", "2", "5"], stdin=lines)
    assert code == 0 and len(out.splitlines()) == 3, err
    tgt.write_text("einundzwanzig\n", encoding="utf-8")
    code, _, err = run_main(["shortlist", "--checkpoint", str(checkpoint), "--src", str(src), "--tgt", str(tgt)])
    assert "--src is deprecated" in err  # the old flag names still work, with a warning
    assert code == 2 and "line-aligned" in err and "Traceback" not in err
    # the message names both files and their line counts (catches a message that drops a name or a count)
    assert f"--source {src} has 3 lines but --target {tgt} has 1" in " ".join(err.split()), err


def test_translate_compile_cache_compiles_into_that_directory(checkpoint, monkeypatch, tmp_path):
    """``--compile-cache DIR`` implies --compile and hands DIR to the background compile's ``_compiled_parts``
    (there a Transformer's step becomes AOTInductor packages: test_static_step); the command waits for it."""
    asked = []
    monkeypatch.setattr("seq2seq.models.compiled._compiled_parts",
                        lambda model, packages=None, isolated=False: asked.append(packages))  # nothing compiles: "off"
    code, out, err = run_main(["translate", "--checkpoint", str(checkpoint), "--batch-size", "1", "--compile-cache",
                               str(tmp_path / "steps"), "--quiet"], stdin="seven\n")
    assert code == 0 and out.strip(), err
    assert asked == [str(tmp_path / "steps")]



def test_translate_compile_keeps_its_packages_beside_the_checkpoint_unless_told_otherwise(checkpoint, monkeypatch,
                                                                                          tmp_path):
    """``--compile`` alone compiles into ``compiled/`` beside the checkpoint (as ``serve --compile-cache auto``), so a
    second run loads the packages; ``--compile-cache none``: ``torch.compile``, nothing kept."""
    import shutil

    asked = []
    monkeypatch.setattr("seq2seq.models.compiled._compiled_parts",
                        lambda model, packages=None, isolated=False: asked.append(packages))
    own = tmp_path / "run" / "best.pt"
    own.parent.mkdir()
    shutil.copy(checkpoint, own)
    for flags in (["--compile"], ["--compile", "--compile-cache", "none"]):
        code, out, err = run_main(["translate", "--checkpoint", str(own), "--batch-size", "1", *flags, "--quiet"],
                                  stdin="seven\n")
        assert code == 0 and out.strip(), err
    assert asked == [str(own.parent / "compiled"), None]


def test_translate_compile_starts_eagerly_and_waits_for_the_compiled_step(checkpoint, monkeypatch):
    """``--compile``: the first lines translate eagerly while the step compiles in the background; the command waits
    for it at the end (so that the next start loads its packages) and writes what eager decoding writes."""
    monkeypatch.setattr("seq2seq.models.compiled.BACKEND", "eager")  # Dynamo's graphs without a C++ compiler: fast
    lines = "seven\ntwenty-one\nninety-nine\nthree hundred and five\n"
    code, plain, err = run_main(["translate", "--checkpoint", str(checkpoint), "--batch-size", "1", "--quiet"],
                                stdin=lines)
    assert code == 0, err
    code, compiled, err = run_main(["translate", "--checkpoint", str(checkpoint), "--batch-size", "1", "--compile",
                                    "--compile-cache", "none"], stdin=lines)
    assert code == 0, err
    assert compiled == plain and len(plain.splitlines()) == 4
    assert "compiled_decoding status=ready" in err, err


def test_the_python_api_takes_a_compile_cache_too(checkpoint, monkeypatch, tmp_path):
    """``Translator.from_checkpoint(..., compile_cache=DIR)`` as ``--compile-cache DIR``: DIR reaches
    ``compile_decoding`` and the translator keeps it (for a background compile)."""
    from seq2seq.decoding.translator import Translator

    asked = []
    monkeypatch.setattr("seq2seq.decoding.translator.compile_decoding",
                        lambda model, packages=None: asked.append(packages) or False)
    translator = Translator.from_checkpoint(checkpoint, device="cpu", compile=True, compile_cache=str(tmp_path))
    assert asked == [str(tmp_path)] and translator.compile_cache == str(tmp_path)

def test_translate_samples_reproducibly_with_a_seed(checkpoint):
    lines = "twenty-one\nseven\n\nthree hundred and five\nninety-nine\n"
    common = ["translate", "--checkpoint", str(checkpoint), "--sample", "--quiet"]

    def sample(*flags: str, stdin: str = lines) -> str:  # in process: the start-up is not the point
        code, out, err = run_main([*common, *flags], stdin=stdin)
        assert code == 0, err
        return out

    first = sample("--top-p", "0.9", "--seed", "1")
    assert len(first.split("\n")) == 6 and first.split("\n")[2] == ""
    for extra in ([], ["--batch-size", "1"]):  # the same seed: the same samples, whatever the batching
        assert sample("--top-p", "0.9", "--seed", "1", *extra) == first
    hot = [sample("--temperature", "5", "--seed", seed) for seed in "12"]
    assert hot[0] != hot[1]
    rows = sample("--n-best", "3", "--top-k", "5", "--seed", "2", stdin="seven\n").splitlines()
    assert len(rows) == 3 and all(r.startswith("0 ||| ") for r in rows), rows
    scores = [float(r.rsplit("|||", 1)[1]) for r in rows]
    assert scores == sorted(scores, reverse=True)


def _checkpoint_like(checkpoint: Path, path: Path, tokenizer=None, **model) -> Path:
    """A checkpoint with the same tokenizer (or ``tokenizer``) as ``checkpoint`` and an untrained
    model of another shape (``model`` options)."""
    import torch

    from seq2seq.config import ModelConfig, RunConfig
    from seq2seq.models import build_model
    from seq2seq.checkpoint.file import load_checkpoint, save_checkpoint
    from seq2seq.checkpoint.parts import bytes_to_tensor

    payload = load_checkpoint(checkpoint)
    if tokenizer is not None:
        payload["tokenizer"] = bytes_to_tensor(tokenizer.to_bytes())
    vocab = payload["config"]["model"]["vocab_size"] if tokenizer is None else tokenizer.vocab_size
    config = RunConfig(model=ModelConfig(vocab_size=vocab, **model)).resolved()
    torch.manual_seed(0)
    save_checkpoint(path, {**payload, "config": config.to_dict(), "model": build_model(config.model).state_dict()})
    return path


def test_translate_with_an_ensemble_of_checkpoints(checkpoint, tmp_path):
    import json

    import numpy as np

    from seq2seq.tokenizer import Tokenizer

    lines = "twenty-one\n\nseven\n"
    rnn = _checkpoint_like(checkpoint, tmp_path / "rnn.pt", arch="rnn", embed_dim=16, hidden_size=16,
                           decoder_hidden_size=32)
    def translate(*args: str) -> tuple[int, str, str]:  # in process: the start-up is not the point
        return run_main(["translate", "--checkpoint", *args, "--quiet"], stdin=lines)

    single, twice = translate(str(checkpoint), "--beam-size", "2"), translate(str(checkpoint), str(checkpoint),
                                                                             "--beam-size", "2")
    assert single[0] == twice[0] == 0 and twice[1] == single[1], twice[2]  # a model with itself
    align = tmp_path / "align.jsonl"
    code, out, err = translate(str(checkpoint), str(rnn), "--beam-size", "2", "--alignments", str(align),
                               "--attribution", "occlusion")
    assert code == 0 and len(out.split("\n")) == 4, err
    records = [json.loads(line) for line in align.read_text(encoding="utf-8").splitlines()]
    assert len(records) == 3 and records[1]["members"][1]["attention_shape"] == [1, 1, 0, 0]  # empty line
    first = records[0]
    assert [m["checkpoint"] for m in first["members"]] == [str(checkpoint), str(rnn)]
    assert first["members"][0]["subword_matrix"] == first["subword_matrix"]  # the record's own: member 0's
    assert first["members"][0]["attention_shape"] == first["attention_shape"]
    assert first["members"][1]["attention_shape"] == [1, 1] + first["attention_shape"][2:]
    assert "occlusion" in first["attribution"]
    with np.load(align.with_suffix(".npz")) as arrays:
        assert arrays["s0_member0_attention"].shape == tuple(first["attention_shape"])
        assert arrays["s0_member1_attention"].shape == tuple(first["members"][1]["attention_shape"])
        np.testing.assert_array_equal(arrays["s0_member0_attention"], arrays["s0_attention"])
    code, out, err = translate(str(checkpoint), str(rnn), "--sample", "--seed", "3")
    assert code == 0 and len(out.split("\n")) == 4, err
    other = Tokenizer.train(["eins zwei drei", "one two three"] * 5, vocab_size=20)
    foreign = _checkpoint_like(checkpoint, tmp_path / "foreign.pt", tokenizer=other, arch="transformer", d_model=16,
                               heads=2, ff_size=32, layers=1)
    code, _, err = translate(str(checkpoint), str(foreign))
    assert code == 2 and "Traceback" not in err
    assert str(checkpoint) in err and str(foreign) in err and "SentencePiece" in err


@pytest.mark.parametrize("args, message", [
    (["--checkpoint", "nowhere.pt"], "no such file"),
    (["--checkpoint", "CKPT", "--shortlist", "absent.npz"], "absent.npz"),
    (["--checkpoint", "CKPT", "--shortlist-sizes", "5", "10"], "needs --shortlist"),
    (["--checkpoint", "CKPT", "--shortlist", "--shortlist-sizes", "-1", "10"], ">= 0"),
    (["--checkpoint", "CKPT", "--input", "missing.txt"], "missing.txt"),
    (["--checkpoint", "CKPT", "--n-best", "3", "--beam-size", "2"], "--n-best"),
    (["--checkpoint", "CKPT", "--reference", "REF"], "--reference"),
    (["--checkpoint", "CKPT", "--sample", "--beam-size", "3"], "has no beam"),
    (["--checkpoint", "CKPT", "--sample", "--top-k", "-1"], "--top-k must be >= 0"),
    (["--checkpoint", "CKPT", "--sample", "--top-p", "1.5"], "--top-p must be in (0, 1]"),
    (["--checkpoint", "CKPT", "--sample", "--temperature", "-1"], "--temperature must be"),
    (["--checkpoint", "CKPT", "--top-p", "0.9"], "used only with --sample"),
    (["--checkpoint", "CKPT", "CKPT", "--alignments", "OUT", "--attribution", "gradient"], "occlusion"),
])
def test_translate_errors_are_one_line_without_traceback(checkpoint, tmp_path, args, message):
    ref = tmp_path / "ref.txt"
    ref.write_text("a\nb\nc\n", encoding="utf-8")
    args = [str(checkpoint) if a == "CKPT" else str(ref) if a == "REF" else str(tmp_path / "a.jsonl") if a == "OUT"
            else a for a in args]
    code, _, err = run_main(["translate", *args], stdin="seven\n")  # in process: the start-up is not the point
    assert code == 2
    assert message in err and "Traceback" not in err
    assert not list(tmp_path.glob(".*.tmp"))


def test_a_translate_error_as_a_user_meets_it(tmp_path):
    """The real command, its own process: exit status 2 and one line, no traceback."""
    proc = run("translate.py", "--checkpoint", str(tmp_path / "nowhere.pt"), stdin="seven\n")
    assert proc.returncode == 2
    missing = tmp_path / "nowhere.pt"
    assert proc.stderr.strip() == (f"error: checkpoint {missing}: no such file; expected a .pt checkpoint written by "
                                   "seq2seq train, a run directory (its best.pt, else last.pt) or a model directory "
                                   "written by seq2seq export")


def test_run_config_yaml_reproduces_the_runs_config(checkpoint):
    from seq2seq.checkpoint.file import load_checkpoint
    from seq2seq.cli import config_from_flags
    from seq2seq.config import RunConfig

    saved = RunConfig.from_dict(load_checkpoint(checkpoint)["config"])
    assert config_from_flags(["--config", str(checkpoint.parent / "config.yaml")]) == saved
    assert saved.data.toy_size == 300 and saved.model.d_model == 32 and saved.schedule.warmup_steps == 300  # toy preset


def test_written_files_are_readable_as_the_umask_allows(checkpoint, tmp_path):
    """Every file a run and translate.py write gets what open(path, "w") would give (umask 022 ->
    0644, 027 -> 0640), not mkstemp's private 0600."""
    run_dir = checkpoint.parent  # the fixture trained under umask 022
    for name in ("best.pt", "last.pt", "config.yaml", "spm.model", "spm.json", "summary.json", "shortlist.npz",
                 "test.hyp"):
        assert stat.S_IMODE((run_dir / name).stat().st_mode) == 0o644, name
    out = tmp_path / "out.txt"
    proc = run("translate.py", "--checkpoint", str(checkpoint), "--beam-size", "1", "--output", str(out),
               stdin="seven\n", umask=0o027)
    assert proc.returncode == 0, proc.stderr
    assert stat.S_IMODE(out.stat().st_mode) == 0o640


def test_bad_output_never_leaves_a_half_written_file(checkpoint, tmp_path):
    out = tmp_path / "out.txt"
    code, _, _ = run_main(["translate", "--checkpoint", str(checkpoint), "--output", str(out),
                           "--input", str(tmp_path / "absent.txt")])
    assert code == 2 and not out.exists()
    assert not list(tmp_path.glob(".*"))


@pytest.mark.parametrize("args, message", [
    (["--arch", "rnn", "--attention", "luong-magic"], "--attention"),
    (["--config", "missing.yaml"], "missing.yaml"),
    (["--resume"], "--output-dir"),
])
def test_train_errors_are_clear(tmp_path, args, message, monkeypatch):
    monkeypatch.chdir(tmp_path)  # in process (the real start-up is the trained fixture's)
    code, _, err = run_main(["train", *args, "--output-dir" if "--resume" not in args else "--quiet",
                             *([str(tmp_path / "run")] if "--resume" not in args else [])])
    assert code == 2, err
    assert message in err and "Traceback" not in err


def test_a_flag_is_taken_only_as_spelled_in_full(tmp_path, monkeypatch):
    """``--max-step`` was argparse's abbreviation of ``--max-steps``: a typo that trained silently."""
    monkeypatch.chdir(tmp_path)
    code, out, err = run_main(["train", "--max-step", "10", "--output-dir", str(tmp_path / "run")])
    assert code == 2 and out == "" and "Traceback" not in err
    assert err.rstrip().endswith("seq2seq train: error: unrecognized argument --max-step; did you mean --max-steps?")
    assert len(err.splitlines()) <= 3  # the usage of ~100 flags cut to one line: the error stays in sight
    assert not (tmp_path / "run").exists()  # nothing trained
    code, _, err = run_main(["train", "--max-step", "10", "stray"])
    assert code == 2 and "unrecognized argument --max-step; did you mean --max-steps?" in err  # flags first
    code, _, err = run_main(["train", "stray"])
    assert code == 2 and "seq2seq train: error: unrecognized arguments: stray" in err  # argparse's own


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_subcommand_refuses_an_abbreviation_and_names_the_nearest_flag(command):
    code, out, err = run_main([command, "--hel"])  # argparse took it for --help and exited 0
    assert code == 2 and out == "" and "Traceback" not in err
    assert f"seq2seq {command}: error: unrecognized argument --hel; did you mean --help?" in err


@pytest.mark.parametrize("argv, message", [
    (["translate", "--checkpoint", "x.pt", "--beam-sise", "3"], "unrecognized argument --beam-sise; did you mean "
                                                                "--beam-size?"),
    (["translate", "--checkpoint", "x.pt", "--beam-sise=3", "--lenght-penalty", "1"],
     "unrecognized arguments --beam-sise (did you mean --beam-size?), --lenght-penalty (did you mean "
     "--length-penalty?)"),
    (["translate", "--checkpoint", "x.pt", "--frobnicate"], "unrecognized argument --frobnicate\n"),
    (["translate", "--chekpoint", "x.pt"], "unrecognized argument --chekpoint; did you mean --checkpoint?"),
    (["trian"], "unknown command 'trian'; did you mean 'train'?"),
])
def test_an_unknown_flag_or_command_is_answered_with_the_nearest_valid_one(argv, message):
    code, _, err = run_main(argv)
    assert code == 2 and "Traceback" not in err
    assert message in err


def test_config_file_with_unknown_key(tmp_path):
    cfg = tmp_path / "run.yaml"
    cfg.write_text("model:\n  arch: rnn\n  hiden_size: 64\n", encoding="utf-8")
    code, _, err = run_main(["train", "--config", str(cfg), "--output-dir", str(tmp_path / "run")])
    assert code == 2
    assert "hiden_size" in err and "run.yaml" in err and "Traceback" not in err


def test_bench_decodes_with_and_without_the_shortlist(checkpoint, tmp_path, monkeypatch):
    import argparse
    import shutil

    from bench import decode_system
    from seq2seq.decoding.translator import Translator

    outputs = []  # every translate call's output texts, in the order of the bench's runs
    translate = Translator.translate

    def recorded(self, sentences, *args, **kwargs):
        hyps = translate(self, sentences, *args, **kwargs)
        outputs.append([h.text for h in hyps])
        return hyps

    monkeypatch.setattr(Translator, "translate", recorded)

    run_dir, data = tmp_path / "run", tmp_path / "data"
    run_dir.mkdir(), data.mkdir()
    shutil.copy(checkpoint, run_dir / "best.pt")  # no shortlist.npz: the bench builds it from train.*
    for split, en, de in (("train", "seven\ntwenty-one\n", "sieben\neinundzwanzig\n"),
                          ("test", "seven\nthree\nfive\n", "sieben\ndrei\nfünf\n")):
        (data / f"{split}.en").write_text(en, encoding="utf-8")
        (data / f"{split}.de").write_text(de, encoding="utf-8")
    args = argparse.Namespace(data_dir=data, src="en", tgt="de", test_split="test", device="cpu", bs1_sentences=2)
    result = decode_system(run_dir, args)
    assert (run_dir / "shortlist.npz").is_file()
    from seq2seq.runtime import cpu_has_native_bf16

    bf16 = {"greedy_bf16", "beam5_bf16", "greedy_bs1_bf16"} if cpu_has_native_bf16() else set()
    int8 = {"greedy_int8", "beam5_int8", "greedy_bs1_int8", "beam5_int8_shortlist", "greedy_bs1_int8_shortlist"}
    assert set(result) == {"greedy", "beam5", "greedy_shortlist", "beam5_shortlist", "greedy_bs1", "greedy_bs1_fp16",
                           "greedy_bs1_shortlist", "greedy_bs1_fp16_shortlist", *bf16, *int8}
    # The agreement counts recounted from the outputs each run produced (recorded above, one translate
    # call per run): catches counting the differences (a != b), comparing with the wrong fp32 twin,
    # or over another subset. Every faster path (shortlist, fp16, bf16, int8) has exactly one count.
    assert len(outputs) == len(result)
    texts = dict(zip(result, outputs))
    for label, entry in result.items():
        assert len(texts[label]) == entry["sentences"]
        twin = label.removesuffix("_shortlist")
        for suffix in ("_fp16", "_bf16", "_int8"):
            twin = twin.removesuffix(suffix)
        counts = {key: value for key, value in entry.items() if key.startswith("same_outputs_as_")}
        expected = {} if twin == label else {
            f"same_outputs_as_{twin}": sum(a == b for a, b in zip(texts[label], texts[twin], strict=True))}
        assert counts == expected, label
    assert {label for label in result if "same_outputs_as_greedy_bs1" in result[label]} == {
        "greedy_bs1_fp16", "greedy_bs1_shortlist", "greedy_bs1_fp16_shortlist", *(bf16 | int8) & {
            "greedy_bs1_bf16", "greedy_bs1_int8", "greedy_bs1_int8_shortlist"}}
    assert result["greedy_bs1"]["sentences"] == 2 and result["beam5"]["sentences"] == 3
    from bench import speed_table

    train = {"precision": "fp32", "parameters": 1e6, "tgt_tokens_per_step": 100, "tgt_tokens_per_s": 1000,
             "model_gflop_per_s_estimate": 10, "fraction_of_matmul_peak": 0.1, "peak_rss_mb": 500}
    table = speed_table({"matmul_gflop_per_s": {"float32_square2048": 100, "float32_ffn4400x256x1024": 90},
                         "train": {"tiny": train}, "decode": {"tiny": result}})
    row = table.splitlines()[-1]
    assert row.count("|") == table.splitlines()[-2].count("|")  # as many cells as the header
    assert f"{result['beam5_shortlist']['sentences_per_s']:.1f}" in row
    assert f"{result['beam5_int8']['sentences_per_s']:.1f} ({result['beam5_int8']['bleu']:.2f})" in row


def test_bench_decode_command_repeats_and_takes_medians(checkpoint, tmp_path):
    import json
    import shutil

    import bench

    data = tmp_path / "data"
    data.mkdir()
    for split, en, de in (("train", "seven\n", "sieben\n"), ("test", "seven\nthree\n", "sieben\ndrei\n")):
        (data / f"{split}.en").write_text(en, encoding="utf-8")
        (data / f"{split}.de").write_text(de, encoding="utf-8")
    (tmp_path / "runs" / "tiny").mkdir(parents=True)
    shutil.copy(checkpoint, tmp_path / "runs" / "tiny" / "best.pt")
    out = tmp_path / "decode.json"
    common = ["decode", "--data-dir", str(data), "--src", "en", "--tgt", "de", "--test-split", "test",
              "--bs1-sentences", "1", "--out", str(out)]
    assert bench.main([*common, "--checkpoints", str(tmp_path / "runs"), "--systems", "tiny", "--repeats", "2"]) == 0
    record = json.loads(out.read_text())
    assert len(record["runs"]["tiny"]) == 2 and "beam5_shortlist" in record["median_sentences_per_s"]["tiny"]
    assert bench.main([*common, "--checkpoints", str(tmp_path / "runs"), "--systems", "absent"]) == 2


def test_bench_profile_splits_decoding_time_and_bounds_it_by_the_matrix_products(checkpoint, tmp_path, capsys):
    import json

    import bench

    data = tmp_path / "data"
    data.mkdir()
    (data / "train.en").write_text("seven\n", encoding="utf-8")
    (data / "test.en").write_text("seven\nthree\ntwenty-one\n", encoding="utf-8")
    out = tmp_path / "profile.json"
    common = ["profile", "--data-dir", str(data), "--src", "en", "--tgt", "de", "--test-split", "test"]
    assert bench.main([*common, "--checkpoint", str(checkpoint.parent), "--beam-size", "2", "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    assert record["sentences"] == 3 and record["beam_size"] == 2
    assert record["matmul_gflop"] > 0 and 0 < record["matmul_seconds"]
    assert record["bound_sentences_per_s"] == pytest.approx(3 / record["matmul_seconds"])
    assert any(op["op"] in bench.MATMUL_OPS for op in record["top_ops"])
    assert "bound with everything else free" in capsys.readouterr().out
    assert bench.main([*common, "--checkpoint", str(tmp_path / "absent")]) == 2
    assert "--checkpoint" in capsys.readouterr().err
