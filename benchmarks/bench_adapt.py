"""Alignments from models adapted to the pairs they align (``seq2seq.adapt``, ``align --adapt-steps``), against
gold word alignments (from the repository root):

    python benchmarks/bench_adapt.py --checkpoint RUN --backward-checkpoint RUN_EN_DE --data-dir MULTI30K
        [--gold examples/gold-alignments/multi30k-val-de-en.100.align] [--steps 0 50 100 200] [--lr 3e-4 1e-4]
        [--pairs N] [--adapt-pairs K ...] [--out FILE.json]

For each (steps, learning rate, pairs per copy): the forward model and, with ``--backward-checkpoint``, the
backward one are adapted to the gold pairs (the first lines of ``--gold-split``, val; ``--pairs N``: the first N
lines, the gold pairs among them; ``--adapt-pairs K``: a copy per chunk of K consecutive pairs, as ``align
--adapt-pairs``) by ``steps`` updates of the translation loss alone, and the links ``seq2seq align`` reads (the
supervised heads, ``--align-method`` grow 0.2) are scored: forward alone and both directions by agreement
(``BackwardAligner``). Steps 0 is the model as trained. Also the seconds each adaptation took on this machine
(CPU model in the record). ``--out``: JSON + md.
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
from seq2seq.config import ADAPT_LR, AlignConfig
from seq2seq.decoding.forced_alignment import force_align
from seq2seq.io_utils import markdown_table, read_lines
from seq2seq.training.adapt import chunks


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_multi30k_flags(parser)
    parser.add_argument("--checkpoint", required=True, help="source->target run or checkpoint")
    parser.add_argument("--backward-checkpoint", help="target->source run or checkpoint (agreement links)")
    parser.add_argument("--gold", type=Path, default=ROOT / "examples/gold-alignments/multi30k-val-de-en.100.align")
    parser.add_argument("--gold-split", default="val")
    parser.add_argument("--steps", type=int, nargs="+", default=[0, 50, 100, 200])
    parser.add_argument("--lr", type=float, nargs="+", default=[ADAPT_LR])
    parser.add_argument("--adapt-pairs", type=int, nargs="+", default=[0],
                        help="a copy adapted to each chunk of this many consecutive pairs, as align --adapt-pairs "
                             "(0, the default: one copy for all --pairs)")
    parser.add_argument("--pairs", type=int, default=0,
                        help="adapt to the first N pairs of --gold-split (at least the gold's; default: the gold's)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", type=Path, default=ROOT / "bench-results" / "adapt" / "adapt.json")
    return parser.parse_args(argv)


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
    for steps, lr, size in itertools.product(args.steps, args.lr, args.adapt_pairs):
        if steps == 0 and (lr, size) != (args.lr[0], args.adapt_pairs[0]):
            continue  # the unadapted model once
        forward_links, agreement_links, seconds = [], [], {"forward_s": 0.0, "backward_s": 0.0}
        for chunk in chunks(pairs, size) if steps else [range(count)]:
            if chunk.start >= count:
                break  # the gold pairs are aligned: the later chunks are not scored
            src, tgt = sources[chunk.start:chunk.stop], targets[chunk.start:chunk.stop]
            started = time.perf_counter()
            fw = adapt(forward, src, tgt, steps, lr)
            seconds["forward_s"] += time.perf_counter() - started
            forward_links += force_align(fw, src, tgt, AlignConfig(*default_alignment(fw)))  # layer, heads
            if backward is not None:
                started = time.perf_counter()
                bw = adapt(backward, tgt, src, steps, lr)
                seconds["backward_s"] += time.perf_counter() - started
                agreement_links += BackwardAligner(fw, bw).aligned(src, tgt)
        entry = {"steps": steps, "lr": lr, "adapt_pairs": size, **{k: round(v, 1) for k, v in seconds.items()},
                 "forward": vars(alignment_error_rate(forward_links[:count], sure, possible))}
        if backward is not None:
            entry["agreement"] = vars(alignment_error_rate(agreement_links[:count], sure, possible))
        record["results"].append(entry)
        rows.append([steps, lr if steps else "", size or pairs if steps else "", f"{entry['forward']['aer']:.4f}",
                     f"{entry['agreement']['aer']:.4f}" if "agreement" in entry else "",
                     round(entry["forward_s"] + entry["backward_s"], 1)])
        print(f"steps {steps} lr {lr} chunks of {size or pairs}: forward {entry['forward']['aer']:.4f}"
              + (f" agreement {entry['agreement']['aer']:.4f}" if "agreement" in entry else ""), flush=True)
        table = (f"AER on {count} gold pairs ({args.gold_split}) after adapting to the first {pairs} (a copy per "
                 f"chunk of consecutive pairs); {record['machine'].get('cpu', '')}\n\n"
                 + markdown_table(["steps", "lr", "pairs per copy", "forward AER", "agreement AER",
                                   "adapting s (both, gold chunks)"], rows))
        write_record(args.out, record, table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
