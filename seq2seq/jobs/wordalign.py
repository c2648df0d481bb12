"""``seq2seq wordalign``: word alignments of a parallel corpus from a statistical aligner, eflomal
(Östling & Tiedemann 2016: a Bayesian IBM model with a fertility and an HMM distortion model,
sampled with Gibbs sampling), as Pharaoh lines.

eflomal aligns the corpus in both directions; the two sets of links are symmetrized
(``alignment.eflomal``: grow-diag-final-and by default, as Koehn et al. 2005 and fast_align's
``atools``). Words are the whitespace tokens of the files, as in ``seq2seq align``'s gold, so the
output can be scored against a gold with the same tokenization, used as a baseline for attention's
alignments, or as supervision (``seq2seq train --guided-alignment``). The aligner is a dependency, not
this project's code: the product here is the command, the symmetrization and the file checks
(pip install 'seq2seq[align]'). ``--method model`` aligns with this project's models instead (``wordalign_model.py``).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..alignment.eflomal import eflomal_links
from ..alignment.links import to_pharaoh
from ..config import SYMMETRIZATIONS
from ..errors import UserError
from ..io_utils import atomic_output, read_parallel
from ..runtime import log

MISSING = "seq2seq wordalign needs eflomal, which is not installed: pip install 'seq2seq[align]'"


@dataclass
class WordAlignJob:
    """What ``seq2seq wordalign`` takes: a parallel corpus, where the links go, and how they are made."""

    source: str
    target: str
    output: str
    symmetrize: str = "grow-diag-final-and"
    model: int = 3  # eflomal's: 1 IBM1, 2 + HMM distortion, 3 + fertility
    iterations: int | None = None  # eflomal's default: from the corpus size (it samples; no seed)


def word_align(job: WordAlignJob) -> int:
    """Align, symmetrize and write one Pharaoh line per sentence pair; returns the number of pairs."""
    if job.symmetrize not in SYMMETRIZATIONS:
        raise UserError(f"--symmetrize must be one of {', '.join(SYMMETRIZATIONS)}, got {job.symmetrize!r}")
    try:
        import eflomal  # noqa: F401
    except ImportError:
        raise UserError(MISSING) from None
    sources, targets = read_parallel(job.source, job.target)
    links = eflomal_links(sources, targets, job.symmetrize, job.model, job.iterations)
    with atomic_output(job.output) as out:
        out.writelines(to_pharaoh(sentence) + "\n" for sentence in links)
    log("wordalign", pairs=len(links), links=sum(map(len, links)), symmetrize=job.symmetrize, output=job.output)
    return len(links)
