"""The numbers of the report: paired significance tests (sacrebleu's), BLEU by source length,
alignment error rates of forced references, and which sentences to show."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from ...alignment.links import alignment_error_rate, argmax_alignment
from ...alignment.records import AlignmentRecord
from ...config import FORCED_BATCH_SIZE, AlignConfig
from ...decoding.scoring import teacher_force
from ...decoding.translator import Translator
from ...errors import UserError
from ...io_utils import counted
from ...metrics import corpus_scores
from ...tokenizer import EOS_ID
from .constants import METRICS


def sacrebleu_metrics() -> dict[str, Any]:
    from sacrebleu.metrics import BLEU, CHRF, TER

    return {"BLEU": BLEU(), "chrF": CHRF(), "TER": TER()}


def run_paired_test(names: Sequence[str], hypotheses: Sequence[list[str]], references: list[str],
                    test_type: str, samples: int) -> tuple[dict[str, str], dict[str, list]]:
    """sacrebleu's PairedTest; results keyed by our metric names (BLEU, chrF, TER)."""
    from sacrebleu.significance import PairedTest

    test = PairedTest(list(zip(names, hypotheses)), sacrebleu_metrics(), [references],
                      test_type=test_type, n_samples=samples)
    signatures, results = test()
    keys = [key for key in results if key != "System"]  # sacrebleu's names: BLEU, chrF2, TER
    return ({ours: str(signatures[key]) for ours, key in zip(METRICS, keys)},
            {ours: results[key] for ours, key in zip(METRICS, keys)})


def significance(names: Sequence[str], hypotheses: Sequence[list[str]], references: list[str],
                 bootstrap: int, ar_trials: int) -> dict[str, Any]:
    """Per system and metric: score, bootstrap mean and 95% CI half-width, p-values against the
    first system (paired bootstrap ``p_bs``, approximate randomization ``p_ar``).

    A score exactly equal to the baseline's (always so for identical outputs) gets p = 1 and
    ``equal_to_baseline``: with no observed difference there is nothing to reject, but sacrebleu
    (2.6) counts only resampled differences strictly greater than the observed one, so when every
    resample ties it reports p = 1/(n+1), i.e. "significant"."""
    bs_signatures, bs = run_paired_test(names, hypotheses, references, "bs", bootstrap)
    ar_signatures, ar = {}, {}
    if len(names) > 1:
        ar_signatures, ar = run_paired_test(names, hypotheses, references, "ar", ar_trials)
    systems = []
    for k, name in enumerate(names):
        scores = {}
        for metric in METRICS:
            result = bs[metric][k]
            equal = k > 0 and result.score == bs[metric][0].score
            scores[metric] = {
                "score": float(result.score), "mean": float(result.mean), "ci": float(result.ci),
                "p_bs": None if k == 0 else (1.0 if equal else float(result.p_value)),
                "p_ar": None if k == 0 else (1.0 if equal else float(ar[metric][k].p_value)),
                "equal_to_baseline": equal,
            }
        identical = k > 0 and hypotheses[k] == hypotheses[0]
        systems.append({"name": name, "identical_to_baseline": identical, "scores": scores})
    return {"baseline": names[0], "bootstrap": bootstrap, "ar_trials": ar_trials,
            "seed": os.environ.get("SACREBLEU_SEED", "12345"),
            "signatures": {"bs": bs_signatures, "ar": ar_signatures}, "systems": systems}




@dataclass
class Bucket:
    label: str
    low: int  # source words, inclusive
    high: int | None  # inclusive; None = no upper bound
    ids: list[int] = field(default_factory=list)


def length_buckets(sources: Sequence[str], bounds: Sequence[int]) -> list[Bucket]:
    """Sentences grouped by source word count: bounds (10, 15) give 1-10, 11-15, 16+.
    Empty source lines belong to no bucket."""
    lows = [1] + [b + 1 for b in bounds]
    highs: list[int | None] = list(bounds) + [None]
    buckets = [Bucket(f"{lo}-{hi}" if hi is not None else f"{lo}+", lo, hi) for lo, hi in zip(lows, highs)]
    for i, source in enumerate(sources):
        words = len(source.split())
        for bucket in buckets:
            if words >= bucket.low and (bucket.high is None or words <= bucket.high):
                bucket.ids.append(i)
                break
    return buckets


def bucket_bleu(buckets: list[Bucket], names: Sequence[str], hypotheses: Sequence[list[str]],
                references: list[str]) -> list[dict[str, Any]]:
    """Corpus BLEU of every system on every bucket (None for an empty bucket)."""
    rows = []
    for bucket in buckets:
        bleu: dict[str, float | None] = {}
        for name, hyps in zip(names, hypotheses):
            if not bucket.ids:
                bleu[name] = None
                continue
            subset = [hyps[i] for i in bucket.ids], [references[i] for i in bucket.ids]
            bleu[name] = corpus_scores(*subset, ("bleu",))["bleu"].score
        rows.append({"label": bucket.label, "low": bucket.low, "high": bucket.high,
                     "sentences": len(bucket.ids), "bleu": bleu})
    return rows




def forced_attentions(translator: Translator, sources: Sequence[str], targets: Sequence[str],
                      batch_size: int = FORCED_BATCH_SIZE, first_index: int = 0) -> list[AlignmentRecord]:
    """Teacher-force each ``target`` on its ``source`` (``scoring.teacher_force``) and return the
    model's attention as alignment records (word matrices over source words x target words,
    default layer/heads; a model trained with guided alignment: its supervised heads). Both sides are cut to the
    translator's ``max_input_tokens`` subwords."""
    align = AlignConfig().for_model(translator.supervised_attention)
    tok, limit = translator.tokenizer, translator.max_input_tokens
    src_ids = [tok.encode(s.strip())[:limit] + [EOS_ID] for s in sources]
    tgt_ids = [tok.encode(t.strip())[:limit] for t in targets]
    _, attention = teacher_force(translator.model, src_ids, tgt_ids, need_attention=True, batch_size=batch_size,
                                 need_scores=False)
    return [AlignmentRecord.build(first_index + k, sources[k], targets[k], tok.pieces(src_ids[k]),
                                  tok.pieces(tgt_ids[k] + [EOS_ID]), attention[k], align)  # (L, H, T+1, S)
            for k in range(len(sources))]


def forced_attention(translator: Translator, source: str, target: str) -> AlignmentRecord:
    """One sentence pair of ``forced_attentions``."""
    return forced_attentions(translator, [source], [target])[0]


def gold_aer(translator: Translator, sources: list[str], references: list[str], sure: list,
             possible: list) -> dict[str, Any]:
    """AER of argmax word alignments from attention while force-decoding the references."""
    records = forced_attentions(translator, sources, references)
    scores = alignment_error_rate([argmax_alignment(r.words) for r in records], sure, possible)
    return vars(scores)




def sentence_chrf(hypotheses: list[str], references: list[str]) -> list[float]:
    from sacrebleu.metrics import CHRF

    metric = CHRF()
    return [metric.sentence_score(h, [r]).score for h, r in zip(hypotheses, references)]


def pick_sentences(chrf: dict[str, list[float]], sources: list[str], count: int) -> list[int]:
    """The ``count`` non-empty sentences where the systems' sentence chrF differ most
    (ties: the earlier line)."""
    spread = np.ptp(np.array(list(chrf.values())), axis=0)  # (sentences,)
    order = sorted((i for i, s in enumerate(sources) if s.strip()), key=lambda i: (-spread[i], i))
    return order[:count]


def check_sentence_ids(ids: Sequence[int], sources: list[str]) -> list[int]:
    """Distinct ids, in order, of non-empty source lines."""
    bad = [i for i in ids if not 0 <= i < len(sources)]
    if bad:
        raise UserError(f"--sentence-ids {' '.join(map(str, bad))}: the test set has "
                        f"{counted(len(sources), 'sentence')}; ids are 0-based line numbers, 0..{len(sources) - 1}")
    empty = [i for i in ids if not sources[i].strip()]
    if empty:
        raise UserError(f"--sentence-ids {' '.join(map(str, empty))}: empty source line(s), nothing to "
                        "plot; choose other sentences")
    return list(dict.fromkeys(ids))
