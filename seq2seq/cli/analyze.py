"""``seq2seq analyze``: attention statistics per layer and head over a corpus, head importance and
pruning, where attention goes; a report directory (markdown, JSON, plots). See
``seq2seq/jobs/analyze/`` for what the report holds and docs/guides/analyzing.md for the statistics.
"""
from __future__ import annotations

import argparse
import sys

from ..config import DEFAULT_BEAM_SIZE
from .common import add_alignment_flags, add_device_flag, align_config, decode_config, job_config, parser_for, run_cli


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    from ..jobs.analyze import __doc__ as description

    p = parser_for("analyze", description)
    p.add_argument("--checkpoint", nargs="+", required=True, metavar="RUN_OR_CKPT",
                   help="one or more run directories (their best.pt) or .pt files; one report column each")
    p.add_argument("--names", nargs="+", help="one display name per checkpoint (default: run directory names)")
    p.add_argument("--input", required=True, help="source sentences, one per line (empty lines are skipped)")
    p.add_argument("--reference", help="reference translations, parallel to --input: attention and loss are "
                                       "read force-decoding them (default: the models' own translations)")
    p.add_argument("--gold-alignments", "--gold", dest="gold_alignments",
                   help="gold word alignments of --input / --reference (Pharaoh, 0-based src-tgt, one line per "
                        "pair): AER per layer and head")
    p.add_argument("--output-dir", "--output", dest="output_dir", required=True,
                   help="report directory (new, or an earlier report to replace)")
    p.add_argument("--beam-size", type=int, default=DEFAULT_BEAM_SIZE,
                   help=f"beam for translations (without --reference, and for BLEU); 1 = greedy "
                        f"(default: {DEFAULT_BEAM_SIZE})")
    p.add_argument("--batch-size", type=int, default=None,
                   help="sentences per batch (default: 32 force-decoding, 320 / beam size translating)")
    p.add_argument("--bleu-sentences", type=int, default=100,
                   help="BLEU of masked and pruned models on the first N analysed sentences; 0 = no BLEU "
                        "(default: 100)")
    p.add_argument("--max-pruned", type=int, default=None, metavar="K",
                   help="pruning curve up to K heads masked (default: all cross-attention heads)")
    p.add_argument("--function-words", type=int, default=50, metavar="N",
                   help="the N most frequent source words count as function words (default: 50)")
    p.add_argument("--top-words", type=int, default=15, metavar="N",
                   help="list the N source words with the most attention mass (default: 15)")
    add_alignment_flags(p)
    add_device_flag(p)
    p.add_argument("--quiet", action="store_true", help="no progress bars or log lines")
    args = p.parse_args(argv)
    args.align = align_config(args)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    return args


@run_cli
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from ..jobs.analyze import AnalyzeJob, analyze

    analyze(job_config(AnalyzeJob, args, decode=decode_config(args)))  # --beam-size, --batch-size
    return 0
