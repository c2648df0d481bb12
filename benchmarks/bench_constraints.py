"""Terminology constraints (``seq2seq translate --constraints``) on a terminology test built from
Multi30k: what forcing reference terms into the output costs and changes (from the repository root):

    python benchmarks/bench_constraints.py --checkpoint RUN [RUN ...] [--data-dir MULTI30K]
        [--split test_2016_flickr] [--sentences 1000] [--terms 1] [--beam-size 5] [--repeats 2] [--out FILE]

The test: for every sentence, the ``--terms`` rarest words of its reference (by frequency in the
training split's target side; alphabetic, at least 4 letters, punctuation stripped) become its
constraints, in reference order, the way a terminology list pins a client's terms. For each
checkpoint, with beam ``--beam-size``:

- **already met**: the share of sentences whose unconstrained output contains every term (what the
  constraints need not do);
- **BLEU / chrF** of the unconstrained and the constrained outputs (sacreBLEU) and the share of
  constrained outputs that contain every term (must be 100 %);
- **cost**: sentences/s of both searches on the same sentences, interleaved ``--repeats`` times
  (plain, constrained, plain, ...) so that machine drift hits both; the record keeps every repeat.

The record (``--out``, JSON + markdown) holds the machine, the commands and the terms chosen.
"""
from __future__ import annotations

import argparse
import re
import sys
import time
from collections import Counter
from pathlib import Path

import torch

from common import add_multi30k_flags, provenance, write_record
from seq2seq.io_utils import display_path, markdown_table, read_lines

WORD = re.compile(r"[^\W\d_]{4,}")


def pick_terms(references: list[str], train_targets: list[str], count: int) -> list[list[str]]:
    """Per reference, its ``count`` rarest words (by training frequency, ties by position) in reference order."""
    frequency = Counter(w for line in train_targets for w in WORD.findall(line))
    terms = []
    for reference in references:
        words = list(dict.fromkeys(WORD.findall(reference)))
        rarest = sorted(words, key=lambda w: (frequency[w], words.index(w)))[:count]
        terms.append([w for w in words if w in rarest])
    return terms


def contains_all(text: str, phrases: list[str]) -> bool:
    return all(p in text for p in phrases)


def measure(translator, sources: list[str], references: list[str], terms: list[list[str]], args) -> dict:
    from seq2seq.metrics import corpus_scores

    options = dict(beam_size=args.beam_size, need_attention=False)
    timings: dict[str, list[float]] = {"plain": [], "constrained": []}
    outputs: dict[str, list[str]] = {}
    for _ in range(args.repeats):
        for label, extra in (("plain", {}), ("constrained", {"constraints": terms, "ordered_constraints": True})):
            start = time.perf_counter()
            outputs[label] = [t.text for t in translator.translate(sources, **options, **extra)]
            timings[label].append(len(sources) / (time.perf_counter() - start))
    result = {}
    for label, texts in outputs.items():
        scores = corpus_scores(texts, references, ("bleu", "chrf"))
        result[label] = {"bleu": scores["bleu"].score, "chrf": scores["chrf"].score,
                         "sentences_per_s": max(timings[label]), "sentences_per_s_repeats": timings[label],
                         "terms_met": sum(contains_all(t, p) for t, p in zip(texts, terms)) / len(texts)}
    result["cost"] = result["plain"]["sentences_per_s"] / result["constrained"]["sentences_per_s"]
    result["examples"] = [{"source": s, "terms": p, "plain": a, "constrained": b}
                          for s, p, a, b in list(zip(sources, terms, outputs["plain"], outputs["constrained"]))[:5]]
    return result


def table(record: dict) -> str:
    rows = []
    for name, r in record["checkpoints"].items():
        for label in ("plain", "constrained"):
            rows.append([name, label, f"{r[label]['terms_met']:.1%}", f"{r[label]['bleu']:.2f}",
                         f"{r[label]['chrf']:.2f}", f"{r[label]['sentences_per_s']:.1f}"])
        rows.append([name, "cost", "", f"{r['constrained']['bleu'] - r['plain']['bleu']:+.2f}",
                     f"{r['constrained']['chrf'] - r['plain']['chrf']:+.2f}", f"{r['cost']:.2f}x slower"])
    header = (f"{record['sentences']} sentences of {record['split']}, {record['terms_per_sentence']} term(s) each "
              f"(rarest reference words), beam {record['beam_size']}, {record['machine']['cpu']}, "
              f"{record['machine']['torch_threads']} threads\n\n")
    return header + markdown_table(["checkpoint", "search", "outputs with every term", "BLEU", "chrF",
                                    "sentences/s"], rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_multi30k_flags(parser)
    parser.add_argument("--checkpoint", nargs="+", required=True, type=Path, help="run directories or .pt files")
    parser.add_argument("--split", default=None, help="the split to test on (default: --test-split)")
    parser.add_argument("--sentences", type=int, default=1000)
    parser.add_argument("--terms", type=int, default=1, help="terms per sentence (default: 1)")
    parser.add_argument("--beam-size", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=2, help="interleaved timing repeats (default: 2)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--out", type=Path, default=Path("bench-results/constraints.json"))
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    from seq2seq.decoding.translator import Translator

    split = args.split or args.test_split
    sources = read_lines(args.data_dir / f"{split}.{args.src}")[: args.sentences]
    references = read_lines(args.data_dir / f"{split}.{args.tgt}")[: args.sentences]
    terms = pick_terms(references, read_lines(args.data_dir / f"train.{args.tgt}"), args.terms)
    record = {**provenance("constraints"), "split": split, "sentences": len(sources), "beam_size": args.beam_size,
              "terms_per_sentence": args.terms, "terms": terms, "checkpoints": {}}
    for checkpoint in args.checkpoint:
        translator = Translator.from_checkpoint(checkpoint, device="cpu")
        name = display_path(checkpoint)
        record["checkpoints"][name] = measure(translator, sources, references, terms, args)
        write_record(args.out, record, table(record))  # after every checkpoint
        print(table(record), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
