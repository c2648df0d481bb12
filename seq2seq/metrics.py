"""Corpus-level BLEU, chrF and TER through sacrebleu, on detokenized text.

Every score carries sacrebleu's signature (e.g. ``nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|
version:2.6.0``) so numbers from different runs and toolkits are comparable.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from sacrebleu.metrics import BLEU, CHRF, TER

from .errors import UserError
from .io_utils import counted


@dataclass
class Score:
    name: str  # BLEU | chrF2 | TER
    score: float
    signature: str
    detail: str = ""  # sacrebleu's full line, e.g. the n-gram precisions and brevity penalty

    def __str__(self) -> str:
        return f"{self.name} = {self.score:.2f}  ({self.signature})"


_METRICS = {"bleu": BLEU, "chrf": CHRF, "ter": TER}


def corpus_scores(
    hypotheses: Sequence[str], references: Sequence[str], metrics: Sequence[str] = ("bleu", "chrf")
) -> dict[str, Score]:
    """Score detokenized hypotheses against one reference each; keys are the metric names asked for."""
    if len(hypotheses) != len(references):
        raise UserError(
            f"{counted(len(hypotheses), 'hypothesis', 'hypotheses')} but {counted(len(references), 'reference')}: "
            "the reference file must have one line per input line"
        )
    results = {}
    for name in metrics:
        if name not in _METRICS:
            raise UserError(f"unknown metric {name!r}; choose from {', '.join(_METRICS)}")
        metric = _METRICS[name]()
        result = metric.corpus_score(list(hypotheses), [list(references)])
        results[name] = Score(result.name, float(result.score), str(metric.get_signature()), str(result))
    return results


def corpus_bleu(hypotheses: Sequence[str], references: Sequence[str]) -> Score:
    return corpus_scores(hypotheses, references, ("bleu",))["bleu"]
