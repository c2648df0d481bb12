"""``seq2seq train``: train a model. With no arguments, the toy quickstart (1,000 steps: minutes on 2 CPU cores).

    seq2seq train                                            # English -> German number words
    seq2seq train --preset rnn-bahdanau --data-dir multi30k --src de --tgt en
    seq2seq train --config RUN/config.yaml --max-steps 20000  # flags override the file
    seq2seq train --output-dir checkpoints/run --resume       # continue an interrupted run
    seq2seq train --preset transformer --print-config        # what would run, as YAML
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from ..config import RESUME_FIELDS, RunConfig, config_to_yaml, flag_for
from ..errors import UserError
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
    cfg = resumed_config(args) if args.resume else build_run_config(args)
    if args.print_config:
        start = f"--preset {args.preset}, then " if args.preset else ""
        header = (f"# The effective config ({start}the file and flags given); seq2seq train --config FILE\n"
                  "# reads it back to the same config. Set one corpus in data (data_dir, dataset or train_file).")
        chosen = getattr(args, "device_choices", [])
        if chosen:
            from ..config import training_device_type

            where = training_device_type(cfg.train.device).upper()
            header += f"\n# Chosen for training on {where} (unset above; a flag overrides):"
            header += "".join(f"\n#   {key}: {value}  ({why})" for key, value, why in chosen)
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


def resumed_config(args: argparse.Namespace) -> RunConfig:
    """``--resume``: the run's own config (``RUN/last.pt``), limits included, with the flags given on
    this command for what a resume may change (``RESUME_FIELDS``: limits, validation rhythm, device),
    each change logged; other settings belong to the run and stay (a warning names the flags ignored)."""
    from ..checkpoint.loaded import LoadedCheckpoint
    from ..runtime import log

    run = Path(args.output_dir)
    if not (run / "last.pt").is_file():
        raise UserError(f"--resume: {run / 'last.pt'} does not exist, so there is no run to continue in "
                        f"{run}; start it without --resume (or point --output-dir at the run)")
    cfg = LoadedCheckpoint.read(run / "last.pt").config
    ignored = [f"--config {args.config}"] if getattr(args, "config", None) else []
    ignored += [f"--preset {args.preset}"] if getattr(args, "preset", None) else []
    changed = cfg.to_dict()
    for dest, value in vars(args).items():
        if "." not in dest:
            continue
        section, name = dest.split(".", 1)
        if dest in RESUME_FIELDS:
            if changed[section][name] != value:
                log("resume", **{flag_for(dest)[2:].replace("-", "_"): f"{changed[section][name]}->{value}"})
                changed[section][name] = value
        else:
            ignored.append(flag_for(dest))
    if ignored:
        changeable = ", ".join(flag_for(key) for key in RESUME_FIELDS)
        log("warning", message=f"--resume continues the run with its own settings; ignored: {', '.join(ignored)} "
                               f"(a resume can change only {changeable})")
    changed["output_dir"] = str(run)
    return RunConfig.from_dict(changed, source=f"--resume {run / 'last.pt'} and flags")
