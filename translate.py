#!/usr/bin/env python
"""Translate text with a trained checkpoint; a Unix filter when no --input/--output is given.

    echo "Ein Hund läuft." | python translate.py --checkpoint checkpoints/run/best.pt
    python translate.py --checkpoint RUN --input test.de --output test.hyp --reference test.en --beam-size 5
    python translate.py --checkpoint RUN --input test.de --alignments align.jsonl --plot-dir plots/
    python translate.py --checkpoint RUN --input test.de --alignments align.jsonl --attribution gradient occlusion
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
    p.add_argument("--batch-size", type=int, default=None,
                   help="sentences per batch (default: 320 / beam size: 320 greedy, 64 with beam 5)")
    p.add_argument("--max-len-ratio", type=float, default=1.5,
                   help="output length bound: ratio * source subwords + 10 (default: 1.5)")
    p.add_argument("--max-input-tokens", type=int, default=250,
                   help="longer inputs are cut to this many subwords, with a warning (default: 250)")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda (default: auto)")
    p.add_argument("--shortlist", nargs="?", const="auto", default=None, metavar="FILE",
                   help="decode each batch over the target tokens its sources can produce (a lexical "
                        "shortlist; faster, outputs may differ slightly). Without FILE: the run's "
                        "shortlist.npz next to the checkpoint (train.py writes it; build others with "
                        "python -m seq2seq.shortlist)")
    p.add_argument("--shortlist-sizes", nargs=2, type=int, metavar=("K", "N"), default=None,
                   help="with --shortlist: K translations per source token and the N most frequent "
                        "target tokens (default: 30 300; smaller is faster, see README Speed)")
    p.add_argument("--precision", default="fp32", choices=["fp32", "fp16", "bf16", "int8"],
                   help="decoding precision (default: fp32). fp16 halves the bytes each step reads: on CPU "
                        "it speeds up one-sentence-at-a-time decoding (--batch-size 1, interactive use) "
                        "~1.8-2.5x with 97-99%% identical outputs, but slows wide CPU batches ~3x. int8 (CPU "
                        "only) quantizes the linear layers: greedy and beam 5 1.35-1.8x faster (batch 1: RNN "
                        "~3x, Transformer ~1.1x), BLEU within 0.3 of fp32; see README Speed")
    p.add_argument("--reference", help="reference file: print sacrebleu BLEU and chrF with signatures")
    a = p.add_argument_group(
        "alignments and attribution",
        "Attention is exported per sentence as the raw (layers, heads, tgt+1, src+1) array and as one "
        "aggregate matrix, merged to words, from which hard links are read. The default aggregate is "
        "the penultimate decoder layer averaged over its heads: Garg et al. (2019) found it aligns "
        "best (the last layer attends to what is useful for predicting the next word, not to its "
        "translation); a one-layer model (every RNN) uses its only layer.")
    a.add_argument("--alignments", metavar="FILE",
                   help="write alignments/attention as JSONL here (+ .npz arrays beside it), atomically")
    a.add_argument("--plot-dir", metavar="DIR",
                   help="write word-level heatmaps per sentence here: NNNNN.png/.svg, NNNNN_grid.png "
                        "(layers x heads, multi-head models), NNNNN_attribution.png (with --attribution)")
    a.add_argument("--layer", default="-2",
                   help="decoder layer for the aggregate: index (negative counts from the top) or 'all' "
                        "(mean of all layers) (default: -2, the penultimate; the only layer of an RNN)")
    a.add_argument("--heads", default="mean",
                   help="'mean' (average all heads) or comma-separated head indices to average (default: mean)")
    a.add_argument("--include-eos", action="store_true",
                   help="keep the source EOS column and target EOS row in matrices and links "
                        "(default: dropped, so EOS never appears as an alignment point)")
    a.add_argument("--align-method", choices=("argmax", "threshold"), default="argmax",
                   help="hard links: argmax = one source word per target word; threshold = every source "
                        "word with at least --align-threshold of the (renormalized) row (default: argmax)")
    a.add_argument("--align-threshold", type=float, default=0.3,
                   help="share of a row for --align-method threshold (default: 0.3)")
    a.add_argument("--attribution", nargs="+", metavar="METHOD",
                   choices=("gradient", "integrated-gradients", "occlusion"),
                   help="also compute attribution matrices (gradient | integrated-gradients | occlusion, "
                        "one or more) into the --alignments export and --plot-dir; see seq2seq/attribution.py")
    a.add_argument("--ig-steps", type=int, default=16,
                   help="integration steps for integrated-gradients (default: 16)")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    return p.parse_args(argv)


@run_cli
def main(argv=None) -> int:
    translate_stream(parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
