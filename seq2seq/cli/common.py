"""What every subcommand shares: the no-traceback error path, flags generated from the config
dataclasses, deprecated flag aliases and the flag groups used by more than one command.

Flags come from the typed config (``seq2seq.config``): every field of a ``RunConfig`` section (``SECTIONS``)
is a ``seq2seq train`` flag (``max_tokens`` -> ``--max-tokens``, or the name the field gives, ``eval.every`` ->
``--eval-every``: ``flag_of``; booleans get ``--x`` / ``--no-x``; ``Literal`` types give ``choices``), with the
field's help text and the default that will actually run, one group per section. Precedence: preset <
``--config FILE`` < flags.
"""
from __future__ import annotations

import argparse
import dataclasses
import difflib
import re
import sys
import typing
from typing import Any, Callable, Collection, Iterable, Literal, TypeVar, get_type_hints

from ..config import (
    ARCH_DEFAULTS, DEFAULT_BEAM_SIZE, DEFAULT_SHARES, FINE_TUNABLE, LINK_METHODS, MARKUP_SYMMETRIZATION,
    MODEL_SYMMETRIZATION, MODEL_SYMMETRIZATIONS, PRESETS, SECTIONS, AlignConfig, DecodeConfig, RunConfig,
    field_default, flag_of, load_config_file, preset,
)
from ..errors import OutputError, UserError
from ..io_utils import output_error

T = TypeVar("T")

VOCABULARY = """\
One vocabulary of flags across subcommands: --src/--tgt are language codes, --source/--target/
--reference/--input are files, --heads/--layers are model sizes while --align-heads/--align-layer
choose attention to read, --max-len-ratio filters training pairs while --max-output-ratio bounds
outputs, --output is what a command writes."""


def run_cli(main: Callable[[list[str] | None], int]) -> Callable[[list[str] | None], int]:
    """Wrap a command's main: UserError -> message on stderr and exit 2; a write the operating system
    refused for a reason the user can fix (``OutputError``, or such an ``OSError`` that no layer below
    named) -> message and exit 1; Ctrl-C -> exit 130; closed pipe -> 0 (``seq2seq translate ... | head``
    is not an error). Every command starts with TF32 off: fp32 means IEEE fp32 (PyTorch's own default
    runs cuDNN's RNNs in TF32) until ``train --tf32`` says otherwise."""

    def wrapped(argv: list[str] | None = None) -> int:
        from ..runtime import allow_tf32  # here, not at import: ``--help`` needs no torch

        allow_tf32(False)
        try:
            return main(argv)
        except OutputError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        except UserError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            return 130
        except BrokenPipeError:
            _silence_stdout()
            return 0
        except OSError as exc:
            failure = output_error(exc, f"at {exc.filename}" if exc.filename else "")
            if failure is None:
                raise
            print(f"error: {failure}", file=sys.stderr)
            return 1

    wrapped.__doc__ = main.__doc__
    return wrapped


def _silence_stdout() -> None:
    import os

    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


class DeprecatedAlias(argparse.Action):
    """An old flag name kept for one release: warns on stderr and sets the new flag's value."""

    def __init__(self, option_strings: list[str], dest: str, new: str, **kwargs: Any) -> None:
        self.new = new
        super().__init__(option_strings, dest, help=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        print(f"warning: {option_string} is deprecated and will be removed; use {self.new}", file=sys.stderr)
        setattr(namespace, self.dest, values)
        if self.dest in ("align_layer", "align_heads"):  # the attention was chosen (``_ChosenAttention``)
            namespace.align_chosen = True


def nearest(name: str, choices: Iterable[str]) -> str | None:
    """The valid name closest to a mistyped one (``--beam-sise`` -> ``--beam-size``), or None."""
    close = difflib.get_close_matches(name, list(choices), n=1)
    return close[0] if close else None


class CommandParser(argparse.ArgumentParser):
    """The parser of every subcommand: a flag is taken only as spelled in full (``--max-step`` is not
    ``--max-steps``), and an unknown flag is answered with the nearest valid one (exit status 2), before
    anything else is checked: a misspelled required flag is named as misspelled, not as missing."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, allow_abbrev=False, **kwargs)

    def parse_args(self, args=None, namespace=None):
        args = list(sys.argv[1:] if args is None else args)
        unknown = self._unknown_flags(args)
        if unknown:
            self.error(self._unrecognized(unknown))
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:  # stray words: argparse's own message
            self.error("unrecognized arguments: " + " ".join(extras))
        return parsed

    def error(self, message: str):
        """Exit 2 with the error after the usage, the usage cut to one line where it runs long (``seq2seq
        train``'s lists about 100 flags: the error would scroll out of sight behind them)."""
        usage = self.format_usage()
        if usage.count("\n") > 6:
            usage = f"usage: {self.prog} [options]  ({self.prog} --help lists them)\n"
        self.exit(2, f"{usage}{self.prog}: error: {message}\n")

    def _known(self) -> list[str]:
        return [flag for action in self._actions for flag in action.option_strings]

    def _unknown_flags(self, args: list[str]) -> list[str]:
        """The words argparse would take for flags (as ``parse_known_args`` tells them from values) that
        name none of this parser's, up to a ``--`` that ends the flags."""
        known, unknown = set(self._known()), []
        for arg in args:
            if arg == "--":
                break
            if not arg.startswith("-") or arg == "-" or _NUMBER.match(arg):  # a value (or stdin's "-")
                continue
            name = arg.split("=", 1)[0]
            short_with_value = not arg.startswith("--") and arg[:2] in known  # -n5
            if name not in known and not short_with_value:
                unknown.append(name)
        return unknown

    def _unrecognized(self, flags: list[str]) -> str:
        shown = [action for action in self._actions if action.help != argparse.SUPPRESS]  # no deprecated alias
        choices = [flag for action in shown for flag in action.option_strings]
        named = [(flag, nearest(flag, choices)) for flag in flags]
        if len(named) == 1:
            flag, near = named[0]
            return f"unrecognized argument {flag}" + (f"; did you mean {near}?" if near else "")
        return "unrecognized arguments " + ", ".join(
            flag + (f" (did you mean {near}?)" if near else "") for flag, near in named)


_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")  # a negative number is a value, not a flag (as argparse)


def parser_for(command: str, description: str) -> argparse.ArgumentParser:
    return CommandParser(prog=f"seq2seq {command}", description=description,
                         formatter_class=argparse.RawDescriptionHelpFormatter)


# ----------------------------------------------------------------------------- flags from dataclasses


def _scalar(hint: Any) -> tuple[Callable[[str], Any], list[str] | None]:
    """(argparse type, choices) for a field type: int, float, str, a Literal, or one of them | None,
    possibly constrained (``Annotated``: pydantic checks the constraint)."""
    if typing.get_origin(hint) is typing.Annotated:
        hint = typing.get_args(hint)[0]
    args = [a for a in typing.get_args(hint) if a is not type(None)] or [hint]
    base = args[0] if len(args) == 1 else hint
    if typing.get_origin(base) is Literal:
        return str, list(typing.get_args(base))
    if base in (int, float):
        return base, None
    return str, None


def _is_bool(hint: Any) -> bool:
    return hint is bool or hint == (bool | None)


def add_dataclass_flags(parser: argparse._ActionsContainer, cls: type, dest_prefix: str = "",
                        defaults: Callable[[str, Any], str] | None = None, names: Collection[str] | None = None
                        ) -> None:
    """One flag per field of dataclass ``cls`` (``names``: of those fields only, each with its ``lone_help``
    where it has one: ``option``); unset flags stay absent from the namespace (SUPPRESS).
    ``defaults(name, value)`` renders the default shown in --help."""
    hints, fields = get_type_hints(cls), dataclasses.fields(cls)
    unknown = set(names or ()) - {f.name for f in fields}
    if unknown:
        raise ValueError(f"{cls.__name__} has no field {', '.join(sorted(unknown))}")
    for f in fields:
        if f.metadata.get("derived") or (names is not None and f.name not in names):
            continue
        hint, flag = hints[f.name], flag_of(cls, f.name)
        shown = defaults(f.name, field_default(f)) if defaults else f"{field_default(f)!r}"
        text = f.metadata.get("help", "")
        if names is not None and "lone_help" in f.metadata:
            text = f.metadata["lone_help"].format(**{g.name: g.default for g in fields})
        kwargs: dict[str, Any] = {"dest": dest_prefix + f.name, "default": argparse.SUPPRESS,
                                  "help": f"{text} (default: {shown})"}
        if _is_bool(hint):
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, **kwargs)
        elif "tuple" in str(hint):
            parser.add_argument(flag, type=float, nargs=2, metavar=("B1", "B2"), **kwargs)
        elif hint == list[int]:
            parser.add_argument(flag, type=int, nargs="+", metavar="N", **kwargs)
        else:
            kind, choices = _scalar(hint)
            parser.add_argument(flag, type=kind, choices=choices,
                                metavar=None if choices else flag[2:].replace("-", "_").upper(), **kwargs)


def _train_default(section: str) -> Callable[[str, Any], str]:
    """The default ``seq2seq train`` runs for a field: per architecture where it differs, and the
    toy preset's value where the no-corpus quickstart changes it."""

    def shown(name: str, value: Any) -> str:
        per_arch = {arch: values.get(section, {}).get(name, value) for arch, values in ARCH_DEFAULTS.items()}
        text = (f"{per_arch['rnn']!r} for rnn, {per_arch['transformer']!r} for transformer"
                if value is None and per_arch["rnn"] is not None else repr(value))
        toy = PRESETS["toy"].get(section, {}).get(name)
        return text + (f"; toy: {toy!r}" if toy is not None else "")

    return shown


def add_config_flags(parser: argparse.ArgumentParser) -> None:
    """The ``seq2seq train`` options: --preset, --config, --print-config and one flag per config field."""
    parser.add_argument("--preset", choices=list(PRESETS),
                        help="start from a preset (configs/NAME.yaml shows each): default toy when no corpus "
                             "is given, otherwise the architecture's defaults")
    parser.add_argument("--config", help="YAML or TOML file with model / data / train sections (e.g. a run's "
                                         "config.yaml); flags override it")
    parser.add_argument("--print-config", action="store_true",
                        help="print the effective config as YAML (what would run) and exit")
    for section, cls in SECTIONS.items():  # one group per section: its name and what it holds
        group = parser.add_argument_group(f"{section} options", cls.__doc__.strip().splitlines()[0].replace("``", ""))
        add_dataclass_flags(group, cls, f"{section}.", _train_default(section))


def build_run_config(args: argparse.Namespace) -> RunConfig:
    """preset < config file < flags, read into a checked, resolved RunConfig.

    Without --preset: the toy preset when neither the file nor the flags name a corpus other than
    the toy one (so a bare ``seq2seq train`` is the quickstart), no preset otherwise."""
    file_values = load_config_file(args.config) if getattr(args, "config", None) else {}
    flag_values: dict[str, dict[str, Any]] = {name: {} for name in SECTIONS}
    for dest, value in vars(args).items():
        if "." in dest:
            section, name = dest.split(".", 1)
            flag_values[section][name] = value
    for section, values in file_values.items():
        if section in SECTIONS and not isinstance(values, dict):
            raise UserError(f"--config {args.config}: '{section}' must be a mapping of options")
    name = getattr(args, "preset", None)
    if name is None:
        data = {**file_values.get("data", {}), **flag_values["data"]}
        corpus = any(data.get(key) for key in ("data_dir", "dataset", "train_file"))
        name = None if corpus else "toy"
    args.preset = name  # the preset that was used, for --print-config
    where = f"--config {args.config}" if getattr(args, "config", None) else "options"
    layers = ([(None, preset(name))] if name else []) + [(where, file_values), ("flags", flag_values)]
    init_from = flag_values["train"].get("init_from") or file_values.get("train", {}).get("init_from")
    if init_from:  # fine-tuning: the trained model's architecture and size, below the file and the flags
        layers.insert(len(layers) - 2, (None, {"model": _trained_model(init_from, file_values, flag_values)}))
    if getattr(args, "output_dir", None):
        layers.append(("--output-dir", {"output_dir": args.output_dir}))
    given = RunConfig.from_layers(layers, source=where)
    args.device_choices = given.device_choices()  # what the device decided, for --print-config
    return given.resolved()


def _trained_model(init_from: str, file_values: dict, flag_values: dict) -> dict[str, Any]:
    """The model section of the checkpoint ``--init-from`` names; a flag or config key that asks for
    another architecture or size is an error naming it (``FINE_TUNABLE``: dropout and the attention
    normalizer may change)."""
    from ..checkpoint.loaded import LoadedCheckpoint

    trained = LoadedCheckpoint.read(init_from).config.model
    model = dataclasses.asdict(trained)
    for source, values in (("--config", file_values.get("model", {})), ("flag", flag_values["model"])):
        for key, value in values.items():
            if key in ("vocab_size", *FINE_TUNABLE) or key not in model or value == model[key]:
                continue
            where = f"--{key.replace('_', '-')} {value}" if source == "flag" else f"--config: model.{key} {value}"
            raise UserError(f"{where}: --init-from {init_from} trained {key} {model[key]!r}; fine-tuning keeps the "
                            "trained model's architecture and size (drop the option)")
    return {key: value for key, value in model.items() if key != "vocab_size"}


def config_from_flags(flags: list[str]) -> RunConfig:
    """The RunConfig that ``seq2seq train`` would build from ``flags``."""
    parser = CommandParser()
    parser.add_argument("--output-dir")
    add_config_flags(parser)
    return build_run_config(parser.parse_args(flags))


# ----------------------------------------------------------------------------- shared flag groups


def add_decode_flags(parser: argparse._ActionsContainer, names: Collection[str] | None = None) -> None:
    """The search options (``DecodeConfig``): the same flags and defaults as ``Translator.translate``;
    ``names``: only those fields' flags (``serve``'s defaults for requests), the others left at
    ``DecodeConfig``'s defaults by ``decode_config``."""
    given = [f for f in dataclasses.fields(DecodeConfig) if names is None or f.name in names]
    sampling = any(f.name == "sample" for f in given)
    shown = {"beam_size": f"{DEFAULT_BEAM_SIZE}; 1 with --sample" if sampling else f"{DEFAULT_BEAM_SIZE}",
             "seed": "none"}
    add_dataclass_flags(parser, DecodeConfig, defaults=lambda name, value: shown.get(name, repr(value)), names=names)
    parser.set_defaults(**{f.name: f.default for f in given})
    if names is None:  # the old name of translate's flag
        parser.add_argument("--max-len-ratio", dest="max_output_ratio", type=float, action=DeprecatedAlias,
                            new="--max-output-ratio")


def add_alignment_flags(parser: argparse._ActionsContainer, include_eos: bool = False) -> None:
    """Which attention becomes the alignment matrix, and how hard links are read from it (``AlignConfig``,
    whose defaults they show); with ``include_eos`` also ``--include-eos``."""
    default = AlignConfig()
    parser.add_argument("--align-layer", default=default.layer_flag, action=_ChosenAttention,
                        help="decoder layer of the aggregate: index (negative counts from the top) or 'all' "
                             f"(mean of all layers) (default: {default.layer_flag}, the penultimate: Garg et al. "
                             "2019 found it aligns best; the only layer of an RNN; a model trained with guided "
                             "alignment: the layer it supervised)")
    parser.add_argument("--align-heads", default=default.heads_flag, action=_ChosenAttention,
                        help="'mean' (average all heads) or comma-separated head indices to average "
                             f"(default: {default.heads_flag}; a model trained with guided alignment: the heads "
                             "it supervised)")
    parser.add_argument("--align-method", choices=LINK_METHODS, default=default.method,
                        help="hard links: argmax = one source word per target word; threshold = every source "
                             "word with at least --align-threshold of the (renormalized) row; soft = every link "
                             "with at least --align-threshold of its row and of its column; grow = "
                             "grow-diag-final-and of the row argmax and the column argmax of the same matrix, "
                             "the links with at least --align-threshold of their row and column "
                             f"(default: {default.method})")
    parser.add_argument("--align-threshold", type=float, default=default.threshold,
                        help="share of a row (and of a column for soft and grow) a link needs (default: "
                             + ", ".join(f"{share} for {method}" for method, share in DEFAULT_SHARES.items() if share)
                             + "; grow 0 keeps every grown link)")
    for old, new in (("--layer", "align_layer"), ("--heads", "align_heads")):
        parser.add_argument(old, dest=new, action=DeprecatedAlias, new="--" + new.replace("_", "-"))
    if include_eos:
        parser.add_argument("--include-eos", action="store_true", default=default.include_eos,
                            help="keep the source EOS column and target EOS row in matrices and links "
                                 "(default: dropped, so EOS never appears as an alignment point)")


def add_backward_flags(parser: argparse._ActionsContainer) -> None:
    """``--backward-checkpoint`` and ``--symmetrize``: a target->source model whose links symmetrize the
    exported ones (``translate``, ``serve``; ``decoding.forced_alignment.BackwardAligner``)."""
    parser.add_argument("--backward-checkpoint", metavar="CHECKPOINT",
                        help="a target->source model: the exported word links (pharaoh_word) become the forward "
                             "model's symmetrized with this model's links of the same pair (--symmetrize)")
    parser.add_argument("--symmetrize", choices=MODEL_SYMMETRIZATIONS, default=None,
                        help="how --backward-checkpoint's links and the forward links are combined (agreement: links "
                             "read from where both models' word attention agree; default: the "
                             f"best measured: {MODEL_SYMMETRIZATION} for exported links, {MARKUP_SYMMETRIZATION} "
                             "for placing --markup tags)")


class _ChosenAttention(argparse._StoreAction):
    """``--align-layer`` / ``--align-heads``: stores the value and notes that the attention was chosen
    (otherwise a model trained with guided alignment reads its supervised heads: ``AlignConfig.for_model``)."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        setattr(namespace, self.dest, values)
        namespace.align_chosen = True


def align_config(args: argparse.Namespace) -> AlignConfig:
    """The alignment flags as a checked ``AlignConfig``; without --align-layer / --align-heads it follows
    the model's supervised attention (``model_default``)."""
    return AlignConfig.from_flags(args.align_layer, args.align_heads, args.align_method, args.align_threshold,
                                  getattr(args, "include_eos", AlignConfig.include_eos),
                                  model_default=not getattr(args, "align_chosen", False))


def job_config(cls: type[T], args: argparse.Namespace, **given: Any) -> T:
    """The dataclass ``cls`` (a job's typed options) from the flags of the same names, ``given`` overriding:
    the one place where a command's Namespace becomes what the library takes."""
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(cls) if hasattr(args, f.name)}
    return cls(**{**values, **given})


def decode_config(args: argparse.Namespace) -> DecodeConfig:
    """The search flags (``add_decode_flags``: all, or some and the others at their defaults) as a checked
    ``DecodeConfig``: the one place a command builds it (``job_config``)."""
    return job_config(DecodeConfig, args)


def add_device_flag(parser: argparse._ActionsContainer) -> None:
    parser.add_argument("--device", default="auto",
                        help="where to run: auto (default: CUDA when available), cpu, cuda or cuda:N")
