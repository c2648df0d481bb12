"""Corpus cleaning: strip whitespace everywhere; drop bad pairs from the training split only.

Validation and test keep every line (only stripped), empty ones included, so that hypothesis line
``i`` always matches reference line ``i`` and scores are comparable with published ones. Length
filters are measured in whitespace-separated words, before subword tokenization.
"""
from __future__ import annotations

import logging

import numpy as np
from datasets import DatasetDict

from ..errors import UserError

log = logging.getLogger(__name__)

KEEP, EMPTY, TOO_LONG, RATIO = 0, 1, 2, 3
REASONS = {EMPTY: "empty", TOO_LONG: "too_long", RATIO: "ratio"}


def _strip(batch: dict) -> dict:
    return {"src": [s.strip() for s in batch["src"]], "tgt": [t.strip() for t in batch["tgt"]]}


def _drop_reasons(batch: dict, max_len: int, max_len_ratio: float) -> dict:
    """Strip, and give every pair a reason code (KEEP if it stays); first failing check wins."""
    stripped = _strip(batch)
    reasons = []
    for src, tgt in zip(stripped["src"], stripped["tgt"]):
        n_src, n_tgt = len(src.split()), len(tgt.split())
        if not n_src or not n_tgt:
            reasons.append(EMPTY)
        elif max_len > 0 and max(n_src, n_tgt) > max_len:
            reasons.append(TOO_LONG)
        elif max_len_ratio > 0 and max(n_src, n_tgt) / min(n_src, n_tgt) > max_len_ratio:
            reasons.append(RATIO)
        else:
            reasons.append(KEEP)
    return {**stripped, "_drop": reasons}


def _keep(reasons: list[int]) -> list[bool]:
    return [reason == KEEP for reason in reasons]


def clean_corpus(dd: DatasetDict, max_len: int = 0, max_len_ratio: float = 0.0) -> tuple[DatasetDict, dict]:
    """Return the cleaned corpus and ``{split: {"read", "kept", "empty", "too_long", "ratio"}}``.

    Training pairs are dropped when a side is empty, a side has more than ``max_len`` words
    (0 = no limit) or ``max(len)/min(len) > max_len_ratio`` (0 = no limit).
    """
    if max_len < 0 or max_len_ratio < 0:
        raise UserError("--max-len and --max-len-ratio must be >= 0 (0 = no filter)")
    out, stats = {}, {}
    for split, dataset in dd.items():
        if split != "train":
            out[split] = dataset.map(_strip, batched=True, desc=f"Stripping {split}")
            stats[split] = {"read": len(dataset), "kept": len(dataset)}
            continue
        marked = dataset.map(_drop_reasons, batched=True, desc="Cleaning train",
                             fn_kwargs={"max_len": max_len, "max_len_ratio": max_len_ratio})
        counts = np.bincount(np.asarray(marked["_drop"], dtype=np.int64), minlength=4)
        kept = marked.filter(_keep, batched=True, input_columns="_drop", desc="Filtering train")
        out[split] = kept.remove_columns("_drop")
        stats[split] = {"read": len(dataset), "kept": int(counts[KEEP]),
                        **{name: int(counts[code]) for code, name in REASONS.items()}}
    train = stats.get("train")
    if train is not None:
        log.info("data: train %d pairs read, %d kept (dropped: %d empty, %d over --max-len, %d over "
                 "--max-len-ratio)", train["read"], train["kept"], train["empty"], train["too_long"],
                 train["ratio"])
        if train["kept"] == 0:
            if train["read"] == 0:
                raise UserError("the training corpus has no lines; check --data-dir / --train-file")
            raise UserError(
                f"the training corpus is empty after cleaning: of {train['read']} pairs, "
                f"{train['empty']} have an empty side, {train['too_long']} exceed --max-len {max_len}, "
                f"{train['ratio']} exceed --max-len-ratio {max_len_ratio}; relax --max-len / "
                "--max-len-ratio (0 disables them) or check that the files hold text"
            )
    return DatasetDict(out), stats
