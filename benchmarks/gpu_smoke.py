"""GPU smoke test: ``python benchmarks/gpu_smoke.py [--data-dir MULTI30K] [--minutes 1]`` on a machine
with one CUDA GPU, from the repository root; about 12 minutes on an H100 with the defaults.

1. the test suite with CUDA visible (``tests/test_cuda.py`` runs instead of skipping);
2. the quickstart (``seq2seq train``, the toy corpus) on CUDA;
3. a short Multi30k run (``--minutes`` each) of the RNN (Bahdanau) and the Transformer in fp32,
   fp16 and bf16 autocast: training target tokens/s and validation BLEU;
4. resume of the fp32 Transformer run on CUDA for a few more steps;
5. decoding of the test split with each fp32 checkpoint: greedy, beam 5, beam 5 + shortlist, fp16 and
   bf16 on CUDA against greedy / beam 5 on CPU of the same checkpoint (sentences/s, BLEU, share of
   outputs identical to the CPU's);
6. attribution (gradient, integrated gradients, occlusion) of a few sentences on CUDA against CPU;
7. ``--precision int8`` on CUDA: refused with a clear message (exit status 2).

Writes ``bench-results/gpu-smoke/gpu_smoke.json`` and its markdown table, and prints the table.
Expected output: every step "ok"; identical outputs near 100 % for fp32 (a near-tie may flip),
above 90 % for fp16/bf16; attribution within a relative 1e-2. The docs (docs/guides/gpu.md) explain
which differences are expected between CPU and GPU.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

from common import ROOT, add_multi30k_flags, provenance, write_record
from seq2seq.io_utils import markdown_table

SYSTEMS = {"rnn": "rnn-bahdanau", "transformer": "transformer"}


def run(command: list[str], timeout: float) -> tuple[int, float, str]:
    """Exit status, seconds, and the last lines of the output of ``command`` (run from the root)."""
    start = time.perf_counter()
    try:
        proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)
        code, text = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as exc:
        code, text = 124, f"timed out after {timeout:.0f} s: {exc.stdout or ''}"
    return code, time.perf_counter() - start, "\n".join(str(text).strip().splitlines()[-6:])


def train_command(args: argparse.Namespace, out: Path, system: str, precision: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "seq2seq", "train", "--preset", system, "--data-dir", str(args.data_dir),
            "--src", args.src, "--tgt", args.tgt, "--device", "cuda", "--precision", precision,
            "--max-minutes", str(args.minutes), "--eval-every", "200", "--quiet", "--no-final-test",
            "--cache-dir", str(out / "cache"), *extra]


def decode_against_cpu(run_dir: Path, args: argparse.Namespace) -> dict:
    """Test-split decoding on CUDA in several modes against CPU decoding of the same checkpoint."""
    from seq2seq.metrics import corpus_scores
    from seq2seq.decoding.translator import Translator

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
    return {"max_relative_difference": worst, "ok": all(v < 1e-2 for v in worst.values())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_multi30k_flags(parser)
    parser.add_argument("--minutes", type=float, default=1.0, help="training budget of each Multi30k run")
    parser.add_argument("--sentences", type=int, default=1000, help="test sentences decoded (default: all)")
    parser.add_argument("--skip-suite", action="store_true", help="skip the test suite (step 1)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench-results" / "gpu-smoke")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("error: no CUDA device is visible; this smoke test needs one GPU", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    record = {**provenance("gpu-smoke"), "gpu": torch.cuda.get_device_name(0),
              "capability": ".".join(map(str, torch.cuda.get_device_capability(0))), "steps": {}}
    steps = record["steps"]

    def step(name: str, command: list[str], timeout: float) -> None:
        code, seconds, tail = run(command, timeout)
        steps[name] = {"ok": code == 0, "exit": code, "seconds": round(seconds, 1), "tail": tail}
        print(f"{name}: {'ok' if code == 0 else f'FAILED ({code})'} in {seconds:.0f} s", flush=True)
        write_record(args.out / "gpu_smoke.json", record)

    if not args.skip_suite:
        step("test suite", [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider"], 1200)
    step("quickstart", [sys.executable, "-m", "seq2seq", "train", "--device", "cuda", "--quiet",
                        "--output-dir", str(args.out / "quickstart")], 600)
    runs = {}
    for arch, system in SYSTEMS.items():
        for precision in ("fp32", "fp16", "bf16"):
            if precision == "bf16" and not torch.cuda.is_bf16_supported():
                continue
            run_dir = args.out / f"{arch}-{precision}"
            step(f"train {arch} {precision}", train_command(args, args.out, system, precision,
                                                            "--output-dir", str(run_dir)), args.minutes * 60 + 300)
            summary_path = run_dir / "summary.json"
            if summary_path.is_file():
                summary = json.loads(summary_path.read_text())
                steps[f"train {arch} {precision}"].update(
                    tok_s=round(summary["train_tgt_tokens_per_s"]), valid_bleu=summary["best_valid_bleu"],
                    steps=summary["steps"])
            runs[(arch, precision)] = run_dir
    transformer = runs[("transformer", "fp32")]
    steps_done = json.loads((transformer / "summary.json").read_text())["steps"] if (
        transformer / "summary.json").is_file() else 0
    step("resume transformer fp32", train_command(args, args.out, "transformer", "fp32", "--output-dir",
                                                  str(transformer), "--resume", "--max-steps",
                                                  str(steps_done + 50)), 600)
    record["decode"] = {}
    for arch in SYSTEMS:
        if (runs[(arch, "fp32")] / "best.pt").is_file():
            record["decode"][arch] = decode_against_cpu(runs[(arch, "fp32")], args)
            write_record(args.out / "gpu_smoke.json", record)
            sources = (args.data_dir / f"{args.test_split}.{args.src}").read_text(encoding="utf-8").splitlines()
            steps[f"attribution {arch}"] = attribution_against_cpu(runs[(arch, "fp32")], sources[:3])
    code, _, tail = run([sys.executable, "-m", "seq2seq", "translate", "--checkpoint", str(transformer),
                         "--device", "cuda", "--precision", "int8"], 120)
    steps["int8 refused on cuda"] = {"ok": code == 2 and "int8 runs on CPU only" in tail, "exit": code, "tail": tail}
    table = smoke_table(record)
    write_record(args.out / "gpu_smoke.json", record, table)
    print(table)
    return 0 if all(s.get("ok") for s in steps.values()) else 1


def smoke_table(record: dict) -> str:
    lines = [f"GPU: {record['gpu']} (compute capability {record['capability']})", ""]
    rows = [[name, "ok" if s.get("ok") else "FAILED", s.get("seconds", ""), s.get("tok_s", ""),
             f"{s['valid_bleu']:.2f}" if "valid_bleu" in s else ""] for name, s in record["steps"].items()]
    lines.append(markdown_table(["step", "result", "seconds", "train tgt tok/s", "valid BLEU"], rows))
    for arch, modes in record.get("decode", {}).items():
        lines += ["", f"Decoding, {arch} (fp32 checkpoint), test split:", ""]
        lines.append(markdown_table(
            ["mode", "sentences/s", "BLEU", "same as CPU"],
            [[mode, f"{r['sentences_per_s']:.1f}", f"{r['bleu']:.2f}",
              f"{r['same_as_cpu']:.1%}" if "same_as_cpu" in r else "(CPU)"] for mode, r in modes.items()]))
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
