"""``seq2seq export``: ship a trained model.

    seq2seq export --format safetensors RUN OUT      # weights, config.json, spm.model: nothing pickled
    seq2seq export --format ctranslate2 RUN OUT      # a CTranslate2 model directory (Transformer only)

RUN is a checkpoint file or a run directory (its best.pt). OUT must not exist unless --force; it
appears only when complete. A safetensors directory is accepted by every --checkpoint flag and by
Translator.from_checkpoint; a CTranslate2 directory is read by ctranslate2.Translator (with the
spm.model beside it: docs/guides/deploying.md).
"""
from __future__ import annotations

import sys
from pathlib import Path

from .common import parser_for, run_cli

FORMATS = ("safetensors", "ctranslate2")


def parse_args(argv: list[str] | None):
    parser = parser_for("export", __doc__)
    parser.add_argument("checkpoint", metavar="RUN", help="a .pt checkpoint or a run directory")
    parser.add_argument("output", metavar="OUT", help="the directory to write")
    parser.add_argument("--format", required=True, choices=FORMATS, help="what to write")
    parser.add_argument("--force", action="store_true", help="replace OUT if it exists")
    parser.add_argument("--quantization", choices=("int8", "int8_float32", "int16", "float16", "bfloat16"),
                        help="ctranslate2 only: store the weights quantized (default: fp32; CTranslate2 can "
                             "also quantize when it loads a model, with compute_type)")
    args = parser.parse_args(argv)
    if args.quantization and args.format != "ctranslate2":
        parser.error("--quantization applies to --format ctranslate2 only")
    return args


@run_cli
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from ..checkpoint.loaded import LoadedCheckpoint
    from ..checkpoint.parts import SHORTLIST
    from ..io_utils import atomic_directory

    checkpoint = Path(args.checkpoint)
    loaded = LoadedCheckpoint.read(checkpoint)  # corrupt / unknown version: a UserError before OUT is touched
    with atomic_directory(args.output, force=args.force) as out:
        if args.format == "safetensors":
            from ..checkpoint.safetensors import write_safetensors

            run_dir = checkpoint if checkpoint.is_dir() else checkpoint.parent
            write_safetensors(loaded.payload, out, shortlist=run_dir / SHORTLIST)
        else:
            from ..checkpoint.ctranslate2 import write_ctranslate2

            write_ctranslate2(loaded, out, args.quantization)
    size = sum(p.stat().st_size for p in Path(args.output).iterdir())
    print(f"export format={args.format} output={args.output} bytes={size}", file=sys.stderr)
    return 0
