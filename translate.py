#!/usr/bin/env python
"""Translate text with a trained checkpoint; a Unix filter when no --input/--output is given.

    echo "Ein Hund läuft." | python translate.py --checkpoint checkpoints/run/best.pt
    python translate.py --checkpoint RUN --input test.de --output test.hyp --reference test.en --beam-size 5
    python translate.py --checkpoint RUN --input test.de --alignments align.jsonl --plot-dir plots/
"""
import argparse
import sys

from seq2seq.cli import run_cli
from seq2seq.translate_cli import translate_stream


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True, help="a .pt checkpoint or a run directory (uses best.pt)")
    p.add_argument("--input", default="-", help="input file, one sentence per line (default: stdin)")
    p.add_argument("--output", default="-", help="output file (default: stdout); written atomically")
    p.add_argument("--beam-size", type=int, default=5, help="1 = greedy (default: 5)")
    p.add_argument("--length-penalty", type=float, default=1.0, help="GNMT length penalty alpha (default: 1.0)")
    p.add_argument("--n-best", type=int, default=1, help="output K hypotheses per line as 'i ||| text ||| score'")
    p.add_argument("--batch-size", type=int, default=64, help="sentences per batch (default: 64)")
    p.add_argument("--max-len-ratio", type=float, default=1.5,
                   help="output length bound: ratio * source subwords + 10 (default: 1.5)")
    p.add_argument("--max-input-tokens", type=int, default=250,
                   help="longer inputs are cut to this many subwords, with a warning (default: 250)")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda (default: auto)")
    p.add_argument("--reference", help="reference file: print sacrebleu BLEU and chrF with signatures")
    p.add_argument("--alignments", help="write alignments/attention as JSONL here (+ .npz arrays beside it)")
    p.add_argument("--plot-dir", help="write one attention heatmap per sentence (PNG and SVG) here")
    p.add_argument("--layer", default="-2",
                   help="Transformer layer for the aggregate alignment: index, or 'all' (default: -2)")
    p.add_argument("--heads", default="mean", help="'mean' or comma-separated head indices (default: mean)")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    return p.parse_args(argv)


@run_cli
def main(argv=None) -> int:
    translate_stream(parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
