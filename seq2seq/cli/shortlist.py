"""``seq2seq shortlist``: build a run's lexical shortlist (IBM Model 1 on parallel text) for
``seq2seq translate --shortlist``. Training writes one into every run directory; this builds one
for other runs or other text.

    seq2seq shortlist --checkpoint RUN --source train.de --target train.en
"""
from __future__ import annotations

import sys
from pathlib import Path

from ..errors import UserError
from ..io_utils import counted
from .common import DeprecatedAlias, parser_for, run_cli


def parse_args(argv: list[str] | None):
    from ..decoding.shortlist import FILE_NAME

    parser = parser_for("shortlist", __doc__)
    parser.add_argument("--checkpoint", required=True, help="a .pt checkpoint or a run directory")
    parser.add_argument("--source", help="training source text, one sentence per line (required)")
    parser.add_argument("--target", help="training target text, line-aligned with --source (required)")
    parser.add_argument("--src", dest="source", action=DeprecatedAlias, new="--source")
    parser.add_argument("--tgt", dest="target", action=DeprecatedAlias, new="--target")
    parser.add_argument("--output", help=f"where to write (default: {FILE_NAME} next to the checkpoint)")
    parser.add_argument("--max-pairs", type=int, default=100_000,
                        help="use at most this many pairs, spread over the files (default: 100000)")
    args = parser.parse_args(argv)
    for flag in ("source", "target"):
        if not getattr(args, flag):
            parser.error(f"the following arguments are required: --{flag}")
    if args.max_pairs < 1:
        raise UserError(f"--max-pairs must be positive, got {args.max_pairs}")
    return args


@run_cli
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from ..checkpoint.loaded import LoadedCheckpoint
    from ..decoding.shortlist import FILE_NAME, build_from_text
    from ..io_utils import read_parallel

    checkpoint = Path(args.checkpoint)
    tokenizer = LoadedCheckpoint.read(checkpoint).tokenizer
    src_lines, tgt_lines = read_parallel(args.source, args.target)
    run_dir = checkpoint if checkpoint.is_dir() else checkpoint.parent
    output = Path(args.output) if args.output else run_dir / FILE_NAME
    build_from_text(tokenizer, src_lines, tgt_lines, args.max_pairs).save(output)
    print(f"shortlist: {output} ({counted(min(len(src_lines), args.max_pairs), 'pair')})", file=sys.stderr)
    return 0
