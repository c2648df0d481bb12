"""The guided alignment section: ``GuidedConfig`` (Garg et al. 2019), where the training pairs' word links come
from and which attention they supervise, switched on by ``links``. Its flags keep their names (``--guided-alignment``,
``--guided-layer``, ...: ``option(..., flag=...)``); a config written before the section existed
(``data.guided_alignment``, ``train.guided_*``) is read into it (``layout.migrated``)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import NonNegativeFloat, NonNegativeInt

from ..errors import UserError
from .align import layer_index
from .fields import STRICT, option
from .model import ModelConfig

#: ``--guided-alignment self``: the model supervises its attention with its own links
#: (``training.guided.SelfGuidance``)
SELF_GUIDANCE = "self"


@dataclass
class GuidedConfig:
    """Guided alignment: the training pairs' word links supervise one decoder layer's cross-attention."""

    __pydantic_config__ = STRICT

    links: str | None = option(
        None, "guided alignment training (Garg et al. 2019): word alignments of the training pairs, a file of "
              "Pharaoh lines (0-based source-target links of whitespace words, one line per training pair before "
              "cleaning; a pair that cleaning drops drops its line), 'eflomal': computed with seq2seq wordalign "
              "on the training pairs and cached, or 'self': after --self-guidance-warmup steps, the model's own "
              "links of each batch (no aligner needed)", flag="guided-alignment")
    weight: NonNegativeFloat = option(
        0.05, "guided alignment (--guided-alignment): weight lambda of the alignment loss added to the "
              "translation loss", flag="guided-alignment-weight")
    layer: int = option(-2, "guided alignment: the decoder layer whose cross-attention is supervised "
                            "(negative counts from the top; an RNN has one)", flag="guided-layer")
    heads: list[int] = option(None, "guided alignment: the supervised head(s) of --guided-layer; the "
                                    "loss supervises their mean", default_factory=lambda: [0], flag="guided-heads")
    full_context: bool = option(
        False, "guided alignment, Transformer: supervise, and read alignments from, --guided-layer's "
               "cross-attention computed with the whole target visible (Garg et al. 2019's full-context "
               "alignment: the decoder run a second time up to that layer without the causal mask)",
        flag="full-context-alignment")
    unaligned: Literal["skip", "eos"] = option(
        "skip", "guided alignment, a file's target words without a link: skip (not supervised, as Garg et al.) or "
                "eos (taught to attend to the source EOS, a NULL word, so that their alignments can stay empty)",
        flag="guided-unaligned")
    loss: Literal["kl", "binary"] = option(
        "kl", "guided alignment: kl = the supervised heads' attention rows brought to the gold rows (Garg et al. "
              "2019); binary = the supervised heads' scores read as one link classifier per (target, source) "
              "pair, a sigmoid each, trained by binary cross-entropy against the links, so that a word can have "
              "zero or several (BinaryAlign); needs --full-context-alignment", flag="guided-loss")
    self_warmup: NonNegativeInt = option(
        400, "--guided-alignment self: steps of plain training before the model's own links supervise it",
        flag="self-guidance-warmup")

    @property
    def alignment_lines(self) -> str | None:
        """Where the training pairs' alignment lines come from (a file, or ``eflomal``): ``links``, or None without
        them or with ``self`` (the links come from the model as it trains)."""
        return None if self.links in (None, "", SELF_GUIDANCE) else self.links

    def supervised_attention(self) -> tuple[int, list[int]] | None:
        """(decoder layer, heads) whose cross-attention guided alignment trained to align words (``layer`` /
        ``heads``), or None for a run without ``links``. Alignment export, ``seq2seq align`` and ``serve`` read
        this attention by default (``AlignConfig.for_model``)."""
        if not self.links:
            return None
        return self.layer, list(self.heads)

    def full_context_layer(self, model: ModelConfig) -> int | None:
        """The decoder layer (0-based) of ``model`` whose cross-attention the model computes with the whole target
        visible (``full_context``: ``layer``), or None; a combination that cannot work is a UserError naming the
        flags."""
        if not self.full_context:
            return None
        if model.arch != "transformer":
            raise UserError("--full-context-alignment needs --arch transformer: an RNN decoder reads the target "
                            "left to right only; drop the flag for an RNN")
        if not self.links:
            raise UserError("--full-context-alignment changes the attention that guided alignment supervises: "
                            "give --guided-alignment FILE (or eflomal) too")
        try:
            return layer_index(self.layer, model.layers)
        except UserError as exc:
            raise UserError(f"--guided-layer {self.layer}: {exc}") from None

    def model_options(self, model: ModelConfig) -> dict:
        """What ``models.build_model`` needs from this section for ``model``: ``full_context_layer`` and
        ``link_classifier``, checked (a UserError naming the flags)."""
        return {"full_context_layer": self.full_context_layer(model), "link_classifier": self.link_classifier(model)}

    def link_classifier(self, model: ModelConfig) -> bool:
        """Whether the full-context layer's scores are trained and read as link probabilities (``loss``
        binary); a combination that cannot work is a UserError naming the flags."""
        full_context_layer = self.full_context_layer(model)  # its errors first, whatever the loss
        if self.loss != "binary":
            return False
        if full_context_layer is None:
            raise UserError("--guided-loss binary trains the full-context layer's scores as link classifiers: give "
                            "--full-context-alignment (and --guided-alignment FILE or eflomal) too")
        if self.links == SELF_GUIDANCE:
            raise UserError("--guided-loss binary learns from a file's links (or eflomal's); with --guided-alignment "
                            "self use --guided-loss kl")
        return True
