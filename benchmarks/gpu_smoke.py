"""GPU smoke test, sized for one short job on a machine with one CUDA GPU, from the repository root:

    python benchmarks/gpu_smoke.py [--data-dir MULTI30K] [--out FILE.json] [--budget-minutes 8]
                                   [--step-timeout 300] [--tests {cuda,suite,none}] [--quickstart-steps 300]
                                   [--archs rnn transformer] [--precisions fp32 bf16] [--minutes 1]
                                   [--resume-steps 100] [--sentences 200] [--attribution-sentences 3]
                                   [--runs DIR] [--dry-run]

The default plan, about 7 minutes on one H100 (425 s on 2026-11-26, record
``bench-results/gpu-smoke-2026-11-26-h100``), cut at ``--budget-minutes`` (8), the last steps first:

1. ``tests/test_cuda.py`` with CUDA visible (tiny models: fp16/bf16 training, resume, decoding and
   attribution against the CPU) and the CPU tests of the GPU paths (``test_gpu_path.py``,
   ``test_gpu_switches.py``: with CUDA visible they show what assumed a CPU), about 45 s;
   ``--tests suite`` runs the whole suite instead (raise ``--step-timeout`` and ``--budget-minutes``
   for it), ``--tests none`` neither;
2. the matmul peak: an 8192-cube product in fp32 (TF32 off), bf16 and fp16, ``--peak-seconds`` (1) each;
3. the quickstart (``seq2seq train``, the toy corpus) on CUDA for ``--quickstart-steps`` steps
   (``--max-steps``; 0 leaves it out), about 30 s;
4. ``--precision int8`` on CUDA with the quickstart's checkpoint (without the quickstart: the first
   Multi30k run's, right after it): refused with a clear message (exit 2), a few seconds;
5. one SentencePiece model for every Multi30k run (``common.shared_tokenizer``: a one-step Transformer
   run), so that no run spends its minute on it, about 30 s;
6. a ``--minutes`` (1) Multi30k run of each of ``--archs`` (the RNN with Bahdanau attention and the
   Transformer presets) in each of ``--precisions`` (fp32 and bf16 autocast; fp16 allowed), about
   75 s each with start-up and the last validation: training target tokens/s, validation BLEU, peak
   GPU memory (``summary.json``), and model TFLOP/s (FLOPs per target token of one fp32 step of the
   architecture, counted once with ``torch.utils.flop_counter``, x tokens/s) with their share of the
   matmul peak in the run's precision (``--no-flops`` leaves the count out);
7. resume of the Transformer fp32 run (``--resume --max-steps`` its step + ``--resume-steps``, 100; the
   run's own one-minute limit lifted with ``--max-minutes 0``), right after that run: "ok" only when
   ``last.pt``'s ``progress.step`` grew by exactly ``--resume-steps`` and every loss that
   ``metrics.jsonl`` logged after the old step is finite, about 20 s;
8. decoding of ``--sentences`` (200; 0 leaves it out) test sentences with each architecture's fp32
   checkpoint: greedy, beam 5, beam 5 + shortlist, fp16 and bf16 on CUDA against greedy / beam 5 on
   CPU of the same checkpoint (sentences/s, BLEU, share of outputs identical to the CPU's), ~15 s each;
9. attribution (gradient, integrated gradients, occlusion) of ``--attribution-sentences`` (3; 0 leaves
   it out) test sentences on CUDA against the CPU, ~10 s each.

Each step runs at most ``--step-timeout`` seconds (300) and at most what is left of
``--budget-minutes``; a step that no longer fits (a training run needs ``--minutes`` + 15 s) is
skipped and recorded as "skipped (budget)". The record (JSON at ``--out``, default
``bench-results/gpu-smoke/gpu_smoke.json``, with its markdown table beside it) is rewritten after every
step, so a command stopped at its limit still leaves the steps it finished; ``finished`` turns true at
the end; a failed step's last 60 lines of output are printed. The runs, the shared tokenizer and the
data cache go to ``--runs`` (default ``bench-results/gpu-smoke/``), whatever ``--out`` says, so that an
``--out`` in the folder that comes back from a GPU machine gets no checkpoints. ``--dry-run`` prints the
plan and exits (no GPU needed).

On the lent GPU machine (``../shared/gpu/README.md``: prepare ``.whl`` and ``.gpu`` on the CPU first
and send them along; the wrapper sets ``SEQ2SEQ_MULTI30K`` and ``$OUT`` is the folder whose files come
back), one command with a limit of about 540 s (the budget, the wrapper's set-up and the last step):

    bash .gpu/on-device.sh python3 benchmarks/gpu_smoke.py --data-dir .gpu/multi30k \\
        --out $OUT/gpu_smoke.json 2>&1 | tee $OUT/gpu_smoke.log

(``python3``, as the wrapper itself calls it). ``$OUT`` then holds ``gpu_smoke.json``, ``gpu_smoke.md``,
the log and the wrapper's ``setup.log``.

Expected: every step "ok" and exit status 0 (1 when a step failed or was skipped for the budget);
identical outputs near 100 % for fp32 (a near-tie may flip), above 90 % for fp16/bf16; attribution
within a relative 1e-2. docs/guides/gpu.md explains which differences are expected between CPU and GPU.
"""
from __future__ import annotations

import argparse
import json
import math
import shutil
import signal
import subprocess
import sys
import threading
import time
import traceback
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from bench import matmul_peak
from common import (ROOT, add_multi30k_flags, copy_tokenizer, preset_command, provenance, shared_tokenizer,
                    step_flops_per_target_token, write_record)
from seq2seq.checkpoint.file import load_checkpoint
from seq2seq.io_utils import markdown_table

SYSTEMS = {"rnn": "rnn-bahdanau", "transformer": "transformer"}
PRECISIONS = ("fp32", "fp16", "bf16")
TRAIN_START_S = 15  # a training run's start-up and last validation beyond its --minutes (for the budget)
CUDA_TESTS = ("tests/test_cuda.py", "tests/test_gpu_path.py", "tests/test_gpu_switches.py")  # --tests cuda
PEAK_SHAPE = (8192, 8192, 8192)  # a square product large enough to reach a data-centre GPU's peak
PEAK_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass
class Step:
    """One step of the plan: ``action(seconds)`` does it within ``seconds`` and returns its record
    entry (``ok``: True / False / None for not applicable). It is skipped unless the budget has
    ``minimum_s`` left; ``describe`` is what ``--dry-run`` prints."""

    name: str
    action: Callable[[float], dict]
    describe: str = ""
    minimum_s: float = 1.0


class StepTimeout(Exception):
    """An in-process step ran past its time limit."""


@contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Raise ``StepTimeout`` in the main thread after ``seconds`` (a child process that
    ``subprocess.run`` waits on is then killed); no limit elsewhere."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        yield
        return

    def expire(signum, frame):
        raise StepTimeout(f"timed out after {seconds:.0f} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.01))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def run(command: list[str], timeout: float) -> tuple[int, float, str]:
    """Exit status (124: timed out), seconds, and the output (stdout and stderr interleaved) of
    ``command`` run from the repository root."""
    start = time.perf_counter()
    try:
        proc = subprocess.run(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)
        code, text = proc.returncode, proc.stdout
    except subprocess.TimeoutExpired as exc:
        partial = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else exc.stdout or ""
        code, text = 124, f"{partial}\ntimed out after {timeout:.0f} s"
    return code, time.perf_counter() - start, text


def tail(text: str, lines: int = 12) -> str:
    return "\n".join(str(text).strip().splitlines()[-lines:])


def command_step(name: str, command: list[str], check: Callable[[int, str], bool] | None = None,
                 before: Callable[[], None] | None = None, describe: str = "") -> Step:
    """A step that runs ``command``: ok when ``check(exit, output)`` (default: exit status 0)."""
    def action(timeout: float) -> dict:
        if before is not None:
            before()
        code, _, text = run(command, timeout)
        ok = check(code, text) if check is not None else code == 0
        return {"ok": ok, "exit": code, "tail": tail(text), "_output": text}

    shown = ["python", *command[1:]] if command[0] == sys.executable else command
    return Step(name, action, describe or " ".join(shown))


def python_step(name: str, function: Callable[[], dict], describe: str, minimum_s: float = 1.0) -> Step:
    """A step done in this process (under ``time_limit``)."""
    def action(timeout: float) -> dict:
        with time_limit(timeout):
            return function()

    return Step(name, action, describe, minimum_s)


# ----------------------------------------------------------------------------- resume check
def checkpoint_step(path: Path) -> int:
    """The step of the checkpoint at ``path`` (``progress.step``)."""
    return int(load_checkpoint(path)["progress"]["step"])


def check_resume(run_dir: Path, before: int, expected: int) -> dict:
    """Whether a resumed run continued: ``last.pt``'s step grew from ``before`` by exactly ``expected``,
    and ``metrics.jsonl`` holds at least one loss after ``before``, all finite."""
    after = checkpoint_step(run_dir / "last.pt")
    metrics = run_dir / "metrics.jsonl"
    records = [json.loads(line) for line in metrics.read_text(encoding="utf-8").splitlines()
               if line.strip()] if metrics.is_file() else []
    losses = [float(r["loss"]) for r in records if r.get("step", 0) > before and "loss" in r]
    finite = bool(losses) and all(math.isfinite(loss) for loss in losses)
    grew = after - before
    problems = []
    if grew != expected:
        problems.append(f"the step grew by {grew}, not {expected}")
    if not losses:
        problems.append(f"metrics.jsonl has no loss after step {before}")
    elif not finite:
        problems.append("a loss after the resume is not finite")
    note = f"step {before} -> {after}" + (f", last loss {losses[-1]:.3f}" if losses else "")
    return {"ok": not problems, "step_before": before, "step_after": after, "losses_after": losses[-5:],
            "note": note + ("" if not problems else ": " + "; ".join(problems))}


# ----------------------------------------------------------------------------- how fast the GPU can go
def measure_matmul_peaks(record: dict, seconds: float = 1.0) -> dict:
    """TFLOP/s of an 8192-cube product in fp32 (TF32 off, as fp32 training runs), bf16 and fp16 on
    CUDA, into ``record["matmul_tflop_per_s"]``: the denominators of each run's share of the peak."""
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        peaks = {name: matmul_peak(dtype, PEAK_SHAPE, seconds, "cuda") / 1000 for name, dtype in PEAK_DTYPES.items()
                 if name != "bf16" or torch.cuda.is_bf16_supported()}
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    record["matmul_tflop_per_s"] = peaks
    return {"ok": True, "note": ", ".join(f"{name} {value:.0f} TFLOP/s" for name, value in peaks.items())}


def flops_per_target_token(run_dir: Path, work: Path, device: str = "cuda") -> float:
    """Model FLOPs per target token of one fp32 training step of ``run_dir``'s config (its tokenizer,
    its data cache) on ``device``, counted in a scratch run directory ``work`` (removed afterwards)."""
    from seq2seq.cli import config_from_flags
    from seq2seq.training.corpus import prepare_run_corpus
    from seq2seq.training.trainer import Trainer

    shutil.rmtree(work, ignore_errors=True)
    copy_tokenizer(run_dir, work)
    try:
        cfg = config_from_flags(["--config", str(run_dir / "config.yaml"), "--output-dir", str(work),
                                 "--device", device, "--precision", "fp32"])
        corpus = prepare_run_corpus(cfg, work, quiet=True)
        cfg.model.vocab_size = corpus.tokenizer.vocab_size
        trainer = Trainer(cfg, corpus, quiet=True)
        batches = iter(corpus.train_batches(0))
        trainer.train_step([next(batches)])  # the first step builds the optimizer state
        return step_flops_per_target_token(trainer, next(batches))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def throughput_entry(record: dict, arch: str, precision: str, run_dir: Path, tokens_per_s: float) -> dict:
    """Model TFLOP/s of a run (its arch's FLOPs per target token, counted once, x its tokens/s) and
    its share of the GPU's measured matmul peak in its precision."""
    counted = record.setdefault("flops_per_tgt_token", {})
    if arch not in counted:
        counted[arch] = flops_per_target_token(run_dir, run_dir.parent / f"flops-{arch}")
    tflops = counted[arch] * tokens_per_s / 1e12
    entry = {"model_tflop_s": round(tflops, 2)}
    peak = record.get("matmul_tflop_per_s", {}).get(precision)
    if peak:
        entry["of_peak"] = round(tflops / peak, 4)
    return entry


# ----------------------------------------------------------------------------- CUDA against CPU
def decode_against_cpu(run_dir: Path, args: argparse.Namespace) -> dict:
    """Test-split decoding on CUDA in several modes against CPU decoding of the same checkpoint."""
    from seq2seq.decoding.translator import Translator
    from seq2seq.metrics import corpus_scores

    sources = (args.data_dir / f"{args.test_split}.{args.src}").read_text(encoding="utf-8").splitlines()
    references = (args.data_dir / f"{args.test_split}.{args.tgt}").read_text(encoding="utf-8").splitlines()
    sources, references = sources[: args.sentences], references[: args.sentences]
    checkpoint = run_dir / "best.pt"
    cpu = Translator.from_checkpoint(checkpoint, device="cpu")
    modes = {"greedy": ("fp32", 1, None), "beam5": ("fp32", 5, None), "beam5_shortlist": ("fp32", 5, "auto"),
             "beam5_fp16": ("fp16", 5, None)}
    if torch.cuda.is_bf16_supported():
        modes["beam5_bf16"] = ("bf16", 5, None)
    results, cpu_outputs = {}, {}
    for beam in (1, 5):
        start = time.perf_counter()
        texts = [t.text for t in cpu.translate(sources, beam_size=beam, need_attention=False)]
        cpu_outputs[beam] = texts
        results[f"cpu_{'greedy' if beam == 1 else 'beam5'}"] = {
            "sentences_per_s": len(sources) / (time.perf_counter() - start),
            "bleu": corpus_scores(texts, references, ("bleu",))["bleu"].score}
    for label, (precision, beam, shortlist) in modes.items():
        gpu = Translator.from_checkpoint(checkpoint, device="cuda", precision=precision, shortlist=shortlist)
        gpu.translate(sources[:32], beam_size=beam, need_attention=False)  # warm-up (kernels, caches)
        torch.cuda.synchronize()
        start = time.perf_counter()
        texts = [t.text for t in gpu.translate(sources, beam_size=beam, need_attention=False)]
        seconds = time.perf_counter() - start
        same = sum(a == b for a, b in zip(texts, cpu_outputs[beam]))
        results[label] = {"sentences_per_s": len(sources) / seconds,
                          "bleu": corpus_scores(texts, references, ("bleu",))["bleu"].score,
                          "same_as_cpu": same / len(sources)}
    return results


def attribution_against_cpu(run_dir: Path, sentences: list[str]) -> dict:
    import numpy as np

    from seq2seq.attribution.attribute import attribute_translation
    from seq2seq.decoding.translator import Translator

    cpu = Translator.from_checkpoint(run_dir / "best.pt", device="cpu")
    gpu = Translator.from_checkpoint(run_dir / "best.pt", device="cuda")
    worst = {}
    for translation in cpu.translate(sentences, beam_size=1):
        for method in ("gradient", "integrated-gradients", "occlusion"):
            a = attribute_translation(cpu, translation, method).raw
            b = attribute_translation(gpu, translation, method).raw
            error = float(np.abs(a - b).max() / max(np.abs(a).max(), 1e-9))
            worst[method] = max(worst.get(method, 0.0), error)
    return {"max_relative_difference": worst, "ok": all(v < 1e-2 for v in worst.values()),
            "note": ", ".join(f"{method} {error:.1e}" for method, error in worst.items())}


# ----------------------------------------------------------------------------- the plan
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_multi30k_flags(parser)
    parser.add_argument("--out", type=Path, default=ROOT / "bench-results" / "gpu-smoke" / "gpu_smoke.json",
                        help="the record (JSON; its markdown table beside it), rewritten after every step")
    parser.add_argument("--runs", type=Path, default=ROOT / "bench-results" / "gpu-smoke",
                        help="where the runs, the shared tokenizer and the data cache go")
    parser.add_argument("--budget-minutes", type=float, default=8.0,
                        help="steps that no longer fit are skipped, 'skipped (budget)' (default: 8)")
    parser.add_argument("--step-timeout", type=float, default=300.0, help="seconds each step may run (default: 300)")
    parser.add_argument("--tests", choices=("cuda", "suite", "none"), default="cuda",
                        help="tests/test_cuda.py (default), the whole suite, or no tests")
    parser.add_argument("--quickstart-steps", type=int, default=300,
                        help="steps of the quickstart (--max-steps; default: 300; 0 leaves it out)")
    parser.add_argument("--archs", nargs="+", choices=list(SYSTEMS), default=list(SYSTEMS),
                        help="architectures of the Multi30k runs (default: rnn transformer)")
    parser.add_argument("--precisions", nargs="+", choices=PRECISIONS, default=["fp32", "bf16"],
                        help="precisions of the Multi30k runs (default: fp32 bf16)")
    parser.add_argument("--minutes", type=float, default=1.0, help="training budget of each Multi30k run (default: 1)")
    parser.add_argument("--resume-steps", type=int, default=100,
                        help="steps the resumed Transformer run must add (default: 100; 0 leaves it out)")
    parser.add_argument("--sentences", type=int, default=200,
                        help="test sentences decoded on CUDA and CPU (default: 200; 0 leaves it out)")
    parser.add_argument("--attribution-sentences", type=int, default=3,
                        help="test sentences attributed on CUDA and CPU (default: 3; 0 leaves it out)")
    parser.add_argument("--peak-seconds", type=float, default=1.0,
                        help="seconds of each matmul-peak measurement (default: 1; 0 leaves it out)")
    parser.add_argument("--no-flops", dest="count_flops", action="store_false",
                        help="do not count each architecture's model FLOPs per token (a few seconds each)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--dry-run", action="store_true", help="print the plan and exit (no GPU needed)")
    args = parser.parse_args(argv)
    args.precisions = list(dict.fromkeys(args.precisions))
    args.archs = list(dict.fromkeys(args.archs))
    args.data_dir, args.out, args.runs = args.data_dir.resolve(), args.out.resolve(), args.runs.resolve()
    args.device = "cuda"  # for common.preset_command / shared_tokenizer
    args.extra = ["--cache-dir", str(args.runs / "cache")]  # one data cache for every run
    return args


def build_plan(args: argparse.Namespace, record: dict) -> list[Step]:
    """The steps that ``args`` ask for, in order (see the module docstring); ``record["decode"]``
    receives the decoding results."""
    py, runs = sys.executable, args.runs
    plan: list[Step] = []
    if args.tests != "none":
        target = list(CUDA_TESTS) if args.tests == "cuda" else []
        plan.append(command_step("tests/test_cuda.py" if target else "test suite",
                                 [py, "-m", "pytest", "-q", "-p", "no:cacheprovider", *target]))
    if args.peak_seconds:
        plan.append(python_step("matmul peak", lambda: measure_matmul_peaks(record, args.peak_seconds),
                                f"{'x'.join(map(str, PEAK_SHAPE))} products in fp32 (TF32 off), bf16 and fp16, "
                                f"{args.peak_seconds:g} s each"))
    train_dirs = {(arch, precision): runs / f"{arch}-{precision}" for precision in args.precisions
                  for arch in args.archs}
    int8_checkpoint = runs / "quickstart" if args.quickstart_steps else next(iter(train_dirs.values()), None)
    int8 = command_step("int8 refused on cuda",
                        [py, "-m", "seq2seq", "translate", "--checkpoint", str(int8_checkpoint), "--device",
                         "cuda", "--precision", "int8"],
                        check=lambda code, text: code == 2 and "int8 runs on CPU only" in text)
    if args.quickstart_steps:
        plan.append(command_step("quickstart", [py, "-m", "seq2seq", "train", "--device", "cuda", "--quiet",
                                                "--max-steps", str(args.quickstart_steps), "--output-dir",
                                                str(runs / "quickstart"), *args.extra],
                                 before=lambda: shutil.rmtree(runs / "quickstart", ignore_errors=True)))
        plan.append(int8)
    if not train_dirs:
        return plan
    spm = runs / "tokenizer"
    plan.append(python_step("tokenizer", lambda: {"ok": (shared_tokenizer(args, spm) / "spm.model").is_file()},
                            f"common.shared_tokenizer into {spm} (a one-step transformer run; reused if there)"))
    resumed = ("transformer", "fp32") if ("transformer", "fp32") in train_dirs else None
    for (arch, precision), run_dir in train_dirs.items():
        plan.append(train_step(args, record, arch, precision, run_dir, spm))
        if not any(step is int8 for step in plan):
            plan.append(int8)  # without the quickstart: on the first Multi30k run's checkpoint
        if (arch, precision) == resumed and args.resume_steps:
            plan.append(resume_step(args, f"resume {arch} {precision}", run_dir))
    checked = {arch: train_dirs[(arch, "fp32" if "fp32" in args.precisions else args.precisions[0])]
               for arch in args.archs}
    for arch, run_dir in checked.items() if args.sentences else ():
        plan.append(python_step(f"decode {arch}", lambda d=run_dir, a=arch: decode_step(args, record, a, d),
                                f"{args.sentences} test sentences, {run_dir.name}/best.pt on CUDA against CPU"))
    for arch, run_dir in checked.items() if args.attribution_sentences else ():
        plan.append(python_step(f"attribution {arch}", lambda d=run_dir: attribution_against_cpu(
            d, read_sources(args)[: args.attribution_sentences]),
            f"{args.attribution_sentences} test sentences, {run_dir.name}/best.pt on CUDA against CPU"))
    return plan


def read_sources(args: argparse.Namespace) -> list[str]:
    return (args.data_dir / f"{args.test_split}.{args.src}").read_text(encoding="utf-8").splitlines()


def train_step(args: argparse.Namespace, record: dict, arch: str, precision: str, run_dir: Path, spm: Path) -> Step:
    """A ``--minutes`` Multi30k run of ``arch``'s preset in ``precision`` with the shared tokenizer:
    target tokens/s, validation BLEU, peak GPU memory, model TFLOP/s and their share of the peak."""
    label = f"train {arch} {precision}"
    flags = ["--precision", precision, "--max-minutes", str(args.minutes), "--eval-every", "200"]

    def action(timeout: float) -> dict:
        if precision == "bf16" and not torch.cuda.is_bf16_supported():
            return {"ok": None, "result": "skipped (no bf16 on this GPU)"}
        shutil.rmtree(run_dir, ignore_errors=True)
        copy_tokenizer(spm, run_dir)
        code, _, text = run(preset_command(label, SYSTEMS[arch], args, run_dir, *flags), timeout)
        entry: dict[str, Any] = {"ok": code == 0, "exit": code, "tail": tail(text), "_output": text}
        summary_path = run_dir / "summary.json"
        if summary_path.is_file():
            summary = json.loads(summary_path.read_text())
            entry.update(tok_s=round(summary["train_tgt_tokens_per_s"]), valid_bleu=summary["best_valid_bleu"],
                         steps=summary["steps"], peak_mb=summary.get("peak_cuda_memory_mb"),
                         note=f"{summary['steps']} steps")
            if code == 0 and args.count_flops:
                try:
                    entry.update(throughput_entry(record, arch, precision, run_dir, summary["train_tgt_tokens_per_s"]))
                except Exception as exc:  # noqa: BLE001 - the run itself succeeded; say why the count failed
                    entry["note"] += f"; FLOP count failed: {type(exc).__name__}: {exc}"[:300]
        return entry

    return Step(label, action, f"seq2seq train --preset {SYSTEMS[arch]} {' '.join(flags)} into {run_dir.name}",
                minimum_s=args.minutes * 60 + TRAIN_START_S)


def resume_step(args: argparse.Namespace, name: str, run_dir: Path) -> Step:
    """``--resume`` of ``run_dir`` for ``--resume-steps`` more steps, checked by ``check_resume``."""
    def action(timeout: float) -> dict:
        before = checkpoint_step(run_dir / "last.pt")
        command = [sys.executable, "-m", "seq2seq", "train", "--output-dir", str(run_dir), "--resume", "--max-steps",
                   str(before + args.resume_steps), "--max-minutes", "0", "--quiet", "--no-final-test"]
        code, _, text = run(command, timeout)
        entry = {"exit": code, "tail": tail(text), "_output": text, **check_resume(run_dir, before, args.resume_steps)}
        entry["ok"] = code == 0 and entry["ok"]
        return entry

    return Step(name, action, f"seq2seq train --output-dir {run_dir.name} --resume --max-steps STEP+"
                              f"{args.resume_steps} --max-minutes 0; last.pt's step must grow by {args.resume_steps}")


def decode_step(args: argparse.Namespace, record: dict, arch: str, run_dir: Path) -> dict:
    results = record.setdefault("decode", {})[arch] = decode_against_cpu(run_dir, args)
    same = {mode: r["same_as_cpu"] for mode, r in results.items() if "same_as_cpu" in r}
    return {"ok": True, "same_as_cpu": same, "checkpoint": f"{run_dir.name}/best.pt",
            "note": "same as CPU: " + ", ".join(f"{mode} {share:.1%}" for mode, share in same.items())}


# ----------------------------------------------------------------------------- running it
def save(record: dict, path: Path) -> None:
    write_record(path, record, smoke_table(record))


def execute(plan: list[Step], record: dict, args: argparse.Namespace,
            clock: Callable[[], float] = time.monotonic, start: float | None = None) -> dict:
    """Run ``plan`` within ``args.budget_minutes`` (from ``start``), each step within
    ``args.step_timeout``; the record is written before the first step and after every step."""
    start = clock() if start is None else start
    budget = args.budget_minutes * 60
    record.setdefault("steps", {})
    record.update(plan=[step.name for step in plan], budget_s=budget, finished=False)
    save(record, args.out)
    for step in plan:
        left = budget - (clock() - start)
        if left < step.minimum_s:
            entry = {"ok": False, "result": "skipped (budget)"}
            print(f"[{clock() - start:5.0f} s] {step.name}: skipped (budget: {left:.0f} s left)", flush=True)
        else:
            began = clock()
            try:
                entry = step.action(min(args.step_timeout, left))
            except Exception as exc:  # noqa: BLE001 - any failure is the step's result
                entry = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:2000],
                         "_output": traceback.format_exc()}
            output = entry.pop("_output", "")
            entry.setdefault("result", "ok" if entry.get("ok") else "FAILED")
            entry["seconds"] = round(clock() - began, 1)
            print(f"[{clock() - start:5.0f} s] {step.name}: {entry['result']} in {entry['seconds']:.0f} s"
                  + (f" ({entry['note']})" if entry.get("note") else ""), flush=True)
            if entry["ok"] is False and output:
                print(tail(output, 60), flush=True)
        record["steps"][step.name] = entry
        record["elapsed_s"] = round(clock() - start, 1)
        save(record, args.out)
    record["finished"] = True
    save(record, args.out)
    return record


def print_plan(plan: list[Step], args: argparse.Namespace) -> None:
    print(f"{len(plan)} steps, budget {args.budget_minutes:g} min, at most {args.step_timeout:g} s each; "
          f"record {args.out}, runs {args.runs}")
    for number, step in enumerate(plan, 1):
        print(f"{number:2}. {step.name}: {step.describe}")


def main(argv: list[str] | None = None) -> int:
    start = time.monotonic()
    args = parse_args(argv)
    record: dict[str, Any] = {"steps": {}, "decode": {}}
    plan = build_plan(args, record)
    if args.dry_run:
        print_plan(plan, args)
        return 0
    if not torch.cuda.is_available():
        print("error: no CUDA device is visible; this smoke test needs one GPU", file=sys.stderr)
        return 2
    args.runs.mkdir(parents=True, exist_ok=True)
    record.update({**provenance("gpu-smoke"), "gpu": torch.cuda.get_device_name(0),
                   "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
                   "capability": ".".join(map(str, torch.cuda.get_device_capability(0))),
                   "settings": {name: value for name, value in vars(args).items()
                                if name not in ("data_dir", "out", "runs", "extra", "dry_run")}})
    print_plan(plan, args)
    execute(plan, record, args, start=start)
    print(smoke_table(record))
    return exit_status(record)


def exit_status(record: dict) -> int:
    """0 when no step failed or was skipped for the budget (a step that does not apply, such as bf16 on
    a GPU without it, is no failure), else 1."""
    return 0 if all(s.get("ok") is not False for s in record["steps"].values()) else 1


def smoke_table(record: dict) -> str:
    lines = [f"GPU: {record['gpu']} (compute capability {record['capability']})", ""]
    steps = record["steps"]
    rows = [[name, s.get("result") or ("ok" if s.get("ok") else "FAILED"), s.get("seconds", ""), s.get("tok_s", ""),
             f"{s['valid_bleu']:.2f}" if "valid_bleu" in s else "",
             f"{s['peak_mb']:.0f}" if s.get("peak_mb") is not None else "", s.get("model_tflop_s", ""),
             f"{s['of_peak']:.1%}" if "of_peak" in s else "",
             str(s.get("note") or s.get("error", "")).splitlines()[0][:120].replace("|", "/") if (
                 s.get("note") or s.get("error")) else ""] for name, s in steps.items()]
    rows += [[name, "not reached", "", "", "", "", "", "", ""] for name in record.get("plan", []) if name not in steps]
    lines.append(markdown_table(["step", "result", "seconds", "train tgt tok/s", "valid BLEU", "peak GPU MB",
                                 "model TFLOP/s", "of matmul peak", "note"], rows))
    if record.get("matmul_tflop_per_s"):
        lines += ["", "Matmul peak (TFLOP/s, " + "x".join(map(str, PEAK_SHAPE)) + "): " + ", ".join(
            f"{name} {value:.0f}" for name, value in record["matmul_tflop_per_s"].items())
            + "; FLOPs per target token: " + ", ".join(
            f"{arch} {value / 1e6:.0f} M" for arch, value in record.get("flops_per_tgt_token", {}).items())]
    for arch, modes in record.get("decode", {}).items():
        lines += ["", f"Decoding, {arch}, test split, CUDA against CPU:", ""]
        lines.append(markdown_table(
            ["mode", "sentences/s", "BLEU", "same as CPU"],
            [[mode, f"{r['sentences_per_s']:.1f}", f"{r['bleu']:.2f}",
              f"{r['same_as_cpu']:.1%}" if "same_as_cpu" in r else "(CPU)"] for mode, r in modes.items()]))
    if "elapsed_s" in record:
        lines += ["", f"{record['elapsed_s']:.0f} s of a {record.get('budget_s', 0):.0f} s budget"
                      + ("" if record.get("finished") else "; not finished")]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
