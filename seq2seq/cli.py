"""Command-line plumbing: flags generated from the config dataclasses, and the no-traceback error path.

Every field of ``ModelConfig``, ``DataConfig`` and ``TrainConfig`` is a flag (``max_tokens`` ->
``--max-tokens``; booleans get ``--x`` / ``--no-x``), so the CLI and config files can never drift
apart. Precedence: built-in defaults < architecture / toy-corpus defaults < ``--config FILE`` < flags.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Any, Callable, get_type_hints

from .config import DataConfig, ModelConfig, RunConfig, TrainConfig, load_config_file
from .errors import UserError

SECTIONS = {"model": ModelConfig, "data": DataConfig, "train": TrainConfig}
DERIVED = {("model", "vocab_size")}  # filled in from the tokenizer, not set by users

# Defaults that depend on the architecture (peer-comparable sizes; see README).
ARCH_DEFAULTS: dict[str, dict[str, dict[str, Any]]] = {
    "rnn": {"model": {"dropout": 0.3}, "train": {"lr": 1e-3, "clip_norm": 5.0, "label_smoothing": 0.1,
                                                  "betas": (0.9, 0.999)}},
    "transformer": {"model": {"dropout": 0.1}, "train": {"lr": 1e-3, "warmup_steps": 1000}},
}

# The embedded toy corpus (English number words -> German): small model, runs in minutes on a CPU.
TOY_DEFAULTS: dict[str, dict[str, Any]] = {
    "model": {"embed_dim": 128, "hidden_size": 128, "decoder_hidden_size": 256, "d_model": 128,
              "ff_size": 512, "layers": 2, "heads": 4, "dropout": 0.1},
    "data": {"toy_size": 20000, "src": "en", "tgt": "de", "vocab_size": 400, "max_tokens": 3000},
    "train": {"max_minutes": 4.0, "eval_every": 400, "warmup_steps": 300, "eval_max_sentences": 300},
}

HELP = {
    "arch": "rnn | transformer",
    "attention": "RNN attention: bahdanau | luong-dot | luong-general | luong-concat",
    "data_dir": "directory of {split}.{lang} text files (e.g. Multi30k)",
    "dataset": "Hugging Face hub dataset name, e.g. bentrevett/multi30k",
    "src": "source language code (file suffix or hub column)",
    "tgt": "target language code",
    "max_tokens": "tokens per batch, padding included",
    "max_minutes": "wall-clock training budget (0 = none)",
    "device": "auto | cpu | cuda",
    "precision": "fp32 | bf16 | fp16 (fp16: CUDA only)",
    "toy_size": "train on the embedded English->German number corpus with this many pairs",
    "streaming": "read, tokenize and batch the training split on the fly (corpora larger than disk cache/RAM)",
    "shuffle_buffer": "pairs in the streaming shuffle buffer",
    "stream_window": "streaming: sort by length within windows of this many batches",
    "tie_embeddings": "tie the target embeddings and the output layer (W_out = E_tgt)",
    "share_source_embeddings": "source and target share one embedding table (joint vocabulary); "
                               "unset: follows --tie-embeddings",
    "compile": "torch.compile the model (slow to start on CPU; off by default)",
    "accumulate": "micro-batches per optimizer step (gradient accumulation)",
    "eval_every": "validate (loss + BLEU) and checkpoint every N steps",
    "patience": "early stopping: evaluations without BLEU improvement (0 = off)",
}


def add_config_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per config field; unset flags stay absent from the namespace (SUPPRESS)."""
    for section, cls in SECTIONS.items():
        group = parser.add_argument_group(f"{section} options")
        hints = get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if (section, f.name) in DERIVED:
                continue
            flag = "--" + f.name.replace("_", "-")
            kwargs: dict[str, Any] = {"dest": f"{section}.{f.name}", "default": argparse.SUPPRESS,
                                      "help": f"{HELP.get(f.name, '')} (default: {f.default!r})".strip()}
            hint = hints[f.name]
            if hint is bool or hint == (bool | None):
                group.add_argument(flag, action=argparse.BooleanOptionalAction, **kwargs)
            elif f.name == "betas":
                group.add_argument(flag, type=float, nargs=2, metavar=("B1", "B2"), **kwargs)
            else:
                group.add_argument(flag, type=_scalar_type(hint), metavar=f.name.upper(), **kwargs)


def _scalar_type(hint: Any) -> Callable[[str], Any]:
    for kind in (int, float):
        if hint is kind or hint == (kind | None):
            return kind
    return str


def build_run_config(args: argparse.Namespace) -> RunConfig:
    """Merge defaults, architecture/toy defaults, the config file and the flags into a RunConfig."""
    file_values = load_config_file(args.config) if getattr(args, "config", None) else {}
    flag_values: dict[str, dict[str, Any]] = {name: {} for name in SECTIONS}
    for dest, value in vars(args).items():
        if "." in dest:
            section, name = dest.split(".", 1)
            flag_values[section][name] = value
    merged: dict[str, Any] = {name: {} for name in SECTIONS}
    arch = flag_values["model"].get("arch") or file_values.get("model", {}).get("arch") or "transformer"
    data_given = {**file_values.get("data", {}), **flag_values["data"]}
    uses_toy = not any(data_given.get(k) for k in ("data_dir", "dataset", "train_file"))
    layers = [ARCH_DEFAULTS.get(arch, {})] + ([TOY_DEFAULTS] if uses_toy else []) + [file_values, flag_values]
    for layer in layers:
        for key, value in layer.items():
            if key in SECTIONS:
                if not isinstance(value, dict):
                    raise UserError(f"config: '{key}' must be a mapping of options")
                merged[key].update(value)
            else:
                merged[key] = value
    if getattr(args, "output_dir", None):
        merged["output_dir"] = args.output_dir
    return RunConfig.from_dict(merged, source=args.config or "options")


def config_from_flags(flags: list[str]) -> RunConfig:
    """The RunConfig that train.py would build from ``flags`` (config flags, --config, --output-dir)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--config")
    parser.add_argument("--output-dir")
    add_config_flags(parser)
    return build_run_config(parser.parse_args(flags))


def run_cli(main: Callable[[list[str] | None], int]) -> Callable[[list[str] | None], int]:
    """Wrap a CLI main: UserError -> message on stderr and exit 2; Ctrl-C -> exit 130; closed pipe -> 0."""

    def wrapped(argv: list[str] | None = None) -> int:
        try:
            return main(argv)
        except UserError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            return 130
        except BrokenPipeError:
            _silence_stdout()
            return 0

    return wrapped


def _silence_stdout() -> None:
    import os

    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
