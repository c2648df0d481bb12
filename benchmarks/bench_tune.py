"""Tune both architectures on validation with equal effort (issue 26), from the repository root:

    python benchmarks/bench_tune.py --data-dir MULTI30K [--minutes 12] [--archs transformer rnn-bahdanau]
                                    [--configs N] [--runs DIR] [--out FILE.json] [-- extra train flags]

The search is declared below (``SEARCH``): the same number of configurations per architecture, the
first of each being the current preset, the others changing one or two settings each (learning rate,
warmup or schedule, batch tokens, dropout, label smoothing, width / depth at a similar parameter
count). Every configuration trains for the same wall-clock budget (``--max-minutes``, which counts
the whole run) in its own process, all with one shared SentencePiece model (trained once, so no run
spends its budget on it); the runs alternate between architectures (transformer 0, rnn 0,
transformer 1, ...) so that a drift of the machine's speed affects both alike. Each run validates
as its preset does (every ``eval_every`` updates, which drives the RNN's plateau schedule) and at its
end: greedy BLEU on the whole validation split (``val``; the test split is never read); the record
keeps the final model's.
A finished run (its ``summary.json``) is reused, so an interrupted search continues where it stopped.

The search below was declared against the presets it tuned (2026-11-25: RNN lr 1e-3, Transformer
warmup 400); its winners are the presets now (RNN ``--lr 2e-3``, Transformer ``--warmup-steps 200``),
so a new search should first restate its configurations against them.

Record: ``--out`` (JSON + markdown): per configuration its flags, parameters, updates, training
speed and validation BLEU / chrF; per architecture the winner and whether it beats the preset.
"""
from __future__ import annotations

import argparse
import itertools
import json
import shutil
import sys
from pathlib import Path

from common import (add_multi30k_flags, add_run_flags, copy_tokenizer, provenance, runs_dir, shared_tokenizer,
                    train_preset, write_record)
from seq2seq.io_utils import markdown_table

#: architecture -> [(name, train flags on top of the preset)]; the first is the preset itself
SEARCH: dict[str, list[tuple[str, list[str]]]] = {
    "transformer": [
        ("preset", []),
        ("lr 2e-3", ["--lr", "2e-3"]),
        ("warmup 200", ["--warmup-steps", "200"]),
        ("6k tokens, lr 1.5e-3", ["--max-tokens", "6000", "--lr", "1.5e-3"]),
        ("dropout 0.2", ["--dropout", "0.2"]),
        ("4 layers, ff 768", ["--layers", "4", "--ff-size", "768"]),
    ],
    "rnn-bahdanau": [
        ("preset", []),
        ("lr 2e-3", ["--lr", "2e-3"]),
        ("lr 5e-4", ["--lr", "5e-4"]),
        ("4k tokens", ["--max-tokens", "4000"]),
        ("dropout 0.2", ["--dropout", "0.2"]),
        ("no label smoothing", ["--label-smoothing", "0"]),
    ],
}


def train(arch: str, name: str, flags: list[str], args: argparse.Namespace, runs: Path, spm: Path) -> dict:
    """One configuration (reused when its run already finished): its summary."""
    run_dir = runs / arch / name.replace(" ", "-").replace(",", "")
    if not (run_dir / "summary.json").is_file():
        shutil.rmtree(run_dir, ignore_errors=True)
        copy_tokenizer(spm, run_dir)
        train_preset(f"{arch} / {name}", arch, args, run_dir, "--max-minutes", str(args.minutes), *flags)
    summary = json.loads((run_dir / "summary.json").read_text())
    valid = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()
             if json.loads(line).get("kind") == "valid"]
    last = valid[-1] if valid else {}
    return {"arch": arch, "name": name, "flags": flags, "run": str(run_dir.relative_to(runs)),
            "parameters": summary["parameters"], "steps": summary["steps"], "elapsed_s": summary["elapsed_s"],
            "train_tgt_tokens_per_s": summary.get("train_tgt_tokens_per_s"), "val_bleu": last.get("bleu"),
            "val_chrf": last.get("chrf"), "val_loss": last.get("loss")}


def winners(results: list[dict]) -> dict:
    """Per architecture: the best configuration on validation BLEU and whether it beats the preset."""
    out = {}
    for arch in dict.fromkeys(r["arch"] for r in results):
        rows = [r for r in results if r["arch"] == arch and r["val_bleu"] is not None]
        best = max(rows, key=lambda r: r["val_bleu"])
        preset = next((r for r in rows if r["name"] == "preset"), None)
        out[arch] = {"best": best["name"], "val_bleu": best["val_bleu"],
                     "preset_val_bleu": preset["val_bleu"] if preset else None,
                     "beats_preset": preset is not None and best["name"] != "preset"
                     and best["val_bleu"] > preset["val_bleu"]}
    return out


def table(record: dict) -> str:
    rows = [[r["arch"], r["name"], " ".join(r["flags"]) or "-", f"{r['parameters'] / 1e6:.1f} M", r["steps"],
             f"{r['train_tgt_tokens_per_s'] or 0:.0f}", "-" if r["val_bleu"] is None else f"{r['val_bleu']:.2f}",
             "-" if r["val_chrf"] is None else f"{r['val_chrf']:.1f}"] for r in record["results"]]
    head = (f"{record['minutes']} minutes per configuration, validation (greedy), {record['machine']['cpu']} "
            f"({record['machine']['cpu_capability']}).\n\n")
    best = "\n".join(f"- {arch}: best `{w['best']}` (val BLEU {w['val_bleu']:.2f}; preset "
                     f"{w['preset_val_bleu'] if w['preset_val_bleu'] is None else round(w['preset_val_bleu'], 2)})"
                     f"{', beats the preset' if w['beats_preset'] else ''}"
                     for arch, w in record["winners"].items())
    return head + markdown_table(["arch", "configuration", "flags", "parameters", "updates", "train tgt tok/s",
                                  "val BLEU", "val chrF"], rows) + "\n\n" + best + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_multi30k_flags(parser)
    parser.add_argument("--archs", nargs="+", choices=list(SEARCH), default=list(SEARCH))
    parser.add_argument("--minutes", type=float, default=12.0, help="wall-clock budget per configuration")
    parser.add_argument("--configs", type=int, default=0, help="the first N configurations per architecture (0 = all)")
    add_run_flags(parser, "tune.json")
    args = parser.parse_args(argv)
    runs = runs_dir(args)
    spm = shared_tokenizer(args, runs / "tokenizer")
    searches = [SEARCH[arch][: args.configs or None] for arch in args.archs]
    order = [(arch, config) for group in itertools.zip_longest(*[[(a, c) for c in s] for a, s in
                                                                   zip(args.archs, searches)])
             for arch, config in filter(None, group)]
    results = [train(arch, name, flags, args, runs, spm) for arch, (name, flags) in order]
    record = {**provenance("tune"), "minutes": args.minutes, "split": "val", "search": SEARCH,
              "results": results, "winners": winners(results)}
    text = table(record)
    write_record(args.out, record, text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
