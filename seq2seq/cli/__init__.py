"""The ``seq2seq`` command: one subcommand per module of this package, imported only when run.

    seq2seq train | translate | align | compare | shortlist | average | export | ... [options]    (seq2seq CMD --help)
"""
from __future__ import annotations

import importlib
import sys

from .common import VOCABULARY, add_config_flags, build_run_config, config_from_flags, nearest, run_cli

__all__ = ["main", "run_cli", "add_config_flags", "build_run_config", "config_from_flags", "COMMANDS"]

COMMANDS = {
    "train": "train a model (no arguments: the toy quickstart)",
    "translate": "translate text with a trained model; a Unix filter; alignments, plots, attribution",
    "align": "score attention alignments against gold links (precision, recall, AER)",
    "wordalign": "word alignments of a parallel corpus: eflomal (a statistical aligner) or the project's models",
    "compare": "side-by-side report of several trained systems on one test set",
    "shortlist": "build a run's lexical shortlist for translate --shortlist",
    "average": "average the weights of several checkpoints of one run",
    "serve": "an HTTP JSON API over a checkpoint, batching concurrent requests (needs the serve extra)",
    "analyze": "attention statistics per layer and head, head importance and pruning over a corpus",
    "view": "interactive HTML viewer of an alignments export (attention, attribution, layers, heads)",
    "export": "write a model as safetensors or for CTranslate2",
    "fairness": "counterfactual gender probes: faithfulness, stability, occupations, attention as evidence",
    "augment": "counterfactual data augmentation: a corpus with gender-swapped copies of its training pairs",
}


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [f"  {name:<{width}}  {text}" for name, text in COMMANDS.items()]
    return ("usage: seq2seq COMMAND [options]   (seq2seq COMMAND --help for its options)\n\n"
            "Attention-based neural machine translation: RNN (Bahdanau / Luong) and Transformer.\n\n"
            "commands:\n" + "\n".join(lines) + "\n\n" + VOCABULARY + "\n")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        sys.stdout.write(usage())
        return 0 if argv else 2
    if argv[0] in ("-V", "--version"):
        from ..version import __version__

        print(f"seq2seq {__version__}")
        return 0
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        near = nearest(command, COMMANDS)
        print(f"error: unknown command {command!r}; " + (f"did you mean {near!r}? " if near else "")
              + f"choose one of {', '.join(COMMANDS)} (seq2seq --help)", file=sys.stderr)
        return 2
    module = importlib.import_module(f"{__name__}.{command}")
    return module.main(rest)
