"""Combining checkpoints and models: checkpoint averaging and an RNN + Transformer ensemble
(from the repository root):

    python benchmarks/bench_combine.py --data-dir MULTI30K [--steps 1200] [--eval-every 150] [--keep 4]

1. Train (each in its own process, ``python -m seq2seq train``) the Transformer preset with
   ``--keep-best K --keep-last K``, validating every ``--eval-every`` steps, then the RNN preset
   (Bahdanau) with a copy of the Transformer run's SentencePiece model (an ensemble needs one
   tokenizer). Both stop after ``--steps`` updates (or ``--minutes``); ``--runs DIR`` reuses the
   runs already in DIR.
2. Average: ``seq2seq average`` of the Transformer's K best and K last kept checkpoints.
3. Decode ``test_2016_flickr`` and the validation split with beam 5: the Transformer's ``best.pt``,
   the two averages, the RNN's ``best.pt`` and the ensemble of both ``best.pt`` (at every step the
   log of the members' mean probability). BLEU and chrF (sacreBLEU), sentences/s.
4. Record: ``--out`` (JSON + markdown table).
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

from common import add_multi30k_flags, add_run_flags, copy_tokenizer, provenance, runs_dir, train_preset, write_record
from seq2seq.io_utils import markdown_table



def train(system: str, args: argparse.Namespace, run_dir: Path, *extra: str) -> dict:
    """One training process; the run directory's summary."""
    return train_preset(system, system, args, run_dir, "--eval-every", str(args.eval_every), "--max-steps",
                        str(args.steps), "--max-minutes", str(args.minutes), *extra)


def train_both(args: argparse.Namespace, runs: Path) -> dict:
    """Step 1 (skipped for a run that already has its summary)."""
    transformer, rnn = runs / "transformer", runs / "rnn"
    summaries = {}
    if not (transformer / "summary.json").is_file():
        shutil.rmtree(transformer, ignore_errors=True)
        train("transformer", args, transformer, "--keep-best", str(args.keep), "--keep-last", str(args.keep))
    if not (rnn / "summary.json").is_file():
        shutil.rmtree(rnn, ignore_errors=True)
        copy_tokenizer(transformer, rnn)  # one tokenizer for both: the ensemble needs it
        train("rnn-bahdanau", args, rnn)
    for name, run_dir in (("transformer", transformer), ("rnn", rnn)):
        summaries[name] = json.loads((run_dir / "summary.json").read_text())
    return summaries


def averages(args: argparse.Namespace, runs: Path) -> dict[str, Path]:
    """Step 2: the K best and K last kept checkpoints of the Transformer, averaged."""
    from seq2seq.checkpoint.kept import KeptCheckpoints
    from seq2seq.checkpoint.average import write_average

    kept, written = KeptCheckpoints(runs / "transformer"), {}
    for kind in ("best", "last"):
        chosen = kept.select(kind, args.keep)
        written[f"average {kind} {args.keep}"] = write_average(chosen, runs / f"transformer-average-{kind}.pt")
    return written


def evaluate(systems: dict[str, list[Path]], args: argparse.Namespace) -> dict:
    """Step 3: beam-5 BLEU / chrF of every system on the test and validation splits."""
    from seq2seq.metrics import corpus_scores
    from seq2seq.decoding.translator import Translator

    splits = {split: [(args.data_dir / f"{split}.{lang}").read_text(encoding="utf-8").splitlines()
                      for lang in (args.src, args.tgt)] for split in (args.test_split, "val")}
    if args.val_sentences:  # the first N validation pairs only (time)
        splits["val"] = [lines[: args.val_sentences] for lines in splits["val"]]
    results = {}
    for name, checkpoints in systems.items():
        translator = Translator.from_checkpoint(checkpoints if len(checkpoints) > 1 else checkpoints[0],
                                                device=args.device)
        results[name] = {"checkpoints": [str(c.relative_to(args.runs_root)) for c in checkpoints]}
        for split, (sources, references) in splits.items():
            start = time.perf_counter()
            hyps = [t.text for t in translator.translate(sources, beam_size=5, need_attention=False)]
            seconds = time.perf_counter() - start
            scores = corpus_scores(hyps, references, ("bleu", "chrf"))
            results[name][split] = {"bleu": scores["bleu"].score, "chrf": scores["chrf"].score,
                                    "sentences_per_s": len(sources) / seconds,
                                    "signature": scores["bleu"].signature}
        print(f"{name}: " + ", ".join(f"{split} BLEU {results[name][split]['bleu']:.2f}" for split in splits),
              file=sys.stderr, flush=True)
    return results


def combine_table(record: dict) -> str:
    test = record["test_split"]
    rows = [[name, f"{r[test]['bleu']:.2f}", f"{r[test]['chrf']:.1f}", f"{r['val']['bleu']:.2f}",
             f"{r[test]['sentences_per_s']:.1f}"] for name, r in record["systems"].items()]
    head = [f"Trained {record['steps']} steps each (Transformer: {record['train']['transformer']['steps']} "
            f"steps in {record['train']['transformer']['elapsed_s'] / 60:.1f} min; RNN: "
            f"{record['train']['rnn']['steps']} steps in {record['train']['rnn']['elapsed_s'] / 60:.1f} min); "
            f"beam 5; {record['machine']['cpu']}.", ""]
    return "\n".join(head) + markdown_table(
        ["system", f"{test} BLEU", "chrF", f"val BLEU ({record['val_sentences']} sentences)", f"{test} sentences/s"],
        rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_multi30k_flags(parser)
    parser.add_argument("--steps", type=int, default=1200, help="updates per system (default: 1200)")
    parser.add_argument("--minutes", type=float, default=0, help="or a wall-clock budget per system (0 = none)")
    parser.add_argument("--eval-every", type=int, default=150)
    parser.add_argument("--keep", type=int, default=4, help="checkpoints averaged (best K, last K)")
    parser.add_argument("--val-sentences", type=int, default=0, help="score the first N validation pairs (0 = all)")
    add_run_flags(parser, "combine.json", "reused if complete")
    args = parser.parse_args(argv)
    runs = args.runs_root = runs_dir(args)
    record = {**provenance("combine"), "steps": args.steps, "test_split": args.test_split,
              "val_sentences": args.val_sentences or "all",
              "train": train_both(args, runs)}
    transformer, rnn = runs / "transformer" / "best.pt", runs / "rnn" / "best.pt"
    systems = {"transformer best.pt": [transformer]}
    systems.update({name: [path] for name, path in averages(args, runs).items()})
    systems.update({"rnn best.pt": [rnn], "ensemble rnn + transformer": [rnn, transformer]})
    record["systems"] = evaluate(systems, args)
    table = combine_table(record)
    write_record(args.out, record, table)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
