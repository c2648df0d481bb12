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
from ..io_utils import counted

log = logging.getLogger(__name__)

KEEP, EMPTY, TOO_LONG, RATIO = 0, 1, 2, 3
REASONS = {EMPTY: "empty", TOO_LONG: "too_long", RATIO: "ratio"}


def _strip(batch: dict) -> dict:
    return {"src": [s.strip() for s in batch["src"]], "tgt": [t.strip() for t in batch["tgt"]]}


def drop_reasons(batch: dict, max_len: int, max_len_ratio: float) -> dict:
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


def is_kept(reasons: list[int]) -> list[bool]:
    return [reason == KEEP for reason in reasons]


def clean_corpus(dd: DatasetDict, max_len: int = 0, max_len_ratio: float = 0.0,
                 sources: dict[str, str | None] | None = None) -> tuple[DatasetDict, dict]:
    """Return the cleaned corpus and ``{split: {"read", "kept", "empty", "too_long", "ratio"}}``.

    Training pairs are dropped when a side is empty, a side has more than ``max_len`` words
    (0 = no limit) or ``max(len)/min(len) > max_len_ratio`` (0 = no limit). Then every split
    training needs must have pairs (``require_pairs``); ``sources`` names where each split came from
    (``corpus.split_sources``) so that the error can name the file or dataset.
    """
    if max_len < 0 or max_len_ratio < 0:
        raise UserError("--max-len and --max-len-ratio must be >= 0 (0 = no filter)")
    out, stats = {}, {}
    for split, dataset in dd.items():
        if split != "train" or len(dataset) == 0:  # (map skips an empty dataset: no _drop column)
            out[split] = dataset.map(_strip, batched=True, desc=f"Stripping {split}")
            stats[split] = {"read": len(dataset), "kept": len(dataset)}
            if split == "train":
                stats[split].update({name: 0 for name in REASONS.values()})
            continue
        marked = dataset.map(drop_reasons, batched=True, desc="Cleaning train",
                             fn_kwargs={"max_len": max_len, "max_len_ratio": max_len_ratio})
        counts = np.bincount(np.asarray(marked["_drop"], dtype=np.int64), minlength=4)
        kept = marked.filter(is_kept, batched=True, input_columns="_drop", desc="Filtering train")
        out[split] = kept.remove_columns("_drop")
        stats[split] = {"read": len(dataset), "kept": int(counts[KEEP]),
                        **{name: int(counts[code]) for code, name in REASONS.items()}}
    train = stats.get("train")
    if train is not None:
        log.info("data: train %d pairs read, %d kept (dropped: %d empty, %d over --max-len, %d over "
                 "--max-len-ratio)", train["read"], train["kept"], train["empty"], train["too_long"],
                 train["ratio"])
    require_pairs(stats, sources or {}, max_len, max_len_ratio)
    return DatasetDict(out), stats


def require_pairs(stats: dict, sources: dict[str, str | None], max_len: int = 0, max_len_ratio: float = 0.0) -> None:
    """UserError naming the split and its source when a split training needs has no pairs.

    Training needs pairs in train (after cleaning) and in validation (best.pt and early stopping
    are chosen by validation BLEU). A test split may be absent (its source is None: the final test
    is skipped), but one that was given and holds no pairs is an error like the others."""
    def where(split: str) -> str:
        return sources.get(split) or f"the {split} split"

    train = stats.get("train")
    if train is not None and train["kept"] == 0:
        if train["read"] == 0:
            raise UserError(f"{where('train')}: no sentence pairs (the training data is empty); "
                            "give files or a dataset that hold parallel sentences")
        raise UserError(
            f"{where('train')}: the training corpus is empty after cleaning: of {counted(train['read'], 'pair')}, "
            f"{train['empty']} with an empty side, {train['too_long']} longer than --max-len {max_len}, "
            f"{train['ratio']} beyond --max-len-ratio {max_len_ratio}; relax --max-len / "
            "--max-len-ratio (0 disables them) or check that the files hold text"
        )
    valid = stats.get("validation")
    if valid is not None and valid["read"] == 0:
        given = sources.get("validation")
        raise UserError(
            (f"{given}: no sentence pairs" if given else "no validation data") + ". Training chooses "
            "best.pt and stops early by validation BLEU, so it needs validation pairs: give "
            "--valid-file FILE (with --train-file), {split}.{lang} files named by --valid-split in "
            "--data-dir, or --valid-split NAME for a hub dataset"
        )
    test = stats.get("test")
    if test is not None and test["read"] == 0 and sources.get("test"):
        raise UserError(f"{sources['test']}: no sentence pairs; give a test file with sentence pairs, "
                        "or leave the test split out (the final test is then skipped)")
