"""Subword regularization at equal training time (from the repository root):

    python benchmarks/bench_subword.py --data-dir MULTI30K [--archs rnn-bahdanau transformer]
        [--alphas 0 0.1] [--minutes 10]

For each preset and each ``--alphas`` value (0 = off), one run of ``--minutes`` on Multi30k with the
same SentencePiece model (trained once, so no run spends its budget on it) and the same seed, one
after the other on this machine; then beam-5 BLEU / chrF of each ``best.pt`` on the validation split
(where an alpha would be chosen) and on the test split (read once, for the record). The record
(``--out``, JSON + markdown) holds the runs' updates and tokens/s too: sampling re-encodes the
training split every epoch, and that time is part of the budget.
"""
from __future__ import annotations

import argparse
import json
import sys

from common import (add_multi30k_flags, add_run_flags, copy_tokenizer, provenance, runs_dir, shared_tokenizer,
                    train_preset, write_record)
from seq2seq.io_utils import markdown_table, read_lines


def score(checkpoint, sources: list[str], references: list[str], device: str) -> dict:
    from seq2seq.decoding.translator import Translator
    from seq2seq.metrics import corpus_scores

    hyps = [t.text for t in Translator.from_checkpoint(checkpoint, device=device).translate(
        sources, beam_size=5, need_attention=False)]
    return {name: round(s.score, 2) for name, s in corpus_scores(hyps, references, ("bleu", "chrf")).items()}


def subword_table(record: dict) -> str:
    rows = [[r["arch"], r["alpha"], r["steps"], round(r["tgt_tokens_per_s"]), r["val"]["bleu"], r["val"]["chrf"],
             r["test"]["bleu"], r["test"]["chrf"]] for r in record["runs"]]
    return markdown_table(["preset", "alpha", "updates", "tgt tok/s", "val BLEU", "val chrF", "test BLEU",
                           "test chrF"], rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_multi30k_flags(parser)
    add_run_flags(parser, "subword.json")
    parser.add_argument("--archs", nargs="+", default=["rnn-bahdanau", "transformer"])
    parser.add_argument("--alphas", nargs="+", type=float, default=[0.0, 0.1])
    parser.add_argument("--minutes", type=float, default=10.0)
    args = parser.parse_args(argv)
    runs = runs_dir(args)
    tokenizer = shared_tokenizer(args, runs / "tokenizer")
    splits = {split: [read_lines(args.data_dir / f"{stem}.{lang}") for lang in (args.src, args.tgt)]
              for split, stem in (("val", "val"), ("test", args.test_split))}
    record = {**provenance("subword"), "minutes": args.minutes, "runs": []}
    for arch in args.archs:
        for alpha in args.alphas:
            run = runs / f"{arch}-alpha{alpha:g}"
            if not (run / "summary.json").is_file():
                copy_tokenizer(tokenizer, run)
                train_preset(f"{arch} alpha {alpha:g}", arch, args, run, "--max-minutes", str(args.minutes),
                             "--subword-alpha", str(alpha))
            summary = json.loads((run / "summary.json").read_text())
            row = {"arch": arch, "alpha": alpha, "steps": summary["steps"],
                   "tgt_tokens_per_s": summary["train_tgt_tokens_per_s"],
                   **{split: score(run / "best.pt", *texts, args.device) for split, texts in splits.items()}}
            record["runs"].append(row)
            print(f"{arch} alpha {alpha:g}: {row}", file=sys.stderr, flush=True)
            write_record(args.out, record, subword_table(record))  # after every run
    print(subword_table(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
