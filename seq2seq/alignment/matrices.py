"""Attention matrices -> word level: layer and head choice, piece-to-word merge, EOS handling."""
from __future__ import annotations

from typing import Any, Iterable, Sequence

import numpy as np

from ..config import AlignConfig, layer_index, parse_heads, parse_layer
from ..errors import UserError

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


def strip_eos(pieces: Sequence[str]) -> list[str]:
    """``pieces`` without a final EOS."""
    pieces = list(pieces)
    return pieces[:-1] if pieces and pieces[-1] == EOS else pieces


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
    return layer_index(layer, num_layers)


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


def aggregate(attn: np.ndarray, layer: int | str = AlignConfig.layer, heads: Heads = AlignConfig.heads) -> np.ndarray:
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


def check_layer_heads(layer: str | int, heads: str | list[int], model) -> tuple[int | str, str | list[int]]:
    """Parse --align-layer / --align-heads (``AlignConfig.layer`` / ``heads``) and check them against the
    model before anything is translated."""
    parsed_layer, parsed_heads = parse_layer(layer), parse_heads(heads)
    try:
        resolve_layer(parsed_layer, model.attention_layers)
    except UserError as exc:
        raise UserError(f"--align-layer {layer}: {exc}") from None
    try:
        head_indices(parsed_heads, model.attention_heads)
    except UserError as exc:
        spelled = heads if isinstance(heads, str) else ",".join(str(h) for h in heads)
        raise UserError(f"--align-heads {spelled}: {exc}") from None
    return parsed_layer, parsed_heads
