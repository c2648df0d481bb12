"""Tag placement of ``translate --markup`` against gold word alignments (from the repository root):

    python benchmarks/bench_markup.py --checkpoint RUN [RUN2 ...] --data-dir MULTI30K [--eflomal]
        [--gold examples/gold-alignments/multi30k-val-de-en.100.align] [--spans 3] [--seed 0]
        [--align-method argmax grow ...] [--align-threshold 0 0.2 ...]
        [--backward-checkpoint RUN_EN_DE [--symmetrize RULE ...]]

1. The gold pairs: the first lines of ``--gold-split`` (val), one Pharaoh line each (sure ``i-j``,
   possible ``i?j``; examples/gold-alignments/README.md).
2. Per pair, ``--spans`` random source spans of 1-3 words (seeded), as if each were wrapped in a tag;
   spans whose words have no gold link are skipped. Where the tag belongs: the smallest run of
   reference words covering every word gold-linked (sure or possible) to the span.
3. The reference is forced as the output (a teacher-forced pass, ``forced_alignment.force_align_words``: the
   attention ``translate --alignments`` would read, with the model's supervised heads for a guided
   checkpoint, links read as for tags: ``AlignConfig.for_markup``) and the tag placed by the product's own
   rule (``decoding.markup.transfer``). Also with eflomal's links (``--eflomal``: ``seq2seq wordalign`` on
   the training split plus the gold pairs, grow-diag-final-and) as a reference point.
4. Per system (and the gold's sure links alone, a ceiling for links that mark no possible ones): exact-span
   accuracy, mean overlap (Jaccard of word sets; an empty placement counts as
   a point, overlap 0), the share of outputs that are well formed (must be 1), ``--out`` (JSON + md).
"""
from __future__ import annotations

import argparse
import itertools
import random
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

from common import ROOT, add_multi30k_flags, provenance, write_record

from seq2seq.alignment.links import read_gold_alignments, read_pharaoh_file
from seq2seq.config import LINK_METHODS, MARKUP_SYMMETRIZATION, MODEL_SYMMETRIZATIONS, AlignConfig, link_share
from seq2seq.decoding.markup import Element, render, transfer
from seq2seq.io_utils import markdown_table, read_lines


def spans(sources: list[str], gold: list[set], count: int, seed: int) -> list[tuple[int, int, int, tuple]]:
    """(pair, start, end, gold target span) for ``count`` random source spans per pair."""
    rng = random.Random(seed)
    out = []
    for k, (source, links) in enumerate(zip(sources, gold)):
        n = len(source.split())
        for _ in range(count):
            width = rng.randint(1, min(3, n))
            start = rng.randrange(n - width + 1)
            targets = sorted({j for i, j in links if start <= i < start + width})
            if targets:
                out.append((k, start, start + width, (targets[0], targets[-1] + 1)))
    return out


def score(cases, links: list[set], sources: list[str], targets: list[str]) -> dict:
    exact = overlap = formed = 0
    for k, start, end, (gold_start, gold_end) in cases:
        element = Element("<b>", "</b>", start, end)
        words = targets[k].split()
        transfer([element], links[k], len(sources[k].split()), len(words))
        placed = set(range(element.target_start, element.target_end))
        wanted = set(range(gold_start, gold_end))
        exact += placed == wanted
        overlap += len(placed & wanted) / len(placed | wanted)
        try:
            ET.fromstring(f"<r>{render(words, [element])}</r>")
            formed += 1
        except ET.ParseError:
            pass
    n = len(cases)
    return {"spans": n, "exact": exact / n, "overlap": overlap / n, "well_formed": formed / n}


def eflomal_links(args: argparse.Namespace, sources: list[str], targets: list[str]) -> list[set]:
    """eflomal on train + the gold pairs (grow-diag-final-and); the gold pairs' links."""
    train_src = read_lines(args.data_dir / f"train.{args.src}")
    train_tgt = read_lines(args.data_dir / f"train.{args.tgt}")
    with tempfile.TemporaryDirectory() as tmp:
        src, tgt, out = Path(tmp) / "src", Path(tmp) / "tgt", Path(tmp) / "out.talp"
        src.write_text("\n".join(train_src + sources) + "\n", encoding="utf-8")
        tgt.write_text("\n".join(train_tgt + targets) + "\n", encoding="utf-8")
        subprocess.run([sys.executable, "-m", "seq2seq", "wordalign", "--source", str(src), "--target", str(tgt),
                        "--output", str(out)], check=True, cwd=ROOT)
        sure, possible = read_pharaoh_file(out)
    return [s | p for s, p in zip(sure, possible)][len(train_src):]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_multi30k_flags(parser)
    parser.add_argument("--checkpoint", nargs="+", type=Path, default=[], help="runs or .pt files to measure")
    parser.add_argument("--gold", type=Path, default=ROOT / "examples/gold-alignments/multi30k-val-de-en.100.align")
    parser.add_argument("--gold-split", default="val")
    parser.add_argument("--spans", type=int, default=3, help="random source spans per pair (default: 3)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eflomal", action="store_true", help="also place tags by eflomal's links")
    parser.add_argument("--align-method", nargs="+", choices=LINK_METHODS, default=[AlignConfig.method],
                        help=f"how links are read from each model's attention; several: one row each (default: "
                             f"{AlignConfig.method})")
    parser.add_argument("--align-threshold", nargs="+", type=float, default=[None],
                        help="shares for the link methods, one row each (default: as translate --markup reads them)")
    parser.add_argument("--backward-checkpoint", type=Path, help="a target->source model: also place tags by each "
                        "model's links symmetrized with its links (--symmetrize)")
    parser.add_argument("--symmetrize", nargs="+", choices=MODEL_SYMMETRIZATIONS, default=[MARKUP_SYMMETRIZATION],
                        help=f"rules for --backward-checkpoint, one row each (default: {MARKUP_SYMMETRIZATION})")
    parser.add_argument("--out", type=Path, default=ROOT / "bench-results" / "markup.json")
    args = parser.parse_args(argv)
    count = len(read_lines(args.gold))
    sources = read_lines(args.data_dir / f"{args.gold_split}.{args.src}")[:count]
    targets = read_lines(args.data_dir / f"{args.gold_split}.{args.tgt}")[:count]
    sure, possible = read_gold_alignments(args.gold, sources, targets)
    cases = spans(sources, possible, args.spans, args.seed)  # possible includes sure
    # a ceiling for any aligner: the gold's own sure links place the tags (the spans count possible links too)
    results = {"gold, sure links only": score(cases, sure, sources, targets)}
    if args.eflomal:
        results["eflomal"] = score(cases, eflomal_links(args, sources, targets), sources, targets)
    from seq2seq.decoding.translator import Translator
    from seq2seq.alignment.links import extract_links
    from seq2seq.decoding.forced_alignment import BackwardAligner, force_align_words

    for checkpoint in args.checkpoint:
        translator = Translator.from_checkpoint(checkpoint, device="cpu")
        for method, threshold in itertools.product(args.align_method, args.align_threshold):
            chosen = AlignConfig(method=method, threshold=threshold, model_default=True)
            align = chosen.for_model(translator.supervised_attention).for_markup()
            words = force_align_words(translator, sources, targets, align.layer, align.heads)
            links = [extract_links(m, align.method, align.threshold) for m in words]
            name = checkpoint.name if checkpoint.is_dir() else checkpoint.parent.name
            share = link_share(method, align.threshold)
            name += f" ({method}{'' if share is None else f' {share:g}'})" if len(args.align_method) > 1 or \
                len(args.align_threshold) > 1 else ""
            results[name] = {**score(cases, links, sources, targets), "layer": str(align.layer),
                             "heads": str(align.heads), "method": method, "threshold": share}
            print(f"{name}: {results[name]}", file=sys.stderr, flush=True)
            if args.backward_checkpoint:
                other = Translator.from_checkpoint(args.backward_checkpoint, device="cpu")
                backward = BackwardAligner(translator, other, chosen)
                back = backward.backward_words(sources, targets)
                for rule in args.symmetrize:
                    both = [backward.combined(f, m, b, markup=True, rule=rule) for f, m, b in zip(links, words, back)]
                    results[f"{name} + backward, {rule}"] = {**score(cases, both, sources, targets), "method": method,
                                                             "symmetrize": rule}
                    print(f"{name} + backward, {rule}: {results[f'{name} + backward, {rule}']}", file=sys.stderr)
    record = {**provenance("markup"), "gold": str(args.gold.relative_to(ROOT) if args.gold.is_relative_to(ROOT)
                                                  else args.gold), "pairs": count, "spans_per_pair": args.spans,
              "seed": args.seed, "results": results}
    rows = [[name, r["spans"], f"{100 * r['exact']:.1f}%", f"{100 * r['overlap']:.1f}%",
             f"{100 * r['well_formed']:.0f}%"] for name, r in results.items()]
    table = (f"Tag placement on {count} gold pairs ({args.gold_split}), {args.spans} random spans of 1-3 source "
             f"words per pair (seed {args.seed}), the reference forced as the output.\n\n"
             + markdown_table(["links from", "spans", "exact span", "overlap", "well formed"], rows))
    write_record(args.out, record, table)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
