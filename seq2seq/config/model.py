"""The model section: ``ModelConfig`` (architecture and size), the options each architecture reads
(``ARCH_OPTIONS``: an option of the other one is a named error, ``check_arch_options``) and the defaults
that depend on the architecture (``ARCH_DEFAULTS``, in every section)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal, Sequence

from ..errors import UserError
from .fields import STRICT, fill_defaults, option

#: Why a sparse ``attention_normalizer`` cannot run, and the fix (``seq2seq.nn.normalizers``)
ENTMAX_MISSING = ("--attention-normalizer sparsemax and entmax15 need the entmax package: "
                  "pip install 'seq2seq[sparse]' (or pip install entmax)")
#: Model fields a fine-tuning run (``--init-from``) may change: they have no parameters.
FINE_TUNABLE = ("dropout", "attention_normalizer")


@dataclass
class ModelConfig:
    """Architecture and size. ``vocab_size`` is filled in from the tokenizer."""

    __pydantic_config__ = STRICT

    arch: Literal["rnn", "transformer"] = option("transformer", "architecture")
    vocab_size: int = option(0, "filled in from the tokenizer", derived=True)
    dropout: float | None = option(None, "dropout probability")
    tie_embeddings: bool = option(True, "tie the target embeddings and the output layer (W_out = E_tgt)")
    share_source_embeddings: bool | None = option(
        None, "source and target share one embedding table (joint vocabulary); unset: follows --tie-embeddings")
    attention_normalizer: Literal["softmax", "sparsemax", "entmax15"] = option(
        "softmax", "what turns attention scores into weights, in the RNN's attention and the Transformer's "
                   "cross-attention: softmax, or sparsemax / 1.5-entmax (exact zeros; need the entmax package: "
                   "pip install 'seq2seq[sparse]')")
    # RNN
    rnn_cell: Literal["gru", "lstm"] = option("gru", "RNN cell")
    attention: Literal["bahdanau", "luong-dot", "luong-general", "luong-concat"] = option(
        "bahdanau", "RNN attention: Bahdanau additive, or Luong global with dot / general / concat scores")
    embed_dim: int = option(256, "RNN: embedding size")
    hidden_size: int = option(256, "RNN: encoder hidden size per direction (bidirectional)")
    decoder_hidden_size: int = option(512, "RNN: decoder hidden size")
    encoder_layers: int = option(1, "RNN: encoder layers")
    decoder_layers: int = option(1, "RNN: decoder layers")
    input_feeding: bool = option(True, "RNN, Luong only: feed the attentional state into the next step")
    # Transformer
    d_model: int = option(256, "Transformer: model width")
    heads: int = option(4, "Transformer: attention heads per layer")
    ff_size: int = option(1024, "Transformer: feed-forward inner size")
    layers: int = option(3, "Transformer: encoder layers = decoder layers")
    norm_first: bool = option(True, "Transformer: pre-norm (else post-norm)")
    positional: Literal["sinusoidal", "learned", "relative", "rope"] = option(
        "sinusoidal", "Transformer: position encoding: sinusoidal or learned (absolute, added to the embeddings), "
                      "relative (Shaw et al. 2018: learned embeddings of the clipped distance j - i in "
                      "self-attention) or rope (rotary, Su et al. 2021: queries and keys rotated by position)")
    max_positions: int = option(1024, "Transformer, learned positions: longest sequence")
    relative_clip: int = option(16, "Transformer, relative positions: clipping distance k (distances beyond "
                                    "+-k share the embedding of +-k)")
    relative_values: bool = option(False, "Transformer, relative positions: add the distance embeddings to the "
                                          "values too, not only to the keys")

    @property
    def shares_source_embeddings(self) -> bool:
        """Whether the source embedding table is the target one (joint vocabulary)."""
        return self.tie_embeddings if self.share_source_embeddings is None else self.share_source_embeddings

    def with_arch_defaults(self) -> "ModelConfig":
        """A copy with the fields left None filled in for ``arch`` (``ARCH_DEFAULTS``)."""
        return fill_defaults(self, ARCH_DEFAULTS[self.arch].get("model", {}), self.arch)

    def differences(self, other: "ModelConfig") -> list[tuple[str, Any, Any]]:
        """(field, this value, other's value) for every architecture or size field that differs, i.e.
        what keeps ``other``'s weights from loading into this model (``FINE_TUNABLE`` and the vocabulary
        size, which comes from the tokenizer, do not count)."""
        skip = {"vocab_size", *FINE_TUNABLE, *self.unread_options()}
        return [(f.name, getattr(self, f.name), getattr(other, f.name)) for f in dataclasses.fields(self)
                if f.name not in skip and getattr(self, f.name) != getattr(other, f.name)]

    def unread_options(self) -> tuple[str, ...]:
        """The options of the other architecture (``ARCH_OPTIONS``): this model does not read them."""
        return tuple(key for arch, keys in ARCH_OPTIONS.items() if arch != self.arch for key in keys)

    def only_read_options(self) -> "ModelConfig":
        """A copy with the other architecture's options at their defaults (what ``RunConfig.resolved``
        keeps: a preset sized for both, as the toy one is, leaves no trace in an RNN's config)."""
        defaults = {f.name: f.default for f in dataclasses.fields(self) if f.name in self.unread_options()}
        return dataclasses.replace(self, **defaults)

    def validate(self) -> None:
        """Checks across fields (types and choices were checked when the config was read)."""
        if self.arch == "transformer" and self.d_model % self.heads:
            raise UserError(f"--d-model ({self.d_model}) must be divisible by --heads ({self.heads})")
        if self.dropout is not None and not 0.0 <= self.dropout < 1.0:
            raise UserError(f"--dropout must be in [0, 1), got {self.dropout}")
        sizes = ("embed_dim", "hidden_size", "decoder_hidden_size", "encoder_layers", "decoder_layers",
                 "d_model", "heads", "ff_size", "layers", "max_positions", "relative_clip")
        for name in sizes:
            if getattr(self, name) < 1:
                raise UserError(f"--{name.replace('_', '-')} must be a positive integer, got {getattr(self, name)}")
        if self.attention_normalizer != "softmax" and not entmax_installed():
            raise UserError(ENTMAX_MISSING)  # before any work (the model checks again when built)
        if self.arch == "transformer" and self.positional == "rope" and (self.d_model // self.heads) % 2:
            raise UserError(f"--positional rope rotates pairs of features: the head size --d-model / --heads "
                            f"({self.d_model} / {self.heads} = {self.d_model // self.heads}) must be even")


def entmax_installed() -> bool:
    """Whether ``import entmax`` would find the package (without importing it, nor torch)."""
    import importlib.util

    try:
        return importlib.util.find_spec("entmax") is not None
    except ValueError:  # in sys.modules without a spec, e.g. set to None to block the import
        return False


#: The model options only one architecture reads (the others are shared by both).
ARCH_OPTIONS: dict[str, tuple[str, ...]] = {
    "rnn": ("rnn_cell", "attention", "embed_dim", "hidden_size", "decoder_hidden_size", "encoder_layers",
            "decoder_layers", "input_feeding"),
    "transformer": ("d_model", "heads", "ff_size", "layers", "norm_first", "positional", "max_positions",
                    "relative_clip", "relative_values"),
}
ARCH_NAMES = {"rnn": "an RNN", "transformer": "a Transformer"}


def check_arch_options(layers: Sequence[tuple[str, dict[str, Any]]], arch: str) -> None:
    """A UserError when a layer of the configuration (``(where, model section)``: ``"flags"``, ``"--config
    FILE"``, ``"--preset NAME"``, Python arguments) sets an option of the architecture other than ``arch`` to
    anything but its default: the model would ignore it silently (``--arch rnn --heads 8``). Defaults pass,
    so a whole effective config (``--print-config``, a run's config.yaml) reads back."""
    if arch not in ARCH_OPTIONS:
        return  # not an architecture: reading the config names the error
    defaults = {f.name: f.default for f in dataclasses.fields(ModelConfig)}
    other = "transformer" if arch == "rnn" else "rnn"
    for where, model in layers:
        for key in ARCH_OPTIONS[other]:
            if key in model and model[key] != defaults[key]:
                what = (f"--{key.replace('_', '-')} {model[key]}" if where == "flags"
                        else f"{where}: model.{key} {model[key]!r}")
                raise UserError(f"{what} is an option of {ARCH_NAMES[other]}, but the model is --arch {arch}, which "
                                f"would ignore it: drop it, or train --arch {other}")


# Defaults that depend on the architecture: a field left None takes the value for its --arch. The batch sizes
# are a CPU's (a GPU's come first, ``DEVICE_DEFAULTS``): smaller batches, more updates in a budget, measured
# better on validation at 25 minutes on two CPU families for both architectures (issue 65; records
# alignment-2026-11-27-intel-transformer-rate, alignment-2026-11-28-epyc-rnn-batch,
# alignment-2026-11-29-avx2-presets).
ARCH_DEFAULTS: dict[str, dict[str, dict[str, Any]]] = {
    "rnn": {"model": {"dropout": 0.3},
            "data": {"max_tokens": 1000},
            "optim": {"clip_norm": 5.0, "betas": (0.9, 0.999)},
            "schedule": {"kind": "plateau", "warmup_steps": 0}},
    "transformer": {"model": {"dropout": 0.1},
                    "data": {"max_tokens": 1500},
                    "optim": {"clip_norm": 1.0, "betas": (0.9, 0.98)},
                    "schedule": {"kind": "inverse-sqrt", "warmup_steps": 400}},
}
