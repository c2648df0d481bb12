"""One sentence's alignment record, its export as JSONL (+ NPZ arrays) and the export schema.

Order of operations in ``AlignmentRecord.build`` (and so in the export):
trim padding -> ``aggregate`` layers/heads -> ``merge_to_words`` (EOS is a word of its own) ->
``drop_eos`` (unless ``include_eos``) -> hard links (``LINK_METHODS``).
Exported matrices keep the raw weights: with the EOS column dropped a row sums to 1 minus the
weight EOS received. Only ``threshold``, ``soft`` and ``grow`` extraction renormalize rows (so a threshold
means the same for every row); ``argmax`` does not need to.

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
``include_eos``, ``method`` (``LINK_METHODS``), ``threshold`` (the share the method used: float, or null for argmax)
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
                     (see ``seq2seq.attribution`` for formulas and signs)

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
from typing import Any, Sequence

import numpy as np

from ..config import AlignConfig, check_link_method, link_share
from ..io_utils import output_error, sync_directory, temp_path_beside
from .matrices import (EOS, Heads, aggregate, as_array, drop_eos, merge_to_words, resolve_layer, strip_eos,
                       words_from_pieces)
from .links import extract_links, to_pharaoh

# ----------------------------------------------------------------------------- records


@dataclass(frozen=True)
class EosPositions:
    """Which EOS positions a sentence's ``(L, H, T, S)`` attention has (``AlignmentRecord.build``): the source EOS
    column and the target EOS row. A hypothesis cut at max length has no target EOS row; an empty input has
    neither (``NO_EOS``)."""

    src_eos: bool = True
    tgt_eos: bool = True


#: the attention of an empty input: no EOS row or column (``AlignmentRecord.build``)
NO_EOS = EosPositions(src_eos=False, tgt_eos=False)


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
    layer: int | str = AlignConfig.layer
    layer_used: int | str = 0
    heads: Heads = AlignConfig.heads
    include_eos: bool = AlignConfig.include_eos
    method: str = AlignConfig.method
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
        align: AlignConfig | None = None,
        eos: EosPositions = EosPositions(),
    ) -> AlignmentRecord:
        """Derive matrices and links from one sentence's ``(L, H, T, S)`` attention, read as ``align`` says
        (layer, heads, include_eos, method, threshold; default ``AlignConfig()``).

        Pieces may be given with or without a trailing ``</s>``. Rows/columns beyond the pieces
        (+ EOS) are padding and trimmed. ``eos`` says which EOS positions ``attention`` has
        (``EosPositions``: no target EOS row for a hypothesis cut at max length, neither for an empty input).
        """
        align = align or AlignConfig()
        src_eos, tgt_eos = eos.src_eos, eos.tgt_eos
        check_link_method(align.method)
        src, tgt = strip_eos(src_pieces), strip_eos(tgt_pieces)
        n_src, n_tgt = len(src) + src_eos, len(tgt) + tgt_eos
        attn = as_array(attention).astype(np.float32)
        if attn.ndim != 4 or attn.shape[2] < n_tgt or attn.shape[3] < n_src:
            raise ValueError(
                f"sentence {index}: attention shape {attn.shape} does not cover {n_tgt} target "
                f"x {n_src} source positions (pieces + EOS)"
            )
        attn = attn[:, :, :n_tgt, :n_src]  # drop padding
        src_all, tgt_all = src + [EOS] * src_eos, tgt + [EOS] * tgt_eos
        subword = aggregate(attn, align.layer, align.heads)
        words = merge_to_words(subword, src_all, tgt_all)
        src_labels = src_all if align.include_eos else src
        tgt_labels = tgt_all if align.include_eos else tgt
        if not align.include_eos:
            subword = drop_eos(subword, not src_eos, not tgt_eos)
            words = drop_eos(words, not src_eos, not tgt_eos)
        return cls(
            index=int(index), source=source, target=target,
            src_pieces=src_labels, tgt_pieces=tgt_labels,
            src_words=words_from_pieces(src_labels), tgt_words=words_from_pieces(tgt_labels),
            attention=attn, subword=subword, words=words,
            pharaoh_subword=to_pharaoh(extract_links(subword, align.method, align.threshold)),
            pharaoh_word=to_pharaoh(extract_links(words, align.method, align.threshold)),
            layer=align.layer, layer_used=resolve_layer(align.layer, attn.shape[0]), heads=align.heads,
            include_eos=align.include_eos, method=align.method,
            threshold=link_share(align.method, align.threshold),
            src_eos=src_eos, tgt_eos=tgt_eos,
        )

    def word_attention(self) -> np.ndarray:
        """Word-level attention per layer and head, ``(L, H, Tw, Sw)``, same EOS policy."""
        src = strip_eos(self.src_pieces) + [EOS] * self.src_eos
        tgt = strip_eos(self.tgt_pieces) + [EOS] * self.tgt_eos
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
        align: AlignConfig | None = None,
    ) -> None:
        self.align = align or AlignConfig()  # how every record is read (``AlignmentRecord.build``)
        check_link_method(self.align.method)
        self.jsonl_path = Path(jsonl_path)
        self.npz_path = Path(npz_path) if npz_path is not None else None
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
        """Build a record with this writer's ``align``, write it and return it."""
        record = AlignmentRecord.build(index, source, target, src_pieces, tgt_pieces, attention, self.align,
                                       EosPositions(tgt_eos=tgt_eos))
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
        try:
            self._write(record)
        except OSError as exc:  # nothing is published: ``_close`` removes both temp files
            raise output_error(exc, f"writing {self.jsonl_path}", "nothing was published") or exc from None

    def _write(self, record: AlignmentRecord) -> None:
        self._jsonl.write(json.dumps(record.to_json(), ensure_ascii=False) + "\n")
        if self._zip is not None:
            key = f"s{record.index}"
            self._add_array(f"{key}_attention", record.attention)
            self._add_array(f"{key}_word_attention", record.word_attention().astype(np.float32))
            self._add_array(f"{key}_subword", record.subword.astype(np.float32))
            self._add_array(f"{key}_words", record.words.astype(np.float32))
            self._add_array(f"{key}_src_pieces", np.array(strip_eos(record.src_pieces), dtype=str))
            self._add_array(f"{key}_tgt_pieces", np.array(strip_eos(record.tgt_pieces), dtype=str))
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
                align = self.align
                heads = align.heads if isinstance(align.heads, str) else _int_list(align.heads)
                meta = dict(layer=align.layer, heads=heads, include_eos=align.include_eos, method=align.method,
                            threshold=align.threshold, sentences=len(self._indices), indices=self._indices)
                self._add_array("meta", np.array(json.dumps(meta)))
            ok = exc_type is None
        finally:
            self._close(publish=ok)

    def _close(self, publish: bool) -> None:
        """Close both files; flush them to the disk and rename them into place (publish), or delete
        them. A refusal of the disk (while writing, flushing or renaming) is an ``OutputError`` naming
        the final file, and no temp file is left. The NPZ is renamed first and the JSONL last: a failure
        between the two leaves the new NPZ beside the earlier JSONL, and the message says to run the
        command again."""
        pairs = [(tmp, final) for tmp, final in ((self._npz_tmp, self.npz_path), (self._jsonl_tmp, self.jsonl_path))
                 if tmp is not None]
        final = pairs[0][1]
        try:
            self._jsonl.close()
            if self._zip is not None:
                self._zip.close()
            if publish:
                for tmp, final in pairs:
                    with open(tmp, "rb+") as handle:
                        os.fsync(handle.fileno())
                for tmp, final in pairs:
                    os.replace(tmp, final)
                sync_directory(self.jsonl_path.parent)
        except OSError as exc:
            raise output_error(exc, f"writing {final}", "the alignments were not (all) published; run the "
                                    "command again") or exc from None
        finally:
            for tmp, _ in pairs:
                tmp.unlink(missing_ok=True)  # gone after a rename; a temp file of a failed write
            self._jsonl = self._zip = self._jsonl_tmp = self._npz_tmp = None
