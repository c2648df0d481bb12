"""The training loop at the GPU's speed: throughput against batch size, precision and the graphed step
for both architectures, and time to BLEU of the GPU recipe, on one CUDA GPU, from the repository root:

    python benchmarks/gpu_train.py [--data-dir MULTI30K] [--out FILE.json] [--parts tests peak throughput bleu]
        [--window 6] [--bleu-minutes 4] [--eval-minutes 0.25] [--recipe auto|KEY] [--work DIR] [--dry-run]

Parts (each writes the record, ``--out``, with its markdown table beside it, when it ends, so a command
stopped at its limit keeps what it measured):

``tests``       ``tests/test_cuda.py`` and ``tests/test_compiled_step.py`` with CUDA visible: no host sync in a
                training step (CUDA's own sync detector; fp16 one), the graphed step against the eager one.
``peak``        the matmul peak of an 8192-cube product: fp32 (TF32 off), TF32, bf16.
``throughput``  in one process, on the Multi30k training split with one tokenizer: for each configuration
                of ``CONFIGS`` (architecture, precision, ``--max-tokens``, eager or ``--compile``), a fresh
                trainer takes warm-up steps (eager 15; compiled: one epoch, i.e. every batch shape once,
                timed as the compile cost), then steps for ``--window`` seconds between two device
                synchronizations: target tokens/s (real tokens, not padding), steps/s, share of the matmul
                peak (FLOPs per target token counted once per architecture), kernel launches per step
                (profiler: cudaLaunchKernel / cudaGraphLaunch calls), host syncs per step (CUDA's sync
                detector over 5 steps), peak memory, the last loss.
``bleu``        time to BLEU: ``seq2seq train --preset transformer-gpu`` (``--bleu-preset``) with the GPU
                recipe (``--recipe auto``: the transformer configuration of ``throughput`` at the device's
                default batch that trains the most tokens in the budget, a graphed one's warm-up deducted;
                else the named one) for ``--bleu-minutes`` of wall-clock (compilation and validation
                included), validating on the full validation split every ``--eval-minutes``; the curve
                (minute, step, valid BLEU), the first minute at which validation reached 38, 39 and 40,
                test BLEU (greedy) of each validation's snapshot (the peer's measure,
                ``peers/onmt_gpu.py``) and test BLEU (beam 5) of the best checkpoint. ``cpu-recipe`` is
                the same with the ``transformer`` preset and the CPU defaults (fp32, 3,000-token batches,
                eager) for comparison.

On the lent GPU machine (``../shared/gpu/README.md``), one command of at most 9 minutes:

    bash .gpu/on-device.sh python3 benchmarks/gpu_train.py --data-dir .gpu/multi30k --out $OUT/gpu_train.json \\
        2>&1 | tee $OUT/gpu_train.log

``--dry-run`` prints the plan (no GPU needed); ``--device cpu`` runs the same code on a CPU with
``--tiny`` sizes (a rehearsal of everything but CUDA's own counters).
"""
from __future__ import annotations

import argparse
import itertools
import json
import shutil
import subprocess
import sys
import time
import traceback
import warnings
from pathlib import Path
from typing import Any

import torch

from bench import matmul_peak
from common import (
    ROOT, add_multi30k_flags, copy_tokenizer, for_arch, provenance, step_flops_per_target_token, write_record,
)
from seq2seq.io_utils import markdown_table
from seq2seq.runtime import synchronize

PRESETS = {"transformer": "transformer", "rnn": "rnn-bahdanau"}
#: (arch, precision, max_tokens, compiled); "tf32" is fp32 with TF32 matrix products
CONFIGS = [
    ("transformer", "fp32", 3000, False),  # the CPU-sized defaults, as CUDA ran them before
    ("transformer", "tf32", 12000, False),
    ("transformer", "bf16", 12000, False),
    ("transformer", "bf16", 12000, True),
    ("rnn", "fp32", 2000, False),
    ("rnn", "tf32", 8000, False),
    ("rnn", "bf16", 8000, False),
]
MORE_CONFIGS = [  # --more-configs
    ("transformer", "tf32", 12000, True),
    ("transformer", "bf16", 24000, False),
    ("transformer", "bf16", 24000, True),
    ("rnn", "tf32", 8000, True),
]
TINY_CONFIGS = [("transformer", "fp32", 400, False), ("transformer", "fp32", 400, True), ("rnn", "fp32", 400, False),
                ("rnn", "fp32", 400, True)]
LAUNCHES = ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernelEx", "cudaGraphLaunch")
THRESHOLDS = (38.0, 39.0, 40.0)


def configs(args) -> list[tuple]:
    chosen = TINY_CONFIGS if args.tiny else CONFIGS + (MORE_CONFIGS if args.more_configs else [])
    if args.configs:
        known = {key(c): c for c in CONFIGS + MORE_CONFIGS + TINY_CONFIGS}
        unknown = [k for k in args.configs if k not in known]
        if unknown:
            raise SystemExit(f"error: --configs: unknown {unknown}; known: {sorted(known)}")
        chosen = [known[k] for k in args.configs]
    return chosen


def key(config: tuple) -> str:
    arch, precision, tokens, compiled = config
    return f"{arch} {precision} {tokens} {'graphed' if compiled else 'eager'}"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_multi30k_flags(parser)
    parser.add_argument("--out", type=Path, default=ROOT / "bench-results" / "gpu-train" / "gpu_train.json")
    parser.add_argument("--work", type=Path, default=ROOT / "bench-results" / "gpu-train" / "work")
    parser.add_argument("--parts", nargs="+", default=["tests", "peak", "throughput", "bleu"],
                        choices=["tests", "peak", "throughput", "bleu", "cpu-recipe"])
    parser.add_argument("--window", type=float, default=6.0, help="seconds of timed steps per configuration")
    parser.add_argument("--compile-limit", type=float, default=150.0, help="most seconds of compiled warm-up")
    parser.add_argument("--bleu-minutes", type=float, default=4.0)
    parser.add_argument("--eval-minutes", type=float, default=0.25)
    parser.add_argument("--bleu-preset", default="transformer-gpu", help="the preset of the time-to-BLEU runs")
    parser.add_argument("--recipe", default="auto",
                        help="auto or a throughput key, e.g. 'transformer bf16 12000 graphed'")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tiny", action="store_true", help="tiny sizes for a CPU rehearsal")
    parser.add_argument("--more-configs", action="store_true", help="also measure MORE_CONFIGS")
    parser.add_argument("--configs", nargs="+", metavar="KEY",
                        help="measure only these throughput keys, e.g. 'rnn tf32 8000 graphed'")
    parser.add_argument("--compile-backend", default="inductor",
                        help="torch.compile backend of the graphed configurations (aot_eager: a quick rehearsal)")
    parser.add_argument("--dry-run", action="store_true")
    return parser.parse_args(argv)


# ----------------------------------------------------------------------------- throughput
def base_config(args, arch: str, precision: str, max_tokens: int, compiled: bool, out: Path):
    from seq2seq.cli import config_from_flags

    flags = ["--preset", PRESETS[arch], "--data-dir", str(args.data_dir), "--src", args.src, "--tgt", args.tgt,
             "--device", args.device, "--output-dir", str(out), "--max-tokens", str(max_tokens),
             "--precision", "fp32" if precision == "tf32" else precision,
             "--tf32" if precision == "tf32" else "--no-tf32", "--compile" if compiled else "--no-compile"]
    if args.tiny:
        flags += ["--d-model", "32", "--heads", "2", "--ff-size", "64", "--layers", "1", "--embed-dim", "32",
                  "--hidden-size", "32", "--decoder-hidden-size", "48", "--vocab-size", "200"]
    return config_from_flags(for_arch(flags))


def endless_batches(corpus, device: torch.device):
    from seq2seq.data.batching import Batch
    from seq2seq.data.prefetch import prefetch

    for epoch in itertools.count():
        batches = corpus.train_batches(epoch)
        yield from prefetch(batches, Batch.pin_memory) if device.type == "cuda" else batches


def count_launches(trainer, batches, steps: int = 3) -> float | None:
    if trainer.device.type != "cuda":
        return None
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            trainer.train_step([next(batches)])
        synchronize(trainer.device)
    return sum(e.count for e in prof.key_averages() if e.key in LAUNCHES) / steps


def count_syncs(trainer, batches, steps: int = 5) -> float | None:
    if trainer.device.type != "cuda":
        return None
    caught_total = 0
    for _ in range(steps):
        batch = next(batches).to(trainer.device)
        synchronize(trainer.device)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                trainer.train_step([batch])
            finally:
                torch.cuda.set_sync_debug_mode(0)
        caught_total += sum("synchroniz" in str(w.message) for w in caught)
    return caught_total / steps


def measure_config(args, record: dict, config: tuple, shared) -> dict:
    """One throughput configuration (see the module docstring)."""
    from seq2seq.runtime import allow_tf32, seed_everything
    from seq2seq.training.corpus import PreparedCorpus
    from seq2seq.training.trainer import Trainer

    arch, precision, max_tokens, compiled = config
    tokenizer, splits = shared
    out = args.work / "throughput"
    cfg = base_config(args, arch, precision, max_tokens, compiled, out)
    cfg.model.vocab_size = tokenizer.vocab_size
    allow_tf32(bool(cfg.train.tf32))
    seed_everything(cfg.train.seed)
    corpus = PreparedCorpus(tokenizer, splits, max_tokens, cfg.train.seed, fixed_shapes=bool(cfg.data.fixed_shapes))
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    trainer = Trainer(cfg, corpus, quiet=True)
    batches = endless_batches(corpus, device)
    entry: dict[str, Any] = {"arch": arch, "precision": precision, "max_tokens": max_tokens, "compiled": compiled,
                             "fixed_shapes": bool(cfg.data.fixed_shapes)}
    flops = record.setdefault("flops_per_tgt_token", {})
    if arch not in flops and not compiled:
        flops[arch] = step_flops_per_target_token(trainer, next(batches))
    warm_start = time.perf_counter()
    warmup = len(corpus.train_sampler) + 5 if compiled else 15
    for step in range(warmup):
        trainer.train_step([next(batches)])
        if time.perf_counter() - warm_start > args.compile_limit:
            entry["warmup_cut"] = step + 1
            break
    synchronize(device)
    entry["warmup_s"] = round(time.perf_counter() - warm_start, 1)
    steps, tokens, start = 0, 0, time.perf_counter()
    loss = None
    while time.perf_counter() - start < args.window:
        loss, n = trainer.train_step([next(batches)])
        steps, tokens = steps + 1, tokens + n
    synchronize(device)
    seconds = time.perf_counter() - start
    entry.update(tok_s=round(tokens / seconds), steps_per_s=round(steps / seconds, 1), last_loss=float(loss))
    entry["launches_per_step"] = count_launches(trainer, batches)
    entry["syncs_per_step"] = count_syncs(trainer, batches)
    if device.type == "cuda":
        entry["peak_mb"] = round(torch.cuda.max_memory_allocated() / 2**20)
    peak = record.get("matmul_tflop_per_s", {}).get(precision)
    if arch in flops:
        entry["model_tflop_s"] = round(flops[arch] * entry["tok_s"] / 1e12, 2)
        if peak:
            entry["of_peak"] = round(entry["model_tflop_s"] / peak, 4)
    del trainer
    torch._dynamo.reset()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return entry


def shared_corpus(args):
    """The Multi30k corpus with the one tokenizer every configuration and run shares (``WORK/tokenizer``)."""
    from seq2seq.training.corpus import prepare_run_corpus

    home = args.work / "tokenizer"
    return prepare_run_corpus(base_config(args, "transformer", "fp32", 3000, False, home), home, quiet=True)


def part_throughput(args, record: dict) -> None:
    corpus = shared_corpus(args)
    shared = (corpus.tokenizer, corpus.splits)
    results = record.setdefault("throughput", {})
    for config in configs(args):
        began = time.perf_counter()
        try:
            results[key(config)] = measure_config(args, record, config, shared)
        except Exception as exc:  # noqa: BLE001 - a configuration that fails is a result
            results[key(config)] = {"error": f"{type(exc).__name__}: {exc}"[:1500],
                                    "trace": traceback.format_exc()[-12000:]}
            print(traceback.format_exc(), flush=True)  # with its causes, for the log
            torch._dynamo.reset()
        results[key(config)]["seconds"] = round(time.perf_counter() - began, 1)
        shown = {k: v for k, v in results[key(config)].items() if k != "trace"}
        print(f"throughput {key(config)}: {json.dumps(shown)}", flush=True)
        save(record, args)


# ----------------------------------------------------------------------------- time to BLEU
def recipe_flags(args, record: dict) -> tuple[str, list[str]]:
    """The GPU recipe: the fastest measured transformer configuration at the device's default batch
    (or ``--recipe``), as train flags."""
    from seq2seq.config import DEVICE_DEFAULTS

    default_batch = DEVICE_DEFAULTS["cuda"]["data"]["max_tokens"]["transformer"]
    measured = {k: v for k, v in record.get("throughput", {}).items()
                if k.startswith("transformer ") and "tok_s" in v and v["max_tokens"] == default_batch}
    budget = args.bleu_minutes * 60  # a compiled step's warm-up is paid inside the budget
    name = args.recipe if args.recipe != "auto" else (
        max(measured, key=lambda k: measured[k]["tok_s"] * max(budget - measured[k]["warmup_s"] * (
            "graphed" in k), 0)) if measured else "transformer bf16 12000 eager")
    _, precision, tokens, mode = name.split()
    flags = ["--max-tokens", tokens, "--precision", "fp32" if precision == "tf32" else precision,
             "--tf32" if precision == "tf32" else "--no-tf32", "--compile" if mode == "graphed" else "--no-compile"]
    return name, flags


def part_bleu(args, record: dict, label: str, preset: str, flags: list[str]) -> dict:
    run_dir = args.work / label
    shutil.rmtree(run_dir, ignore_errors=True)
    copy_tokenizer(args.work / "tokenizer", run_dir)
    command = [sys.executable, "-m", "seq2seq", "train", "--preset", preset, "--data-dir", str(args.data_dir),
               "--src", args.src, "--tgt", args.tgt, "--device", args.device, "--output-dir", str(run_dir),
               "--quiet", "--max-minutes", str(args.bleu_minutes), "--eval-every", "0",
               "--eval-every-minutes", str(args.eval_minutes), "--keep-last", "100", *flags]
    if args.tiny:
        command += ["--d-model", "32", "--heads", "2", "--ff-size", "64", "--layers", "1", "--vocab-size", "200"]
    command = command[:4] + for_arch(command[4:])
    print(f"[{label}] {' '.join(command)}", flush=True)
    started = time.perf_counter()
    proc = subprocess.run(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=args.bleu_minutes * 60 + 240)
    entry: dict[str, Any] = {"flags": flags, "exit": proc.returncode,
                             "wall_s": round(time.perf_counter() - started, 1),
                             "tail": "\n".join(proc.stdout.strip().splitlines()[-15:])}
    metrics = run_dir / "metrics.jsonl"
    if metrics.is_file():
        records = [json.loads(line) for line in metrics.read_text().splitlines()]
        curve = [{"minute": round(r["elapsed"] / 60, 2), "train_minute": round(r["train_seconds"] / 60, 2),
                  "step": r["step"], "bleu": round(r["bleu"], 2)} for r in records if r["kind"] == "valid"]
        entry["curve"] = curve
        entry["first_minute_at"] = {f"{t:g}": next((c["minute"] for c in curve if c["bleu"] >= t), None)
                                    for t in THRESHOLDS}
        trains = [r for r in records if r["kind"] == "train"]
        if trains:
            entry["tok_s"] = round(trains[-1]["tokens_per_s"])
    if entry.get("curve"):  # test BLEU (greedy) of every validation's snapshot: the peer's measure
        try:
            tests = test_curve(args, run_dir)
            for point in entry["curve"]:
                point["test_bleu_greedy"] = tests.get(point["step"])
            entry["first_minute_test_at"] = {
                f"{t:g}": next((c["minute"] for c in entry["curve"] if (c.get("test_bleu_greedy") or 0) >= t), None)
                for t in THRESHOLDS}
        except Exception as exc:  # noqa: BLE001 - the run's own numbers stand
            entry["test_curve_error"] = f"{type(exc).__name__}: {exc}"[:500]
    summary = run_dir / "summary.json"
    if summary.is_file():
        data = json.loads(summary.read_text())
        entry.update(best_valid_bleu=data.get("best_valid_bleu"), steps=data.get("steps"),
                     test=data.get("test"), peak_mb=data.get("peak_cuda_memory_mb"))
    return entry


def test_curve(args, run_dir: Path) -> dict[int, float]:
    """Greedy test BLEU of each snapshot in ``run_dir/checkpoints`` (``--keep-last``), by step."""
    from seq2seq.decoding.translator import Translator
    from seq2seq.metrics import corpus_scores

    sources = (args.data_dir / f"{args.test_split}.{args.src}").read_text(encoding="utf-8").splitlines()
    references = (args.data_dir / f"{args.test_split}.{args.tgt}").read_text(encoding="utf-8").splitlines()
    index = json.loads((run_dir / "checkpoints" / "index.json").read_text())
    scores = {}
    for item in index:
        translator = Translator.from_checkpoint(run_dir / "checkpoints" / item["file"], device=args.device)
        texts = [t.text for t in translator.translate(sources, beam_size=1, need_attention=False)]
        scores[item["step"]] = round(corpus_scores(texts, references, ("bleu",))["bleu"].score, 2)
    return scores


# ----------------------------------------------------------------------------- the record
def save(record: dict, args) -> None:
    write_record(args.out, record, table(record))


def table(record: dict) -> str:
    lines = [f"GPU: {record.get('gpu')}", ""]
    if record.get("tests"):
        lines += [f"Tests with CUDA visible: {record['tests'].get('summary', '')}", ""]
    if record.get("matmul_tflop_per_s"):
        peaks = record["matmul_tflop_per_s"]
        lines += ["Matmul peak (TFLOP/s): " + ", ".join(f"{k} {v:.0f}" for k, v in peaks.items()), ""]
    rows = []
    for name, r in record.get("throughput", {}).items():
        if "error" in r:
            rows.append([name, "FAILED: " + r["error"].splitlines()[0][:100].replace("|", "/")] + [""] * 8)
            continue
        rows.append([name, r["tok_s"], r["steps_per_s"], f"{r['of_peak']:.1%}" if "of_peak" in r else "",
                     r.get("launches_per_step", ""), r.get("syncs_per_step", ""), r.get("peak_mb", ""),
                     r["warmup_s"], f"{r['last_loss']:.3f}", r.get("warmup_cut", "")])
    if rows:
        lines += [markdown_table(["configuration", "tgt tok/s", "steps/s", "of matmul peak", "launches/step",
                                  "syncs/step", "peak MB", "warm-up s", "loss", "warm-up cut at"], rows), ""]
    for label in ("bleu", "cpu-recipe"):
        r = record.get(label)
        if not r:
            continue
        test = (r.get("test") or {})
        lines += [f"Time to BLEU, {label} ({r.get('recipe', '')}; {' '.join(r.get('flags', []))}): "
                  f"exit {r.get('exit')}, "
                  f"{r.get('steps')} steps, {r.get('tok_s')} tok/s, best valid BLEU {r.get('best_valid_bleu')}, "
                  f"first minute at valid BLEU {r.get('first_minute_at')}, test {test}", ""]
        if r.get("curve"):
            lines.append(markdown_table(["minute", "train minute", "step", "valid BLEU", "test BLEU (greedy)"],
                                        [[c["minute"], c["train_minute"], c["step"], c["bleu"],
                                          c.get("test_bleu_greedy", "")] for c in r["curve"]]))
            lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.dry_run:
        print(__doc__.split("\n\n")[2])
        print("parts:", " ".join(args.parts))
        for config in configs(args):
            print("  throughput:", key(config))
        return 0
    if args.device == "cuda" and not torch.cuda.is_available():
        print("error: no CUDA device is visible (use --device cpu --tiny for a rehearsal)", file=sys.stderr)
        return 2
    args.work.mkdir(parents=True, exist_ok=True)
    from seq2seq.training import compiled

    compiled.BACKEND = args.compile_backend
    record: dict[str, Any] = {**provenance("gpu-train"), "parts": args.parts,
                              "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
                              "settings": {k: str(v) for k, v in vars(args).items()}}
    save(record, args)
    status = 0
    if "tests" in args.parts:
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "tests/test_cuda.py",
                               "tests/test_compiled_step.py", "-p", "no:cacheprovider"], cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
        lines = proc.stdout.strip().splitlines()
        record["tests"] = {"exit": proc.returncode, "summary": lines[-1] if lines else "",
                           "tail": "\n".join(lines[-60:])}
        print("\n".join(lines[-60:] if proc.returncode else lines[-3:]), flush=True)
        status |= proc.returncode != 0
        save(record, args)
    if "peak" in args.parts and args.device == "cuda":
        peaks = {}
        for name, dtype, tf32 in (("fp32", torch.float32, False), ("tf32", torch.float32, True),
                                  ("bf16", torch.bfloat16, False)):
            torch.backends.cuda.matmul.allow_tf32 = tf32
            peaks[name] = round(matmul_peak(dtype, (8192, 8192, 8192), 1.0, "cuda") / 1000, 1)
        torch.backends.cuda.matmul.allow_tf32 = False
        record["matmul_tflop_per_s"] = peaks
        print("peak", peaks, flush=True)
        save(record, args)
    if "throughput" in args.parts:
        part_throughput(args, record)
    if not (args.work / "tokenizer" / "spm.model").is_file():
        shared_corpus(args)  # the time-to-BLEU runs copy its tokenizer
    for label in ("bleu", "cpu-recipe"):
        if label not in args.parts:
            continue
        if label == "bleu":
            name, flags = recipe_flags(args, record)
        else:
            name = "the CPU defaults"
            flags = ["--max-tokens", "3000", "--precision", "fp32", "--no-tf32", "--no-compile"]
        try:
            preset = args.bleu_preset if label == "bleu" else "transformer"
            record[label] = {"recipe": f"--preset {preset}, {name}", **part_bleu(args, record, label, preset, flags)}
        except Exception as exc:  # noqa: BLE001
            record[label] = {"recipe": name, "error": f"{type(exc).__name__}: {exc}"[:1500]}
        status |= record[label].get("exit") != 0
        print(f"{label}: " + json.dumps({k: v for k, v in record[label].items() if k not in ("tail", "curve")}),
              flush=True)
        save(record, args)
    record["finished"] = True
    save(record, args)
    print(table(record))
    return int(status)


if __name__ == "__main__":
    sys.exit(main())
