"""Length generalisation of the Transformer's position encodings (from the repository root):

    python benchmarks/bench_positions.py [--max-src-words 14] [--minutes 12] \\
        [--positions sinusoidal learned relative rope] [--out bench-results/positions.json] [-- TRAIN FLAGS]

Method. Train only on short sentences, test on all lengths:

1. Filter: the training pairs whose source has at most N words (``--max-src-words``, whitespace
   words; default 14, which keeps 83% of Multi30k's training pairs and leaves 14.9% of the
   test_2016_flickr German sources longer) are written, with the validation pairs filtered the same
   way and the unfiltered test split, to ``<work>/data/`` (``<work>`` is ``--out`` without its
   suffix). Validation is filtered too because the training run picks ``best.pt`` by validation
   BLEU: with the full split, sentences longer than N would influence the model that is tested. The
   full validation split is still scored at the end (step 3), as the usual all-lengths figure.
2. Train: ``--preset transformer`` once per ``--positional`` value, each in its own process
   (``python -m seq2seq train``), with the same wall-clock budget (``--minutes``), seed, data and
   SentencePiece model: the first run trains it on the filtered training text, the later runs get a
   copy (so no encoding sees a piece vocabulary built from long sentences, and all share one).
   Learned positions are limited to ``--max-positions`` (1,024, far above any Multi30k sentence),
   but the positions past the longest filtered training sequence are never trained; the record
   gives those lengths in pieces (``pieces``).
3. Decode, in this process: the test split and the full validation split with beam 5 from each run's
   ``best.pt``. Test BLEU (sacrebleu, as everywhere) is reported overall and per source-length bucket
   (words; default 1-7, 8-10, 11-N, N+1-N+4, N+5+), with each bucket's sentence count and length ratio
   (hypothesis words / reference words); buckets above N were never seen in training (``unseen``).
   Bucket BLEU of a few dozen sentences is noisy: compare encodings within a bucket, not buckets.
4. Record: ``--out`` (JSON, with each run's summary.json: steps, tokens/s, ...) and its markdown table
   (``.md``); the runs stay in ``<work>/<positional>/``.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from common import ROOT, provenance, write_record
from seq2seq.io_utils import display_path, markdown_table

DEFAULT_DATA = os.environ.get("SEQ2SEQ_MULTI30K")  # Multi30k {split}.{lang} files, or --data-dir
POSITIONS = ("sinusoidal", "learned", "relative", "rope")


def read_lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def words(sentence: str) -> int:
    return len(sentence.split())


def length_buckets(max_words: int, edges: list[int] | None) -> list[dict]:
    """Source-length buckets (inclusive word ranges) from upper ``edges`` (default 7, 10, N, N + 4;
    N is always an edge); the last is open. A bucket above N holds lengths never trained on."""
    edges = sorted({e for e in (edges or [7, 10, max_words + 4]) if e > 0} | {max_words})
    lows = [1] + [e + 1 for e in edges]
    return [{"words": f"{low}+" if high is None else f"{low}-{high}" if high > low else str(low), "low": low,
             "high": high, "unseen": low > max_words} for low, high in zip(lows, [*edges, None])]


def in_bucket(length: int, bucket: dict) -> bool:
    return length >= bucket["low"] and (bucket["high"] is None or length <= bucket["high"])


def write_filtered_data(args: argparse.Namespace, target: Path) -> dict:
    """Step 1: train and val pairs with at most ``max_src_words`` source words, the test split whole.
    Files already as wanted are left alone (their mtimes key the tokenizer and corpus caches)."""
    target.mkdir(parents=True, exist_ok=True)
    stats = {}
    for split in ("train", "val", args.test_split):
        src, tgt = (read_lines(args.data_dir / f"{split}.{lang}") for lang in (args.src, args.tgt))
        filtered = split != args.test_split
        kept = [(s, t) for s, t in zip(src, tgt) if not filtered or words(s) <= args.max_src_words]
        for lang, column in ((args.src, 0), (args.tgt, 1)):
            text, path = "".join(pair[column] + "\n" for pair in kept), target / f"{split}.{lang}"
            if not path.is_file() or path.read_text(encoding="utf-8") != text:
                path.write_text(text, encoding="utf-8")
        if filtered:
            stats[split] = {"pairs": len(src), "kept": len(kept)}
    return stats


def train_run(positional: str, args: argparse.Namespace, data_dir: Path, run_dir: Path,
              shared_spm: Path | None) -> dict:
    """Step 2: one training process; ``shared_spm`` (the first run's tokenizer) is copied in first."""
    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    if shared_spm is not None:
        for suffix in (".model", ".json"):
            shutil.copy(shared_spm.with_suffix(suffix), run_dir / f"spm{suffix}")
    command = [sys.executable, "-m", "seq2seq", "train", "--preset", "transformer", "--data-dir", str(data_dir),
               "--src", args.src, "--tgt", args.tgt, "--test-split", args.test_split, "--vocab-size",
               str(args.vocab_size), "--positional", positional, "--seed", str(args.seed), "--max-minutes",
               str(args.minutes), "--eval-every", str(args.eval_every), "--device", args.device,
               "--output-dir", str(run_dir), "--quiet", "--no-final-test", *args.extra]
    print(f"[{positional}] {' '.join(command)}", file=sys.stderr, flush=True)
    subprocess.run(command, check=True, cwd=ROOT)
    return json.loads((run_dir / "summary.json").read_text())


def decode_run(run_dir: Path, args: argparse.Namespace, buckets: list[dict]) -> dict:
    """Step 3: beam 5 from best.pt on the test split (overall and per bucket) and the full val split."""
    from seq2seq.metrics import corpus_scores
    from seq2seq.config import DecodeConfig
    from seq2seq.decoding.translator import Translator

    translator = Translator.from_checkpoint(run_dir / "best.pt", device=args.device)
    result = {}
    for name, split in (("test", args.test_split), ("valid_full", "val")):
        sources, references = (read_lines(args.data_dir / f"{split}.{lang}") for lang in (args.src, args.tgt))
        hyps = [t.text for t in translator.translate(sources, beam_size=5, batch_size=DecodeConfig(beam_size=5).batch,
                                                     need_attention=False)]
        (run_dir / f"{split}.beam5.hyp").write_text("".join(h + "\n" for h in hyps), encoding="utf-8")
        bleu = corpus_scores(hyps, references, ("bleu",))["bleu"]
        result[name] = {"sentences": len(sources), "bleu": bleu.score, "signature": bleu.signature}
        if name == "test":
            result[name]["buckets"] = [bucket_score(bucket, sources, hyps, references) for bucket in buckets]
    return result


def bucket_score(bucket: dict, sources: list[str], hyps: list[str], references: list[str]) -> dict:
    from seq2seq.metrics import corpus_scores

    rows = [i for i, source in enumerate(sources) if in_bucket(words(source), bucket)]
    entry = {**bucket, "sentences": len(rows), "bleu": None, "length_ratio": None}
    if rows:
        entry["bleu"] = corpus_scores([hyps[i] for i in rows], [references[i] for i in rows], ("bleu",))["bleu"].score
        entry["length_ratio"] = sum(words(hyps[i]) for i in rows) / max(1, sum(words(references[i]) for i in rows))
    return entry


def piece_lengths(spm: Path, data_dir: Path, args: argparse.Namespace) -> dict:
    """The longest filtered training source / target and test source in the shared model's pieces
    (without BOS / EOS)."""
    from seq2seq.tokenizer import Tokenizer

    tokenizer = Tokenizer.load(spm)
    longest = {}
    for key, split, lang in (("train_src", "train", args.src), ("train_tgt", "train", args.tgt),
                             ("test_src", args.test_split, args.src)):
        longest[f"{key}_max"] = max(map(len, tokenizer.encode_batch(read_lines(data_dir / f"{split}.{lang}"))))
    return longest


def positions_table(record: dict) -> str:
    """Step 4: one row per position encoding; bucket cells are BLEU (length ratio)."""
    n = record["max_src_words"]
    buckets = next(iter(record["runs"].values()))["decode"]["test"]["buckets"] if record["runs"] else []
    header = ["positional", "steps", "train tgt tok/s", f"val <= {n} w BLEU (best, greedy)", "full val BLEU",
              "test BLEU", *(f"{b['words']} w, n={b['sentences']}{' (unseen)' if b['unseen'] else ''}"
                             for b in buckets)]
    rows = []
    for name, run in record["runs"].items():
        t, d = run["train"], run["decode"]
        cells = [f"{b['bleu']:.2f} ({b['length_ratio']:.2f})" if b["sentences"] else "—" for b in d["test"]["buckets"]]
        rows.append([name, t["steps"], f"{t['train_tgt_tokens_per_s']:,.0f}", f"{t['best_valid_bleu']:.2f}",
                     f"{d['valid_full']['bleu']:.2f}", f"{d['test']['bleu']:.2f}", *cells])
    longer, pieces = record["test_longer_than_n"], record["pieces"]
    return (f"Transformer trained on sources of at most {n} words ({record['filtered']['train']['kept']:,} of "
            f"{record['filtered']['train']['pairs']:,} pairs), {record['minutes_per_run']} min each; "
            f"{record['test_split']}: {longer['sentences']} of {longer['of']} sources ({longer['share']:.1%}) "
            f"longer. Longest training source / target {pieces['train_src_max']} / {pieces['train_tgt_max']} "
            f"pieces, test source {pieces['test_src_max']}. Beam 5; bucket cells: BLEU (hypothesis / reference "
            "words).\n\n"
            + markdown_table(header, rows) + "\n")


def run(args: argparse.Namespace) -> dict:
    out = args.out.resolve()
    work = out.with_suffix("")
    data_dir = work / "data"
    test_lengths = [words(s) for s in read_lines(args.data_dir / f"{args.test_split}.{args.src}")]
    longer = sum(length > args.max_src_words for length in test_lengths)
    print(f"{args.test_split}: {longer} of {len(test_lengths)} sources ({longer / len(test_lengths):.1%}) have "
          f"more than {args.max_src_words} words: never seen in training", file=sys.stderr, flush=True)
    record = {**provenance("positions"), "data": display_path(args.data_dir), "pair": f"{args.src}-{args.tgt}",
              "test_split": args.test_split, "max_src_words": args.max_src_words, "minutes_per_run": args.minutes,
              "seed": args.seed, "vocab_size": args.vocab_size, "extra_flags": args.extra,
              "test_longer_than_n": {"sentences": longer, "of": len(test_lengths),
                                     "share": longer / len(test_lengths)},
              "filtered": write_filtered_data(args, data_dir), "runs": {}}
    buckets = length_buckets(args.max_src_words, args.bucket_edges)
    shared_spm = None
    for positional in args.positions:
        run_dir = work / positional
        summary = train_run(positional, args, data_dir, run_dir, shared_spm)
        shared_spm = shared_spm or run_dir / "spm.model"
        record["runs"][positional] = {"train": summary, "decode": decode_run(run_dir, args, buckets)}
        write_record(out, record)  # after every run: a crash keeps what was measured
    record["pieces"] = piece_lengths(shared_spm, data_dir, args)
    table = positions_table(record)
    write_record(out, record, table)
    print(table)
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python benchmarks/bench_positions.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA, required=DEFAULT_DATA is None,
                        help="Multi30k directory of {split}.{lang} files (default: $SEQ2SEQ_MULTI30K)")
    parser.add_argument("--src", default="de")
    parser.add_argument("--tgt", default="en")
    parser.add_argument("--test-split", default="test_2016_flickr")
    parser.add_argument("--max-src-words", type=int, default=14, help="longest training source, words (default: 14)")
    parser.add_argument("--bucket-edges", type=int, nargs="+",
                        help="upper ends of the source-length buckets (default: 7 10 N N+4; N is always one)")
    parser.add_argument("--positions", nargs="+", default=list(POSITIONS), choices=POSITIONS)
    parser.add_argument("--minutes", type=float, default=12.0, help="training budget per run (default: 12)")
    parser.add_argument("--eval-every", type=int, default=400)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--out", type=Path, default=Path("bench-results/positions.json"),
                        help="the JSON record (.md beside it); runs and data go to OUT without its suffix")
    parser.add_argument("extra", nargs="*", help="extra train flags after --, applied to every run")
    args = parser.parse_args(argv)
    args.data_dir = args.data_dir.resolve()
    if args.max_src_words < 1:
        parser.error("--max-src-words must be at least 1")
    missing = [f"{split}.{lang}" for split in ("train", "val", args.test_split) for lang in (args.src, args.tgt)
               if not (args.data_dir / f"{split}.{lang}").is_file()]
    if missing:
        print(f"error: --data-dir {args.data_dir} lacks {', '.join(missing)}; point it at Multi30k", file=sys.stderr)
        return 2
    run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
