"""Typed configuration, the presets and every default: the one place they live.

Configuration flows one way: preset < config file < flags (or Python keyword arguments) -> these
dataclasses -> ``resolved()`` -> factories. Every value is checked against its declared type and
choices when it is read (pydantic validates the dataclasses; a YAML ``lr: 1e-3``, a string to
YAML, becomes 0.001, ``lr: abc`` is an error naming the key, the value and the file). Unknown keys
fail loudly, so a typo never silently falls back to a default. Fields whose default depends on the
architecture are ``None`` until ``resolved()`` fills them from ``ARCH_DEFAULTS``; the CLI, the
Python API (``seq2seq.train``) and the benchmarks all resolve the same way. The whole resolved
config is saved in every checkpoint and as ``config.yaml`` in every run directory.

The sections live by concern: ``model.py`` (``ModelConfig``, the options of each architecture, the
architecture defaults), ``data.py``, ``train.py`` (the run's ``train``, ``optim``, ``schedule``, ``eval`` and
``checkpoint`` sections), ``guided.py`` (guided alignment), ``decode.py``, ``align.py``, ``fields.py`` (what a
section is made of), ``layout.py`` (the layout of configs written before the sections, read into them); here
``RunConfig``, the presets and the one layering (``RunConfig.from_layers``). Everything is re-exported:
``from seq2seq.config import ...``.
"""
from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter, ValidationError

from ..errors import UserError
from .align import (  # noqa: F401  (re-exported: ``from seq2seq.config import AlignConfig`` everywhere)
    ADAPT_LR, ADAPT_PAIRS, FORCED_BATCH_SIZE, LINK_METHODS, MARKUP_SYMMETRIZATION, MODEL_SYMMETRIZATION,
    MODEL_SYMMETRIZATIONS, SYMMETRIZATIONS, AlignConfig, AttributionConfig, DEFAULT_SHARES, check_link_method,
    layer_index, link_share, parse_heads, parse_layer,
)
from .data import DataConfig  # noqa: F401
from .decode import DECODER_ROWS, DEFAULT_BEAM_SIZE, DecodeConfig, check_decoding  # noqa: F401
from .fields import STRICT, Device, field_default, fill_defaults, flag_of, option  # noqa: F401
from .guided import SELF_GUIDANCE, GuidedConfig  # noqa: F401
from .layout import MOVED, migrated, moved_hint  # noqa: F401
from .model import (  # noqa: F401
    ARCH_DEFAULTS, ARCH_OPTIONS, ENTMAX_MISSING, FINE_TUNABLE, ModelConfig, check_arch_options, entmax_installed,
)
from .train import CheckpointConfig, EvalConfig, OptimConfig, ScheduleConfig, TrainConfig  # noqa: F401


# Defaults that depend on where the run trains, for fields still None after the preset, the file and
# the flags, and before ARCH_DEFAULTS: a value is either one for every architecture or a dict by
# architecture. A GPU takes batches several times larger (at CPU-sized batches a small model is bound
# by kernel launches, not arithmetic), autocast in bf16 where it has bf16 tensor cores ('auto') and
# TF32 fp32 matrix products; each is measured in docs/benchmarks.md (GPU training) and overridden by
# its flag. ``device_choices`` lists what was chosen and why (``seq2seq train --print-config``).
DEVICE_DEFAULTS: dict[str, dict[str, dict[str, Any]]] = {
    "cpu": {"train": {"precision": "fp32", "tf32": False, "compile": False}},
    "cuda": {"data": {"max_tokens": {"rnn": 8000, "transformer": 12000}},
             "train": {"precision": {"rnn": "fp32", "transformer": "auto"}, "tf32": True,
                       "compile": {"rnn": False, "transformer": True}}},
}
DEVICE_REASONS = {
    "cpu": {"precision": "IEEE fp32: bf16 is opt-in on CPUs, where it changes results and is slow without "
                         "AVX512-BF16 / AMX",
            "tf32": "CUDA only",
            "compile": "minutes of compiling on a CPU, and no gain recorded there"},
    "cuda": {"max_tokens": "GPU-sized batches: at CPU sizes a step is bound by kernel launches",
             "precision": "Transformer: bf16 autocast where the GPU has bf16 tensor cores (auto), else fp32; "
                          "RNN: fp32 (TF32), faster than bf16 for cuDNN's recurrences",
             "tf32": "TF32 fp32 matrix products on Ampere or newer: several times faster, ~1e-3 relative error",
             "compile": "Transformer: the step compiled and replayed as CUDA graphs, ~3x the eager tokens/s "
                        "after about a minute of compiling; RNN: eager"},
}

# Named starting points (partial configs, the layer below a config file and flags). ``toy`` is what
# `seq2seq train` with no corpus runs: the embedded number-word task, a small model, a fixed number of
# steps (not minutes), so that every CPU trains the same model.
# rnn-bahdanau, which rnn-align extends (one definition: a change to the one follows in the other)
RNN_BAHDANAU: dict[str, dict[str, Any]] = {"model": {"arch": "rnn", "attention": "bahdanau"}, "optim": {"lr": 2e-3}}
PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    "toy": {
        "model": {"embed_dim": 128, "hidden_size": 128, "decoder_hidden_size": 256, "d_model": 128,
                  "ff_size": 512, "layers": 2, "heads": 4, "dropout": 0.1},
        "data": {"toy_size": 20000, "src": "en", "tgt": "de", "vocab_size": 400, "max_tokens": 3000},
        "train": {"max_steps": 1000}, "schedule": {"warmup_steps": 300}, "eval": {"every": 400, "max_sentences": 300},
    },
    # rnn-bahdanau and transformer: the architecture's defaults and the winners of the equal-effort
    # validation search (benchmarks/bench_tune.py, docs/benchmarks.md); rnn-luong was not searched, but keeps
    # lr 1e-3 against rnn-bahdanau's 2e-3 by val at 25 minutes (docs/benchmarks.md, 2026-11-29).
    # transformer's peak rate 2e-3 (with the CPU's 1,500-token batches): better on validation at 25 minutes on
    # two CPU families (issue 65, docs/benchmarks.md)
    "rnn-bahdanau": RNN_BAHDANAU,
    "rnn-luong": {"model": {"arch": "rnn", "attention": "luong-general"}},
    "transformer": {"model": {"arch": "transformer"}, "schedule": {"warmup_steps": 200}, "optim": {"lr": 2e-3}},
    # rnn-bahdanau trained to align words as it translates: its one attention guided by eflomal's links of the
    # training pairs (pip install 'seq2seq[align]'), lightly (weight 0.2: its BLEU stays where the unguided
    # preset's is), unlinked words on the source EOS (NULL); AER about 0.06-0.08 lower on two CPU families
    # (docs/guides/alignments.md, benchmarks/bench_alignment.py's rnn-guided-null)
    "rnn-align": {**RNN_BAHDANAU, "guided": {"links": "eflomal", "weight": 0.2, "unaligned": "eos"}},
    # the transformer preset trained to align words as it translates: guided alignment on eflomal's links of
    # the training pairs (pip install 'seq2seq[align]'), weight 1, supervising the penultimate layer's first
    # head with the whole target visible (full context), unlinked words on the source EOS (NULL), learning fast
    # early (peak rate 2e-3, and the CPU's batches of 1,500 tokens, ARCH_DEFAULTS) and settling at the
    # end of its budget (linear decay: needs --max-minutes or --max-steps); the recipe of
    # docs/guides/alignments.md, measured by benchmarks/bench_alignment.py
    "transformer-align": {"model": {"arch": "transformer"}, "optim": {"lr": 2e-3},
                          "schedule": {"kind": "linear", "warmup_steps": 200},
                          "guided": {"links": "eflomal", "weight": 1.0, "unaligned": "eos", "full_context": True}},
    # the transformer preset for budgets of many epochs (a GPU trains Multi30k's in seconds): more dropout
    # and a higher peak rate; the winner of a validation search on one GPU (docs/benchmarks.md)
    "transformer-gpu": {"model": {"arch": "transformer", "dropout": 0.3}, "schedule": {"warmup_steps": 200},
                        "optim": {"lr": 2e-3}},
    # Vaswani et al. 2017's base model (6+6 layers, d512, 8 heads, FF 2048, 48 M parameters with an 8k
    # vocabulary) for corpora larger than Multi30k; docs/guides/training.md gives its cost per device
    "transformer-base": {"model": {"arch": "transformer", "d_model": 512, "heads": 8, "ff_size": 2048, "layers": 6},
                         "schedule": {"warmup_steps": 4000}, "optim": {"lr": 7e-4}},
}


@dataclass
class RunConfig:
    """Everything a training run needs; ``resolved()`` is what actually runs."""

    __pydantic_config__ = STRICT

    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    guided: GuidedConfig = field(default_factory=GuidedConfig)
    output_dir: str = ""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, raw: dict[str, Any], source: str = "config") -> "RunConfig":
        """Build from nested dicts (today's layout or the one before the sections: ``layout.migrated``),
        converting and checking every value; errors name ``source``."""
        return validate(cls, migrated(raw, source), source)

    @classmethod
    def from_layers(cls, layers: list[tuple[str | None, dict[str, Any]]], source: str = "config") -> "RunConfig":
        """The one layering of the command and the API: ``layers`` (where each comes from, a partial config)
        from the lowest (a preset) to the highest (flags), merged section by section (``merge_layers``), an
        option of the architecture the model is not an error naming where it was set (``check_arch_options``;
        a layer from None is not checked: a preset, which may size both architectures as the toy one does, or
        a trained model's section), then read (errors name ``source``). Each layer may be in the layout before
        the sections (``layout.migrated``). Not yet resolved."""
        layers = [(where, migrated(values, where or source)) for where, values in layers]
        merged = merge_layers([values for _, values in layers])
        model = merged.get("model")
        arch = model.get("arch", ModelConfig.arch) if isinstance(model, dict) else ModelConfig.arch
        check_arch_options([(where, values["model"]) for where, values in layers
                            if where is not None and isinstance(values.get("model"), dict)], arch)
        return cls.from_dict(merged, source=source)

    @classmethod
    def from_preset(cls, name: str, **sections: dict[str, Any]) -> "RunConfig":
        """A preset with overrides per section, resolved: ``RunConfig.from_preset("rnn-luong",
        data={"data_dir": "multi30k", "src": "de", "tgt": "en"})`` is ``seq2seq train --preset
        rnn-luong --data-dir multi30k --src de --tgt en``."""
        return cls.from_layers([(None, preset(name)), ("arguments", sections)]).resolved()

    def resolved(self, device_type: str | None = None) -> "RunConfig":
        """A checked copy with every device- and architecture-dependent default (None) filled in:
        ``DEVICE_DEFAULTS`` for ``device_type`` ('cpu' or 'cuda'; None: where ``train.device`` trains),
        then ``ARCH_DEFAULTS``; ``fixed_shapes`` unset follows ``train.compile``; the other architecture's
        model options at their defaults (``ModelConfig.only_read_options``).

        It runs once on the way to the trainer (the command, then ``train()``, then the ``Trainer``): a config
        that ``resolved`` returned, for the same device and unchanged since, comes back as an equal copy without
        resolving again (``model.vocab_size``, set from the tokenizer, and ``output_dir`` may have been set); one
        changed otherwise, or read back from a checkpoint (a resumed run's own), resolves anew."""
        device_type = device_type or training_device_type(self.train.device)
        if getattr(self, "_resolved_as", None) == (device_type, self._sections()):
            return copy.deepcopy(self)
        cfg = RunConfig.from_dict(self.to_dict(), source="config")  # re-checks values set in Python
        for section in SECTIONS:
            filled = fill_defaults(getattr(cfg, section), DEVICE_DEFAULTS[device_type].get(section, {}), cfg.model.arch)
            setattr(cfg, section, fill_defaults(filled, ARCH_DEFAULTS[cfg.model.arch].get(section, {}), cfg.model.arch))
        if cfg.data.fixed_shapes is None:
            cfg.data.fixed_shapes = cfg.train.compile
        cfg.model = cfg.model.only_read_options()
        cfg.model.validate()
        cfg.guided.model_options(cfg.model)  # its errors before any work
        cfg._resolved_as = (device_type, cfg._sections())
        return cfg

    def _sections(self) -> dict[str, Any]:
        """What resolving reads and fills: the values of every section but the derived ones (``vocab_size``)."""
        values = {name: dataclasses.asdict(getattr(self, name)) for name in SECTIONS}
        for name, cls in SECTIONS.items():
            for f in dataclasses.fields(cls):
                if f.metadata.get("derived"):
                    del values[name][f.name]
        return values

    def device_choices(self, device_type: str | None = None) -> list[tuple[str, Any, str]]:
        """(key, value, why) of each ``DEVICE_DEFAULTS`` value that ``resolved(device_type)`` would
        fill in (fields this config leaves unset), for ``--print-config``."""
        device_type = device_type or training_device_type(self.train.device)
        chosen = []
        for section, defaults in DEVICE_DEFAULTS[device_type].items():
            for key, value in defaults.items():
                if getattr(getattr(self, section), key) is None:
                    value = value[self.model.arch] if isinstance(value, dict) else value
                    chosen.append((f"{section}.{key}", value, DEVICE_REASONS[device_type].get(key, "")))
        return chosen


def training_device_type(device: str) -> str:
    """'cuda' or 'cpu': where ``--device`` trains (auto: CUDA when PyTorch sees a GPU)."""
    if device != "auto":
        return "cpu" if device == "cpu" else "cuda"
    import torch  # only to resolve 'auto'

    return "cuda" if torch.cuda.is_available() else "cpu"


def preset(name: str) -> dict[str, dict[str, Any]]:
    """The partial config of a preset (a deep copy)."""
    if name not in PRESETS:
        raise UserError(f"--preset {name!r}: unknown; choose one of {', '.join(PRESETS)}")
    return copy.deepcopy(PRESETS[name])


def merge_layers(layers: list[dict[str, Any]]) -> dict[str, Any]:
    """Later layers override earlier ones, section by section (``model``, ``data``, ``train``, ...: ``SECTIONS``)."""
    merged: dict[str, Any] = {}
    for layer in layers:
        for key, value in layer.items():
            if isinstance(value, dict) and isinstance(merged.get(key), dict):
                merged[key] = {**merged[key], **value}
            else:
                merged[key] = copy.deepcopy(value)
    return merged


_ADAPTERS: dict[type, TypeAdapter] = {}


def validate(cls: type, raw: Any, source: str) -> Any:
    """``raw`` (nested dicts from a file, flags or a checkpoint) as dataclass ``cls``; a bad value is
    a UserError naming the source, the key, the value and what was expected."""
    adapter = _ADAPTERS.setdefault(cls, TypeAdapter(cls))
    try:
        return adapter.validate_python(raw)
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            key = ".".join(str(part) for part in error["loc"] if not isinstance(part, int))
            if error["type"] == "unexpected_keyword_argument":
                hint = moved_hint(str(error["loc"][-1])) if len(error["loc"]) > 1 else ""
                problems.append(f"unknown key {key}{hint}; {_valid_keys(cls, error['loc'][:-1])}")
            else:
                problems.append(f"{key}: {error['msg'].rstrip('.')} (got {error['input']!r})")
        raise UserError(f"{source}: " + "; ".join(problems)) from None


def _valid_keys(cls: type, path: tuple) -> str:
    """The keys allowed where an unknown one was found: in ``cls`` itself, or in its section ``path[0]``."""
    if path:
        cls = SECTIONS.get(path[0], cls)
    return f"valid keys are: {', '.join(f.name for f in dataclasses.fields(cls))}"


#: The sections of a ``RunConfig``, in the order a config file lists them, each a group of ``seq2seq train --help``
SECTIONS: dict[str, type] = {"model": ModelConfig, "data": DataConfig, "train": TrainConfig, "optim": OptimConfig,
                             "schedule": ScheduleConfig, "eval": EvalConfig, "checkpoint": CheckpointConfig,
                             "guided": GuidedConfig}

#: What ``--resume`` may change (``section.field``): the stopping limits and validation rhythm, and where the run
#: computes. Everything else is the run's own, read back from its checkpoint.
LIMIT_FIELDS = ("train.max_steps", "train.max_epochs", "train.max_minutes", "eval.patience", "eval.every",
                "eval.every_minutes")
RESUME_FIELDS = LIMIT_FIELDS + ("train.device", "train.threads", "train.tf32", "train.compile")  # compile: how


def flag_for(key: str) -> str:
    """The ``seq2seq train`` flag of a ``section.field`` key (``eval.every`` -> ``--eval-every``)."""
    section, name = key.split(".", 1)
    return flag_of(SECTIONS[section], name)


def config_to_yaml(cfg: RunConfig, header: str = "") -> str:
    """The config as YAML that ``--config`` reads back to an equal config, listing only the model options
    its architecture reads (the other architecture's, at their defaults, are left out: a Transformer's
    preset shows no ``rnn_cell``; ``ModelConfig.unread_options``)."""
    import yaml

    data = cfg.to_dict()
    defaults = {f.name: f.default for f in dataclasses.fields(ModelConfig)}
    for key in cfg.model.unread_options():
        if data["model"][key] == defaults[key]:
            del data["model"][key]
    data["optim"]["betas"] = list(data["optim"]["betas"]) if data["optim"]["betas"] is not None else None
    text = yaml.safe_dump(data, sort_keys=False, default_flow_style=False, allow_unicode=True)
    return (header.rstrip("\n") + "\n" if header else "") + text


def load_config_file(path: str | Path) -> dict[str, Any]:
    """Read a YAML (.yaml/.yml) or TOML (.toml) config file into a dict."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"--config {path}: no such file")
    text = path.read_text(encoding="utf-8")
    try:
        if path.suffix == ".toml":
            import tomllib

            data = tomllib.loads(text)
        elif path.suffix in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(text) or {}
        else:
            raise UserError(f"--config {path}: use a .yaml, .yml or .toml file")
    except UserError:
        raise
    except Exception as exc:  # parse errors from yaml/tomllib
        raise UserError(f"--config {path}: cannot parse: {exc}") from None
    if not isinstance(data, dict):
        raise UserError(f"--config {path}: expected a mapping with sections ({', '.join(SECTIONS)})")
    return data
