"""``seq2seq augment``: counterfactual data augmentation, a corpus with gender-swapped copies of its training
pairs (``seq2seq/jobs/fairness/augment.py``; docs/guides/fairness.md).

    seq2seq augment --data-dir multi30k --src en --tgt de --output-dir multi30k-cda
"""
from __future__ import annotations

import argparse

from .common import job_config, parser_for, run_cli


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = parser_for("augment", __doc__)
    p.add_argument("--data-dir", required=True, help="directory of {split}.{lang} text files (e.g. Multi30k)")
    p.add_argument("--src", required=True, help="source language code (file suffix)")
    p.add_argument("--tgt", required=True, help="target language code")
    p.add_argument("--output-dir", required=True, help="where the augmented corpus goes (a new directory)")
    p.add_argument("--swap-list-src", help="the source side's swap list (two tab-separated columns; default: "
                                           "the shipped list of --src)")
    p.add_argument("--swap-list-tgt", help="the target side's swap list (default: the shipped list of --tgt)")
    p.add_argument("--train-split", default="train", help="file stem of the training split (default: train)")
    p.add_argument("--force", action="store_true", help="replace --output-dir if it exists")
    return p.parse_args(argv)


@run_cli
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from ..jobs.fairness.augment import AugmentJob, augment

    augment(job_config(AugmentJob, args))
    return 0
