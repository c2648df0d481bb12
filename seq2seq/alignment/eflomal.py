"""Word alignments of sentence pairs from a statistical aligner, eflomal (Östling & Tiedemann 2016: a
Bayesian IBM model with a fertility and an HMM distortion model, sampled with Gibbs sampling).

eflomal aligns the pairs in both directions; the two sets of links are symmetrized here
(``links``: grow-diag-final-and by default, as Koehn et al. 2005 and fast_align's ``atools``).
Words are the whitespace tokens of the sentences. Used by ``seq2seq wordalign`` (files in, Pharaoh
lines out) and by guided alignment training (``--guided-alignment eflomal``). The aligner is a
dependency, not this project's code (pip install 'seq2seq[align]').
"""
from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Sequence

from ..config import SYMMETRIZATIONS
from ..errors import UserError
from .links import Link, parse_pharaoh, symmetrized

MISSING = "eflomal is not installed: pip install 'seq2seq[align]'"


def eflomal_links(sources: Sequence[str], targets: Sequence[str], symmetrize: str = "grow-diag-final-and",
                  model: int = 3, iterations: int | None = None) -> list[set[Link]]:
    """(source word, target word) links of every pair, both directions symmetrized as ``symmetrize``
    says; ``model`` is eflomal's (1 IBM1, 2 + HMM distortion, 3 + fertility), ``iterations`` its
    sampling iterations (None: from the corpus size; eflomal takes no seed)."""
    if symmetrize not in SYMMETRIZATIONS:
        raise UserError(f"--symmetrize must be one of {', '.join(SYMMETRIZATIONS)}, got {symmetrize!r}")
    try:
        import eflomal
    except ImportError:
        raise UserError(MISSING) from None
    with tempfile.TemporaryDirectory() as scratch:
        forward, backward = Path(scratch) / "fwd", Path(scratch) / "rev"
        aligner = eflomal.Aligner(model=model, n_iterations=iterations)
        # eflomal counts a line per sentence: an empty side is a sentence with no words (no links)
        aligner.align([s + "\n" for s in sources], [t + "\n" for t in targets],
                      links_filename_fwd=str(forward), links_filename_rev=str(backward), quiet=True)
        fwd, rev = _read_links(forward, len(sources)), _read_links(backward, len(sources))
    return [symmetrized(f, r, symmetrize) for f, r in zip(fwd, rev)]


def _read_links(path: Path, pairs: int) -> list[set[Link]]:
    """eflomal's links of one direction: a line per pair, ``i-j`` with i the source word in both files
    (the reverse file is already in source-target order, as fast_align -r writes it)."""
    lines = path.read_text(encoding="utf-8").split("\n")[:pairs]
    lines += [""] * (pairs - len(lines))
    return [parse_pharaoh(line)[0] for line in lines]
