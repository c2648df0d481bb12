#!/usr/bin/env python
"""Train an NMT model. With no arguments: the default model on the embedded toy corpus (~4 min on CPU).

    python train.py                                        # toy English->German numbers
    python train.py --arch rnn --attention bahdanau --data-dir ../shared/data/multi30k --src de --tgt en
    python train.py --config run.yaml --max-steps 20000    # flags override the file
    python train.py --output-dir checkpoints/run --resume  # continue an interrupted run
"""
import argparse
import sys
import time

from seq2seq.cli import add_config_flags, build_run_config, run_cli
from seq2seq.training import train


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", help="YAML or TOML file with model/data/train sections; flags override it")
    parser.add_argument("--output-dir", help="run directory (default: checkpoints/<date>-<arch>)")
    parser.add_argument("--resume", action="store_true", help="continue the run in --output-dir from last.pt")
    parser.add_argument("--quiet", action="store_true", help="no progress bars; plain log lines only")
    parser.add_argument("--no-final-test", dest="final_test", action="store_false",
                        help="skip the test-set evaluation and alignment plot at the end")
    add_config_flags(parser)
    return parser.parse_args(argv)


@run_cli
def main(argv=None) -> int:
    args = parse_args(argv)
    if args.resume and not args.output_dir:
        print("error: --resume needs --output-dir pointing at the run to continue", file=sys.stderr)
        return 2
    cfg = build_run_config(args)
    if not cfg.output_dir:
        name = cfg.model.arch + (f"-{cfg.model.attention}" if cfg.model.arch == "rnn" else "")
        cfg.output_dir = f"checkpoints/{time.strftime('%Y%m%d-%H%M%S')}-{name}"
    result = train(cfg, resume=args.resume, quiet=args.quiet, final_test=args.final_test)
    if result.rank != 0:  # torchrun: rank 0 reports
        return 0
    print(f"run: {result.output_dir}")
    for score in result.test_scores.values():
        print(f"test {score}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
