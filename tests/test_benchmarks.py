"""Every benchmark script runs from benchmarks/ on tiny data with a tiny budget and writes its
record (JSON with provenance, markdown table beside it). Speeds measured here mean nothing; the
point is that the scripts a reader would rerun still work."""
from __future__ import annotations

import contextlib
import importlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import run_shared
import torch

from conftest import run_main
from seq2seq.toy import toy_corpus

pytestmark = pytest.mark.slow  # subprocesses that train: `pytest -m "not slow"` skips them

ROOT = Path(__file__).resolve().parents[1]
TINY_MODEL = ["--d-model", "32", "--heads", "2", "--ff-size", "64", "--layers", "1", "--max-steps", "3",
              "--eval-every", "3", "--eval-max-sentences", "4"]


@contextlib.contextmanager
def as_a_child(cwd, env: dict | None = None):
    """Run the block in ``cwd`` (and with ``env`` as the whole environment, when given), as a child process
    would; the working directory, the environment and torch's thread count are restored afterwards."""
    here, environ, threads = Path.cwd(), dict(os.environ), torch.get_num_threads()
    try:
        if env is not None:
            os.environ.clear()
            os.environ.update(env)
        os.chdir(cwd)
        yield
    finally:
        os.chdir(here)
        os.environ.clear()
        os.environ.update(environ)
        torch.set_num_threads(threads)


def script(name: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    """``python benchmarks/NAME ARGS`` run from ``cwd``, as its ``main(argv)`` in this process (no Python +
    torch start-up; what the script's own subprocesses print is not captured): ``sys.argv`` as the command
    would have it (records keep it), the working directory, the environment and torch's thread count are
    restored afterwards. One test keeps the real command
    (``test_ab_speed_...``: ``ab_speed.py`` as a user runs it)."""
    module = importlib.import_module(Path(name).stem)
    out, err = io.StringIO(), io.StringIO()
    argv = sys.argv
    try:
        with as_a_child(cwd):
            sys.argv = [str(ROOT / "benchmarks" / name), *args]  # the record's command
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                try:
                    code = module.main(list(args))
                except SystemExit as exc:
                    code = exc.code
    finally:
        sys.argv = argv
    assert code in (0, None), out.getvalue()[-2000:] + err.getvalue()[-3000:]
    return subprocess.CompletedProcess([name, *args], 0, out.getvalue(), err.getvalue())


def train_in_process(*argv: str) -> None:
    """``seq2seq train ARGV`` in this process (``conftest.run_main``), torch's thread count restored."""
    threads = torch.get_num_threads()
    try:
        code, out, err = run_main(["train", *argv])
    finally:
        torch.set_num_threads(threads)
    assert code == 0, out[-2000:] + err[-3000:]


SEQ2SEQ_CHILD = [sys.executable, "-m", "seq2seq"]


@pytest.fixture(autouse=True)
def seq2seq_children_in_process(monkeypatch):
    """A benchmark's ``python -m seq2seq ...`` child that it waits on (``subprocess.run``: ``train_preset``'s
    runs, ``wordalign``, ``export``) runs in this process (``conftest.run_main``), as ``script`` runs the
    benchmark itself: each saves the child's Python, torch and torch._dynamo start-up (~5 s on an AVX2-only EPYC,
    ~40 children a suite). The child's working directory, environment, status (``check``) and output
    (``capture_output``, ``stdout``/``stderr`` as PIPE, STDOUT or a file) are kept; torch's thread count is
    restored. Children started with ``Popen`` (runs side by side, measured runs) and every other command stay
    processes: those paths run for real here."""
    real = subprocess.run

    def run(command, *args, **kwargs):
        if args or not isinstance(command, list) or [str(c) for c in command[:3]] != SEQ2SEQ_CHILD:
            return real(command, *args, **kwargs)
        with as_a_child(kwargs.get("cwd") or Path.cwd(), kwargs.get("env")):
            code, out, err = run_main([str(c) for c in command[3:]])
        if kwargs.get("capture_output"):
            kwargs["stdout"] = kwargs["stderr"] = subprocess.PIPE
        if kwargs.get("stderr") == subprocess.STDOUT:
            out, err, kwargs["stderr"] = out + err, "", None
        streams = {}
        for name, text, default in (("stdout", out, sys.stdout), ("stderr", err, sys.stderr)):
            target = kwargs.get(name)
            if target == subprocess.PIPE:
                streams[name] = text if kwargs.get("text") or kwargs.get("universal_newlines") else text.encode()
            elif target is None:
                default.write(text)
            elif target != subprocess.DEVNULL and hasattr(target, "write"):
                target.write(text if "b" not in getattr(target, "mode", "") else text.encode())
        if kwargs.get("check") and code:
            raise subprocess.CalledProcessError(code, command, streams.get("stdout"), streams.get("stderr"))
        return subprocess.CompletedProcess(command, code, streams.get("stdout"), streams.get("stderr"))

    monkeypatch.setattr(subprocess, "run", run)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    """A Multi30k-shaped directory ({train,val,test}.{en,de}) from the toy corpus."""
    directory = tmp_path_factory.mktemp("bench-data")
    corpus = toy_corpus(n_train=200, n_valid=8, n_test=8, seed=5)
    for split, stem in (("train", "train"), ("validation", "val"), ("test", "test")):
        for column, lang in (("src", "en"), ("tgt", "de")):
            (directory / f"{stem}.{lang}").write_text("\n".join(corpus[split][column]) + "\n", encoding="utf-8")
    return directory


def tiny_run(data: Path, tmp_path: Path) -> Path:
    """A TINY_MODEL Transformer trained on ``data`` (en -> de) in ``tmp_path / "run"``."""
    run = tmp_path / "run"
    train_in_process("--data-dir", str(data), "--src", "en", "--tgt", "de", "--test-split", "test", "--vocab-size",
                     "60", "--device", "cpu", "--output-dir", str(run), "--no-final-test", "--quiet", *TINY_MODEL)
    return run


def check_record(path: Path, benchmark: str) -> dict:
    record = json.loads(path.read_text())
    assert record["benchmark"] == benchmark and record["command"].startswith("python benchmarks/")
    assert record["machine"]["cpu_capability"] and "versions" in record["machine"]
    return record


def test_quality_benchmark_trains_decodes_and_records(data, tmp_path):
    out = tmp_path / "quality"
    script("bench.py", "quality", "--data-dir", str(data), "--src", "en", "--tgt", "de", "--test-split", "test",
           "--systems", "transformer", "--minutes", "1", "--vocab-size", "60", "--device", "cpu", "--out", str(out),
           "--", *TINY_MODEL, cwd=tmp_path)
    record = check_record(out / "quality.json", "quality")
    decode = record["systems"]["transformer"]["decode"]
    assert {"greedy", "beam5", "greedy_bs1"} <= set(decode) and "| transformer |" in (out / "quality.md").read_text()


def test_positions_benchmark_trains_each_encoding_on_short_sources_and_scores_by_length(data, tmp_path):
    out = tmp_path / "positions.json"  # toy sources have 1-9 words; the test set 4, 6 and 9
    proc = script("bench_positions.py", "--data-dir", str(data), "--src", "en", "--tgt", "de", "--test-split",
                  "test", "--max-src-words", "6", "--positions", "learned", "rope", "--minutes", "0.05",
                  "--vocab-size", "60", "--device", "cpu", "--out", str(out), "--", *TINY_MODEL, cwd=tmp_path)
    assert "2 of 8 sources (25.0%) have more than 6 words" in proc.stderr
    record = check_record(out, "positions")
    train_src = (tmp_path / "positions" / "data" / "train.en").read_text().splitlines()
    assert train_src and max(len(s.split()) for s in train_src) == 6
    assert record["filtered"]["val"]["kept"] < record["filtered"]["val"]["pairs"] == 8
    assert list(record["runs"]) == ["learned", "rope"]  # two of the four: each run is a process (~12 s)
    for run in record["runs"].values():
        buckets = run["decode"]["test"]["buckets"]
        assert [(b["words"], b["unseen"]) for b in buckets] == [("1-6", False), ("7", True), ("8-10", True),
                                                                ("11+", True)]
        assert [b["sentences"] for b in buckets] == [6, 0, 2, 0] and buckets[1]["bleu"] is None
        assert run["decode"]["valid_full"]["sentences"] == 8 and run["train"]["steps"] <= 3
    assert record["pieces"]["test_src_max"] > 0
    table = (tmp_path / "positions.md").read_text()
    assert "| rope |" in table and "8-10 w, n=2 (unseen)" in table


def test_combine_benchmark_averages_checkpoints_and_ensembles_an_rnn_with_a_transformer(data, tmp_path):
    out = tmp_path / "combine.json"
    tiny = ["--d-model", "32", "--heads", "2", "--ff-size", "64", "--layers", "1", "--embed-dim", "32",
            "--hidden-size", "32", "--decoder-hidden-size", "48", "--vocab-size", "60", "--eval-max-sentences", "4"]
    script("bench_combine.py", "--data-dir", str(data), "--src", "en", "--tgt", "de", "--test-split", "test",
           "--steps", "6", "--eval-every", "3", "--keep", "2", "--device", "cpu", "--out", str(out), "--", *tiny,
           cwd=tmp_path)
    record = check_record(out, "combine")
    assert list(record["systems"]) == ["transformer best.pt", "average best 2", "average last 2", "rnn best.pt",
                                       "ensemble rnn + transformer"]
    assert record["systems"]["ensemble rnn + transformer"]["checkpoints"] == ["rnn/best.pt", "transformer/best.pt"]
    assert all(r["val"]["sentences_per_s"] > 0 for r in record["systems"].values())
    # the scores are those of the systems it names, on the test split: decode two of them again here
    from seq2seq.decoding.translator import Translator
    from seq2seq.metrics import corpus_scores

    sources, references = ((data / f"test.{lang}").read_text().splitlines() for lang in ("en", "de"))
    for name in ("transformer best.pt", "ensemble rnn + transformer"):
        paths = [out.with_suffix("") / c for c in record["systems"][name]["checkpoints"]]
        hyps = [t.text for t in Translator.from_checkpoint(paths, device="cpu").translate(sources, beam_size=5)]
        assert record["systems"][name]["test"]["bleu"] == corpus_scores(hyps, references, ("bleu",))["bleu"].score
    assert record["train"]["transformer"]["steps"] == record["train"]["rnn"]["steps"] == 6
    assert "| ensemble rnn + transformer |" in (tmp_path / "combine.md").read_text()


def test_speed_benchmark_measures_training_steps(data, tmp_path):
    out = tmp_path / "speed"
    script("bench.py", "speed", "--data-dir", str(data), "--src", "en", "--tgt", "de", "--test-split", "test",
           "--systems", "transformer", "--steps", "2", "--warmup", "1", "--vocab-size", "60", "--out", str(out),
           "--peak-seconds", "0.05", "--bs1-sentences", "2", "--", "--d-model", "32", "--heads", "2", "--ff-size",
           "64", "--layers", "1", "--max-tokens", "300", cwd=tmp_path)  # the peers' sizes take most of a minute
    record = check_record(out / "speed.json", "speed")
    assert record["train"]["transformer"]["steps"] == 2 and record["train"]["transformer"]["tgt_tokens_per_s"] > 0


def test_scale_benchmark_prepares_and_trains_from_its_cache(tmp_path):
    out = tmp_path / "records"
    script("bench_scale.py", "--pairs", "300", "--steps", "2", "--control-pairs", "0", "--vocab-size", "80",
           "--num-proc", "1", "--sp-input-sentence-size", "1000", "--work-dir", str(tmp_path / "work"),
           "--out", str(out), "--", "--d-model", "32", "--heads", "2", "--ff-size", "64", "--layers", "1", cwd=tmp_path)
    record = check_record(out / "scale-300.json", "scale")
    assert record["train"]["stored"]["steps"] == 2 and record["train"]["stored"]["cache_reused"]
    assert not (tmp_path / "work").exists()  # the work directory is removed unless --keep


def test_gpu_smoke_refuses_to_run_without_a_gpu_and_tabulates_a_record(tmp_path, monkeypatch, capsys):
    import gpu_smoke

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpu_smoke.main(["--data-dir", str(tmp_path)]) == 2
    assert "no CUDA device is visible" in capsys.readouterr().err
    record = {"gpu": "NVIDIA H100", "capability": "9.0",
              "matmul_tflop_per_s": {"fp32": 51.2, "bf16": 700.0}, "flops_per_tgt_token": {"rnn": 1.5e8},
              "steps": {"train rnn fp32": {"ok": True, "seconds": 70.0, "tok_s": 90000, "valid_bleu": 30.5,
                                           "peak_mb": 2048.4, "model_tflop_s": 13.5, "of_peak": 0.2637},
                        "int8 refused on cuda": {"ok": False}},
              "decode": {"rnn": {"cpu_greedy": {"sentences_per_s": 50.0, "bleu": 30.0},
                                 "greedy": {"sentences_per_s": 900.0, "bleu": 30.0, "same_as_cpu": 0.998}}}}
    table = gpu_smoke.smoke_table(record)
    assert "| train rnn fp32 | ok | 70.0 | 90000 | 30.50 | 2048 | 13.5 | 26.4% |" in table
    assert "Matmul peak (TFLOP/s, 8192x8192x8192): fp32 51, bf16 700; FLOPs per target token: rnn 150 M" in table
    assert "| int8 refused on cuda | FAILED |" in table
    assert "| greedy | 900.0 | 30.00 | 99.8% |" in table and "(CPU)" in table


def test_gpu_smoke_plan_follows_its_flags(tmp_path, capsys):
    import gpu_smoke

    def names(*flags: str) -> list[str]:
        args = gpu_smoke.parse_args(["--data-dir", str(tmp_path), "--runs", str(tmp_path / "runs"), *flags])
        return [step.name for step in gpu_smoke.build_plan(args, {})]

    assert names() == ["tests/test_cuda.py", "matmul peak", "quickstart", "int8 refused on cuda", "tokenizer",
                       "train rnn fp32", "train transformer fp32", "resume transformer fp32", "train rnn bf16",
                       "train transformer bf16", "decode rnn", "decode transformer", "attribution rnn",
                       "attribution transformer"]
    assert names("--tests", "suite", "--peak-seconds", "0", "--quickstart-steps", "0", "--archs", "transformer",
                 "--precisions", "fp16", "--sentences", "0") == [
        "test suite", "tokenizer", "train transformer fp16", "int8 refused on cuda",
        "attribution transformer"]  # int8 on the first run's checkpoint; no fp32 run to resume
    assert names("--tests", "none", "--quickstart-steps", "0", "--precisions", "fp32", "--resume-steps", "0",
                 "--attribution-sentences", "0", "--archs", "rnn") == [
        "matmul peak", "tokenizer", "train rnn fp32", "int8 refused on cuda", "decode rnn"]
    assert gpu_smoke.main(["--data-dir", str(tmp_path), "--dry-run", "--quickstart-steps", "40"]) == 0  # no GPU
    assert "--max-steps 40" in capsys.readouterr().out


def test_gpu_smoke_rewrites_its_record_after_every_step_and_skips_what_the_budget_cannot_fit(tmp_path, monkeypatch):
    import time

    import gpu_smoke

    now, commands, on_disk = [0.0], [], []
    out = tmp_path / "out" / "smoke.json"

    def fake_run(command, timeout):  # each command takes 20 s of the fake clock
        on_disk.append(list(json.loads(out.read_text())["steps"]))
        commands.append(command)
        now[0] += 20
        if "translate" in command:
            return 2, 20.0, "error: --precision int8 runs on CPU only (quantized CPU kernels)"
        return 0, 20.0, "done"

    def fake_tokenizer(args, home):
        home.mkdir(parents=True)
        (home / "spm.model").write_text("model")
        (home / "spm.json").write_text("{}")
        now[0] += 20
        return home

    monkeypatch.setattr(gpu_smoke, "run", fake_run)
    monkeypatch.setattr(gpu_smoke, "shared_tokenizer", fake_tokenizer)
    monkeypatch.setattr(gpu_smoke, "load_checkpoint", lambda path: {"progress": {"step": 500}})  # never grows
    args = gpu_smoke.parse_args(["--data-dir", str(tmp_path), "--runs", str(tmp_path / "runs"), "--out", str(out),
                                 "--budget-minutes", "3", "--sentences", "0", "--attribution-sentences", "0",
                                 "--peak-seconds", "0"])
    record = {"gpu": "stub", "capability": "9.0", "steps": {}}
    plan = gpu_smoke.build_plan(args, record)
    gpu_smoke.execute(plan, record, args, clock=lambda: now[0])
    # 20 s a step: at 140 s the 1-minute runs (75 s with start-up) no longer fit the 180 s budget
    assert {name: s["result"] for name, s in record["steps"].items()} == {
        "tests/test_cuda.py": "ok", "quickstart": "ok", "int8 refused on cuda": "ok", "tokenizer": "ok",
        "train rnn fp32": "ok", "train transformer fp32": "ok", "resume transformer fp32": "FAILED",
        "train rnn bf16": "skipped (budget)", "train transformer bf16": "skipped (budget)"}
    assert [len(steps) for steps in on_disk] == [0, 1, 2, 4, 5, 6]  # the record was rewritten after every step
    assert json.loads(out.read_text()) == json.loads(json.dumps(record)) and record["finished"]
    assert gpu_smoke.exit_status(record) == 1
    resume = record["steps"]["resume transformer fp32"]
    assert resume["step_before"] == resume["step_after"] == 500 and "grew by 0, not 100" in resume["note"]
    assert "--resume --max-steps 600 --max-minutes 0" in " ".join(commands[-1])  # its own limits lifted
    train = " ".join(commands[3])
    assert "--preset rnn-bahdanau" in train and "--precision fp32 --max-minutes 1.0" in train
    assert "--device cuda" in train and "--cache-dir" in train
    assert (tmp_path / "runs" / "rnn-fp32" / "spm.model").read_text() == "model"  # the shared tokenizer
    table = out.with_suffix(".md").read_text()
    assert "| train rnn bf16 | skipped (budget) |" in table and "grew by 0, not 100" in table
    with pytest.raises(gpu_smoke.StepTimeout):
        with gpu_smoke.time_limit(0.05):
            time.sleep(2)


def test_gpu_smoke_counts_each_architectures_flops_once_and_shares_the_peak_of_the_runs_precision(tmp_path,
                                                                                                 monkeypatch):
    import gpu_smoke

    counted = []
    monkeypatch.setattr(gpu_smoke, "flops_per_target_token", lambda run_dir, work: counted.append(run_dir) or 2e8)
    record = {"matmul_tflop_per_s": {"fp32": 50.0, "bf16": 500.0}}
    assert gpu_smoke.throughput_entry(record, "rnn", "fp32", tmp_path / "rnn-fp32", 100_000) == {
        "model_tflop_s": 20.0, "of_peak": 0.4}
    assert gpu_smoke.throughput_entry(record, "rnn", "bf16", tmp_path / "rnn-bf16", 250_000) == {
        "model_tflop_s": 50.0, "of_peak": 0.1}
    assert gpu_smoke.throughput_entry(record, "rnn", "fp16", tmp_path / "rnn-fp16", 250_000) == {
        "model_tflop_s": 50.0}  # no fp16 peak measured: no share
    assert counted == [tmp_path / "rnn-fp32"] and record["flops_per_tgt_token"] == {"rnn": 2e8}


def test_gpu_smoke_counts_model_flops_per_target_token_of_a_run(tmp_path):
    """The count on a real (tiny, CPU) run: about 6 x the parameters a token passes through, no scratch left."""
    import gpu_smoke

    from seq2seq.cli import config_from_flags
    from seq2seq.training.run import train

    run = tmp_path / "run"
    cfg = config_from_flags(["--device", "cpu", "--max-steps", "2", "--output-dir", str(run), "--cache-dir",
                             str(tmp_path / "cache")])
    result = train(cfg, quiet=True)
    assert json.loads((run / "summary.json").read_text())["peak_cuda_memory_mb"] is None  # not on CUDA
    flops = gpu_smoke.flops_per_target_token(run, tmp_path / "scratch", device="cpu")
    assert 2 * result.parameters < flops < 12 * result.parameters
    assert not (tmp_path / "scratch").exists()


def test_gpu_smoke_resume_check_needs_the_step_count_to_grow_and_finite_losses(tmp_path, monkeypatch):
    import gpu_smoke

    step = [200]
    monkeypatch.setattr(gpu_smoke, "load_checkpoint", lambda path: {"progress": {"step": step[0]}})
    lines = [{"kind": "train", "step": 50, "loss": float("nan")}, {"kind": "train", "step": 100, "loss": 4.0},
             {"kind": "train", "step": 150, "loss": 3.5}, {"kind": "valid", "step": 200, "loss": 3.25, "bleu": 9.0}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    check = gpu_smoke.check_resume(tmp_path, 100, 100)
    assert check["ok"] and check["note"] == "step 100 -> 200, last loss 3.250" and check["losses_after"] == [3.5, 3.25]
    step[0] = 101  # the resumed run stopped after one step (the old --max-minutes bug)
    assert not gpu_smoke.check_resume(tmp_path, 100, 100)["ok"]
    assert "no loss after step 200" in gpu_smoke.check_resume(tmp_path, 200, 0)["note"]
    assert "not finite" in gpu_smoke.check_resume(tmp_path, 0, 200)["note"]  # the NaN at step 50


def test_ctranslate2_benchmark_decodes_with_both_engines_in_every_mode_at_both_thread_counts(data, tmp_path):
    pytest.importorskip("ctranslate2")
    run_dir = tiny_run(data, tmp_path)
    out = tmp_path / "ct2.json"
    script("bench_ctranslate2.py", "--checkpoint", str(run_dir), "--data-dir", str(data), "--src", "en", "--tgt",
           "de", "--test-split", "test", "--batch1-sentences", "2", "--threads", "1", "2", "--precisions", "fp32",
           "--out", str(out), "--modes", "greedy, batch 1", "--engines", "ctranslate2", "--rounds", "2", cwd=tmp_path)
    # not "ours compiled": a minute of compiling, its outputs are test_static_step's; int8: the same loop
    record = check_record(out, "ctranslate2")
    rows = {(r["mode"], r["engine"], r["precision"], r["threads"]): r for r in record["results"]}
    assert len(rows) == 4 and record["threads"] == [1, 2]
    assert rows[("greedy, batch 1", "ours", "fp32", 2)]["sentences"] == 2
    order = [(r["engine"], r["threads"]) for r in record["results"]]
    assert order == [("ours", 1), ("ctranslate2", 1), ("ours", 2), ("ctranslate2", 2)]  # interleaved
    assert 0 <= rows[("greedy, batch 1", "ctranslate2", "fp32", 1)]["identical_to_ours_fp32"] <= 1  # an untrained model
    assert record["bandwidth_floor"]["decoder_bytes"] > 0 and record["machine"]["cpu_flags"] is not None
    assert rows[("greedy, batch 1", "ours", "fp32", 2)]["identical_to_ours_fp32"] == 1.0
    for row in rows.values():  # two rounds each, the fastest kept
        assert len(row["round_seconds"]) == 2 and row["seconds"] == min(row["round_seconds"])
    text = (tmp_path / "ct2.md").read_text()
    assert "| greedy, batch 1 | fp32 | ctranslate2 | 2 |" in text and "Each engine at its best thread count" in text


def test_batch1_profile_splits_each_sentence_into_its_parts(data, tmp_path):
    """Smoke run of profile_batch1.py, eager only (the packaged engine compiles: minutes); the parts add up to the
    sentence's time and the wrappers are gone afterwards."""
    from seq2seq.decoding import translator
    from seq2seq.decoding.vocabulary import OutputVocabulary

    before = translator.translate_batch, OutputVocabulary.log_probs
    run_dir = tiny_run(data, tmp_path)
    out = tmp_path / "profile.json"
    script("profile_batch1.py", "--checkpoint", str(run_dir), "--data-dir", str(data), "--src", "en", "--test-split",
           "test", "--sentences", "3", "--beams", "1", "2", "--threads", "1", "--engines", "eager", "--out", str(out),
           cwd=tmp_path)
    assert (translator.translate_batch, OutputVocabulary.log_probs) == before
    record = check_record(out, "profile-batch1")
    assert [(r["beam"], r["engine"]) for r in record["results"]] == [(1, "eager"), (2, "eager")]
    for row in record["results"]:
        assert row["steps"] > 0 and abs(sum(row["share"].values()) - 1) < 1e-6 and row["share"]["model steps"] > 0
    assert "| search bookkeeping |" in out.with_suffix(".md").read_text()


def test_tune_benchmark_alternates_architectures_and_picks_winners_on_validation(data, tmp_path):
    from bench_tune import SEARCH

    assert len({len(configs) for configs in SEARCH.values()}) == 1  # equal effort: as many configurations each
    assert all(configs[0] == ("preset", []) for configs in SEARCH.values())
    out = tmp_path / "tune.json"
    tiny = ["--d-model", "32", "--heads", "2", "--ff-size", "64", "--layers", "1", "--embed-dim", "32",
            "--hidden-size", "32", "--decoder-hidden-size", "32", "--max-steps", "2", "--eval-max-sentences", "4",
            "--vocab-size", "60"]
    proc = script("bench_tune.py", "--data-dir", str(data), "--src", "en", "--tgt", "de", "--test-split", "test",
                  "--minutes", "1", "--configs", "2", "--device", "cpu", "--out", str(out), "--", *tiny,
                  cwd=tmp_path)
    record = check_record(out, "tune")
    assert [(r["arch"], r["name"]) for r in record["results"]] == [
        ("transformer", "preset"), ("rnn-bahdanau", "preset"), ("transformer", "lr 2e-3"), ("rnn-bahdanau", "lr 2e-3")]
    assert all(r["val_bleu"] is not None and r["steps"] <= 2 for r in record["results"])
    assert set(record["winners"]) == {"transformer", "rnn-bahdanau"}
    assert "| rnn-bahdanau | lr 2e-3 | --lr 2e-3 |" in (tmp_path / "tune.md").read_text()
    again = script("bench_tune.py", "--data-dir", str(data), "--src", "en", "--tgt", "de", "--test-split", "test",
                   "--minutes", "1", "--configs", "2", "--device", "cpu", "--out", str(out), "--", *tiny,
                   cwd=tmp_path)
    assert "[transformer / preset]" in proc.stderr and "[transformer / preset]" not in again.stderr  # reused


def test_budget_benchmark_tests_the_snapshots_nearest_each_budget_and_resumes_a_killed_run(data, tmp_path):
    out = tmp_path / "budget.json"
    tiny = ["--d-model", "32", "--heads", "2", "--ff-size", "64", "--layers", "1", "--embed-dim", "32",
            "--hidden-size", "32", "--decoder-hidden-size", "32", "--eval-max-sentences", "4", "--vocab-size", "60",
            "--threads", "1"]
    flags = ["--data-dir", str(data), "--src", "en", "--tgt", "de", "--test-split", "test", "--minutes", "0.05",
             "--eval-minutes", "0.01", "--budgets", "0.01", "0.04", "1", "--beam-size", "2", "--device", "cpu",
             "--out", str(out)]
    gold = tmp_path / "gold.align"  # the first two val pairs: their first words aligned
    gold.write_text("0-0\n0-0\n")
    proc = script("bench_budget.py", *flags, "--parallel", "--gold", str(gold), "--", *tiny, cwd=tmp_path)
    record = check_record(out, "budget")
    assert list(record["archs"]) == ["rnn-bahdanau", "transformer-align"] and record["parallel"]
    links = out.with_suffix("") / "train.talp"  # eflomal's links, computed before the clocks start
    assert len(links.read_text().splitlines()) == len((data / "train.en").read_text().splitlines())
    assert f"--guided-alignment {links}" in proc.stderr
    for result in record["archs"].values():
        curve = result["curve"]
        assert len(curve) >= 3 and [r["step"] for r in curve] == sorted({r["step"] for r in curve})
        slots = [int(r["elapsed"] // 0.6) for r in curve[:-1]]  # the grid: one validation per 0.6 s slot
        assert slots == sorted(set(slots)) and all(s >= 1 for s in slots)
        assert [b["budget_minutes"] for b in result["budgets"]] == [0.01, 0.04]  # the run stopped short of 1
        for row in result["budgets"]:
            assert 0 <= row["test_bleu"] <= 100 and 0 <= row["val_bleu"] <= 100 and 0 <= row["aer"] <= 1
            assert (Path(result["run"]) / row["checkpoint"]).is_file()  # the snapshot is kept
    assert set(record["crossings"]) == {"minutes", "steps"}
    assert (tmp_path / "budget.png").read_bytes()[:4] == b"\x89PNG"
    assert "Validation curves (transformer-align against rnn-bahdanau)" in (tmp_path / "budget.md").read_text()
    # rescore_aer.py: the AER column scored again from the kept snapshots, the old figures kept with the reason
    scored = [row["aer"] for row in record["archs"]["transformer-align"]["budgets"]]
    record["archs"]["transformer-align"]["budgets"][0]["aer"] = 0.99  # as if first read from the wrong attention
    out.write_text(json.dumps(record))
    script("rescore_aer.py", "--record", str(out), "--runs", str(out.with_suffix("")), "--data-dir", str(data),
           "--src", "en", "--tgt", "de", "--archs", "transformer-align", "--reason", "a test.", cwd=tmp_path)
    rescored = check_record(out, "budget")
    assert [row["aer"] for row in rescored["archs"]["transformer-align"]["budgets"]] == scored
    assert rescored["aer_rescored"][0]["before"] == {"transformer-align": [0.99, *scored[1:]]}
    assert "AER re-scored" in (tmp_path / "budget.md").read_text()
    transformer = Path(record["archs"]["transformer-align"]["run"])
    (transformer / "summary.json").unlink()  # as if killed after its last checkpoint
    steps = record["archs"]["transformer-align"]["steps"]
    again = script("bench_budget.py", *[f if f != "0.05" else "0.07" for f in flags], "--", *tiny, cwd=tmp_path)
    assert "[transformer-align]" in again.stderr and "--resume" in again.stderr and "[rnn-bahdanau]" not in again.stderr
    assert check_record(out, "budget")["archs"]["transformer-align"]["steps"] > steps


def test_wordalign_benchmark_scores_both_aligners_on_the_gold_pairs_with_their_cost(data, tmp_path):
    pytest.importorskip("eflomal")
    out = tmp_path / "wordalign.json"
    gold = tmp_path / "gold.align"  # the first two val pairs: their first words aligned
    gold.write_text("0-0\n0-0\n")
    small = ["--d-model", "32", "--heads", "2", "--ff-size", "64", "--layers", "1", "--vocab-size", "60",
             "--eval-every", "0", "--lr", "1e-2", "--max-steps", "110"]  # stops by steps, past the 100-update floor
    script("bench_wordalign.py", "--data-dir", str(data), "--src", "en", "--tgt", "de", "--gold", str(gold),
           "--minutes", "2", "--out", str(out), "--", *small, cwd=tmp_path)
    record = check_record(out, "wordalign")
    assert record["gold_pairs"] == 2 and record["corpus_pairs"] == 202  # 200 training pairs, then the gold's
    assert set(record["aligners"]) == {"eflomal", "model (agreement)", "model (forward only)"}
    for name, scores in record["aligners"].items():
        assert 0 <= scores["aer"] <= 1 and 0 <= scores["recall"] <= 1
        assert name == "model (forward only)" or scores["seconds"] > 0 and scores["peak_rss_mb"] > 50
    assert len((out.with_suffix("") / "model.talp").read_text().splitlines()) == 202
    assert "| eflomal |" in out.with_suffix(".md").read_text()


def test_first_start_benchmark_times_the_command_a_user_types(tmp_path):
    out = tmp_path / "first.json"  # eager only: a real compile takes half a minute (the record's runs do it)
    script("bench_first_start.py", "--checkpoint", str(ROOT / "tests/data/pre-tiers/transformer.pt"), "--toy",
           "--sentences", "3", "--modes", "eager", "--out", str(out), cwd=tmp_path)
    record = check_record(out, "first_start")
    (result,) = record["checkpoints"].values()
    assert record["sentences"] == 3 and 0 < result["eager"]["first_line_s"] <= result["eager"]["last_line_s"]
    assert "| eager |" in out.with_suffix(".md").read_text()


def test_finetune_benchmark_tunes_a_base_and_scores_both_domains(data, tmp_path):
    out = tmp_path / "finetune.json"
    script("bench_finetune.py", "--data-dir", str(data), "--src", "en", "--tgt", "de", "--test-split", "test",
           "--tune-data", "val", "--tune-sentences", "4", "--base-minutes", "1", "--tune-minutes", "1",
           "--device", "cpu", "--out", str(out), "--", *TINY_MODEL, "--vocab-size", "60", cwd=tmp_path)
    record = check_record(out, "finetune")
    assert set(record["scores"]) == {"base", "tuned"} and record["held_out"] == 4  # val: 8 pairs, 4 tuned on
    assert set(record["scores"]["tuned"]) == {"domain", "original"}
    tuned = torch.load(out.with_suffix("") / "tuned" / "last.pt", weights_only=True)["config"]
    assert tuned["train"]["init_from"] == str(out.with_suffix("") / "base" / "best.pt")
    assert "| tuned |" in out.with_suffix(".md").read_text()


def test_subword_benchmark_trains_each_alpha_on_one_tokenizer(data, tmp_path):
    out = tmp_path / "subword.json"
    script("bench_subword.py", "--data-dir", str(data), "--src", "en", "--tgt", "de", "--test-split", "test",
           "--archs", "transformer", "--alphas", "0", "0.2", "--minutes", "1", "--device", "cpu", "--out", str(out),
           "--", *TINY_MODEL, "--vocab-size", "60", cwd=tmp_path)
    record = check_record(out, "subword")
    assert [(r["arch"], r["alpha"], r["steps"]) for r in record["runs"]] == [("transformer", 0.0, 3),
                                                                          ("transformer", 0.2, 3)]
    runs = out.with_suffix("")
    alphas = [torch.load(runs / f"transformer-alpha{a}" / "last.pt", weights_only=True)["config"]["data"]
              ["subword_alpha"] for a in ("0", "0.2")]
    assert alphas == [0.0, 0.2]
    assert (runs / "transformer-alpha0" / "spm.model").read_bytes() == (runs / "transformer-alpha0.2" /
                                                                        "spm.model").read_bytes()


def test_gpu_profile_times_decoding_and_training_per_precision_and_backend(data, tmp_path):
    """On a CPU the same code runs (a smoke test); the profile is taken only for a case at half fp32's rate (bf16
    on a CPU without bf16 instructions: one profiled step, as reading a profile's events takes seconds a step)."""
    run = tiny_run(data, tmp_path)
    out = tmp_path / "profile.json"
    script("gpu_profile.py", "--checkpoint", str(run / "best.pt"), "--data-dir", str(data), "--src", "en", "--tgt",
           "de", "--test-split", "test", "--device", "cpu", "--sentences", "4", "--train-steps", "2",
           "--warmup-steps", "1", "--profile-steps", "1", "--precisions", "fp32", "bf16", "--backends", "default",
           "math", "--out", str(out), "--work", str(tmp_path / "work"), cwd=tmp_path)
    record = check_record(out, "gpu-profile")
    for profile in record.get("train_profile", {}).values():  # where bf16 trained at under half fp32's rate
        assert profile["by_cpu"] and all(row["calls"] > 0 for row in profile["by_cpu"])
    assert set(record["decode"]) == set(record["train"]) == {"fp32 default", "fp32 math", "bf16 default", "bf16 math"}
    assert record["decode"]["fp32 math"]["same_as_first_config"] == 1.0  # the backends do not differ on a CPU
    assert all(r["tgt_tokens_per_s"] > 0 for r in record["train"].values()) and record["finished"]
    assert not (tmp_path / "work").exists()


def test_constraints_benchmark_forces_the_rarest_reference_words_and_times_both_searches(data, tmp_path):
    run = tiny_run(data, tmp_path)
    out = tmp_path / "constraints.json"
    script("bench_constraints.py", "--checkpoint", str(run), "--data-dir", str(data), "--src", "en", "--tgt", "de",
           "--split", "test", "--sentences", "6", "--repeats", "1", "--out", str(out), cwd=tmp_path)
    record = check_record(out, "constraints")
    [result] = record["checkpoints"].values()
    assert result["constrained"]["terms_met"] == 1.0 and len(record["terms"]) == 6
    assert all(len(terms) <= 1 for terms in record["terms"]) and "| cost |" in out.with_suffix(".md").read_text()


def test_alignment_benchmark_scores_eflomal_and_each_variants_attention_on_the_gold(data, tmp_path):
    pytest.importorskip("eflomal")
    val = (data / "val.en").read_text(encoding="utf-8").splitlines()[:3]
    gold = tmp_path / "gold.align"
    gold.write_text("0-0\n" * len(val), encoding="utf-8")  # the first words of each pair are linked
    out = tmp_path / "alignment.json"
    script("bench_alignment.py", "--data-dir", str(data), "--src", "en", "--tgt", "de", "--test-split", "test",
           "--gold", str(gold), "--minutes", "0.1", "--variants", "transformer", "transformer-align",
           "--adapt-steps", "2", "--runs", str(tmp_path / "runs"), "--out", str(out), "--", "--vocab-size", "60",
           *TINY_MODEL, cwd=tmp_path)
    record = check_record(out, "alignment")
    assert all(r["adapted"]["steps"] == 2 and 0 <= r["adapted"]["aer"] <= 1 for r in record["runs"].values())
    assert "AER (adapted, 2 updates)" in out.with_suffix(".md").read_text()
    assert record["gold_pairs"] == 3 and 0 <= record["eflomal"]["aer"] <= 1
    guided = record["runs"]["transformer-align"]
    assert guided["default"]["heads"] == [0] and record["runs"]["transformer"]["default"]["heads"] == "mean"
    assert set(guided["methods"]) == {"argmax", "threshold", "soft", "grow", "probability", "grow 0"}
    assert {"layer 0, mean", "layer 0, head 1", "layer all, mean"} <= set(guided["aer"])
    assert out.with_suffix(".png").is_file() and "| eflomal" in out.with_suffix(".md").read_text()


def test_fairness_benchmark_trains_both_corpora_probes_and_records(data, tmp_path):
    gendered = tmp_path / "gendered"
    gendered.mkdir()
    for path in data.iterdir():
        extra = {"en": "a man sings\na woman is here\n", "de": "ein Mann singt\neine Frau ist hier\n"}[path.suffix[1:]]
        gendered.joinpath(path.name).write_text(path.read_text(encoding="utf-8") + extra * 3, encoding="utf-8")
    out = tmp_path / "fairness.json"
    script("bench_fairness.py", "--data-dir", str(gendered), "--test-split", "test", "--minutes", "1", "--presets",
           "transformer", "--seeds", "1", "--probe-sentences", "3", "--evidence-sentences", "1", "--beam-size", "1",
           "--runs", str(tmp_path / "runs"), "--out", str(out), "--", "--vocab-size", "60", *TINY_MODEL, cwd=tmp_path)
    record = check_record(out, "fairness")
    assert [(r["corpus"], r["updates"]) for r in record["runs"]] == [("base", 3), ("cda", 3)]
    assert record["cda"]["added"] == 6 and record["probed_sentences"] == 3
    assert all(r["probe"]["occupations acc"] is not None for r in record["runs"])
    assert "| transformer | cda |" in out.with_suffix(".md").read_text()
    assert str(tmp_path) not in out.read_text()  # paths as placeholders


def test_ab_speed_measures_each_tree_interleaved_and_refuses_a_tree_it_does_not_import(tmp_path):
    out = tmp_path / "ab.json"
    script("ab_speed.py", "--tree", f"a={ROOT}", "--tree", f"b={ROOT}", "--rounds", "1", "--sentences", "8",
           "--batch1-sentences", "2", "--train-steps", "0", "--out", str(out), cwd=tmp_path)  # decoding only
    record = check_record(out, "ab-speed")
    assert [len(record["per_round"][name]) for name in "ab"] == [1, 1]
    assert record["median"]["a"].keys() == record["median"]["b"].keys() >= {"rnn beam 5, batch 1 sentences/s",
                                                                           "transformer sampling sentences/s"}
    assert "| transformer greedy sentences/s |" in out.with_suffix(".md").read_text()
    empty = tmp_path / "empty"
    empty.mkdir()
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "ab_speed.py"), "--tree", f"x={empty}",
                           "--rounds", "1", "--out", str(tmp_path / "x.json")], capture_output=True, text=True,
                          cwd=tmp_path)
    assert proc.returncode != 0 and "not from the tree" in proc.stderr


def test_ab_outputs_compares_every_mode_of_two_trees(tmp_path, monkeypatch):
    out = tmp_path / "ab.json"
    script("ab_outputs.py", "--tree", f"a={ROOT}", "--tree", f"b={ROOT}", "--sentences", "4", "--out", str(out),
           cwd=tmp_path)
    record = check_record(out, "ab-outputs")
    assert {"transformer beam 5", "rnn constraints", "ensemble sampling"} <= set(record["modes"])
    assert all(m["same"] and m["outputs"] >= 4 for m in record["modes"].values())
    import ab_outputs  # a tree whose outputs differ: named, and the exit status says so

    monkeypatch.setattr(ab_outputs, "decode", lambda tree, n: {"rnn greedy": [["x", -1.0]] if "a" in str(tree)
                                                                else [["y", -1.0]]})
    assert ab_outputs.main(["--tree", "a=/a", "--tree", "b=/b", "--out", str(tmp_path / "x.json")]) == 1
    assert json.loads((tmp_path / "x.json").read_text())["modes"]["rnn greedy"]["first_differences"] == [
        [["x", -1.0], ["y", -1.0]]]


def test_beam_stop_benchmark_scores_each_rule_against_greedy(tmp_path):
    test = toy_corpus(n_train=10, n_valid=10, n_test=12, seed=4)["test"]
    (tmp_path / "src.txt").write_text("\n".join(test["src"]) + "\n", encoding="utf-8")
    (tmp_path / "ref.txt").write_text("\n".join(test["tgt"]) + "\n", encoding="utf-8")
    out = tmp_path / "stop.json"
    script("bench_beam_stop.py", "--checkpoint", str(ROOT / "tests/data/pre-tiers/rnn.pt"), "--source", "src.txt",
           "--reference", "ref.txt", "--rounds", "2", "--batch1-sentences", "3", "--out", str(out), cwd=tmp_path)
    record = check_record(out, "beam-stop")
    assert set(record["results"]) == {"greedy", "exact", "likely"} and len(record["per_round"]["exact wide"]) == 2
    exact, likely = record["results"]["exact"], record["results"]["likely"]
    assert exact["model_score"] >= likely["model_score"] - 1e-3  # the exact rule finds at least as good outputs
    assert exact["sentences/s batch 1"] > 0 and "| likely |" in out.with_suffix(".md").read_text()


def test_rnn_step_benchmark_times_the_step_eager_and_compiled(tmp_path):
    """Smoke run of bench_rnn_step.py with Dynamo's "eager" backend (no code generated: the same logits)."""
    out = tmp_path / "rnn-step.json"
    script("bench_rnn_step.py", "--vocab-size", "100", "--source-length", "5", "--rows", "1", "3", "--steps", "4",
           "--rounds", "1", "--backend", "eager", "--out", str(out), cwd=tmp_path)
    record = check_record(out, "rnn-step")
    assert [r["rows"] for r in record["results"]] == [1, 3] and record["backend"] == "eager"
    assert all(r["max_logit_difference"] == 0 and r["eager_ms_per_step"] > 0 for r in record["results"])
    assert "| 3 |" in (tmp_path / "rnn-step.md").read_text()


def test_aoti_step_benchmark_compiles_the_step_into_a_package_that_decodes_like_the_eager_step(tmp_path):
    """Smoke run of bench_aoti_step.py: one decoder layer, no Inductor options, torch.compile's "eager" backend;
    the AOTInductor package is compiled for real (a C++ compiler is needed) and its logits match eager ones.
    What the script patches in ``models.compiled`` for its own run is restored."""
    from seq2seq.models import compiled

    try:
        torch._inductor.cpp_builder.get_cpp_compiler()
    except Exception as exc:  # Inductor's own error when it finds none
        pytest.skip(f"no C++ compiler: {exc}")
    before = compiled.INDUCTOR_OPTIONS, compiled.BACKEND
    out = tmp_path / "aoti-step.json"
    script("bench_aoti_step.py", "--vocab-size", "100", "--source-length", "5", "--rows", "3", "--steps", "4",
           "--rounds", "1", "--layers", "1", "--options", "plain", "--backend", "eager", "--out", str(out),
           cwd=tmp_path)  # one row count: each compiles a package (~15 s)
    assert (compiled.INDUCTOR_OPTIONS, compiled.BACKEND) == before
    record = check_record(out, "aoti-step")
    assert [r["rows"] for r in record["results"]] == [3] and record["layers"] == 1
    for row in record["results"]:
        assert row["max_logit_difference"]["compiled"] == 0 and row["max_logit_difference"]["aoti"] < 1e-4
        assert row["aoti_load_s"] < row["aoti_compile_s"] and row["package_mb"] > 0
    assert "| 3 |" in out.with_suffix(".md").read_text()


def test_adapt_benchmark_scores_each_adaptation_forward_and_by_agreement(tmp_path):
    from test_align_cli import _train_checkpoint, reversed_checkpoint

    checkpoint = run_shared.built_once("align-cli-transformer", _train_checkpoint) / "run" / "best.pt"
    corpus = toy_corpus(n_train=10, n_valid=4, n_test=2, seed=5)
    for column, lang in (("src", "en"), ("tgt", "de")):
        (tmp_path / f"val.{lang}").write_text("\n".join(corpus["validation"][column]) + "\n", encoding="utf-8")
    gold = tmp_path / "gold.align"
    gold.write_text("0-0\n" * 4, encoding="utf-8")
    out = tmp_path / "adapt.json"
    script("bench_adapt.py", "--checkpoint", str(checkpoint), "--backward-checkpoint",
           str(reversed_checkpoint(checkpoint, tmp_path / "backward.pt")), "--data-dir", str(tmp_path), "--src", "en",
           "--tgt", "de", "--gold", str(gold), "--steps", "0", "2", "--lr", "1e-3", "3e-3", "--adapt-pairs", "0", "3",
           "--out", str(out), cwd=tmp_path)
    record = check_record(out, "adapt")
    assert [(r["steps"], r["lr"], r["adapt_pairs"]) for r in record["results"]] == [
        (0, 1e-3, 0), (2, 1e-3, 0), (2, 1e-3, 3), (2, 3e-3, 0), (2, 3e-3, 3)]
    for result in record["results"]:
        assert 0 <= result["forward"]["aer"] <= 1 and 0 <= result["agreement"]["aer"] <= 1
        assert result["forward"]["sentences"] == 4  # in chunks of 3: the second chunk's pair scored too
    table = out.with_suffix(".md").read_text()
    assert "| 2 | 0.003 | 4 |" in table and "| 2 | 0.003 | 3 |" in table
