"""The one corpus layout: a ``DatasetDict`` with splits train/validation/test of string columns src, tgt."""
from __future__ import annotations

from datasets import Dataset, Features, List, Value

SPLITS = ("train", "validation", "test")
PAIR_FEATURES = Features({"src": Value("string"), "tgt": Value("string")})
ENCODED_FEATURES = Features({
    "src": Value("string"),
    "tgt": Value("string"),
    "src_ids": List(Value("int32")),  # source pieces + EOS
    "tgt_ids": List(Value("int32")),  # target pieces, no BOS/EOS (collate adds them)
})
# A training split with guided alignment lines (``guided.py``): the line's text and its number in the file.
GUIDED_FEATURES = Features({**ENCODED_FEATURES, "align": Value("string"), "align_line": Value("int64")})
# The flag that names each split's file stem in --data-dir (for error messages).
SPLIT_FLAGS = {"train": "--train-split", "validation": "--valid-split", "test": "--test-split"}


def pairs_dataset(src: list[str], tgt: list[str]) -> Dataset:
    """An in-memory dataset of parallel sentences (``len(src) == len(tgt)``)."""
    return Dataset.from_dict({"src": src, "tgt": tgt}, features=PAIR_FEATURES)


def empty_pairs() -> Dataset:
    return pairs_dataset([], [])
