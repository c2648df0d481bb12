"""``seq2seq average``: average the weights of several checkpoints of one run into a new checkpoint.

    seq2seq average --checkpoint RUN --best 5 --output RUN/average-best5.pt   # kept with --keep-best 5
    seq2seq average --checkpoint RUN --last 5 --output RUN/average-last5.pt   # kept with --keep-last 5
    seq2seq average --checkpoint A.pt B.pt C.pt --output average.pt

The result is a weights-only checkpoint that ``seq2seq translate --checkpoint`` reads like any other.
"""
from __future__ import annotations

import sys
from pathlib import Path

from ..errors import UserError
from .common import parser_for, run_cli


def parse_args(argv: list[str] | None):
    parser = parser_for("average", __doc__)
    parser.add_argument("--checkpoint", nargs="+", required=True,
                        help="two or more .pt checkpoints, or one run directory with --best or --last")
    chosen = parser.add_mutually_exclusive_group()
    chosen.add_argument("--best", type=int, metavar="N", help="the N kept checkpoints with the best validation BLEU")
    chosen.add_argument("--last", type=int, metavar="N", help="the N newest kept checkpoints")
    parser.add_argument("--output", required=True, help="the averaged checkpoint to write (.pt)")
    return parser.parse_args(argv)


def checkpoint_paths(args) -> list[Path]:
    """The files to average: listed, or chosen from a run directory's kept checkpoints."""
    from ..checkpoint.kept import KeptCheckpoints

    paths = [Path(p) for p in args.checkpoint]
    count = args.best if args.best is not None else args.last
    if count is None:
        if len(paths) == 1 and paths[0].is_dir():
            raise UserError(f"--checkpoint {paths[0]} is a run directory: choose --best N or --last N of its kept "
                            "checkpoints, or list .pt files")
        return paths
    if len(paths) != 1 or not paths[0].is_dir():
        raise UserError("--best / --last choose from one run directory: pass --checkpoint RUN")
    if count < 2:
        raise UserError(f"--{'best' if args.best is not None else 'last'} must be >= 2, got {count}")
    return KeptCheckpoints(paths[0]).select("best" if args.best is not None else "last", count)


@run_cli
def main(argv: list[str] | None = None) -> int:
    from ..checkpoint.average import write_average

    args = parse_args(argv)
    paths = checkpoint_paths(args)
    if Path(args.output).resolve() in {p.resolve() for p in paths}:
        raise UserError(f"--output {args.output} is one of the checkpoints averaged; choose another file")
    output = write_average(paths, args.output)
    print(f"averaged {len(paths)} checkpoints -> {output}", file=sys.stderr)
    return 0
