"""Word links of given sentence pairs from a model's attention, by force-decoding the targets: the
links ``seq2seq align`` scores against gold; and the links of a target->source ("backward") model,
transposed to (source, target) and symmetrized with the forward model's, for ``seq2seq align``,
``translate --backward-checkpoint`` and ``serve``.

Two directions' links are combined as ``alignment.links.symmetrized`` says (intersection for precision,
grow-diag-final(-and) for recall, Koehn et al. 2003). The backward model reads the pair the other way
round: its source is our target. Its words must be ours: both tokenizers split at whitespace, so a
pair whose pieces spell another number of words than the text is aligned but logged.
"""
from __future__ import annotations

from typing import Sequence

from ..alignment.links import extract_links, parse_pharaoh, symmetrized, to_pharaoh, transpose_links
from ..alignment.matrices import Link, check_layer_heads, words_from_pieces
from ..alignment.records import AlignmentRecord
from ..config import MARKUP_SYMMETRIZATION, MODEL_SYMMETRIZATION, AlignConfig
from ..errors import UserError
from ..runtime import LOGGER
from ..tokenizer import EOS_ID
from .scoring import teacher_force
from .translator import Translator


def force_align(translator: Translator, sources: Sequence[str], targets: Sequence[str],
                layer: int | str = AlignConfig.layer, heads: str | list[int] = AlignConfig.heads,
                method: str = AlignConfig.method, threshold: float | None = AlignConfig.threshold, batch_size: int = 32,
                names: tuple[str, str] = ("source", "target")) -> list[set[Link]]:
    """Word-level (src, tgt) links per sentence pair from the attention of a teacher-forced pass
    over the given targets. ``names`` label the files in errors."""
    tok = translator.tokenizer
    src_ids = [tok.encode(s) + [EOS_ID] for s in sources]
    tgt_ids = [tok.encode(t) for t in targets]
    order = sorted(range(len(sources)), key=lambda i: -len(src_ids[i]))  # similar lengths per batch
    _, attention = teacher_force(translator.model, [src_ids[i] for i in order],
                                 [tgt_ids[i] for i in order], need_attention=True, batch_size=batch_size,
                                 need_scores=False)
    links: list[set[Link]] = [set()] * len(sources)
    for i, attn in zip(order, attention):
        src_pieces, tgt_pieces = tok.pieces(src_ids[i][:-1]), tok.pieces(tgt_ids[i])
        for name, pieces, text in ((names[0], src_pieces, sources[i]), (names[1], tgt_pieces, targets[i])):
            if len(words_from_pieces(pieces)) != len(text.split()):
                LOGGER.warning(f"warning: {name} line {i + 1}: {len(text.split())} whitespace words but "
                               f"{len(words_from_pieces(pieces))} after tokenization; word indices may be off")
        record = AlignmentRecord.build(i, sources[i], targets[i], src_pieces, tgt_pieces, attn,
                                       layer=layer, heads=heads, method=method, threshold=threshold)
        links[i] = extract_links(record.words, method, threshold)
    return links


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
    """A target->source model that symmetrizes a forward model's word links: ``backward_links(sources,
    targets)`` force-decodes each source given its target with the backward model and reads its links
    with the same options (its own supervised layer and heads by default), transposed to (source,
    target); callers combine them with the forward ones as ``symmetrize`` says (``symmetrized``), tags
    (``--markup``) as ``markup_symmetrize`` says. ``symmetrize`` None: the measured best rule for each
    (``MODEL_SYMMETRIZATION``, ``MARKUP_SYMMETRIZATION``)."""

    def __init__(self, forward: Translator, backward: Translator, align: AlignConfig, symmetrize: str | None = None,
                 batch_size: int = 32, flag: str = "--backward-checkpoint") -> None:
        check_backward(forward, backward, flag)
        self.symmetrize = symmetrize or MODEL_SYMMETRIZATION
        self.markup_symmetrize = symmetrize or MARKUP_SYMMETRIZATION
        symmetrized(set(), set(), self.symmetrize)  # a bad rule fails now, not after the first batch
        self.backward, self.batch_size = backward, batch_size
        chosen = align.for_model(backward.supervised_attention)
        self.layer, self.heads = check_layer_heads(chosen.layer, chosen.heads, backward.model)
        self.method, self.threshold = chosen.method, chosen.threshold
        self.markup_threshold = chosen.for_markup().threshold

    def backward_links(self, sources: Sequence[str], targets: Sequence[str], markup: bool = False
                       ) -> list[set[Link]]:
        """The backward model's word links of each pair, in (source, target) order; ``markup``: read as
        for placing tags (``AlignConfig.for_markup``)."""
        threshold = self.markup_threshold if markup else self.threshold
        links = force_align(self.backward, targets, sources, self.layer, self.heads, self.method, threshold,
                            self.batch_size, names=("target", "source"))
        return [transpose_links(x) for x in links]

    def symmetrized_fields(self, sources: Sequence[str], targets: Sequence[str], forward: Sequence[str]
                           ) -> list[dict[str, str]]:
        """For pairs whose forward word links are the Pharaoh lines ``forward``: the fields an alignment
        record gets, ``pharaoh_word`` (the symmetrized links), ``symmetrize`` (the rule),
        ``forward_pharaoh_word`` and ``backward_pharaoh_word``. Every pair needs both sides non-empty."""
        backward = self.backward_links(sources, targets)
        return [{"pharaoh_word": to_pharaoh(symmetrized(parse_pharaoh(own)[0], back, self.symmetrize)),
                 "symmetrize": self.symmetrize, "forward_pharaoh_word": own, "backward_pharaoh_word": to_pharaoh(back)}
                for own, back in zip(forward, backward)]
