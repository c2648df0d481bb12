"""``seq2seq train``: train a model. With no arguments, the toy quickstart (~4 min on 2 CPU cores).

    seq2seq train                                            # English -> German number words
    seq2seq train --preset rnn-bahdanau --data-dir multi30k --src de --tgt en
    seq2seq train --config RUN/config.yaml --max-steps 20000  # flags override the file
    seq2seq train --output-dir checkpoints/run --resume       # continue an interrupted run
    seq2seq train --preset transformer --print-config        # what would run, as YAML
"""
from __future__ import annotations

import sys
import time

from ..config import config_to_yaml
from .common import add_config_flags, build_run_config, parser_for, run_cli


def parse_args(argv: list[str] | None):
    parser = parser_for("train", __doc__)
    parser.add_argument("--output-dir", help="run directory (default: checkpoints/<date>-<arch>)")
    parser.add_argument("--resume", action="store_true", help="continue the run in --output-dir from last.pt")
    parser.add_argument("--quiet", action="store_true", help="no progress bars; plain log lines only")
    parser.add_argument("--no-final-test", dest="final_test", action="store_false",
                        help="skip the test-set evaluation and alignment plot at the end")
    add_config_flags(parser)
    return parser.parse_args(argv)


@run_cli
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.resume and not args.output_dir:
        print("error: --resume needs --output-dir pointing at the run to continue", file=sys.stderr)
        return 2
    cfg = build_run_config(args)
    if args.print_config:
        start = f"--preset {args.preset}, then " if args.preset else ""
        header = (f"# The effective config ({start}the file and flags given); seq2seq train --config FILE\n"
                  "# reads it back to the same config. Set one corpus in data (data_dir, dataset or train_file).")
        sys.stdout.write(config_to_yaml(cfg, header=header))
        return 0
    if not cfg.output_dir:
        name = cfg.model.arch + (f"-{cfg.model.attention}" if cfg.model.arch == "rnn" else "")
        cfg.output_dir = f"checkpoints/{time.strftime('%Y%m%d-%H%M%S')}-{name}"
    from ..training.run import train  # the training loop (and datasets) only when training

    result = train(cfg, resume=args.resume, quiet=args.quiet, final_test=args.final_test)
    if result.rank != 0:  # torchrun: rank 0 reports
        return 0
    print(f"run: {result.output_dir}")
    for score in result.test_scores.values():
        print(f"test {score}")
    return 0
