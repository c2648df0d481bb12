"""Hard alignment links: argmax / threshold extraction, symmetrization, Pharaoh files, AER."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from ..config import SYMMETRIZATIONS, AlignConfig, link_share
from ..errors import UserError
from ..io_utils import counted
from .matrices import Link, as_array, normalize_rows

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


def symmetrized(forward: set[Link], backward: set[Link], how: str) -> set[Link]:
    """Both directions' (source, target) links combined as ``how`` says (``SYMMETRIZATIONS``): eflomal's two
    directions, or two translation models' (``seq2seq align``, ``translate --backward-checkpoint``)."""
    if how not in SYMMETRIZATIONS:
        raise UserError(f"--symmetrize must be one of {', '.join(SYMMETRIZATIONS)}, got {how!r}")
    if how == "forward":
        return set(forward)
    if how == "backward":
        return set(backward)
    if how == "intersection":
        return intersect_alignments(forward, backward)
    return grow_diag_final(forward, backward, final_and=how == "grow-diag-final-and")


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
        raise UserError(f"{flag} {path} has {counted(len(sure), 'line')} for {counted(len(sources), 'sentence pair')}"
                        "; give one Pharaoh line (src-tgt word links) per pair")
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

    precision: float | None  # |A∩P| / |A|; None (undefined, 0/0) without predicted links
    recall: float | None  # |A∩S| / |S|; None (undefined, 0/0) without sure links
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

    P is taken as P ∪ S per sentence (None = S only). Edge cases: with no predicted links precision
    is undefined (0/0: None, shown as "n/a"; AER is then 1.0 by its formula when there are sure links:
    nothing predicted, every sure link missed); with no sure links recall is undefined (None); with
    neither, AER is 0.0 (no link to get right, none got wrong).
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
        precision=a_p / a if a else None,
        recall=a_s / s if s else None,
        aer=1.0 - (a_s + a_p) / (a + s) if a + s else 0.0,
        predicted=a, sure=s, possible=p, predicted_sure=a_s, predicted_possible=a_p,
        sentences=len(predicted),
    )



def soft_alignment(matrix: np.ndarray, threshold: float) -> set[Link]:
    """Every ``(i, j)`` holding at least ``threshold`` of target row j and of source column i, each
    renormalized to sum to 1 (the matrix read in both directions, as Dou & Neubig 2021 read two
    softmaxes of one similarity matrix):  R_ji = A_ji / sum_i' A_ji',  C_ji = A_ji / sum_j' A_j'i,
    link iff min(R_ji, C_ji) >= threshold."""
    m = as_array(matrix)
    both = np.minimum(normalize_rows(m), normalize_rows(m.T).T)
    return threshold_alignment(both, threshold)


def grow_alignment(matrix: np.ndarray, min_share: float = 0.0) -> set[Link]:
    """Grow-diag-final-and (``grow_diag_final``) of two argmax readings of one matrix: each target
    word's most attended source word (rows) and each source word's most attending target word
    (columns), so that no backward model is needed to symmetrize; of those, the links holding at least
    ``min_share`` of their row and of their column (``soft_alignment``'s test: growing adds neighbours the
    matrix barely supports, and the floor drops them again; 0 keeps every grown link)."""
    rows = argmax_alignment(matrix)
    grown = grow_diag_final(rows, transpose_links(argmax_alignment(as_array(matrix).T)))
    return grown & soft_alignment(matrix, min_share) if min_share > 0 else grown


def agreement_matrix(forward: np.ndarray, backward: np.ndarray) -> np.ndarray:
    """Where two directions' word attention agree, as one ``(T, S)`` matrix: ``forward`` ``(T, S)`` read
    from a source->target model, ``backward`` ``(S, T)`` from a target->source model of the same pair,

        G_ts = sqrt(P_f(s | t) * P_b(t | s)),  P_f, P_b: each matrix's rows renormalized to sum to 1,

    high only where both directions put their mass (the posterior agreement of Liang et al. 2006, read out
    at alignment time; soft, so links are read from it as from one model's matrix, ``extract_links``).
    Where the two models split a pair into different numbers of words, the matrices are cut to the words
    both have (an included EOS row or column is the last one, and goes first)."""
    f, b = as_array(forward).astype(np.float64), as_array(backward).astype(np.float64).T
    rows, cols = min(f.shape[0], b.shape[0]), min(f.shape[1], b.shape[1])
    f, b = f[:rows, :cols], b[:rows, :cols]
    return np.sqrt(normalize_rows(f) * normalize_rows(b.T).T)


def extract_links(matrix: np.ndarray, method: str = AlignConfig.method,
                  threshold: float | None = AlignConfig.threshold) -> set[Link]:
    """Hard links of a ``(T, S)`` matrix by ``method`` (``LINK_METHODS``): ``argmax`` (one per row),
    ``threshold`` (on rows renormalized to sum to 1, so a threshold means the same in every row),
    ``soft`` (``soft_alignment``), ``grow`` (``grow_alignment``) or ``probability`` (the matrix as it is: a
    link classifier's probabilities, summed over a source word's pieces and averaged over a target word's),
    with the share ``threshold`` (None: the method's default, ``config.DEFAULT_SHARES``)."""
    share = link_share(method, threshold)
    if method == "threshold":
        return threshold_alignment(normalize_rows(matrix), share)
    if method == "probability":
        return threshold_alignment(matrix, share)
    if method == "soft":
        return soft_alignment(matrix, share)
    if method == "grow":
        return grow_alignment(matrix, share)
    return argmax_alignment(matrix)
