"""``seq2seq fairness``: counterfactual gender probes of trained models: each input sentence that names a
group is translated as written and with its group terms swapped (man <-> woman, er <-> sie, articles and
adjective endings agreeing); the report says whether the output carries the swap (faithfulness), what else
changed (stability), where the changed words look (attention and attribution on the swapped word) and, for
English -> German, whether occupations follow the pronoun (WinoMT-style). docs/guides/fairness.md.

    seq2seq fairness --checkpoint RUN_RNN RUN_TRANSFORMER --input val.en --output-dir fairness
"""
from __future__ import annotations

import argparse
import sys

from ..config import DEFAULT_BEAM_SIZE
from .common import add_alignment_flags, add_device_flag, align_config, decode_config, job_config, parser_for, run_cli


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = parser_for("fairness", __doc__)
    p.add_argument("--checkpoint", nargs="+", required=True, metavar="RUN_OR_CKPT",
                   help="one or more run directories (their best.pt) or .pt files; one report column each")
    p.add_argument("--names", nargs="+", help="one display name per checkpoint (default: run directory names)")
    p.add_argument("--input", required=True, help="source sentences, one per line; those naming a group are probed")
    p.add_argument("--output-dir", "--output", dest="output_dir", required=True,
                   help="report directory (new, or an earlier report to replace)")
    p.add_argument("--src", help="source language (default: the checkpoint's); a swap list is shipped for en, de")
    p.add_argument("--tgt", help="target language (default: the checkpoint's)")
    p.add_argument("--swap-list-src", help="your own source swap list: two tab-separated columns, a word of the "
                                           "first group and its counterpart (default: the shipped list)")
    p.add_argument("--swap-list-tgt", help="your own target swap list (default: the shipped list)")
    p.add_argument("--occupations", action=argparse.BooleanOptionalAction, default=None,
                   help="the English -> German occupation probe (default: on for en -> de models)")
    p.add_argument("--attribution", default="gradient",
                   help="attribution method of the evidence, or none (default: gradient)")
    p.add_argument("--evidence-sentences", type=int, default=100, metavar="N",
                   help="attribute the first N pairs (attention: all) (default: 100)")
    p.add_argument("--max-sentences", type=int, default=0, metavar="N",
                   help="probe at most N sentences that name a group (default: 0 = all)")
    p.add_argument("--examples", type=int, default=5, metavar="N", help="pairs shown per model (default: 5)")
    p.add_argument("--beam-size", type=int, default=DEFAULT_BEAM_SIZE,
                   help=f"beam of the translations; 1 = greedy (default: {DEFAULT_BEAM_SIZE})")
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
    from ..jobs.fairness.report import FairnessJob, fairness

    fairness(job_config(FairnessJob, args, decode=decode_config(args)))
    return 0
