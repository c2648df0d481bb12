"""``seq2seq wordalign``: word alignments of a parallel corpus as Pharaoh lines, from the statistical aligner eflomal
(the default: both directions symmetrized, grow-diag-final-and) or from this project's models (``--method model``:
a source->target and a target->source model, given or trained on the corpus within a budget, combined by
agreement): a baseline for attention's alignments (score both with ``seq2seq align --gold``) and supervision.

    seq2seq wordalign --source train.de --target train.en --output train.talp
    seq2seq wordalign --method model --max-minutes 50 --source train.de --target train.en --output train.talp
    seq2seq wordalign --method model --checkpoint RUN_DE_EN --backward-checkpoint RUN_EN_DE \\
        --source corpus.de --target corpus.en --output corpus.talp
    seq2seq wordalign --method model --max-minutes 10 ... -- --d-model 128 --layers 2   # train flags after --

eflomal needs pip install 'seq2seq[align]', and so does training with the default preset (eflomal teaches it).
See ``seq2seq/jobs/wordalign.py`` and ``seq2seq/jobs/wordalign_model.py``.
"""
from __future__ import annotations

import argparse

from ..config import FORCED_BATCH_SIZE, MODEL_SYMMETRIZATIONS
from ..errors import UserError
from .common import add_device_flag, config_from_flags, job_config, parser_for, run_cli

#: what --method model sets itself, so not a train flag after --
RESERVED = ("--data-dir", "--dataset", "--dataset-config", "--train-file", "--valid-file", "--test-file", "--src",
            "--tgt", "--train-split", "--valid-split", "--test-split", "--toy-size", "--cache-dir", "--streaming",
            "--output-dir", "--max-minutes", "--guided-alignment", "--device", "--preset")
#: the flags of one method only (dest: flag), the other's error
EFLOMAL_ONLY = {"model": "--model", "iterations": "--iterations"}
MODEL_ONLY = {"checkpoint": "--checkpoint", "backward_checkpoint": "--backward-checkpoint",
              "max_minutes": "--max-minutes", "preset": "--preset", "output_dir": "--output-dir",
              "sequential": "--sequential", "rounds": "--rounds", "train_flags": "train flags after --",
              "batch_size": "--batch-size"}
TRAINING_ONLY = ("preset", "output_dir", "sequential", "rounds", "train_flags")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = parser_for("wordalign", __doc__)
    p.add_argument("--source", required=True, help="source sentences, one per line, words separated by spaces")
    p.add_argument("--target", required=True, help="target sentences, parallel to --source")
    p.add_argument("--output", required=True, help="where the Pharaoh lines go (0-based i-j, source-target); "
                                                   "written atomically")
    p.add_argument("--method", choices=("eflomal", "model"), default="eflomal",
                   help="eflomal, the statistical aligner (default: fast, no training), or model: this project's "
                        "models, given (--checkpoint) or trained on the corpus (--max-minutes)")
    p.add_argument("--symmetrize", choices=MODEL_SYMMETRIZATIONS,
                   help="how the two directions' links combine (default: grow-diag-final-and for eflomal; agreement "
                        "of both models' attention for --method model, forward with one model)")
    eflomal = p.add_argument_group("--method eflomal")
    eflomal.add_argument("--model", type=int, choices=(1, 2, 3),
                         help="eflomal's model: 1 IBM1, 2 + HMM distortion, 3 + fertility (default: 3)")
    eflomal.add_argument("--iterations", type=int, default=None, help="sampling iterations (default: eflomal's, "
                                                                      "from the corpus size)")
    model = p.add_argument_group("--method model")
    model.add_argument("--checkpoint", help="a source->target checkpoint (.pt or run directory) to align with; "
                                            "nothing is trained")
    model.add_argument("--backward-checkpoint", help="with --checkpoint: a target->source one, combined by agreement")
    model.add_argument("--max-minutes", type=float,
                       help="instead of --checkpoint: train both directions on the corpus in this many minutes in "
                            "all (2+ cores: at once, on half the cores each; else one after the other, half each); "
                            "eflomal's teacher and the alignment come on top")
    model.add_argument("--preset", help="with --max-minutes: what to train (default: transformer-align, taught by "
                                        "eflomal's links of the corpus)")
    model.add_argument("--output-dir", help="with --max-minutes: where the two runs are kept, to align again with "
                                            "--checkpoint (default: OUTPUT.models)")
    model.add_argument("--sequential", action="store_true",
                       help="with --max-minutes: train one direction after the other, half the budget each, on "
                            "all the cores (default: at once where there are 2 cores or more)")
    model.add_argument("--rounds", type=int,
                       help="with --max-minutes: self-training, N rounds (default 1): each after the first trains both "
                            "directions again, --max-minutes each round, taught by the links of the round before "
                            "(OUTPUT_DIR/round-K) instead of eflomal's")
    model.add_argument("--batch-size", type=int, help=f"sentence pairs per forward pass when aligning "
                                                      f"(default: {FORCED_BATCH_SIZE})")
    add_device_flag(model)
    model.add_argument("train_flags", nargs="*", metavar="-- TRAIN FLAGS",
                       help="with --max-minutes: seq2seq train flags for both runs, after -- (e.g. -- --d-model 128 "
                            "--seed 2); the corpus, budget, run directories, device and teacher are set here")
    args = p.parse_args(argv)
    _check_method_flags(args)
    return args


def _check_method_flags(args: argparse.Namespace) -> None:
    """Each method's flags with that method only; train flags only when training, and none that it sets."""
    other = MODEL_ONLY if args.method == "eflomal" else EFLOMAL_ONLY
    given = [flag for dest, flag in other.items() if getattr(args, dest) not in (None, False, [])]
    if given:
        owner = "model" if args.method == "eflomal" else "eflomal"
        raise UserError(f"{given[0]} is an option of --method {owner}, not of --method {args.method}")
    if args.method == "model" and args.checkpoint is not None:
        training = [MODEL_ONLY[dest] for dest in TRAINING_ONLY if getattr(args, dest) not in (None, False, [])]
        if training:
            raise UserError(f"{training[0]} is for training (--max-minutes); with --checkpoint nothing is trained")
    reserved = [flag for flag in args.train_flags if flag.split("=", 1)[0] in RESERVED]
    if reserved:
        raise UserError(f"{reserved[0]} after --: seq2seq wordalign sets it itself (the corpus is --source/--target, "
                        "the budget --max-minutes, the runs go to --output-dir; --device and --preset are its own)")
    if args.batch_size is not None and args.batch_size < 1:
        raise UserError(f"--batch-size must be positive, got {args.batch_size}")


@run_cli
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    given = {name: value for name, value in vars(args).items() if value is not None}  # None: the job's default
    if args.method == "eflomal":
        from ..jobs.wordalign import WordAlignJob, word_align

        word_align(job_config(WordAlignJob, argparse.Namespace(**given)))
        return 0
    from ..jobs.wordalign_model import PRESET, ModelAlignJob, model_word_align

    if args.max_minutes is not None:  # the preset and the train flags, as seq2seq train reads them
        given["preset"] = args.preset or PRESET
        given["train_config"] = config_from_flags(["--preset", given["preset"], "--device", args.device,
                                                   *args.train_flags])
    model_word_align(job_config(ModelAlignJob, argparse.Namespace(**given)))
    return 0
