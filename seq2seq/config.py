"""Typed configuration: CLI flags / config file -> these dataclasses -> factories.

Configuration flows one way. Unknown keys fail loudly (``from_dict``) so a typo in a config file
never silently falls back to a default. The whole ``RunConfig`` is saved inside every checkpoint.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_type_hints

from .errors import UserError

RNN_ATTENTIONS = ("bahdanau", "luong-dot", "luong-general", "luong-concat")


@dataclass
class ModelConfig:
    """Architecture and size. ``vocab_size`` is filled in from the tokenizer."""

    arch: str = "transformer"  # rnn | transformer
    vocab_size: int = 0
    dropout: float = 0.1
    tie_embeddings: bool = True  # tie the target input embeddings and the output layer
    # the source uses the target embedding table (joint vocabulary); None: the same as tie_embeddings
    share_source_embeddings: bool | None = None
    # RNN
    rnn_cell: str = "gru"  # gru | lstm
    attention: str = "bahdanau"  # one of RNN_ATTENTIONS
    embed_dim: int = 256
    hidden_size: int = 256  # per direction in the encoder
    decoder_hidden_size: int = 512
    encoder_layers: int = 1
    decoder_layers: int = 1
    input_feeding: bool = True  # Luong only: feed the attentional state h~ into the next step
    # Transformer
    d_model: int = 256
    heads: int = 4
    ff_size: int = 1024
    layers: int = 3  # encoder layers = decoder layers
    norm_first: bool = True  # pre-norm (True) or post-norm (False)
    positional: str = "sinusoidal"  # sinusoidal | learned
    max_positions: int = 1024

    @property
    def shares_source_embeddings(self) -> bool:
        """Whether the source embedding table is the target one (joint vocabulary)."""
        return self.tie_embeddings if self.share_source_embeddings is None else self.share_source_embeddings

    def validate(self) -> None:
        if self.arch not in ("rnn", "transformer"):
            raise UserError(f"--arch must be 'rnn' or 'transformer', got {self.arch!r}")
        if self.arch == "rnn" and self.attention not in RNN_ATTENTIONS:
            raise UserError(
                f"--attention must be one of {', '.join(RNN_ATTENTIONS)}, got {self.attention!r}"
            )
        if self.rnn_cell not in ("gru", "lstm"):
            raise UserError(f"--rnn-cell must be 'gru' or 'lstm', got {self.rnn_cell!r}")
        if self.positional not in ("sinusoidal", "learned"):
            raise UserError(f"--positional must be 'sinusoidal' or 'learned', got {self.positional!r}")
        if self.arch == "transformer" and self.d_model % self.heads:
            raise UserError(f"--d-model ({self.d_model}) must be divisible by --heads ({self.heads})")
        if not 0.0 <= self.dropout < 1.0:
            raise UserError(f"--dropout must be in [0, 1), got {self.dropout}")
        sizes = ("embed_dim", "hidden_size", "decoder_hidden_size", "encoder_layers", "decoder_layers",
                 "d_model", "heads", "ff_size", "layers", "max_positions")
        for name in sizes:
            if getattr(self, name) < 1:
                raise UserError(f"--{name.replace('_', '-')} must be a positive integer, got {getattr(self, name)}")


@dataclass
class DataConfig:
    """Where the corpus comes from and how it is cleaned, tokenized and batched."""

    data_dir: str | None = None  # directory of {split}.{lang} files
    dataset: str | None = None  # Hugging Face hub name, e.g. bentrevett/multi30k
    dataset_config: str | None = None  # e.g. de-en for wmt14
    train_file: str | None = None  # TSV or JSONL with src/tgt (overrides data_dir)
    valid_file: str | None = None
    test_file: str | None = None
    src: str = "src"  # language code (file suffix / hub column)
    tgt: str = "tgt"
    train_split: str = "train"
    valid_split: str = "val"
    test_split: str = "test_2016_flickr"
    max_len: int = 0  # drop pairs longer than this many whitespace words (0 = keep all)
    max_len_ratio: float = 0.0  # drop pairs whose length ratio exceeds this (0 = keep all)
    vocab_size: int = 8000
    sp_model_type: str = "unigram"  # unigram | bpe
    sp_input_sentence_size: int = 2_000_000  # sentences sampled to train SentencePiece
    max_tokens: int = 4096  # batch budget, padding included (per side)
    num_proc: int = 1
    cache_dir: str = "data/cache"  # encoded corpora, reused across runs
    toy_size: int = 0  # >0: train on the embedded toy corpus with this many training pairs
    streaming: bool = False  # read, tokenize and batch the training split on the fly (corpora past RAM)
    shuffle_buffer: int = 10_000  # streaming: pairs held in the shuffle buffer
    stream_window: int = 100  # streaming: sort by length within windows of this many batches


@dataclass
class TrainConfig:
    """Optimisation, schedule, evaluation and checkpointing."""

    seed: int = 1
    device: str = "auto"  # auto | cpu | cuda
    precision: str = "fp32"  # fp32 | bf16 | fp16
    optimizer: str = "adamw"  # adam | adamw
    lr: float = 0.0  # 0 = architecture default
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.98)
    schedule: str = "auto"  # auto | inverse-sqrt | plateau | constant
    warmup_steps: int = 4000
    plateau_patience: int = 2
    plateau_factor: float = 0.5
    label_smoothing: float = 0.1
    clip_norm: float = 1.0
    accumulate: int = 1
    max_steps: int = 0  # 0 = unbounded
    max_epochs: int = 0  # 0 = unbounded
    max_minutes: float = 0.0  # wall-clock budget, 0 = unbounded
    eval_every: int = 500
    eval_beam_size: int = 1
    eval_max_sentences: int = 0  # 0 = whole validation set
    patience: int = 0  # early stopping: evaluations without BLEU improvement (0 = off)
    log_every: int = 50
    compile: bool = False
    threads: int = 0  # 0 = torch default


@dataclass
class RunConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    output_dir: str = ""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, raw: dict[str, Any], source: str = "config") -> "RunConfig":
        return _build(cls, raw, source)


def _build(cls: type, raw: dict[str, Any], where: str) -> Any:
    """Build dataclass ``cls`` from a dict, recursing into nested dataclasses; unknown keys fail."""
    if not isinstance(raw, dict):
        raise UserError(f"{where}: expected a mapping, got {type(raw).__name__}")
    hints = get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - names)
    if unknown:
        raise UserError(
            f"{where}: unknown key(s) {', '.join(unknown)}; valid keys are: {', '.join(sorted(names))}"
        )
    kwargs = {}
    for name, value in raw.items():
        hint = hints[name]
        if dataclasses.is_dataclass(hint):
            kwargs[name] = _build(hint, value, f"{where}.{name}")
        elif name == "betas" and isinstance(value, list):
            kwargs[name] = tuple(value)
        else:
            kwargs[name] = value
    return cls(**kwargs)


def load_config_file(path: str | Path) -> dict[str, Any]:
    """Read a YAML (.yaml/.yml) or TOML (.toml) config file into a dict."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"--config {path}: no such file")
    text = path.read_text(encoding="utf-8")
    try:
        if path.suffix == ".toml":
            import tomllib

            return tomllib.loads(text)
        if path.suffix in (".yaml", ".yml"):
            import yaml

            return yaml.safe_load(text) or {}
    except Exception as exc:  # parse errors from yaml/tomllib
        raise UserError(f"--config {path}: cannot parse: {exc}") from None
    raise UserError(f"--config {path}: use a .yaml, .yml or .toml file")
