"""Where GPU time goes in half precision: training and beam decoding of one checkpoint's model, in
fp32 / bf16 / fp16, under each scaled-dot-product-attention backend, with a profile of each slow case.

    python benchmarks/gpu_profile.py --checkpoint RUN/best.pt [--data-dir MULTI30K] [--out FILE.json]
        [--device cuda] [--sentences 200] [--train-steps 150] [--warmup-steps 20] [--profile-steps 20]

The first GPU run (``bench-results/gpu-smoke-2026-11-26-h100``) trained the Transformer preset 3x
slower in bf16 than in fp32 and beam-decoded it 25x slower in fp16/bf16, with a rate that grew during
the run (a per-shape cost). This script separates the suspects in one short GPU job:

1. **decoding**: beam 5 over ``--sentences`` test sentences with the checkpoint in each precision,
   under each attention backend (``default``: PyTorch's choice; ``efficient``, ``flash``, ``cudnn``,
   ``math``: ``torch.nn.attention.sdpa_kernel`` restricted to one), each pass twice over the same
   sentences (a second pass much faster than the first means a per-shape cost, e.g. a plan built
   for every new sequence length);
2. **training**: the checkpoint's config (the Transformer preset) trained from scratch on the
   training split in each precision and backend: target tokens/s over ``--train-steps`` steps after
   ``--warmup-steps``, then the same again (the second window shows whether the rate still grows);
3. **profiles** (``torch.profiler``, CPU and CUDA): the operators with the most self CPU and self
   CUDA time in the default backend, for each precision whose rate fell below half of fp32's.

The record (``--out``, JSON) is rewritten after every measurement, so a job stopped at its limit
keeps what it measured. A backend that cannot run a case (e.g. flash with a padding mask) is
recorded with its error. On a CPU (``--device cpu``) it runs the same code (a smoke test; the fused
kernel is used only off CPU, so the backends do not differ there).
"""
from __future__ import annotations

import argparse
import itertools
import json
import shutil
import sys
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch

from common import ROOT, add_multi30k_flags, provenance, write_record

PRECISIONS = ("fp32", "bf16", "fp16")
BACKENDS = ("default", "efficient", "flash", "cudnn", "math")


def backend_context(name: str):
    """``sdpa_kernel`` restricted to backend ``name``; no restriction for ``default``."""
    if name == "default":
        return nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([{"efficient": SDPBackend.EFFICIENT_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
                         "cudnn": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH}[name]])


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def top_operators(prof, device: torch.device, rows: int = 15) -> dict[str, list[dict[str, Any]]]:
    """The operators with the most self CPU time and (on CUDA) self device time."""
    events = prof.key_averages()

    def table(key: str) -> list[dict[str, Any]]:
        ranked = sorted(events, key=lambda e: getattr(e, key, 0), reverse=True)[:rows]
        return [{"name": e.key, "calls": e.count, "self_cpu_ms": e.self_cpu_time_total / 1000,
                 "self_device_ms": getattr(e, "self_device_time_total", 0) / 1000} for e in ranked]

    result = {"by_cpu": table("self_cpu_time_total")}
    if device.type == "cuda":
        result["by_device"] = table("self_device_time_total")
    return result


def profiled(device: torch.device, work) -> dict:
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        work()
        synchronize(device)
    return top_operators(prof, device)


# ----------------------------------------------------------------------------- decoding
def decode_rate(translator, sources: list[str], device: torch.device) -> tuple[float, list[str]]:
    synchronize(device)
    start = time.perf_counter()
    texts = [t.text for t in translator.translate(sources, beam_size=5, need_attention=False)]
    synchronize(device)
    return len(sources) / (time.perf_counter() - start), texts


def measure_decoding(args: argparse.Namespace, record: dict, sources: list[str]) -> None:
    from seq2seq.decoding.translator import Translator

    device = torch.device(args.device)
    results = record.setdefault("decode", {})
    reference: list[str] | None = None
    for precision in args.precisions:
        translator = Translator.from_checkpoint(args.checkpoint, device=args.device, precision=precision)
        for backend in args.backends:
            label = f"{precision} {backend}"
            try:
                with backend_context(backend):
                    first, texts = decode_rate(translator, sources, device)
                    second, _ = decode_rate(translator, sources, device)
            except RuntimeError as exc:
                results[label] = {"error": str(exc).splitlines()[0][:300]}
            else:
                reference = texts if reference is None else reference
                results[label] = {"first_pass_sentences_per_s": round(first, 1),
                                  "second_pass_sentences_per_s": round(second, 1),
                                  "same_as_first_config": sum(a == b for a, b in zip(texts, reference)) / len(texts)}
            print(f"decode {label}: {results[label]}", flush=True)
            save(record, args)
        fp32 = results.get("fp32 default", {}).get("second_pass_sentences_per_s")
        mine = results.get(f"{precision} default", {}).get("second_pass_sentences_per_s")
        if fp32 and mine and mine < fp32 / 2 and args.profile_sentences:
            fresh = Translator.from_checkpoint(args.checkpoint, device=args.device, precision=precision)
            record.setdefault("decode_profile", {})[precision] = profiled(
                device, lambda: fresh.translate(sources[: args.profile_sentences], beam_size=5, need_attention=False))
            save(record, args)
        del translator
        if device.type == "cuda":
            torch.cuda.empty_cache()


# ----------------------------------------------------------------------------- training
def build_trainer(args: argparse.Namespace, precision: str, work: Path, corpus=None):
    """A Trainer of the checkpoint's config (fresh weights) in ``precision``; the corpus is encoded once."""
    from seq2seq.checkpoint.loaded import LoadedCheckpoint
    from seq2seq.cli import config_from_flags
    from seq2seq.config import config_to_yaml
    from seq2seq.training.corpus import prepare_run_corpus
    from seq2seq.training.trainer import Trainer

    loaded = LoadedCheckpoint.read(args.checkpoint)
    work.mkdir(parents=True, exist_ok=True)
    config = work / "base.yaml"
    config.write_text(config_to_yaml(loaded.config), encoding="utf-8")
    cfg = config_from_flags(["--config", str(config), "--data-dir", str(args.data_dir), "--src", args.src, "--tgt",
                             args.tgt, "--device", args.device, "--precision", precision, "--output-dir",
                             str(work / precision), "--cache-dir", str(work / "cache")])
    if corpus is None:
        corpus = prepare_run_corpus(cfg, work / precision, quiet=True, tokenizer=loaded.tokenizer)
    cfg.model.vocab_size = corpus.tokenizer.vocab_size
    return Trainer(cfg, corpus, quiet=True), corpus


def train_rate(trainer, batches, steps: int, device: torch.device) -> float:
    synchronize(device)
    tokens, start = 0, time.perf_counter()
    for _ in range(steps):
        loss, n = trainer.train_step([next(batches)])
        tokens += n
    float(loss)
    synchronize(device)
    return tokens / (time.perf_counter() - start)


def measure_training(args: argparse.Namespace, record: dict) -> None:
    device = torch.device(args.device)
    results = record.setdefault("train", {})
    work = args.work
    corpus = None
    for precision in args.precisions:
        for backend in args.backends:
            label = f"{precision} {backend}"
            try:
                trainer, corpus = build_trainer(args, precision, work, corpus)
                batches = (b for epoch in itertools.count() for b in corpus.train_batches(epoch))
                with backend_context(backend):
                    warm = train_rate(trainer, batches, args.warmup_steps, device)
                    first = train_rate(trainer, batches, args.train_steps, device)
                    second = train_rate(trainer, batches, args.train_steps, device)
                results[label] = {"warmup_tgt_tokens_per_s": round(warm), "tgt_tokens_per_s": round(first),
                                  "second_window_tgt_tokens_per_s": round(second)}
                fp32 = results.get("fp32 default", {}).get("second_window_tgt_tokens_per_s")
                if (backend == "default" and fp32 and second < fp32 / 2 and args.profile_steps):
                    record.setdefault("train_profile", {})[precision] = profiled(
                        device, lambda: train_rate(trainer, batches, args.profile_steps, device))
            except RuntimeError as exc:
                results[label] = {"error": str(exc).splitlines()[0][:300]}
            print(f"train {label}: {results[label]}", flush=True)
            save(record, args)
            trainer = None
            if device.type == "cuda":
                torch.cuda.empty_cache()
    shutil.rmtree(work, ignore_errors=True)


# ----------------------------------------------------------------------------- running it
def save(record: dict, args: argparse.Namespace) -> None:
    write_record(args.out, record)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_multi30k_flags(parser)
    parser.add_argument("--checkpoint", type=Path, required=True, help="a trained checkpoint (its model and config)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench-results" / "gpu-profile" / "gpu_profile.json")
    parser.add_argument("--work", type=Path, default=ROOT / "bench-results" / "gpu-profile" / "work",
                        help="scratch directory of the training runs (removed at the end)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--precisions", nargs="+", choices=PRECISIONS, default=list(PRECISIONS))
    parser.add_argument("--backends", nargs="+", choices=BACKENDS, default=["default", "efficient", "math"])
    parser.add_argument("--sentences", type=int, default=200, help="test sentences beam-decoded (0: no decoding)")
    parser.add_argument("--profile-sentences", type=int, default=40)
    parser.add_argument("--train-steps", type=int, default=150, help="steps of each timed window (0: no training)")
    parser.add_argument("--warmup-steps", type=int, default=20)
    parser.add_argument("--profile-steps", type=int, default=20)
    parser.add_argument("--parts", nargs="+", choices=("decode", "train"), default=["decode", "train"])
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("error: --device cuda but no CUDA device is visible", file=sys.stderr)
        return 2
    record: dict[str, Any] = {**provenance("gpu-profile"), "checkpoint": args.checkpoint.name,
                              "settings": {k: v for k, v in vars(args).items()
                                           if k not in ("data_dir", "out", "work", "checkpoint")}}
    if args.device.startswith("cuda"):
        record.update(gpu=torch.cuda.get_device_name(0), cuda=torch.version.cuda,
                      cudnn=torch.backends.cudnn.version())
    sources = (args.data_dir / f"{args.test_split}.{args.src}").read_text(encoding="utf-8").splitlines()
    if "decode" in args.parts and args.sentences:
        measure_decoding(args, record, sources[: args.sentences])
    if "train" in args.parts and args.train_steps:
        measure_training(args, record)
    record["finished"] = True
    save(record, args)
    print(json.dumps({k: record.get(k) for k in ("decode", "train")}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
