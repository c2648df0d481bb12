"""Alignments from models adapted to the pairs they align (``seq2seq.adapt``, ``align --adapt-steps``), against
gold word alignments (from the repository root):

    python benchmarks/bench_adapt.py --checkpoint RUN --backward-checkpoint RUN_EN_DE --data-dir MULTI30K
        [--gold examples/gold-alignments/multi30k-val-de-en.100.align] [--steps 0 50 100 200] [--lr 3e-4 1e-4]
        [--out FILE.json]

For each (steps, learning rate): the forward model and, with ``--backward-checkpoint``, the backward one are
adapted to the gold pairs (the first lines of ``--gold-split``, val; ``--pairs N``: the first N lines, the gold
pairs among them) by ``steps`` updates of the translation
loss alone, and the links ``seq2seq align`` reads (the supervised heads, ``--align-method`` grow 0.2) are
scored: forward alone and both directions by agreement (``BackwardAligner``). Steps 0 is the model as trained.
Also the seconds each adaptation took on this machine (CPU model in the record). ``--out``: JSON + md.
"""
from __future__ import annotations

import argparse
import itertools
import time
from pathlib import Path

from bench_alignment import default_alignment
from common import ROOT, add_multi30k_flags, provenance, write_record

from seq2seq import BackwardAligner, Translator, adapt
from seq2seq.alignment.links import alignment_error_rate, read_gold_alignments
from seq2seq.config import ADAPT_LR
from seq2seq.decoding.forced_alignment import force_align
from seq2seq.io_utils import markdown_table, read_lines


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_multi30k_flags(parser)
    parser.add_argument("--checkpoint", required=True, help="source->target run or checkpoint")
    parser.add_argument("--backward-checkpoint", help="target->source run or checkpoint (agreement links)")
    parser.add_argument("--gold", type=Path, default=ROOT / "examples/gold-alignments/multi30k-val-de-en.100.align")
    parser.add_argument("--gold-split", default="val")
    parser.add_argument("--steps", type=int, nargs="+", default=[0, 50, 100, 200])
    parser.add_argument("--lr", type=float, nargs="+", default=[ADAPT_LR])
    parser.add_argument("--pairs", type=int, default=0,
                        help="adapt to the first N pairs of --gold-split (at least the gold's; default: the gold's)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", type=Path, default=ROOT / "bench-results" / "adapt" / "adapt.json")
    return parser.parse_args(argv)


def score(translator: Translator, sources: list[str], targets: list[str], sure, possible) -> dict:
    """AER of the links ``seq2seq align`` reads by default (a guided model's supervised heads)."""
    links = force_align(translator, sources, targets, *default_alignment(translator))
    return vars(alignment_error_rate(links, sure, possible))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    count = len(read_lines(args.gold))
    pairs = max(args.pairs, count)
    sources = read_lines(args.data_dir / f"{args.gold_split}.{args.src}")[:pairs]
    targets = read_lines(args.data_dir / f"{args.gold_split}.{args.tgt}")[:pairs]
    if len(sources) < pairs:
        raise SystemExit(f"--pairs {pairs}: {args.gold_split} has only {len(sources)} pairs")
    sure, possible = read_gold_alignments(args.gold, sources[:count], targets[:count])
    forward = Translator.from_checkpoint(args.checkpoint, device=args.device)
    backward = (Translator.from_checkpoint(args.backward_checkpoint, device=args.device)
                if args.backward_checkpoint else None)
    record = {**provenance("adapt"), "pairs": count, "adapted_pairs": pairs, "results": []}
    rows = []
    for steps, lr in itertools.product(args.steps, args.lr):
        if steps == 0 and lr != args.lr[0]:
            continue  # the unadapted model once
        started = time.perf_counter()
        fw = adapt(forward, sources, targets, steps, lr)
        entry = {"steps": steps, "lr": lr, "forward_s": round(time.perf_counter() - started, 1),
                 "forward": score(fw, sources[:count], targets[:count], sure, possible)}
        if backward is not None:
            started = time.perf_counter()
            bw = adapt(backward, targets, sources, steps, lr)
            entry["backward_s"] = round(time.perf_counter() - started, 1)
            links = BackwardAligner(fw, bw).aligned(sources[:count], targets[:count])
            entry["agreement"] = vars(alignment_error_rate(links, sure, possible))
        record["results"].append(entry)
        rows.append([steps, lr if steps else "", f"{entry['forward']['aer']:.4f}",
                     f"{entry['agreement']['aer']:.4f}" if "agreement" in entry else "",
                     round(entry["forward_s"] + entry.get("backward_s", 0), 1)])
        print(f"steps {steps} lr {lr}: forward {entry['forward']['aer']:.4f}"
              + (f" agreement {entry['agreement']['aer']:.4f}" if "agreement" in entry else ""), flush=True)
        table = (f"AER on {count} gold pairs ({args.gold_split}) after adapting to the first {pairs}; "
                 f"{record['machine'].get('cpu', '')}\n\n"
                 + markdown_table(["steps", "lr", "forward AER", "agreement AER", "adapting s (both)"], rows))
        write_record(args.out, record, table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
