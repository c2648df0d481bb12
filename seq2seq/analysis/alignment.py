"""Attention -> alignments: layer/head choice, word-level merge, hard links, Pharaoh, AER, export.

Conventions
-----------
* A model returns one attention array per sentence of shape ``(layers, heads, tgt_len, src_len)``:
  rows are the produced target subwords plus a final EOS row, columns the source subwords plus a
  final source EOS column. RNNs have layers = heads = 1.
* Links are ``(src_index, tgt_index)`` pairs, 0-based, as in Pharaoh files (``"i-j"``).
* Matrices are ``(..., tgt, src)``: one row per target token, a distribution over source tokens.

Order of operations in ``AlignmentRecord.build`` (and so in the export):
trim padding -> ``aggregate`` layers/heads -> ``merge_to_words`` (EOS is a word of its own) ->
``drop_eos`` (unless ``include_eos``) -> hard links (``argmax`` or ``threshold``).
Exported matrices keep the raw weights: with the EOS column dropped a row sums to 1 minus the
weight EOS received. Only ``threshold`` extraction renormalizes rows (so a threshold means the same
for every row); ``argmax`` does not need to.

JSONL schema (one JSON object per line, UTF-8, one line per sentence)
---------------------------------------------------------------------
``index``            int, the sentence number in the input (0-based)
``source``/``target`` detokenized source sentence and translation
``src_pieces``       source SentencePiece pieces = the columns of ``subword_matrix``
``tgt_pieces``       target pieces = the rows of ``subword_matrix``
``src_words``        source words (pieces joined at ``▁``) = the columns of ``word_matrix``
``tgt_words``        target words = the rows of ``word_matrix``
                     (with ``include_eos`` the four lists end with ``"</s>"``)
``subword_matrix``   [[float]] aggregated attention, rounded to 4 decimals
``word_matrix``      [[float]] word-level attention, rounded to 4 decimals
``subword_shape``/``word_shape``  [rows, cols]; rows can be 0 (empty translation)
``pharaoh_subword``  "i-j ..." links between piece indices (source-target, 0-based, sorted)
``pharaoh_word``     "i-j ..." links between word indices
``attention_shape``  [layers, heads, tgt_len, src_len] of the raw array (always incl. EOS)
``layer``            the layer asked for (int or "all"); ``layer_used`` the index actually used
``heads``            "mean" or the list of head indices averaged
``include_eos``, ``method`` ("argmax" | "threshold"), ``threshold`` (float or null)
``members``          only for an ensemble (several checkpoints): one object per member, in order,
                     with ``checkpoint``, ``attention_shape``, ``layer_used``, ``subword_matrix``,
                     ``word_matrix``, ``subword_shape``, ``word_shape``, ``pharaoh_subword``,
                     ``pharaoh_word`` (the record's own matrices are member 0's)
``attribution``      only with attributions (``translate.py --attribution``): one object per
                     method, keyed by method name ("gradient", "integrated-gradients",
                     "occlusion"); labels are the record's piece/word lists above:
                     ``method``, ``steps`` (integrated gradients, else null), ``normalization``,
                     ``raw_matrix`` [[float]] signed (T+1, S+1) incl. EOS row/column,
                     ``raw_shape``, ``subword_matrix`` / ``word_matrix`` (row-normalized
                     importances, same EOS policy and merge as attention), ``subword_shape``,
                     ``word_shape``, ``pharaoh_subword``, ``pharaoh_word``
                     (see ``seq2seq.analysis.attribution`` for formulas and signs)

An empty input line gives a record with empty piece/word lists and matrices, so the JSONL has
one line per input line. With ``--n-best`` only the best hypothesis is exported.

NPZ schema (written on close, only if ``npz_path`` is given; no pickled objects)
------------------------------------------------------------------------------
``s{index}_attention``       float32 (L, H, T+1, S+1) raw subword attention incl. EOS row/column
``s{index}_word_attention``  float32 (L, H, Tw, Sw) word-level per layer and head
``s{index}_subword``         float32 (T', S') = ``subword_matrix`` unrounded
``s{index}_words``           float32 (Tw, Sw) = ``word_matrix`` unrounded
``s{index}_src_pieces`` / ``s{index}_tgt_pieces``  str arrays (labels of ``s{index}_attention``
                             without EOS)
``s{index}_member{m}_attention``  float32 (L_m, H_m, T+1, S+1) ensemble member m's raw attention
``s{index}_attr_{method}_raw``    float64 (T+1, S+1) signed attribution incl. EOS (if asked)
``s{index}_attr_{method}``        float32 row-normalized subword attribution (EOS policy as above)
``s{index}_attr_{method}_words``  float32 word-level attribution
``meta``                     0-d str array holding a JSON object: layer, heads, include_eos,
                             method, threshold, sentences (count), indices
The word-level and aggregated arrays follow ``include_eos`` like the JSONL.
"""
from __future__ import annotations

import json
import os
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from ..errors import UserError
from ..io_utils import temp_path_beside

WORD_START = "\u2581"  # SentencePiece's '▁'
EOS = "</s>"
SPECIALS = frozenset({"<s>", "</s>", "<pad>"})  # always a word of their own

Link = tuple[int, int]  # (src_index, tgt_index)
Heads = str | int | Sequence[int]


# ----------------------------------------------------------------------------- words


def word_spans(pieces: Sequence[str]) -> list[tuple[int, int]]:
    """Half-open ``[start, end)`` piece spans of words: a piece starting with '▁' starts a word,
    so does the first piece; specials (``<s>``, ``</s>``, ``<pad>``) are words of their own."""
    spans: list[tuple[int, int]] = []
    start = 0
    for k, piece in enumerate(pieces):
        prev_special = k > 0 and pieces[k - 1] in SPECIALS
        if k > 0 and (piece.startswith(WORD_START) or piece in SPECIALS or prev_special):
            spans.append((start, k))
            start = k
    if pieces:
        spans.append((start, len(pieces)))
    return spans


def words_from_pieces(pieces: Sequence[str]) -> list[str]:
    """The words spelled by ``pieces`` (one per ``word_spans`` entry, '▁' removed)."""
    words = []
    for start, end in word_spans(pieces):
        word = "".join(pieces[start:end]).replace(WORD_START, " ").strip()
        words.append(word or WORD_START)  # a lone '▁' piece stays visible
    return words


def _span_matrix(spans: list[tuple[int, int]], n: int, average: bool) -> np.ndarray:
    """(words, pieces) matrix: 1 (sum) or 1/len (average) where a piece belongs to a word."""
    m = np.zeros((len(spans), n), dtype=np.float64)
    for w, (start, end) in enumerate(spans):
        m[w, start:end] = 1.0 / (end - start) if average else 1.0
    return m


def merge_to_words(
    matrix: np.ndarray, src_pieces: Sequence[str], tgt_pieces: Sequence[str]
) -> np.ndarray:
    """Subword ``(..., T, S)`` -> word ``(..., T_words, S_words)`` attention.

    Rule: SUM over a source word's pieces (the attention a target token pays to the whole word,
    so a row keeps its total), AVERAGE over a target word's pieces (each piece is one decision;
    the word's distribution is their mean, so rows summing to 1 still sum to 1).
    ``src_pieces``/``tgt_pieces`` label the columns/rows, including ``</s>`` if present.
    """
    m = as_array(matrix)
    if m.shape[-2:] != (len(tgt_pieces), len(src_pieces)):
        raise ValueError(
            f"merge_to_words: matrix {m.shape[-2:]} does not match "
            f"{len(tgt_pieces)} target x {len(src_pieces)} source pieces"
        )
    tgt_map = _span_matrix(word_spans(tgt_pieces), len(tgt_pieces), average=True)  # (Tw, T)
    src_map = _span_matrix(word_spans(src_pieces), len(src_pieces), average=False).T  # (S, Sw)
    return (tgt_map @ m.astype(np.float64) @ src_map).astype(m.dtype)


def links_to_words(
    links: Iterable[Link], src_pieces: Sequence[str], tgt_pieces: Sequence[str]
) -> set[Link]:
    """Subword links -> word links: two words are linked if any of their pieces are
    (the usual conversion for BPE alignments, e.g. Garg et al. 2019)."""
    src_word = _piece_to_word(src_pieces)
    tgt_word = _piece_to_word(tgt_pieces)
    return {(src_word[i], tgt_word[j]) for i, j in links}


def _piece_to_word(pieces: Sequence[str]) -> list[int]:
    owner = [0] * len(pieces)
    for w, (start, end) in enumerate(word_spans(pieces)):
        owner[start:end] = [w] * (end - start)
    return owner


# ----------------------------------------------------------------------------- matrices


def as_array(x: Any) -> np.ndarray:
    """numpy view of an array or a (CPU/GPU, grad or not) torch tensor, without importing torch."""
    if hasattr(x, "detach"):
        x = x.detach().float().cpu().numpy()
    return np.asarray(x)


def drop_eos(
    matrix: np.ndarray,
    keep_src_eos: bool = False,
    keep_tgt_eos: bool = False,
    renormalize: bool = False,
) -> np.ndarray:
    """Remove the final source-EOS column and/or target-EOS row of ``(..., T, S)``.

    Weights stay raw (a row then sums to less than 1) unless ``renormalize``: rows are rescaled
    to sum to 1 (all-zero rows stay zero). Export keeps raw weights; threshold extraction
    renormalizes.
    """
    m = as_array(matrix)
    if not keep_src_eos:
        m = m[..., :, : max(m.shape[-1] - 1, 0)]
    if not keep_tgt_eos:
        m = m[..., : max(m.shape[-2] - 1, 0), :]
    return normalize_rows(m) if renormalize else m


def normalize_rows(matrix: np.ndarray) -> np.ndarray:
    """Rows of ``(..., T, S)`` rescaled to sum to 1; all-zero rows stay zero."""
    m = as_array(matrix)
    total = m.sum(axis=-1, keepdims=True)
    return np.divide(m, total, out=np.zeros_like(m), where=total > 0)


def resolve_layer(layer: int | str, num_layers: int) -> int | str:
    """Layer index actually used: negative indices past the first layer clamp to layer 0
    (so the default -2 means "the only layer" for a one-layer RNN); "all" stays "all"."""
    if layer == "all":
        return "all"
    if not isinstance(layer, (int, np.integer)) or isinstance(layer, bool):
        raise UserError(f"alignment layer must be an integer or 'all', got {layer!r}")
    if layer >= num_layers:
        raise UserError(
            f"alignment layer {layer} does not exist: the model has {num_layers} decoder "
            f"layer(s); use 0..{num_layers - 1}, a negative index, or 'all'"
        )
    return int(layer) % num_layers if layer >= -num_layers else 0


def head_indices(heads: Heads, num_heads: int) -> list[int]:
    if isinstance(heads, str):
        if heads != "mean":
            raise UserError(f"alignment heads must be 'mean' or head indices, got {heads!r}")
        return list(range(num_heads))
    chosen = [int(heads)] if isinstance(heads, (int, np.integer)) else [int(h) for h in heads]
    bad = [h for h in chosen if not -num_heads <= h < num_heads]
    if not chosen or bad:
        raise UserError(
            f"alignment heads {list(chosen)} invalid: the model has {num_heads} head(s); "
            f"pick indices in 0..{num_heads - 1} or 'mean'"
        )
    return [h % num_heads for h in chosen]


def aggregate(attn: np.ndarray, layer: int | str = -2, heads: Heads = "mean") -> np.ndarray:
    """``(L, H, T, S)`` -> ``(T, S)``: one decoder layer (or the mean of all with ``"all"``),
    averaged over ``heads`` ("mean" = all heads, or a list / single index).

    The default is the penultimate layer averaged over heads: Garg et al. (2019), "Jointly
    Learning to Align and Translate with Transformer Models", found it gives the best
    alignments. A one-layer model (every RNN) has no penultimate layer; -2 clamps to layer 0.
    """
    a = as_array(attn)
    if a.ndim != 4:
        raise ValueError(f"aggregate expects (layers, heads, tgt, src), got shape {a.shape}")
    used = resolve_layer(layer, a.shape[0])
    per_layer = a if used == "all" else a[used : used + 1]
    return per_layer[:, head_indices(heads, a.shape[1])].mean(axis=(0, 1))


# ----------------------------------------------------------------------------- hard links


def argmax_alignment(matrix: np.ndarray) -> set[Link]:
    """One link per target row (T, S): its most attended source column; all-zero rows get none."""
    m = as_array(matrix)
    if m.shape[-1] == 0:
        return set()
    best = m.argmax(axis=-1)
    return {(int(best[j]), j) for j in range(m.shape[0]) if m[j, best[j]] > 0}


def threshold_alignment(matrix: np.ndarray, threshold: float) -> set[Link]:
    """Every ``(i, j)`` with ``matrix[j, i] >= threshold`` (zero, one or several per row)."""
    tgt, src = np.nonzero(as_array(matrix) >= threshold)
    return {(int(i), int(j)) for i, j in zip(src, tgt)}


def transpose_links(links: Iterable[Link]) -> set[Link]:
    """Swap each pair: a backward (target->source) model's links, read from its own matrix as
    (its_src, its_tgt) = (our tgt, our src), become (src, tgt) for ``intersect_alignments``."""
    return {(j, i) for i, j in links}


def intersect_alignments(forward: Iterable[Link], backward: Iterable[Link]) -> set[Link]:
    """High-precision symmetrization. Both arguments in (src, tgt) order: pass the backward
    model's links through ``transpose_links`` first."""
    return set(forward) & set(backward)


def grow_diag_final(forward: Iterable[Link], backward: Iterable[Link], final_and: bool = True
                    ) -> set[Link]:
    """Koehn et al. (2003) symmetrization: start from the intersection, grow into neighbouring
    union links (incl. diagonals) that cover an unaligned word, then add union links whose
    words are both (``final_and``) or either unaligned. Same (src, tgt) order as above."""
    forward, backward = set(forward), set(backward)
    union, links = forward | backward, forward & backward
    neighbours = [(-1, 0), (0, -1), (1, 0), (0, 1), (-1, -1), (-1, 1), (1, -1), (1, 1)]

    def unaligned(i: int, j: int) -> tuple[bool, bool]:
        return all(a != i for a, _ in links), all(b != j for _, b in links)

    grown = True
    while grown:
        grown = False
        for i, j in sorted(links):
            for di, dj in neighbours:
                cand = (i + di, j + dj)
                if cand in union and cand not in links and any(unaligned(*cand)):
                    links.add(cand)
                    grown = True
    for direction in (forward, backward):
        for cand in sorted(direction):
            free_src, free_tgt = unaligned(*cand)
            if (free_src and free_tgt) if final_and else (free_src or free_tgt):
                links.add(cand)
    return links


# ----------------------------------------------------------------------------- Pharaoh


def to_pharaoh(links: Iterable[Link], possible: Iterable[Link] = ()) -> str:
    """``"i-j i-j ..."`` sorted by (src, tgt); links only in ``possible`` are written ``i?j``."""
    sure = set(links)
    tokens = [(i, j, "-") for i, j in sure] + [(i, j, "?") for i, j in set(possible) - sure]
    return " ".join(f"{i}{sep}{j}" for i, j, sep in sorted(tokens))


def _parse_token(token: str) -> tuple[Link, bool]:
    """One token -> (link, is_sure). Raises ValueError on anything malformed."""
    if "?" in token:
        i, j = token.split("?")
        return (_index(i), _index(j)), False
    parts = token.split("-")
    if len(parts) == 3 and parts[2] in ("S", "s", "P", "p"):
        return (_index(parts[0]), _index(parts[1])), parts[2] in ("S", "s")
    if len(parts) != 2:
        raise ValueError(token)
    return (_index(parts[0]), _index(parts[1])), True


def _index(text: str) -> int:
    if not (text.isascii() and text.isdigit()):
        raise ValueError(text)
    return int(text)


def parse_pharaoh(line: str) -> tuple[set[Link], set[Link]]:
    """``"0-0 1?2 2-1-P 3-3-S"`` -> (sure, possible) with possible ⊇ sure (as AER requires).

    ``i-j`` and ``i-j-S`` are sure links, ``i?j`` and ``i-j-P`` possible ones; indices 0-based.
    """
    sure: set[Link] = set()
    possible: set[Link] = set()
    for token in line.split():
        try:
            link, is_sure = _parse_token(token)
        except ValueError:
            raise UserError(
                f"bad alignment token {token!r} in line {line.strip()!r}: expected 0-based "
                "'i-j' or 'i-j-S' (sure), 'i?j' or 'i-j-P' (possible), separated by spaces"
            ) from None
        possible.add(link)
        if is_sure:
            sure.add(link)
    return sure, possible


def read_pharaoh_file(path: str | os.PathLike) -> tuple[list[set[Link]], list[set[Link]]]:
    """Read one Pharaoh line per sentence -> (sure sets, possible sets); a blank line = no links."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"alignment file {path} not found: pass an existing Pharaoh file")
    sure_sets, possible_sets = [], []
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            try:
                sure, possible = parse_pharaoh(line)
            except UserError as err:
                raise UserError(f"{path}, line {number}: {err}") from None
            sure_sets.append(sure)
            possible_sets.append(possible)
    return sure_sets, possible_sets


# ----------------------------------------------------------------------------- AER


def read_gold_alignments(path: str | os.PathLike, sources: Sequence[str], targets: Sequence[str],
                         flag: str = "--gold") -> tuple[list[set[Link]], list[set[Link]]]:
    """Gold (sure, possible) links for sentence pairs, one Pharaoh line per pair, checked to index
    the whitespace-separated words of each source and target (0-based, source-target)."""
    sure, possible = read_pharaoh_file(path)
    if len(sure) != len(sources):
        raise UserError(f"{flag} {path} has {len(sure)} lines but there are {len(sources)} sentence "
                        "pairs; give one Pharaoh line (src-tgt word links) per pair")
    for line, (links, src, tgt) in enumerate(zip(possible, sources, targets), start=1):
        n_src, n_tgt = len(src.split()), len(tgt.split())
        bad = sorted((i, j) for i, j in links if i >= n_src or j >= n_tgt)
        if bad:
            i, j = bad[0]
            raise UserError(f"{flag} {path} line {line}: link {i}-{j} is outside the sentence pair "
                            f"({n_src} source x {n_tgt} target words); gold links must index the "
                            "whitespace-separated words, 0-based, source-target")
    return sure, possible


@dataclass
class AlignmentScores:
    """Corpus-level alignment quality (Och & Ney 2003); counts are summed over sentences."""

    precision: float  # |A∩P| / |A|
    recall: float  # |A∩S| / |S|
    aer: float  # 1 - (|A∩S| + |A∩P|) / (|A| + |S|)
    predicted: int  # |A|
    sure: int  # |S|
    possible: int  # |P| (with S added)
    predicted_sure: int  # |A∩S|
    predicted_possible: int  # |A∩P|
    sentences: int


def alignment_error_rate(
    predicted: Sequence[set[Link]],
    sure: Sequence[set[Link]],
    possible: Sequence[set[Link]] | None = None,
) -> AlignmentScores:
    """Precision, recall and AER of predicted links A against gold sure S and possible P.

    P is taken as P ∪ S per sentence (None = S only). Edge cases: with no predicted links
    precision is 1.0; with no sure links recall is 1.0; with neither, AER is 0.0.
    """
    possible = sure if possible is None else possible
    if not len(predicted) == len(sure) == len(possible):
        raise UserError(
            f"alignment counts differ: {len(predicted)} predicted, {len(sure)} sure and "
            f"{len(possible)} possible sentences; the gold file needs one line per sentence"
        )
    a = s = p = a_s = a_p = 0
    for pred, gold_s, gold_p in zip(predicted, sure, possible):
        pred, gold_s = set(pred), set(gold_s)
        gold_p = set(gold_p) | gold_s
        a, s, p = a + len(pred), s + len(gold_s), p + len(gold_p)
        a_s, a_p = a_s + len(pred & gold_s), a_p + len(pred & gold_p)
    return AlignmentScores(
        precision=a_p / a if a else 1.0,
        recall=a_s / s if s else 1.0,
        aer=1.0 - (a_s + a_p) / (a + s) if a + s else 0.0,
        predicted=a, sure=s, possible=p, predicted_sure=a_s, predicted_possible=a_p,
        sentences=len(predicted),
    )


# ----------------------------------------------------------------------------- records


def _strip_eos(pieces: Sequence[str]) -> list[str]:
    pieces = list(pieces)
    return pieces[:-1] if pieces and pieces[-1] == EOS else pieces


@dataclass
class AlignmentRecord:
    """One sentence's attention and everything derived from it (see the module docstring).

    Piece/word lists label the exported matrices: with ``include_eos`` they end with ``</s>``.
    ``attention`` is the raw ``(L, H, T, S)`` array incl. EOS row/column, padding trimmed.
    """

    index: int
    source: str
    target: str
    src_pieces: list[str]
    tgt_pieces: list[str]
    src_words: list[str]
    tgt_words: list[str]
    attention: np.ndarray  # (L, H, T, S) raw subword attention incl. EOS
    subword: np.ndarray  # (T', S') aggregated over layer/heads
    words: np.ndarray  # (Tw, Sw) word level
    pharaoh_subword: str
    pharaoh_word: str
    layer: int | str = -2
    layer_used: int | str = 0
    heads: Heads = "mean"
    include_eos: bool = False
    method: str = "argmax"
    threshold: float | None = None
    src_eos: bool = True  # does ``attention`` have a source EOS column?
    tgt_eos: bool = True  # ... a target EOS row? (False if decoding stopped at max length)
    extra: dict[str, Any] = field(default_factory=dict)  # more JSONL keys (e.g. "attribution")
    extra_arrays: dict[str, np.ndarray] = field(default_factory=dict)  # more npz arrays s{index}_{key}

    @classmethod
    def build(
        cls,
        index: int,
        source: str,
        target: str,
        src_pieces: Sequence[str],
        tgt_pieces: Sequence[str],
        attention: np.ndarray,
        layer: int | str = -2,
        heads: Heads = "mean",
        include_eos: bool = False,
        method: str = "argmax",
        threshold: float = 0.3,
        src_eos: bool = True,
        tgt_eos: bool = True,
    ) -> AlignmentRecord:
        """Derive matrices and links from one sentence's ``(L, H, T, S)`` attention.

        Pieces may be given with or without a trailing ``</s>``. Rows/columns beyond the pieces
        (+ EOS) are padding and trimmed. ``tgt_eos=False`` for a hypothesis cut at max length.
        """
        if method not in ("argmax", "threshold"):
            raise UserError(f"alignment method must be 'argmax' or 'threshold', got {method!r}")
        src, tgt = _strip_eos(src_pieces), _strip_eos(tgt_pieces)
        n_src, n_tgt = len(src) + src_eos, len(tgt) + tgt_eos
        attn = as_array(attention).astype(np.float32)
        if attn.ndim != 4 or attn.shape[2] < n_tgt or attn.shape[3] < n_src:
            raise ValueError(
                f"sentence {index}: attention shape {attn.shape} does not cover {n_tgt} target "
                f"x {n_src} source positions (pieces + EOS)"
            )
        attn = attn[:, :, :n_tgt, :n_src]  # drop padding
        src_all, tgt_all = src + [EOS] * src_eos, tgt + [EOS] * tgt_eos
        subword = aggregate(attn, layer, heads)
        words = merge_to_words(subword, src_all, tgt_all)
        src_labels = src_all if include_eos else src
        tgt_labels = tgt_all if include_eos else tgt
        if not include_eos:
            subword = drop_eos(subword, not src_eos, not tgt_eos)
            words = drop_eos(words, not src_eos, not tgt_eos)
        return cls(
            index=int(index), source=source, target=target,
            src_pieces=src_labels, tgt_pieces=tgt_labels,
            src_words=words_from_pieces(src_labels), tgt_words=words_from_pieces(tgt_labels),
            attention=attn, subword=subword, words=words,
            pharaoh_subword=to_pharaoh(extract_links(subword, method, threshold)),
            pharaoh_word=to_pharaoh(extract_links(words, method, threshold)),
            layer=layer, layer_used=resolve_layer(layer, attn.shape[0]), heads=heads,
            include_eos=include_eos, method=method,
            threshold=threshold if method == "threshold" else None,
            src_eos=src_eos, tgt_eos=tgt_eos,
        )

    def word_attention(self) -> np.ndarray:
        """Word-level attention per layer and head, ``(L, H, Tw, Sw)``, same EOS policy."""
        src = _strip_eos(self.src_pieces) + [EOS] * self.src_eos
        tgt = _strip_eos(self.tgt_pieces) + [EOS] * self.tgt_eos
        words = merge_to_words(self.attention, src, tgt)
        if self.include_eos:
            return words
        return drop_eos(words, not self.src_eos, not self.tgt_eos)

    def to_json(self) -> dict[str, Any]:
        """The JSONL object (schema in the module docstring)."""
        return {
            "index": self.index, "source": self.source, "target": self.target,
            "src_pieces": self.src_pieces, "tgt_pieces": self.tgt_pieces,
            "src_words": self.src_words, "tgt_words": self.tgt_words,
            "subword_matrix": rounded(self.subword), "word_matrix": rounded(self.words),
            "subword_shape": list(self.subword.shape), "word_shape": list(self.words.shape),
            "pharaoh_subword": self.pharaoh_subword, "pharaoh_word": self.pharaoh_word,
            "attention_shape": list(self.attention.shape),
            "layer": self.layer if isinstance(self.layer, str) else int(self.layer),
            "layer_used": self.layer_used,
            "heads": self.heads if isinstance(self.heads, str) else _int_list(self.heads),
            "include_eos": self.include_eos, "method": self.method, "threshold": self.threshold,
            **self.extra,
        }


def extract_links(matrix: np.ndarray, method: str = "argmax", threshold: float = 0.3) -> set[Link]:
    """Hard links of a ``(T, S)`` matrix: ``argmax`` (one per row) or ``threshold`` (on rows
    renormalized to sum to 1, so a threshold means the same in every row)."""
    if method not in ("argmax", "threshold"):
        raise UserError(f"alignment method must be 'argmax' or 'threshold', got {method!r}")
    if method == "threshold":
        return threshold_alignment(normalize_rows(matrix), threshold)
    return argmax_alignment(matrix)


def rounded(matrix: np.ndarray) -> list:
    return np.round(matrix.astype(np.float64), 4).tolist()


def _int_list(heads: Heads) -> list[int]:
    return [int(heads)] if isinstance(heads, (int, np.integer)) else [int(h) for h in heads]


# ----------------------------------------------------------------------------- writer


class AlignmentWriter:
    """Write ``AlignmentRecord``s as JSONL (streamed) and optionally NPZ, both atomically.

    Use as a context manager: files appear under their final names only when the block exits
    without an exception; otherwise the temp files are removed and nothing is left behind.
    """

    def __init__(
        self,
        jsonl_path: str | os.PathLike,
        npz_path: str | os.PathLike | None = None,
        layer: int | str = -2,
        heads: Heads = "mean",
        include_eos: bool = False,
        method: str = "argmax",
        threshold: float = 0.3,
    ) -> None:
        if method not in ("argmax", "threshold"):
            raise UserError(f"alignment method must be 'argmax' or 'threshold', got {method!r}")
        self.jsonl_path = Path(jsonl_path)
        self.npz_path = Path(npz_path) if npz_path is not None else None
        self.settings = dict(layer=layer, heads=heads, include_eos=include_eos, method=method,
                             threshold=threshold)
        self._indices: list[int] = []
        self._seen: set[int] = set()
        self._jsonl_tmp: Path | None = None
        self._npz_tmp: Path | None = None
        self._jsonl = None
        self._zip: zipfile.ZipFile | None = None

    def __enter__(self) -> AlignmentWriter:
        self._jsonl_tmp = temp_path_beside(self.jsonl_path)
        self._jsonl = self._jsonl_tmp.open("x", encoding="utf-8")
        if self.npz_path is not None:
            self._npz_tmp = temp_path_beside(self.npz_path)
            self._zip = zipfile.ZipFile(self._npz_tmp, "x", zipfile.ZIP_STORED, allowZip64=True)
        return self

    def add(self, index: int, source: str, target: str, src_pieces: Sequence[str],
            tgt_pieces: Sequence[str], attention: np.ndarray, tgt_eos: bool = True
            ) -> AlignmentRecord:
        """Build a record with this writer's settings, write it and return it."""
        record = AlignmentRecord.build(index, source, target, src_pieces, tgt_pieces, attention,
                                       tgt_eos=tgt_eos, **self.settings)
        self.write(record)
        return record

    def write(self, record: AlignmentRecord) -> None:
        """Append one record (built elsewhere) to the JSONL and the NPZ."""
        if self._jsonl is None:
            raise RuntimeError("AlignmentWriter is not open: use it in a 'with' block")
        if record.index in self._seen:
            raise ValueError(f"sentence index {record.index} written twice")
        self._seen.add(record.index)
        self._indices.append(record.index)
        self._jsonl.write(json.dumps(record.to_json(), ensure_ascii=False) + "\n")
        if self._zip is not None:
            key = f"s{record.index}"
            self._add_array(f"{key}_attention", record.attention)
            self._add_array(f"{key}_word_attention", record.word_attention().astype(np.float32))
            self._add_array(f"{key}_subword", record.subword.astype(np.float32))
            self._add_array(f"{key}_words", record.words.astype(np.float32))
            self._add_array(f"{key}_src_pieces", np.array(_strip_eos(record.src_pieces), dtype=str))
            self._add_array(f"{key}_tgt_pieces", np.array(_strip_eos(record.tgt_pieces), dtype=str))
            for name, array in record.extra_arrays.items():
                self._add_array(f"{key}_{name}", array)

    def _add_array(self, key: str, array: np.ndarray) -> None:
        """Stream one array into the zip exactly as ``np.savez`` would store it."""
        with self._zip.open(f"{key}.npy", "w", force_zip64=True) as handle:
            np.lib.format.write_array(handle, np.asarray(array), allow_pickle=False)

    def __exit__(self, exc_type, exc, tb) -> None:
        ok = False
        try:
            if exc_type is None and self._zip is not None:
                heads = self.settings["heads"]
                meta = dict(self.settings, sentences=len(self._indices), indices=self._indices,
                            heads=heads if isinstance(heads, str) else _int_list(heads))
                self._add_array("meta", np.array(json.dumps(meta)))
            ok = exc_type is None
        finally:
            self._close(publish=ok)

    def _close(self, publish: bool) -> None:
        """Close both files; rename them into place (publish) or delete them."""
        self._jsonl.close()
        if self._zip is not None:
            self._zip.close()
        for tmp, final in ((self._jsonl_tmp, self.jsonl_path), (self._npz_tmp, self.npz_path)):
            if tmp is not None and publish:
                os.replace(tmp, final)
            elif tmp is not None:
                tmp.unlink(missing_ok=True)
        self._jsonl = self._zip = self._jsonl_tmp = self._npz_tmp = None
