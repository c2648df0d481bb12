"""When should a sentence's beam search stop? Quality and speed of the stopping rules on one checkpoint
(from the repository root):

    python benchmarks/bench_beam_stop.py --checkpoint RUN/best.pt \\
        --source MULTI30K/test_2016_flickr.de --reference MULTI30K/test_2016_flickr.en

Decodes the sources with greedy search and with beam search under each ``--beam-stop`` rule (``exact``:
once no live hypothesis can end above the n-best finished ones, up to the length bound; ``likely``: once
none would at its current length), in alternating order over ``--rounds`` rounds, one torch thread: test
BLEU (sacrebleu), the sum of the model's scores of the outputs (log P / GNMT lp: higher is a better
search), how many outputs score below greedy's output under the same scoring, and sentences/s (median),
for wide batches and, with ``--batch1-sentences``, one sentence at a time.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import sacrebleu
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import provenance, write_record  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RULES = ("exact", "likely")


def main(argv: list[str] | None = None) -> int:
    from seq2seq.decoding.generator import length_penalty_gnmt
    from seq2seq.decoding.translator import Translator
    from seq2seq.io_utils import markdown_table, read_lines

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--source", required=True)
    parser.add_argument("--reference", required=True)
    parser.add_argument("--beam-size", type=int, default=5)
    parser.add_argument("--length-penalty", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch1-sentences", type=int, default=100, help="0: wide batches only")
    parser.add_argument("--out", type=Path, default=ROOT / "bench-results" / "beam-stop.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    sources, references = read_lines(args.source, "--source"), read_lines(args.reference, "--reference")
    translator = Translator.from_checkpoint(args.checkpoint, device="cpu")
    greedy = translator.translate(sources, beam_size=1, need_attention=False)

    def greedy_scored(t) -> float:  # greedy's output scored as the beam scores it
        return t.log_prob / length_penalty_gnmt(len(t.tokens) + 1, args.length_penalty)

    results = {"greedy": {"bleu": sacrebleu.corpus_bleu([t.text for t in greedy], [references]).score,
                          "model_score": sum(greedy_scored(t) for t in greedy)}}
    speed: dict[str, list[float]] = {f"{rule} {width}": [] for rule in RULES for width in ("wide", "batch 1")}
    for k in range(args.rounds):
        for rule in RULES if k % 2 == 0 else reversed(RULES):
            options = dict(beam_size=args.beam_size, length_penalty=args.length_penalty, beam_stop=rule,
                           need_attention=False)
            start = time.perf_counter()
            beam = translator.translate(sources, **options)
            speed[f"{rule} wide"].append(len(sources) / (time.perf_counter() - start))
            results[rule] = {"bleu": sacrebleu.corpus_bleu([t.text for t in beam], [references]).score,
                             "model_score": sum(t.score for t in beam),
                             "below_greedy": sum(b.score < greedy_scored(g) - 1e-4 for g, b in zip(greedy, beam))}
            if args.batch1_sentences:
                start = time.perf_counter()
                translator.translate(sources[:args.batch1_sentences], batch_size=1, **options)
                speed[f"{rule} batch 1"].append(args.batch1_sentences / (time.perf_counter() - start))
    for rule in RULES:
        for width in ("wide", "batch 1"):
            if speed[f"{rule} {width}"]:
                results[rule][f"sentences/s {width}"] = statistics.median(speed[f"{rule} {width}"])
    record = {**provenance("beam-stop"), "checkpoint": args.checkpoint, "source": args.source,
              "sentences": len(sources), "beam_size": args.beam_size, "length_penalty": args.length_penalty,
              "rounds": args.rounds, "per_round": speed, "results": results}
    rows = [[name, f"{r['bleu']:.2f}", f"{r['model_score']:.2f}", r.get("below_greedy", "-"),
             *(f"{r[key]:.1f}" if key in r else "-" for key in ("sentences/s wide", "sentences/s batch 1"))]
            for name, r in results.items()]
    text = (f"Beam {args.beam_size}, length penalty {args.length_penalty}, {len(sources)} sentences, one thread, "
            f"median of {args.rounds} rounds (benchmarks/bench_beam_stop.py).\n\n"
            + markdown_table(["search", "BLEU", "sum of model scores", "below greedy", "sentences/s wide",
                              "sentences/s batch 1"], rows) + "\n")
    write_record(args.out, record, text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
