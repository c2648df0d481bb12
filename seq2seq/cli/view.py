"""``seq2seq view``: an interactive HTML viewer of an alignments export (one self-contained file).

    seq2seq translate --checkpoint RUN --input test.de --alignments align.jsonl --attribution gradient
    seq2seq view align.jsonl --output align.html

Hover or click a target word to shade its source words by weight; switch attention / attribution
method, layer and head, word / subword level; step through the sentences. Per-layer and per-head
attention comes from the .npz translate writes beside the JSONL (without it: the export's aggregate).
``seq2seq translate --html FILE`` writes the same page while translating.
"""
from __future__ import annotations

import sys
from pathlib import Path

from ..errors import UserError
from ..io_utils import counted
from .common import parser_for, run_cli


def parse_args(argv: list[str] | None):
    p = parser_for("view", __doc__)
    p.add_argument("alignments", metavar="ALIGNMENTS",
                   help="the JSONL written by seq2seq translate --alignments FILE")
    p.add_argument("--output", help="the HTML file to write, atomically (default: ALIGNMENTS with .html)")
    p.add_argument("--npz", help="raw attention arrays for the layer / head selectors (default: the .npz beside "
                                 "ALIGNMENTS, if there is one)")
    p.add_argument("--no-npz", action="store_true",
                   help="ignore the .npz: show only the export's aggregate attention (a smaller file)")
    p.add_argument("--title", help="page title (default: the file name)")
    p.add_argument("--quiet", action="store_true", help="no message on stderr")
    return p.parse_args(argv)


@run_cli
def main(argv: list[str] | None = None) -> int:
    from ..alignment.viewer import write_viewer

    args = parse_args(argv)
    jsonl = Path(args.alignments)
    output = Path(args.output) if args.output else jsonl.with_suffix(".html")
    if args.npz and args.no_npz:
        raise UserError("--npz FILE and --no-npz contradict each other; give one")
    npz = Path(args.npz) if args.npz else None
    if npz is not None and not npz.is_file():
        raise UserError(f"--npz {npz} not found: pass the .npz translate wrote beside the JSONL")
    if npz is None and not args.no_npz and jsonl.with_suffix(".npz").is_file():
        npz = jsonl.with_suffix(".npz")
    count = write_viewer(jsonl, output, npz=npz, title=args.title)
    if not args.quiet:
        print(f"wrote {output} ({counted(count, 'sentence')}{'' if npz else ', aggregate attention only'})",
              file=sys.stderr)
    return 0
