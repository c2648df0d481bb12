"""Word links of given sentence pairs from a model's attention, by force-decoding the targets: the
links ``seq2seq align`` scores against gold; and the links of a target->source ("backward") model,
transposed to (source, target) and symmetrized with the forward model's, for ``seq2seq align``,
``translate --backward-checkpoint`` and ``serve``.

Two directions are combined as ``alignment.links.symmetrized`` says (their links: intersection for
precision, grow-diag-final(-and) for recall, Koehn et al. 2003) or by ``agreement`` (their word attention:
``alignment.links.agreement_matrix``). The backward model reads the pair the other way
round: its source is our target. Its words must be ours: both tokenizers split at whitespace, so a
pair whose pieces spell another number of words than the text is aligned but logged.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..alignment.links import agreement_matrix, extract_links, parse_pharaoh, symmetrized, to_pharaoh, transpose_links
from ..alignment.matrices import Link, as_array, check_layer_heads, words_from_pieces
from ..alignment.records import AlignmentRecord
from ..config import FORCED_BATCH_SIZE, MARKUP_SYMMETRIZATION, MODEL_SYMMETRIZATION, MODEL_SYMMETRIZATIONS, AlignConfig
from ..errors import UserError
from ..runtime import LOGGER
from ..tokenizer import EOS_ID
from .scoring import teacher_force
from .translator import Translator


def force_align_words(translator: Translator, sources: Sequence[str], targets: Sequence[str],
                      layer: int | str = AlignConfig.layer, heads: str | list[int] = AlignConfig.heads,
                      batch_size: int = FORCED_BATCH_SIZE, names: tuple[str, str] = ("source", "target"),
                      first_line: int = 1) -> list[np.ndarray]:
    """Word-level ``(target words, source words)`` attention of each sentence pair (EOS dropped), from a
    teacher-forced pass over the given targets. ``names`` label the files in warnings, where ``sources[0]`` is
    line ``first_line``."""
    tok = translator.tokenizer
    src_ids = [tok.encode(s) + [EOS_ID] for s in sources]
    tgt_ids = [tok.encode(t) for t in targets]
    order = sorted(range(len(sources)), key=lambda i: -len(src_ids[i]))  # similar lengths per batch
    _, attention = teacher_force(translator.model, [src_ids[i] for i in order],
                                 [tgt_ids[i] for i in order], need_attention=True, batch_size=batch_size,
                                 need_scores=False)
    words: list[np.ndarray] = [np.zeros((0, 0))] * len(sources)
    for i, attn in zip(order, attention):
        src_pieces, tgt_pieces = tok.pieces(src_ids[i][:-1]), tok.pieces(tgt_ids[i])
        for name, pieces, text in ((names[0], src_pieces, sources[i]), (names[1], tgt_pieces, targets[i])):
            if len(words_from_pieces(pieces)) != len(text.split()):
                LOGGER.warning(f"warning: {name} line {first_line + i}: {len(text.split())} whitespace words but "
                               f"{len(words_from_pieces(pieces))} after tokenization; word indices may be off")
        words[i] = AlignmentRecord.build(i, sources[i], targets[i], src_pieces, tgt_pieces, attn,
                                         AlignConfig(layer=layer, heads=heads)).words
    return words


def force_align(translator: Translator, sources: Sequence[str], targets: Sequence[str],
                align: AlignConfig | None = None, batch_size: int = FORCED_BATCH_SIZE,
                names: tuple[str, str] = ("source", "target")) -> list[set[Link]]:
    """Word-level (src, tgt) links per sentence pair: ``force_align_words`` with ``align``'s layer and heads, read
    by its method and threshold (default ``AlignConfig()``; EOS is always dropped, ``include_eos`` and
    ``model_default`` are not read)."""
    align = align or AlignConfig()
    return [extract_links(m, align.method, align.threshold)
            for m in force_align_words(translator, sources, targets, align.layer, align.heads, batch_size, names)]


def check_backward(forward: Translator, backward: Translator, flag: str = "--backward-checkpoint") -> None:
    """A UserError when the backward model was trained in the forward model's direction (same source
    and target language codes: its links would not be the other direction's)."""
    if forward.languages is None or backward.languages is None:
        return
    (src, tgt), (b_src, b_tgt) = forward.languages, backward.languages
    if (b_src, b_tgt) == (src, tgt) and src != tgt:
        raise UserError(f"{flag}: that model translates {b_src}->{b_tgt}, the same direction as the forward "
                        f"model; give a {tgt}->{src} (target->source) model")


class BackwardAligner:
    """A target->source model that symmetrizes a forward model's word links: ``backward_words(sources,
    targets)`` force-decodes each source given its target with the backward model and reads its word attention
    with the same options (its own supervised layer and heads by default); ``combined`` joins them with the
    forward model's as ``symmetrize`` says (``MODEL_SYMMETRIZATIONS``: a rule on both directions' links,
    ``alignment.links.symmetrized``, or ``agreement``, links read from both matrices at once,
    ``alignment.links.agreement_matrix``), tags (``--markup``) as ``markup_symmetrize`` says. ``symmetrize``
    None: the measured best rule for each (``MODEL_SYMMETRIZATION``, ``MARKUP_SYMMETRIZATION``); ``align`` None:
    each model's supervised heads where it was trained with guided alignment, else the default layer and heads.
    ``aligned(sources, targets)`` does it all for given sentence pairs (the Python API's two-direction
    alignment)."""

    def __init__(self, forward: Translator, backward: Translator, align: AlignConfig | None = None,
                 symmetrize: str | None = None, batch_size: int = FORCED_BATCH_SIZE,
                 flag: str = "--backward-checkpoint") -> None:
        check_backward(forward, backward, flag)
        align = align or AlignConfig(model_default=True)  # each model's supervised heads where it has them
        if symmetrize is not None and symmetrize not in MODEL_SYMMETRIZATIONS:  # fails now, not after a batch
            raise UserError(f"--symmetrize must be one of {', '.join(MODEL_SYMMETRIZATIONS)}, got {symmetrize!r}")
        self.symmetrize = symmetrize or MODEL_SYMMETRIZATION
        self.markup_symmetrize = symmetrize or MARKUP_SYMMETRIZATION
        self.forward, self.backward, self.batch_size = forward, backward, batch_size
        own = align.for_model(forward.supervised_attention)
        self.forward_layer, self.forward_heads = check_layer_heads(own.layer, own.heads, forward.model)
        chosen = align.for_model(backward.supervised_attention)
        self.layer, self.heads = check_layer_heads(chosen.layer, chosen.heads, backward.model)
        self.method, self.threshold = chosen.method, chosen.threshold
        self.markup_threshold = chosen.for_markup().threshold

    def aligned(self, sources: Sequence[str], targets: Sequence[str]) -> list[set[Link]]:
        """The (source word, target word) links of given sentence pairs (a reference, a translation) from both
        models, combined as ``symmetrize`` says: what ``seq2seq align --output`` writes for them. Words are
        whitespace tokens, as ``force_align_words`` says."""
        words = force_align_words(self.forward, sources, targets, self.forward_layer, self.forward_heads,
                                  self.batch_size)
        return [self.combined(extract_links(own, self.method, self.threshold), own, back)
                for own, back in zip(words, self.backward_words(sources, targets))]

    def backward_words(self, sources: Sequence[str], targets: Sequence[str]) -> list[np.ndarray]:
        """The backward model's ``(source words, target words)`` attention of each pair (its rows: our source)."""
        return force_align_words(self.backward, targets, sources, self.layer, self.heads, self.batch_size,
                                 names=("target", "source"))

    def links(self, backward_words: np.ndarray, markup: bool = False) -> set[Link]:
        """The backward model's word links of one pair in (source, target) order; ``markup``: read as for
        placing tags (``AlignConfig.for_markup``)."""
        return transpose_links(extract_links(backward_words, self.method,
                                             self.markup_threshold if markup else self.threshold))

    def combined(self, forward: set[Link], forward_words: np.ndarray, backward_words: np.ndarray,
                 markup: bool = False, rule: str | None = None) -> set[Link]:
        """One pair's symmetrized links: the forward model's ``forward`` links and ``(target, source)`` word
        attention ``forward_words`` with the backward model's ``backward_words`` (``backward_words``), by
        ``rule`` (default: ``symmetrize``, or ``markup_symmetrize`` for tags)."""
        rule = rule or (self.markup_symmetrize if markup else self.symmetrize)
        if rule == "agreement":
            threshold = self.markup_threshold if markup else self.threshold
            return extract_links(agreement_matrix(forward_words, backward_words), self.method, threshold)
        return symmetrized(forward, self.links(backward_words, markup), rule)

    def symmetrized_fields(self, sources: Sequence[str], targets: Sequence[str], forward: Sequence[str],
                           forward_words: Sequence[np.ndarray]) -> list[dict[str, str]]:
        """For pairs whose forward word links are the Pharaoh lines ``forward`` and word attention
        ``forward_words``: the fields an alignment record gets, ``pharaoh_word`` (the symmetrized links),
        ``symmetrize`` (the rule), ``forward_pharaoh_word`` and ``backward_pharaoh_word``. Every pair needs
        both sides non-empty."""
        fields = []
        for own, own_words, back in zip(forward, forward_words, self.backward_words(sources, targets)):
            links = self.combined(parse_pharaoh(own)[0], as_array(own_words), back)
            fields.append({"pharaoh_word": to_pharaoh(links), "symmetrize": self.symmetrize,
                           "forward_pharaoh_word": own, "backward_pharaoh_word": to_pharaoh(self.links(back))})
        return fields
