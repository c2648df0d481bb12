"""``seq2seq wordalign``: word alignments of a parallel corpus from the statistical aligner eflomal,
both directions symmetrized (grow-diag-final-and by default), as Pharaoh lines: a baseline for
attention's alignments (score both with ``seq2seq align --gold``) and supervision.

    seq2seq wordalign --source train.de --target train.en --output train.talp

Needs pip install 'seq2seq[align]'. See ``seq2seq/jobs/wordalign.py``.
"""
from __future__ import annotations

import argparse

from ..config import SYMMETRIZATIONS
from .common import job_config, parser_for, run_cli


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = parser_for("wordalign", __doc__)
    p.add_argument("--source", required=True, help="source sentences, one per line, words separated by spaces")
    p.add_argument("--target", required=True, help="target sentences, parallel to --source")
    p.add_argument("--output", required=True, help="where the Pharaoh lines go (0-based i-j, source-target); "
                                                   "written atomically")
    p.add_argument("--symmetrize", choices=SYMMETRIZATIONS, default="grow-diag-final-and",
                   help="how the two directions' links combine (default: grow-diag-final-and)")
    p.add_argument("--model", type=int, choices=(1, 2, 3), default=3,
                   help="eflomal's model: 1 IBM1, 2 + HMM distortion, 3 + fertility (default: 3)")
    p.add_argument("--iterations", type=int, default=None, help="sampling iterations (default: eflomal's, from "
                                                               "the corpus size)")
    return p.parse_args(argv)


@run_cli
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from ..jobs.wordalign import WordAlignJob, word_align

    word_align(job_config(WordAlignJob, args))
    return 0
