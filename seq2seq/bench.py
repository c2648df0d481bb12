"""Benchmarks: ``python -m seq2seq.bench quality`` (and later ``speed``).

quality: trains the RNN with Bahdanau attention, the RNN with Luong general attention and the
Transformer on Multi30k (German->English by default) with one shared 8k SentencePiece model, each
for the same wall-clock budget, each in its own process (so peak memory is per system), then
decodes the test split greedily and with beam 5 and writes a JSON record and a markdown table.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA = Path(os.environ.get("SEQ2SEQ_MULTI30K", ROOT.parent / "shared" / "data" / "multi30k"))

# Peer-comparable sizes (see ../shared/bench-peers): the same as Joey NMT / OpenNMT-py runs.
SYSTEMS: dict[str, list[str]] = {
    "rnn-bahdanau": ["--arch", "rnn", "--attention", "bahdanau", "--embed-dim", "256", "--hidden-size", "256",
                     "--decoder-hidden-size", "512", "--dropout", "0.3", "--max-tokens", "2000"],
    "rnn-luong-general": ["--arch", "rnn", "--attention", "luong-general", "--embed-dim", "256",
                          "--hidden-size", "256", "--decoder-hidden-size", "512", "--dropout", "0.3",
                          "--max-tokens", "2000"],
    "transformer": ["--arch", "transformer", "--layers", "3", "--d-model", "256", "--heads", "4",
                    "--ff-size", "1024", "--dropout", "0.1", "--label-smoothing", "0.1", "--max-tokens", "3000",
                    "--warmup-steps", "400", "--lr", "1e-3"],
}


def machine() -> dict:
    return {"platform": platform.platform(), "python": platform.python_version(), "torch": torch.__version__,
            "cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}


def train_system(name: str, args: argparse.Namespace, run_dir: Path, shared_spm: Path | None) -> dict:
    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    if shared_spm is not None:  # one shared SentencePiece model: reused, not retrained
        for suffix in (".model", ".json"):
            shutil.copy(shared_spm.with_suffix(suffix), run_dir / f"spm{suffix}")
    command = [sys.executable, str(ROOT / "train.py"), "--data-dir", str(args.data_dir), "--src", args.src,
               "--tgt", args.tgt, "--vocab-size", str(args.vocab_size), "--max-minutes", str(args.minutes),
               "--eval-every", str(args.eval_every), "--output-dir", str(run_dir), "--quiet",
               "--no-final-test", "--device", args.device, *SYSTEMS[name], *args.extra]
    print(f"[{name}] {' '.join(command)}", file=sys.stderr, flush=True)
    subprocess.run(command, check=True, cwd=ROOT)
    return json.loads((run_dir / "summary.json").read_text())


def decode_system(run_dir: Path, args: argparse.Namespace) -> dict:
    from .evaluation import corpus_scores
    from .translator import Translator

    sources = (args.data_dir / f"{args.test_split}.{args.src}").read_text(encoding="utf-8").splitlines()
    references = (args.data_dir / f"{args.test_split}.{args.tgt}").read_text(encoding="utf-8").splitlines()
    translator = Translator.from_checkpoint(run_dir / "best.pt", device=args.device)
    results = {}
    for label, beam, batch in (("greedy", 1, 64), ("beam5", 5, 64), ("greedy_bs1", 1, 1)):
        subset = sources if label != "greedy_bs1" else sources[: args.bs1_sentences]
        start = time.perf_counter()
        hyps = translator.translate(subset, beam_size=beam, batch_size=batch, need_attention=False)
        seconds = time.perf_counter() - start
        texts = [h.text for h in hyps]
        entry = {"sentences": len(subset), "seconds": seconds, "sentences_per_s": len(subset) / seconds,
                 "tgt_tokens_per_s": sum(len(h.tokens) + 1 for h in hyps) / seconds}
        if label != "greedy_bs1":
            scores = corpus_scores(texts, references, ("bleu", "chrf"))
            entry.update({k: v.score for k, v in scores.items()})
            entry["signatures"] = {k: v.signature for k, v in scores.items()}
            entry["length_ratio"] = sum(len(t.split()) for t in texts) / sum(len(r.split()) for r in references)
            (run_dir / f"test.{label}.hyp").write_text("\n".join(texts) + "\n", encoding="utf-8")
        results[label] = entry
    return results


def markdown_table(record: dict) -> str:
    rows = ["| system | params | train time | train tgt tok/s | peak RSS train | BLEU greedy / beam 5 | "
            "chrF greedy / beam 5 | greedy sent/s | beam 5 sent/s | greedy bs1 sent/s |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in record["systems"].items():
        t, d = r["train"], r["decode"]
        rows.append(
            f"| {name} | {t['parameters'] / 1e6:.1f} M | {t['elapsed_s'] / 60:.1f} min ({t['steps']} steps) | "
            f"{t['train_tgt_tokens_per_s']:,.0f} | {t['peak_rss_mb'] / 1024:.1f} GB | "
            f"{d['greedy']['bleu']:.2f} / {d['beam5']['bleu']:.2f} | {d['greedy']['chrf']:.1f} / "
            f"{d['beam5']['chrf']:.1f} | {d['greedy']['sentences_per_s']:.1f} | "
            f"{d['beam5']['sentences_per_s']:.1f} | {d['greedy_bs1']['sentences_per_s']:.1f} |")
    return "\n".join(rows) + "\n"


def quality(args: argparse.Namespace) -> dict:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    record = {"benchmark": "quality", "command": " ".join(sys.argv), "date": time.strftime("%Y-%m-%d %H:%M"),
              "data": str(args.data_dir), "pair": f"{args.src}-{args.tgt}", "minutes_per_system": args.minutes,
              "vocab_size": args.vocab_size, "machine": machine(), "systems": {}}
    shared_spm = None
    for name in args.systems:
        run_dir = out / name
        train_summary = train_system(name, args, run_dir, shared_spm)
        shared_spm = shared_spm or run_dir / "spm.model"
        record["systems"][name] = {"flags": SYSTEMS[name], "train": train_summary,
                                   "decode": decode_system(run_dir, args)}
        (out / "quality.json").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    (out / "quality.md").write_text(markdown_table(record), encoding="utf-8")
    print(markdown_table(record))
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m seq2seq.bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    q = sub.add_parser("quality", help="RNN (Bahdanau, Luong) vs Transformer at equal wall-clock budget")
    q.add_argument("--data-dir", type=Path, default=DEFAULT_DATA)
    q.add_argument("--src", default="de")
    q.add_argument("--tgt", default="en")
    q.add_argument("--test-split", default="test_2016_flickr")
    q.add_argument("--minutes", type=float, default=20.0, help="training budget per system (default: 20)")
    q.add_argument("--vocab-size", type=int, default=8000)
    q.add_argument("--eval-every", type=int, default=400)
    q.add_argument("--systems", nargs="+", default=list(SYSTEMS), choices=list(SYSTEMS))
    q.add_argument("--device", default="auto")
    q.add_argument("--bs1-sentences", type=int, default=200, help="sentences for the batch-1 greedy timing")
    q.add_argument("--out", default="bench-results/quality")
    q.add_argument("extra", nargs="*", help="extra train.py flags after --, applied to every system")
    args = parser.parse_args(argv)
    if not (args.data_dir / f"train.{args.src}").is_file():
        print(f"error: --data-dir {args.data_dir} has no train.{args.src}; point it at Multi30k", file=sys.stderr)
        return 2
    quality(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
