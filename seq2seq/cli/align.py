"""``seq2seq align``: alignment quality of a model's attention against gold links (precision,
recall, AER), forward and, with a target->source model, symmetrized; or the links alone (``--output``).

    seq2seq align --checkpoint RUN/best.pt --source test.de --target test.en --gold test.talp \\
        [--backward-checkpoint RUN_EN_DE/best.pt] [--output links.txt] [--adapt-steps 100]
    seq2seq align --checkpoint RUN --source corpus.de --target corpus.en --output corpus.talp

See ``seq2seq/jobs/align.py`` for how the target is force-decoded and links are read.
"""
from __future__ import annotations

from ..errors import UserError
from ..config import (ADAPT_LR, ADAPT_PAIRS, FORCED_BATCH_SIZE, LINK_METHODS, MODEL_SYMMETRIZATION,
                      MODEL_SYMMETRIZATIONS)
from .common import DeprecatedAlias, add_alignment_flags, add_device_flag, align_config, job_config, parser_for, run_cli


def parse_args(argv: list[str] | None):
    p = parser_for("align", __doc__)
    p.add_argument("--checkpoint", required=True, help="source->target checkpoint (.pt or run directory)")
    p.add_argument("--source", required=True, help="source sentences, one per line, tokenized like the gold")
    p.add_argument("--target", required=True, help="target (reference) sentences, one per line")
    p.add_argument("--gold", help="gold Pharaoh alignments (0-based i-j sure, i?j possible) to score the links "
                                  "against; without it, --output only")
    p.add_argument("--backward-checkpoint", help="target->source checkpoint for symmetrized links")
    p.add_argument("--symmetrize", choices=MODEL_SYMMETRIZATIONS,
                   help=f"which links --output gets (default: {MODEL_SYMMETRIZATION} with a backward model, else "
                        "forward)")
    add_alignment_flags(p)
    p.add_argument("--method", dest="align_method", choices=LINK_METHODS, action=DeprecatedAlias,
                   new="--align-method")
    p.add_argument("--threshold", dest="align_threshold", type=float, action=DeprecatedAlias,
                   new="--align-threshold")
    p.add_argument("--output", help="write the chosen links here as Pharaoh lines (atomically)")
    p.add_argument("--json", action="store_true", help="also print the scores as one JSON line")
    p.add_argument("--adapt-steps", type=int, default=0,
                   help="first fine-tune a copy of each model on each --adapt-pairs of the given pairs for this "
                        "many updates (translation loss only; about half a second each on 2 CPU cores; 100 was "
                        "best on the val gold) (default: 0, off)")
    p.add_argument("--adapt-lr", type=float, default=ADAPT_LR,
                   help=f"learning rate of --adapt-steps (default: {ADAPT_LR})")
    p.add_argument("--adapt-pairs", type=int, default=ADAPT_PAIRS,
                   help="with --adapt-steps: adapt a copy of each model to every this many consecutive pairs, "
                        "--adapt-steps updates each (the cost grows with the pairs; 0: one copy for all pairs) "
                        f"(default: {ADAPT_PAIRS})")
    p.add_argument("--batch-size", type=int, default=FORCED_BATCH_SIZE,
                   help=f"sentence pairs per forward pass (default: {FORCED_BATCH_SIZE})")
    add_device_flag(p)
    args = p.parse_args(argv)
    args.align = align_config(args)
    if args.batch_size < 1:
        raise UserError(f"--batch-size must be positive, got {args.batch_size}")
    if args.adapt_steps < 0 or args.adapt_lr <= 0 or args.adapt_pairs < 0:
        raise UserError(f"--adapt-steps and --adapt-pairs must be >= 0 and --adapt-lr positive, got "
                        f"{args.adapt_steps}, {args.adapt_pairs} and {args.adapt_lr}")
    return args


@run_cli
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from ..jobs.align import AlignJob, evaluate

    evaluate(job_config(AlignJob, args))
    return 0
