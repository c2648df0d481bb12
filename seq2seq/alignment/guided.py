"""Guided alignment supervision (Garg et al. 2019): word links of training pairs -> the gold
attention over subword pieces that the alignment loss (``seq2seq.nn.alignment_loss``) compares with.

Words are the whitespace tokens of a pair, as in ``seq2seq align``'s gold. SentencePiece starts a
word at every piece that begins with '▁' (``matrices.word_spans``), so piece k of a sentence belongs
to word w(k) = #{word-start pieces among pieces 0..k} - 1, the first piece always starting one.
Links are read from Pharaoh lines (``links.parse_pharaoh``); possible links (``i?j``, ``i-j-P``)
count as links. The gold row of target piece t (the attention row that predicts ``tgt_out[t]``) is
uniform over the source pieces of every word linked to t's word:

    G[t, s] = 1 / |S(t)| for s in S(t), else 0,    S(t) = {s : (w(s), w(t)) is a link}

A target piece whose word has no link gets an all-zero row and is not supervised (as in Garg et
al.), or with ``null`` (``--guided-unaligned eos``) a row with all its mass on the source EOS, the NULL
word of the statistical aligners, in a pair that has links; the target EOS row is never supervised. A pair whose
SentencePiece words differ in number from its whitespace words (normalization removed or split a
word) cannot be mapped: it is not supervised, and the pairs affected are counted and logged.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from ..errors import UserError
from ..runtime import log
from ..tokenizer import Tokenizer
from .links import grow_alignment, parse_pharaoh
from .matrices import SPECIALS, WORD_START

FLAG = "--guided-alignment"


def word_start_table(tokenizer: Tokenizer) -> np.ndarray:
    """(vocab,) bool: whether each piece starts a word (begins with '▁' or is a special token), the rule
    of ``matrices.word_spans`` as a lookup table, so a batch's words are found without piece strings."""
    pieces = tokenizer.pieces(range(tokenizer.vocab_size))
    return np.array([p.startswith(WORD_START) or p in SPECIALS for p in pieces], dtype=bool)


def piece_words(ids: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """The word index of each piece of ``ids`` (no EOS), by ``starts`` (``word_start_table``)."""
    begins = starts[np.asarray(ids, dtype=np.int64)]
    if len(begins):
        begins[0] = True
    return np.cumsum(begins) - 1


def word_count(words: np.ndarray) -> int:
    """How many words ``piece_words`` found."""
    return int(words[-1]) + 1 if len(words) else 0


def piece_gold(links: np.ndarray, src_words: np.ndarray, tgt_words: np.ndarray, n_src: int, n_tgt: int
               ) -> np.ndarray | None:
    """The (T, S) gold rows of one pair: ``links`` (L, 2) word links (source word, target word),
    ``src_words`` / ``tgt_words`` the word of each piece (``piece_words``), ``n_src`` / ``n_tgt`` the
    pair's whitespace word counts. None when the pieces spell another number of words."""
    if word_count(src_words) != n_src or word_count(tgt_words) != n_tgt:
        return None
    linked = np.zeros((n_tgt, n_src), dtype=np.float32)  # word level: linked[j, i] = 1 for link (i, j)
    linked[links[:, 1], links[:, 0]] = 1.0
    rows = linked[tgt_words][:, src_words]  # (T, S): piece t and piece s whose words are linked
    total = rows.sum(axis=1, keepdims=True)
    return np.divide(rows, total, out=np.zeros_like(rows), where=total > 0)


def own_gold(attention: np.ndarray, src_ids: np.ndarray, tgt_ids: np.ndarray, starts: np.ndarray,
             share: float) -> np.ndarray:
    """The gold rows a model's own attention gives one pair (``--guided-alignment self``): ``attention``
    (T, S) over the pair's target pieces (``tgt_ids``, no EOS) and source pieces (``src_ids``, no EOS; extra
    rows and columns are ignored) merged to words as ``matrices.merge_to_words`` merges them (summed over a
    source word's pieces, averaged over a target word's), linked by ``grow`` with ``share`` (the links
    ``seq2seq align`` would export), and spread back over the pieces as for a file's links (``piece_gold``)."""
    src_words, tgt_words = piece_words(src_ids, starts), piece_words(tgt_ids, starts)
    n_src, n_tgt = word_count(src_words), word_count(tgt_words)
    if not n_src or not n_tgt:
        return np.zeros((len(tgt_ids), len(src_ids)), dtype=np.float32)
    words = np.zeros((n_tgt, n_src))
    np.add.at(words, (tgt_words[:, None], src_words[None, :]), attention[: len(tgt_ids), : len(src_ids)])
    words /= np.bincount(tgt_words, minlength=n_tgt)[:, None]
    links = np.asarray(sorted(grow_alignment(words, share)), dtype=np.int64).reshape(-1, 2)
    return piece_gold(links, src_words, tgt_words, n_src, n_tgt)


@dataclass
class GuidedAlignments:
    """The word links of every row of a training split, checked, in compact arrays: row r's links are
    ``links[offsets[r]:offsets[r + 1]]`` as (source word, target word); ``words[r]`` is its
    (source, target) whitespace word count. ``gold`` builds a batch's gold attention from them."""

    links: np.ndarray  # (total links, 2) int32
    offsets: np.ndarray  # (rows + 1,) int64
    words: np.ndarray  # (rows, 2) int32
    starts: np.ndarray  # (vocab,) bool: word-start pieces
    null: bool = False  # a linked pair's unlinked target pieces: gold on the source EOS (else not supervised)

    @classmethod
    def from_split(cls, split, tokenizer: Tokenizer, path: str, batch_size: int = 10_000,
                   null: bool = False) -> "GuidedAlignments":
        """Parse and check the ``align`` lines of an encoded training split (``seq2seq.data.guided``)
        against its sentence pairs: a bad token or a link outside a pair's whitespace words is a
        UserError naming the file and line. Logs how many pairs have links and how many cannot be
        mapped to pieces."""
        if "align" not in split.column_names:
            raise UserError(f"{FLAG}: the training corpus carries no alignment lines; it was prepared without "
                            f"{FLAG} (a bug, or a cache written by another version: remove the cache directory)")
        links: list[np.ndarray] = []
        counts, words = [], []
        for rows in split.iter(batch_size=batch_size):
            for src, tgt, line, number in zip(rows["src"], rows["tgt"], rows["align"], rows["align_line"]):
                pairs = _checked_links(line, number, len(src.split()), len(tgt.split()), path)
                links.append(pairs)
                counts.append(len(pairs))
                words.append((len(src.split()), len(tgt.split())))
        guided = cls(np.concatenate(links) if links else np.zeros((0, 2), np.int32),
                     np.concatenate([[0], np.cumsum(counts, dtype=np.int64)]),
                     np.asarray(words, dtype=np.int32).reshape(-1, 2), word_start_table(tokenizer), null)
        guided._report(split)
        return guided

    def __len__(self) -> int:
        return len(self.words)

    def _report(self, split) -> None:
        unmapped, row = 0, 0
        for rows in split.select_columns(["src_ids", "tgt_ids"]).iter(batch_size=10_000):
            for src, tgt in zip(rows["src_ids"], rows["tgt_ids"]):
                unmapped += not self._maps(row, src[:-1], tgt)
                row += 1
        linked = int(np.count_nonzero(np.diff(self.offsets)))
        log("guided_alignment", pairs=len(self), with_links=linked, links=len(self.links), not_mapped=unmapped)
        if unmapped:
            log("warning", message=f"{FLAG}: {unmapped} of {len(self)} training pairs get no alignment supervision: "
                                   "their SentencePiece words differ in number from their whitespace words")

    def _maps(self, row: int, src: Sequence[int], tgt: Sequence[int]) -> bool:
        """Whether row ``row``'s pieces (source without EOS) spell its whitespace word counts."""
        return (word_count(piece_words(src, self.starts)), word_count(piece_words(tgt, self.starts))) == \
            tuple(self.words[row])

    def gold(self, rows: Sequence[int], src_ids: Sequence[np.ndarray], tgt_ids: Sequence[np.ndarray],
             shape: tuple[int, int]) -> torch.Tensor:
        """(B, T, S) gold attention for the batch of split rows ``rows`` with these id sequences
        (source ending in EOS, target without BOS / EOS), padded to ``shape`` = (T, S) of the batch."""
        out = np.zeros((len(rows), *shape), dtype=np.float32)
        for b, (row, src, tgt) in enumerate(zip(rows, src_ids, tgt_ids)):
            row = int(row)
            links = self.links[self.offsets[row]:self.offsets[row + 1]]
            if not len(links):
                continue
            n_src, n_tgt = self.words[row]
            src_pieces = np.asarray(src)[:-1]  # the source EOS is never gold
            rows_gold = piece_gold(links, piece_words(src_pieces, self.starts), piece_words(tgt, self.starts),
                                   int(n_src), int(n_tgt))
            if rows_gold is not None:
                out[b, : len(tgt), : len(src_pieces)] = rows_gold
                if self.null:  # the source EOS as NULL: where a target piece's word has no link
                    out[b, : len(tgt), len(src_pieces)] = rows_gold.sum(axis=1) == 0
        return torch.from_numpy(out)


def _checked_links(line: str, number: int, n_src: int, n_tgt: int, path: str) -> np.ndarray:
    """One line's links (sure and possible) as (L, 2) int32 (source word, target word), checked."""
    try:
        _, possible = parse_pharaoh(line)
    except UserError as exc:
        raise UserError(f"{FLAG} {path}, line {number}: {exc}") from None
    bad = sorted((i, j) for i, j in possible if i >= n_src or j >= n_tgt)
    if bad:
        i, j = bad[0]
        raise UserError(
            f"{FLAG} {path}, line {number}: link {i}-{j} is outside its sentence pair ({n_src} source x {n_tgt} "
            "target whitespace words); links are 0-based source-target word indices, and line N belongs to "
            "training pair N of the training data before cleaning (is the file for these training files, and "
            "in source-target order?)")
    return np.asarray(sorted(possible), dtype=np.int32).reshape(-1, 2)
