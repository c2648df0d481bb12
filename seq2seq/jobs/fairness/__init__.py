"""Fairness, as the attention notes ask for it: counterfactual probes of a translation model, with attention and
attribution as evidence, and counterfactual data augmentation as a mitigation.

    seq2seq fairness --checkpoint RUN --input val.en --output-dir fairness     # the probe (report.py)
    seq2seq augment --data-dir multi30k --src en --tgt de --output-dir cda    # the mitigation (augment.py)

Modules: ``lexicon`` (swap lists: the pairs of group terms, read from two-column files; ``lists/`` ships English
and German), ``swaps`` (a sentence with its group terms exchanged), ``english`` and ``german`` (each language's
choices and, for German, the agreement of articles and adjectives), ``probe`` (faithfulness, stability, evidence),
``occupations`` (the English -> German occupation probe), ``augment``, ``render`` (markdown), ``report`` (the job,
the report directory). docs/guides/fairness.md defines every metric and what it cannot show.
"""
from .augment import AugmentJob, augment
from .report import FairnessJob, fairness
from .swaps import Swapped, Swapper, swapper_for

__all__ = ["AugmentJob", "FairnessJob", "Swapped", "Swapper", "augment", "fairness", "swapper_for"]
