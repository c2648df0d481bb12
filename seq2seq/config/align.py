"""How attention becomes alignments and explanations: ``AlignConfig`` (layer, heads, link extraction),
the link methods and symmetrizations, ``AttributionConfig``."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

from ..errors import UserError
from .fields import option

#: how hard links are read from an attention matrix (``seq2seq.alignment.links.extract_links``)
LINK_METHODS = ("argmax", "threshold", "soft", "grow", "probability")
#: each method's share of a row (threshold; and of a column: soft, grow) when ``--align-threshold`` is not given:
#: the best on the val gold (docs/guides/alignments.md); argmax takes none
DEFAULT_SHARES = {"argmax": None, "threshold": 0.3, "soft": 0.3, "grow": 0.2, "probability": 0.5}


@dataclass
class AlignConfig:
    """Which attention becomes an alignment matrix and how hard links are read from it: the one home of
    these defaults, shared by ``seq2seq translate``, ``serve``, ``align``, ``compare`` and ``analyze``,
    ``Translation.alignment_record``, the alignment export and gradient-weighted attention.

    ``layer`` -2 is the penultimate decoder layer: Garg et al. (2019) found it aligns best (an RNN has
    one layer and uses it); ``heads`` "mean" averages every head of it."""

    layer: int | Literal["all"] = option(-2, "decoder layer of the aggregate: index (negative counts from the "
                                             "top) or 'all' (mean of all layers)")
    heads: Literal["mean"] | list[int] = option("mean", "'mean' (average all heads) or the head indices to "
                                                        "average")
    method: Literal[LINK_METHODS] = option(
        "grow", "hard links (grow aligned best on the val gold, for plain and guided attention alike: "
                "docs/guides/alignments.md): argmax = one source word per target word; threshold = every "
                "source word with at least `threshold` of the (renormalized) row; soft = every link with at "
                "least `threshold` of its row and of its column; grow = grow-diag-final-and of the row and the "
                "column argmax, keeping the links with at least `threshold` of their row and of their column; "
                "probability = every link whose value is at least `threshold` as it is, rows not renormalized: "
                "for a link classifier's probabilities (--guided-loss binary), zero or several per word")
    threshold: float | None = option(None, "share of a row (and, for soft and grow, of a column) a link needs: "
                                           "in (0, 1] (grow: [0, 1], 0 keeps every grown link); unset: the "
                                           "method's default (DEFAULT_SHARES)")
    include_eos: bool = option(False, "keep the source EOS column and target EOS row in matrices and links")
    model_default: bool = option(True, "a model trained with guided alignment reads the layer and heads it "
                                       "supervised while ``layer`` and ``heads`` are the defaults (``for_model``); "
                                       "False: the defaults as they are (``--align-layer`` / ``--align-heads`` "
                                       "given)")

    @classmethod
    def from_flags(cls, layer: str, heads: str, method: str = "argmax", threshold: float | None = None,
                   include_eos: bool = False, model_default: bool = False) -> "AlignConfig":
        """From the spelling of ``--align-layer`` / ``--align-heads`` ("-2", "all"; "mean", "0,2"), checked;
        ``model_default``: neither flag was given (see ``for_model``)."""
        config = cls(parse_layer(layer), parse_heads(heads), method, threshold, include_eos, model_default)
        config.check()
        return config

    def for_model(self, supervised: tuple[int, list[int]] | None) -> "AlignConfig":
        """The settings for a model whose ``GuidedConfig.supervised_attention()`` is ``supervised``: for a model
        trained with guided alignment, its supervised layer and heads (the attention trained to align words)
        where ``layer`` and ``heads`` were left at their defaults and ``model_default`` holds; otherwise
        unchanged. So ``AlignConfig()`` follows each model (``AlignConfig(model_default=False)`` reads layer -2's
        mean of heads of any model), and a layer or heads given in code are kept."""
        chosen = (self.layer, self.heads) != (AlignConfig.layer, AlignConfig.heads)
        if not self.model_default or chosen or supervised is None:
            return self
        layer, heads = supervised
        return dataclasses.replace(self, layer=layer, heads=list(heads), model_default=False)

    def for_markup(self) -> "AlignConfig":
        """The settings for placing ``--markup`` tags, where a link too many costs less than one missing: grow
        keeps every grown link (share 0) unless ``--align-threshold`` was given (measured: the share floor
        that makes exported links more precise places fewer tags exactly, docs/guides/alignments.md)."""
        if self.method != "grow" or self.threshold is not None:
            return self
        return dataclasses.replace(self, threshold=0.0)

    def check(self) -> None:
        check_link_method(self.method, "--align-method")
        link_share(self.method, self.threshold)

    @property
    def layer_flag(self) -> str:
        """``layer`` as ``--align-layer`` spells it."""
        return str(self.layer)

    @property
    def heads_flag(self) -> str:
        """``heads`` as ``--align-heads`` spells it."""
        return self.heads if isinstance(self.heads, str) else ",".join(str(h) for h in self.heads)

    def link_options(self) -> dict[str, Any]:
        """The keyword arguments of ``Translation.alignment_record`` and ``Attribution.record`` besides layer and
        heads (``AlignmentRecord.build`` takes the ``AlignConfig`` whole)."""
        return {"include_eos": self.include_eos, "method": self.method, "threshold": self.threshold}


def layer_index(layer: int, num_layers: int) -> int:
    """The decoder layer a (possibly negative) index names: negative indices past the first layer clamp
    to layer 0 (so the default -2 means "the only layer" of a one-layer model); one past the last is a
    UserError."""
    if layer >= num_layers:
        raise UserError(f"alignment layer {layer} does not exist: the model has {num_layers} decoder "
                        f"layer(s); use 0..{num_layers - 1}, a negative index, or 'all'")
    return int(layer) % num_layers if layer >= -num_layers else 0


def check_link_method(method: str, name: str = "alignment method") -> None:
    """A UserError naming ``name`` unless ``method`` is one of ``LINK_METHODS``."""
    if method not in LINK_METHODS:
        raise UserError(f"{name} must be one of {', '.join(LINK_METHODS)}, got {method!r}")


def link_share(method: str, threshold: float | None) -> float | None:
    """The share ``method`` reads links with: ``threshold``, or the method's default (``DEFAULT_SHARES``) when
    it is None; None for argmax. A UserError when it is out of range: (0, 1], or [0, 1] for grow."""
    check_link_method(method, "--align-method")
    if DEFAULT_SHARES[method] is None:
        return None
    share = DEFAULT_SHARES[method] if threshold is None else float(threshold)
    above_floor = share >= 0.0 if method == "grow" else share > 0.0
    if not above_floor or share > 1.0:
        interval = "[0, 1]" if method == "grow" else "(0, 1]"
        raise UserError(f"--align-threshold must be in {interval} (a share of a row; for probability, a link's "
                        f"probability) for --align-method {method}, got {threshold}")
    return share


def parse_layer(value: str | int) -> int | str:
    """``--align-layer``: an integer layer index or 'all'."""
    if value == "all" or isinstance(value, int):
        return value
    try:
        return int(value)
    except ValueError:
        raise UserError(f"--align-layer must be an integer layer index or 'all', got {value!r}") from None


def parse_heads(value: str | list[int]) -> str | list[int]:
    """``--align-heads``: 'mean' or comma-separated head indices."""
    if value == "mean" or isinstance(value, list):
        return value
    try:
        return [int(h) for h in value.split(",")]
    except ValueError:
        raise UserError(f"--align-heads must be 'mean' or comma-separated integers like 0,2, got {value!r}") from None


@dataclass
class AttributionConfig:
    """Which attribution methods run on a translation and with what settings (``seq2seq translate
    --attribution``; ``seq2seq.attribution``)."""

    methods: list[str] = option(None, "attribution methods to run (seq2seq.attribution.base.METHODS)",
                                default_factory=list)
    ig_steps: int = option(16, "integration steps for integrated-gradients")
    samples: int = option(200, "perturbed sources per sentence for lime and kernel-shap; a source of M words "
                               "needs at least 2 (M + 1)")
    seed: int = option(0, "seed of the lime and kernel-shap samples: the same seed gives the same attributions")


#: How two directions' links are combined (``alignment.links.symmetrized``): wordalign, align, translate.
SYMMETRIZATIONS = ("grow-diag-final-and", "grow-diag-final", "intersection", "forward", "backward")
#: ... and two translation models' (``translate`` / ``serve`` ``--backward-checkpoint``, ``align``): also
#: ``agreement``, links read from where both models' attention agree (``alignment.links.agreement_matrix``)
MODEL_SYMMETRIZATIONS = SYMMETRIZATIONS + ("agreement",)
#: How two translation models' links are combined by default: the best rule with grow links on the val gold
#: (docs/guides/alignments.md; eflomal's two directions keep grow-diag-final-and)
MODEL_SYMMETRIZATION = "agreement"
#: ... and for placing tags (``--markup``), where the union's recall counts more: the best rule there
MARKUP_SYMMETRIZATION = "grow-diag-final-and"
#: Adapting a model to the pairs it aligns (``training.adapt``, ``align --adapt-steps``): the learning rate
#: chosen on the val gold (bench-results/alignment-2026-11-27-adapt)
ADAPT_LR = 3e-4
#: ... and how many consecutive pairs each adapted copy is fitted to (``align --adapt-pairs``): the gain comes
#: from fitting few pairs many times (docs/guides/alignments.md, adapting to the pairs)
ADAPT_PAIRS = 100
#: Sentence pairs per teacher-forced pass when the attention of given pairs is read: forced alignment
#: (``align --batch-size``, ``decoding.forced_alignment``), compare's forced attentions and analyze's forced passes
FORCED_BATCH_SIZE = 32
