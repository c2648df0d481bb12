"""Hugging Face hub corpora: download with ``datasets`` and map columns/splits to src/tgt.

Two layouts are understood: flat columns named by language (``bentrevett/multi30k``: ``en``,
``de``) and the WMT style ``translation`` column of ``{lang: text}`` dicts (``wmt14``, ``de-en``).
"""
from __future__ import annotations

import logging

import datasets
from datasets import Dataset, DatasetDict, IterableDataset, IterableDatasetDict

from ..errors import UserError
from .schema import PAIR_FEATURES, empty_pairs

log = logging.getLogger(__name__)

# Hub split names tried for each of our splits, in order.
SPLIT_CANDIDATES = {
    "train": ("train",),
    "validation": ("validation", "valid", "val", "dev"),
    "test": ("test",),
}


def load_hub(
    name: str,
    config: str | None,
    src: str,
    tgt: str,
    streaming: bool = False,
    split_names: dict[str, str] | None = None,
) -> DatasetDict | IterableDatasetDict:
    """``datasets.load_dataset(name, config)`` mapped by ``hub_to_pairs``; offline -> UserError."""
    where = f"--dataset {name}" + (f" --dataset-config {config}" if config else "")
    try:
        raw = datasets.load_dataset(name, config, streaming=streaming)
    except datasets.exceptions.DatasetNotFoundError:
        raise UserError(f"{where}: no such dataset on the Hugging Face hub (check the name)") from None
    except (ConnectionError, OSError, TimeoutError) as exc:
        raise UserError(
            f"{where}: could not reach the Hugging Face hub ({type(exc).__name__}: {exc}). Without "
            f"internet, use --data-dir DIR with {{split}}.{{lang}} files (e.g. DIR/train.{src}, "
            f"DIR/train.{tgt}) or --train-file FILE.tsv|FILE.jsonl"
        ) from None
    except ValueError as exc:  # e.g. missing/unknown config: the message lists the available ones
        raise UserError(f"{where}: {exc} (set --dataset-config)") from None
    return hub_to_pairs(raw, src, tgt, split_names, where=where)


def hub_to_pairs(
    dataset_dict: DatasetDict | IterableDatasetDict,
    src: str,
    tgt: str,
    split_names: dict[str, str] | None = None,
    where: str = "--dataset",
) -> DatasetDict | IterableDatasetDict:
    """Map a hub ``DatasetDict`` to train/validation/test with columns src, tgt.

    ``split_names`` gives explicit hub split names (which must exist); otherwise the first of
    ``SPLIT_CANDIDATES`` found is used. A missing validation/test split becomes empty.
    """
    if src == tgt:
        raise UserError(f"--src and --tgt are both {src!r}; give the two language codes")
    available = list(dataset_dict.keys())
    streaming = isinstance(dataset_dict, IterableDatasetDict)
    out = {}
    for split, candidates in SPLIT_CANDIDATES.items():
        explicit = (split_names or {}).get(split)
        names = (explicit,) if explicit else candidates
        found = next((n for n in names if n in dataset_dict), None)
        if found is None and (explicit or split == "train"):
            raise UserError(f"{where}: no split {' / '.join(names)}; available splits: "
                            f"{', '.join(available)}")
        if found is None:
            log.warning("data: %s has no %s split (tried %s); it is empty", where, split, ", ".join(names))
            out[split] = _empty_iterable() if streaming else empty_pairs()
            continue
        out[split] = _to_pairs(dataset_dict[found], src, tgt, f"{where} split {found!r}")
    return IterableDatasetDict(out) if streaming else DatasetDict(out)


def _no_rows():
    yield from ()


def _empty_iterable() -> IterableDataset:
    return IterableDataset.from_generator(_no_rows, features=PAIR_FEATURES)


def _columns(dataset: Dataset | IterableDataset) -> list[str]:
    if dataset.column_names is not None:
        return list(dataset.column_names)
    first = next(iter(dataset), None)  # streaming dataset without declared features
    return list(first) if first else []


def _translation_languages(dataset: Dataset | IterableDataset) -> list[str]:
    feature = (dataset.features or {}).get("translation")
    if isinstance(feature, datasets.Translation):
        return list(feature.languages)
    if isinstance(feature, dict):
        return list(feature)
    first = next(iter(dataset), None)
    return list(first["translation"]) if first else []


def _pick_translation(batch: dict, src: str, tgt: str) -> dict:
    pairs = batch["translation"]
    return {"src": [p[src] for p in pairs], "tgt": [p[tgt] for p in pairs]}


def _to_pairs(dataset: Dataset | IterableDataset, src: str, tgt: str, where: str):
    columns = _columns(dataset)
    if src in columns and tgt in columns:
        dataset = dataset.select_columns([src, tgt])
        # via temporary names, so that e.g. columns already called src/tgt (or swapped) work
        dataset = dataset.rename_columns({src: "__src__", tgt: "__tgt__"})
        dataset = dataset.rename_columns({"__src__": "src", "__tgt__": "tgt"})
        if dataset.features is not None and dataset.features != PAIR_FEATURES:
            dataset = dataset.cast(PAIR_FEATURES)
        return dataset
    if "translation" in columns:
        languages = _translation_languages(dataset)
        unknown = [lang for lang in (src, tgt) if lang not in languages]
        if unknown:
            raise UserError(f"{where}: no language {', '.join(unknown)} in its 'translation' column; "
                            f"available: {', '.join(languages)} (fix --src/--tgt)")
        return dataset.map(_pick_translation, batched=True, fn_kwargs={"src": src, "tgt": tgt},
                           remove_columns=columns, features=PAIR_FEATURES)
    raise UserError(f"{where}: no columns {src!r} and {tgt!r} and no 'translation' column; "
                    f"available columns: {', '.join(columns)} (fix --src/--tgt)")
