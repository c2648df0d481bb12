"""Fine-tuning (``seq2seq train --init-from``): what continuing a trained model on new data does to
the data it was tuned on and to the data it was trained for (from the repository root):

    python benchmarks/bench_finetune.py --data-dir MULTI30K [--base-minutes 10] [--tune-minutes 2]

1. Base: the RNN (Bahdanau) preset trained on Multi30k's training split for ``--base-minutes``
   (``--base RUN`` reuses a trained run instead).
2. Tune data, a "domain" of its own: ``--tune-data numbers`` (default) is the embedded toy task
   reversed, German number words -> English (*ein und zwanzig* -> *twenty-one*), a domain Multi30k
   never shows; ``--tune-data val`` (or another split) is that split of Multi30k. ``--tune-sentences``
   pairs are trained on and the held-out rest (``--held-out`` pairs for numbers) is that domain's
   test, so no tuned sentence is ever scored.
3. Fine-tune: ``--init-from`` the base's best.pt on the tune data for ``--tune-minutes`` at
   ``--tune-lr`` (constant schedule), validating on the held-out part.
4. Decode with beam 5, base and tuned: the held-out part of ``--tune-split`` (the new "domain") and
   ``--test-split`` (the original domain). BLEU and chrF (sacreBLEU); the record (``--out``, JSON +
   markdown) holds both, with the commands.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from common import add_multi30k_flags, add_run_flags, provenance, runs_dir, train_preset, write_record
from seq2seq.io_utils import markdown_table, read_lines


def domain_lines(args: argparse.Namespace) -> dict[str, list[str]]:
    """Source and target lines of the tune domain, by language."""
    if args.tune_data != "numbers":
        return {lang: read_lines(args.data_dir / f"{args.tune_data}.{lang}") for lang in (args.src, args.tgt)}
    from seq2seq.toy import toy_corpus

    pairs = toy_corpus(n_train=args.tune_sentences + args.held_out, n_valid=1, n_test=1, seed=args.seed)["train"]
    return {args.src: list(pairs["tgt"]), args.tgt: list(pairs["src"])}  # toy is English -> German: reversed


def tune_data(args: argparse.Namespace, home: Path) -> tuple[Path, int]:
    """``home/{train,val}.{src,tgt}``: the first ``--tune-sentences`` pairs of the tune domain to train on,
    the rest to validate and score on. Returns the directory and the number of held-out pairs."""
    home.mkdir(parents=True, exist_ok=True)
    held_out = 0
    for lang, lines in domain_lines(args).items():
        (home / f"train.{lang}").write_text("\n".join(lines[: args.tune_sentences]) + "\n", encoding="utf-8")
        rest = lines[args.tune_sentences:]
        for split in ("val", "heldout", args.test_split):  # validation; scoring; the split training expects
            (home / f"{split}.{lang}").write_text("\n".join(rest) + "\n", encoding="utf-8")
        held_out = len(rest)
    return home, held_out


def score(checkpoint: Path, sources: list[str], references: list[str], device: str) -> dict:
    from seq2seq.decoding.translator import Translator
    from seq2seq.metrics import corpus_scores

    translator = Translator.from_checkpoint(checkpoint, device=device)
    hyps = [t.text for t in translator.translate(sources, beam_size=5, need_attention=False)]
    return {name: round(s.score, 2) for name, s in corpus_scores(hyps, references, ("bleu", "chrf")).items()}


def finetune_table(record: dict) -> str:
    rows = [[name, r["domain"]["bleu"], r["domain"]["chrf"], r["original"]["bleu"], r["original"]["chrf"]]
            for name, r in record["scores"].items()]
    return markdown_table(["model", f"{record['tune_data']} (held out) BLEU", "chrF",
                           f"{record['test_split']} BLEU", "chrF"], rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_multi30k_flags(parser)
    add_run_flags(parser, "finetune.json")
    parser.add_argument("--base", type=Path, help="a trained run to start from (default: train one)")
    parser.add_argument("--base-minutes", type=float, default=10.0)
    parser.add_argument("--tune-data", default="numbers", help="numbers (German number words -> English) or a "
                                                                   "Multi30k split, e.g. val")
    parser.add_argument("--tune-sentences", type=int, default=2000)
    parser.add_argument("--held-out", type=int, default=300, help="held-out pairs of the numbers domain")
    parser.add_argument("--tune-minutes", type=float, default=2.0)
    parser.add_argument("--tune-lr", type=float, default=5e-4)
    args = parser.parse_args(argv)
    runs = runs_dir(args)
    base = args.base or runs / "base"
    if args.base is None and not (base / "best.pt").is_file():
        train_preset("base", "rnn-bahdanau", args, base, "--max-minutes", str(args.base_minutes))
    data, held_out = tune_data(args, runs / "tune-data")
    tuned = runs / "tuned"
    if not (tuned / "best.pt").is_file():
        train_preset("tune", "rnn-bahdanau", argparse.Namespace(**{**vars(args), "data_dir": data}), tuned,
                     "--init-from", str(base / "best.pt"), "--max-minutes", str(args.tune_minutes),
                     "--lr", str(args.tune_lr), "--schedule", "constant", "--eval-every", "100")
    sets = {"domain": (data / f"heldout.{args.src}", data / f"heldout.{args.tgt}"),
            "original": (args.data_dir / f"{args.test_split}.{args.src}",
                         args.data_dir / f"{args.test_split}.{args.tgt}")}
    texts = {name: (read_lines(s), read_lines(r)) for name, (s, r) in sets.items()}
    record = {**provenance("finetune"), "tune_data": args.tune_data, "test_split": args.test_split,
              "tune_sentences": args.tune_sentences, "held_out": held_out, "base_minutes": args.base_minutes,
              "tune_minutes": args.tune_minutes, "tune_lr": args.tune_lr, "scores": {}}
    for name, run in (("base", base), ("tuned", tuned)):
        record["scores"][name] = {key: score(run / "best.pt", *texts[key], args.device) for key in texts}
        print(f"{name}: {record['scores'][name]}", file=sys.stderr, flush=True)
    table = finetune_table(record)
    write_record(args.out, record, table)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
