"""One translation of one input, as every engine and command returns it: the text, its tokens and
scores, the n-best alternatives, and (when asked for) the attention that the alignment export,
plots and viewer read, and per-token confidence."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..config import AlignConfig


@dataclass
class Translation:
    """One hypothesis for one input. ``attention`` rows: target pieces + EOS; columns: source
    pieces + EOS; shape (layers, heads, len(tgt_pieces), len(src_pieces))."""

    source: str
    text: str
    tokens: list[int]
    score: float  # length-penalised log-probability used for ranking
    log_prob: float
    src_pieces: list[str] = field(default_factory=list)
    tgt_pieces: list[str] = field(default_factory=list)
    attention: np.ndarray | None = None
    src_tokens: list[int] = field(default_factory=list)  # source ids incl. EOS (for attribution)
    alternatives: list["Translation"] = field(default_factory=list)  # n-best list, best first
    #: ensembles: every member's attention (L_m, H_m, len(tgt_pieces), len(src_pieces)), the first
    #: checkpoint's first (``attention`` is that one); None for one model
    member_attention: list[np.ndarray] | None = None
    #: with ``translate(..., confidence=True)``: log p(y_t | y_<t, x) of each target piece and EOS
    #: (aligned with ``tgt_pieces``; they sum to ``log_prob`` when the search used the whole
    #: vocabulary) and the entropy in nats of the model's distribution at that step
    token_log_probs: list[float] | None = None
    token_entropy: list[float] | None = None
    #: the (layer, heads) that guided alignment trained the model to align with (``Translator.supervised_attention``),
    #: which ``alignment`` and ``alignment_record`` read unless told otherwise; None: a model trained without it
    supervised_attention: tuple[int, list[int]] | None = None

    def default_attention(self) -> tuple[int | str, str | list[int]]:
        """The layer and heads read when none are given: the supervised ones of a model trained with guided
        alignment, else ``AlignConfig``'s defaults (``AlignConfig.for_model``)."""
        align = AlignConfig().for_model(self.supervised_attention)
        return align.layer, align.heads

    @property
    def alignment(self) -> np.ndarray | None:
        """(tgt_len + 1, src_len + 1) attention of the default layer averaged over its heads (the penultimate
        decoder layer's, the only one of an RNN; a model trained with guided alignment: its supervised heads)."""
        if self.attention is None:
            return None
        from ..alignment.matrices import aggregate

        return aggregate(self.attention, *self.default_attention())

    def confidence(self) -> dict[str, list[dict[str, Any]]] | None:
        """Per target piece and per word (pieces joined at SentencePiece's word starts; EOS a word of its
        own): ``log_prob`` (a word's: the sum of its pieces', the log-probability of the whole word) and
        ``entropy`` (a word's: the mean of its pieces'). None unless translated with confidence=True."""
        if self.token_log_probs is None or self.token_entropy is None:
            return None
        from ..alignment.matrices import word_spans, words_from_pieces

        tokens = [{"piece": piece, "log_prob": lp, "entropy": h}
                  for piece, lp, h in zip(self.tgt_pieces, self.token_log_probs, self.token_entropy)]
        words = [{"word": word, "log_prob": sum(self.token_log_probs[start:end]),
                  "entropy": sum(self.token_entropy[start:end]) / (end - start)}
                 for word, (start, end) in zip(words_from_pieces(self.tgt_pieces), word_spans(self.tgt_pieces))]
        return {"tokens": tokens, "words": words}

    def alignment_record(self, index: int, layer: int | str | None = None, heads: str | list[int] | None = None,
                         include_eos: bool = AlignConfig.include_eos, method: str = AlignConfig.method,
                         threshold: float | None = AlignConfig.threshold):
        """This translation's attention as an ``AlignmentRecord`` (word merge, Pharaoh links);
        ``method`` (``LINK_METHODS``) extracts the hard links (see seq2seq.alignment). ``layer`` and ``heads``
        None: ``default_attention`` (a guided model's supervised heads)."""
        from ..alignment.records import AlignmentRecord

        if self.attention is None:
            raise ValueError("translate with need_attention=True to get alignments")
        default_layer, default_heads = self.default_attention()
        layer = default_layer if layer is None else layer
        heads = default_heads if heads is None else heads
        return AlignmentRecord.build(index, self.source, self.text, self.src_pieces, self.tgt_pieces, self.attention,
                                     AlignConfig(layer=layer, heads=heads, method=method, threshold=threshold,
                                                 include_eos=include_eos))


@dataclass
class EmptyOutputs:
    """Counts the inputs with text that translated to an empty output, the mark of an undertrained model
    (it learnt that EOS is likely before anything else): ``add`` each batch of translations, then
    ``warning``."""

    inputs: int = 0  # inputs with text
    empty: int = 0  # of them, translated to an empty output

    def add(self, translations: list[Translation]) -> None:
        for translation in translations:
            if translation.source.strip():
                self.inputs += 1
                self.empty += not translation.text.strip()

    def warning(self, what: str = "non-empty inputs") -> str | None:
        """The warning ("3 of 10 non-empty inputs translated to empty outputs: ..."; ``what`` names the
        inputs), or None when none came out empty."""
        if not self.empty:
            return None
        return (f"{self.empty} of {self.inputs} {what} translated to empty outputs: the model may be undertrained "
                "(train it longer: more updates)")
