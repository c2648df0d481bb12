"""``seq2seq compare``: a side-by-side report of several trained systems on one test set
(BLEU / chrF with significance, length buckets, attention plots, optionally AER). See
``seq2seq/jobs/compare/`` for what the report holds.
"""
from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from ..config import DEFAULT_BEAM_SIZE
from .common import DeprecatedAlias, add_device_flag, decode_config, job_config, parser_for, run_cli

if TYPE_CHECKING:
    from ..jobs.compare.job import CompareJob


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The options of ``seq2seq compare`` (``main`` turns them into the ``CompareJob`` that ``compare`` takes)."""
    from ..jobs.compare import BUDGET_MINUTES, DEFAULT_BUCKETS, __doc__ as description

    parser = parser_for("compare", description)
    parser.add_argument("runs", nargs="+", metavar="RUN_OR_CKPT",
                        help="run directories (their best.pt) or .pt files; the first is the baseline")
    parser.add_argument("--source", help="test source file, one sentence per line")
    parser.add_argument("--reference", help="test reference file, parallel to --source")
    parser.add_argument("--data-dir", help="instead of --source/--reference: DIR/SPLIT.SRC and DIR/SPLIT.TGT")
    parser.add_argument("--src", help="source language suffix with --data-dir (e.g. de)")
    parser.add_argument("--tgt", help="target language suffix with --data-dir (e.g. en)")
    parser.add_argument("--split", default="test_2016_flickr", help="file stem with --data-dir (default: %(default)s)")
    parser.add_argument("--output", help="report directory (new, or an earlier report to replace); required")
    parser.add_argument("--out", dest="output", action=DeprecatedAlias, new="--output")
    parser.add_argument("--names", nargs="+", help="one display name per system (default: run directory names)")
    parser.add_argument("--beam-size", type=int, default=DEFAULT_BEAM_SIZE,
                        help=f"beam for the scored translations (default: {DEFAULT_BEAM_SIZE})")
    parser.add_argument("--batch-size", type=int, default=None,
                        help="sentences per decoding batch (default: 320 / beam size, as seq2seq translate)")
    choice = parser.add_mutually_exclusive_group()
    choice.add_argument("--sentences", type=int, default=3,
                        help="plot the N sentences whose chrF differs most between systems (default: 3)")
    choice.add_argument("--sentence-ids", type=int, nargs="+", help="plot these sentences (0-based line numbers)")
    parser.add_argument("--gold", help="gold word alignments (Pharaoh, src-tgt, 0-based, one line per pair): "
                                       "report AER")
    parser.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples (default: 1000)")
    parser.add_argument("--ar-trials", type=int, default=10000,
                        help="approximate randomization trials (default: 10000)")
    parser.add_argument("--length-buckets", type=int, nargs="+", default=list(DEFAULT_BUCKETS), metavar="N",
                        help="upper bounds of the source-length buckets in words (default: 10 15 20 30)")
    parser.add_argument("--budgets", type=float, nargs="+", default=list(BUDGET_MINUTES), metavar="MIN",
                        help="training budgets (minutes) at which the report reads each run's validation BLEU "
                             "(default: 5 10 20 40 90)")
    add_device_flag(parser)
    parser.add_argument("--quiet", action="store_true", help="no progress bars or log lines")
    args = parser.parse_args(argv)
    if not args.output:
        parser.error("the following arguments are required: --output")
    args.argv = list(sys.argv[1:] if argv is None else argv)
    return args


@run_cli
def main(argv: list[str] | None = None) -> int:
    job = job_from_args(parse_args(argv))
    from ..jobs.compare import compare

    compare(job)
    return 0


def job_from_args(args: argparse.Namespace) -> CompareJob:
    """The flags as the ``CompareJob`` that ``seq2seq.jobs.compare.compare`` takes."""
    from ..jobs.compare.job import CompareJob

    return job_config(CompareJob, args, decode=decode_config(args))  # --beam-size, --batch-size
