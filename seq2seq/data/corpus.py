"""Pick the corpus a ``DataConfig`` names, load it, and fingerprint it cheaply for caches.

Local training files larger than ``IN_MEMORY_BYTES`` are not read into RAM: they are written to
Arrow under ``<cache_dir>/.raw-<fingerprint>`` by ``Dataset.from_generator`` (line by line), so that
cleaning and encoding (``datasets.map``) also work on memory-mapped files; ``prepare_data`` removes
that directory once the encoded corpus is saved.
"""
from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Iterator

from datasets import Dataset, DatasetDict
from datasets.exceptions import DatasetGenerationError

from ..config import DataConfig
from ..errors import UserError
from ..toy import TOY_VERSION, toy_corpus
from .cleaning import clean_corpus
from .guided import attach_alignment_lines
from .files import load_table_files, load_text_dir, parallel_line_pairs, table_pairs
from .hub import load_hub
from .schema import PAIR_FEATURES

log = logging.getLogger(__name__)

PIPELINE_VERSION = 1  # bump when loading/cleaning changes what a corpus yields (invalidates caches)
IN_MEMORY_BYTES = 64 * 2**20  # local training files above this size go to Arrow on disk, not into RAM
SOURCE_FLAGS = {"toy": "--toy-size", "files": "--train-file", "dir": "--data-dir", "hub": "--dataset"}


def corpus_source(cfg: DataConfig) -> str:
    """Which corpus ``cfg`` names: 'toy', 'files', 'dir' or 'hub' (exactly one must be given;
    --train-file overrides --data-dir)."""
    given = [kind for kind, on in (("toy", cfg.toy_size > 0), ("files", bool(cfg.train_file)),
                                   ("dir", bool(cfg.data_dir)), ("hub", bool(cfg.dataset))) if on]
    if "files" in given and "dir" in given:
        log.warning("data: --train-file overrides --data-dir %s", cfg.data_dir)
        given.remove("dir")
    if (cfg.valid_file or cfg.test_file) and "files" not in given:
        raise UserError("--valid-file / --test-file need --train-file")
    if len(given) > 1:
        raise UserError(f"give one corpus, not {' and '.join(SOURCE_FLAGS[k] for k in given)}")
    if not given:
        raise UserError(
            "no corpus given: use --data-dir DIR ({split}.{lang} files), --train-file FILE "
            "(.tsv/.jsonl), --dataset NAME (Hugging Face hub) or --toy-size N (built-in "
            "English->German number words)"
        )
    return given[0]


def text_splits(cfg: DataConfig) -> dict[str, str]:
    return {"train": cfg.train_split, "validation": cfg.valid_split, "test": cfg.test_split}


def explicit_hub_splits(cfg: DataConfig) -> dict[str, str]:
    """Split names the user changed from the defaults (those must exist on the hub)."""
    defaults = text_splits(DataConfig())
    return {split: name for split, name in text_splits(cfg).items() if name != defaults[split]}


def toy_eval_size(toy_size: int) -> int:
    """Validation and test size of the toy corpus: 10% of train, at least 10, at most 500."""
    return min(500, max(10, toy_size // 10))


def load_corpus(cfg: DataConfig) -> DatasetDict:
    """The raw (uncleaned) corpus named by ``cfg``: splits train/validation/test, columns src/tgt."""
    kind = corpus_source(cfg)
    if kind == "toy":
        n_eval = toy_eval_size(cfg.toy_size)
        return toy_corpus(n_train=cfg.toy_size, n_valid=n_eval, n_test=n_eval)
    if kind in ("files", "dir"):
        on_disk = sum(p.stat().st_size for p in _train_paths(cfg) if p.is_file()) > IN_MEMORY_BYTES
        if kind == "files":
            corpus = load_table_files(cfg.train_file, cfg.valid_file, cfg.test_file, cfg.src, cfg.tgt,
                                      skip_train=on_disk)
        else:
            corpus = load_text_dir(cfg.data_dir, cfg.src, cfg.tgt, text_splits(cfg), skip_train=on_disk)
        if on_disk:
            corpus["train"] = _train_on_disk(cfg, kind)
        return corpus
    return load_hub(cfg.dataset, cfg.dataset_config, cfg.src, cfg.tgt,
                    split_names=explicit_hub_splits(cfg))


def _train_paths(cfg: DataConfig) -> list[Path]:
    if cfg.train_file:
        return [Path(cfg.train_file)]
    return [Path(cfg.data_dir) / f"{cfg.train_split}.{lang}" for lang in (cfg.src, cfg.tgt)]


def raw_dir(cfg: DataConfig) -> Path:
    """Where ``load_corpus`` writes large local training files as Arrow (temporary)."""
    return Path(cfg.cache_dir) / f".raw-{corpus_fingerprint(cfg)[:20]}"


def _train_on_disk(cfg: DataConfig, kind: str) -> Dataset:
    """The training pairs written line by line to Arrow under ``raw_dir`` and memory-mapped."""
    if kind == "dir":
        paths = _train_paths(cfg)
        generator, kwargs = parallel_line_pairs, {"src_path": str(paths[0]), "tgt_path": str(paths[1])}
    else:
        generator, kwargs = table_pairs, {"path": str(cfg.train_file), "src": cfg.src, "tgt": cfg.tgt}
    log.info("data: reading the large training corpus into Arrow under %s", raw_dir(cfg))
    try:
        return Dataset.from_generator(generator, features=PAIR_FEATURES, gen_kwargs=kwargs,
                                      cache_dir=str(raw_dir(cfg)))
    except DatasetGenerationError as exc:  # our own UserError (bad line, unequal files) inside
        if isinstance(exc.__cause__, UserError):
            raise exc.__cause__ from None
        raise


def load_clean_corpus(cfg: DataConfig, alignment_lines: str | Path | None = None) -> tuple[DatasetDict, dict]:
    """``load_corpus`` then ``clean_corpus`` with the config's filters; returns (corpus, stats). With
    ``alignment_lines`` (a file of one Pharaoh line per training pair: guided alignment's, ``GuidedConfig``) the
    training pairs carry them through cleaning (``guided.py``)."""
    corpus = load_corpus(cfg)
    if alignment_lines:
        corpus["train"] = attach_alignment_lines(corpus["train"], alignment_lines)
    return clean_corpus(corpus, cfg.max_len, cfg.max_len_ratio, split_sources(cfg))


def split_sources(cfg: DataConfig) -> dict[str, str | None]:
    """Where each split comes from, as an error message names it (the flag and the file, or the
    hub dataset and split); None for a validation or test split that was not given."""
    kind = corpus_source(cfg)
    if kind == "toy":
        return {split: f"the toy corpus ({split} split, --toy-size {cfg.toy_size})" for split in text_splits(cfg)}
    if kind == "files":
        files = {"train": ("--train-file", cfg.train_file), "validation": ("--valid-file", cfg.valid_file),
                 "test": ("--test-file", cfg.test_file)}
        return {split: f"{flag} {path}" if path else None for split, (flag, path) in files.items()}
    if kind == "dir":
        sources: dict[str, str | None] = {}
        for split, stem in text_splits(cfg).items():
            paths = [Path(cfg.data_dir) / f"{stem}.{lang}" for lang in (cfg.src, cfg.tgt)]
            given = split == "train" or any(p.is_file() for p in paths)
            sources[split] = f"--data-dir: {paths[0]} / {paths[1].name}" if given else None
        return sources
    name = cfg.dataset + (f" ({cfg.dataset_config})" if cfg.dataset_config else "")
    return {split: f"--dataset {name}, {split} split" for split in text_splits(cfg)}


def _file_stat(path: Path) -> list | None:
    try:
        stat = path.stat()
    except OSError:
        return None
    return [str(path.resolve()), stat.st_size, stat.st_mtime_ns]


def corpus_fingerprint(cfg: DataConfig) -> str:
    """A cheap sha256 identifying the cleaned corpus: source (file paths, sizes and mtimes; hub
    name and config; toy size), languages, split names and cleaning settings. File contents are
    not read; a hub dataset updated upstream under the same name is not detected."""
    kind = corpus_source(cfg)
    if kind == "toy":
        source = {"toy_size": cfg.toy_size, "toy_version": TOY_VERSION}
    elif kind == "files":
        source = {"files": [_file_stat(Path(f)) if f else None
                            for f in (cfg.train_file, cfg.valid_file, cfg.test_file)]}
    elif kind == "dir":
        source = {"dir": [_file_stat(Path(cfg.data_dir) / f"{stem}.{lang}")
                          for stem in text_splits(cfg).values() for lang in (cfg.src, cfg.tgt)]}
    else:
        source = {"hub": [cfg.dataset, cfg.dataset_config], "splits": explicit_hub_splits(cfg)}
    settings = {"kind": kind, "source": source, "src": cfg.src, "tgt": cfg.tgt,
                "splits": text_splits(cfg), "max_len": cfg.max_len,
                "max_len_ratio": cfg.max_len_ratio, "version": PIPELINE_VERSION}
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()


def corpus_texts(dataset: Dataset, batch_size: int = 10_000) -> Iterator[str]:
    """Source and target sentences of ``dataset`` as one stream (joint tokenizer training)."""
    for batch in dataset.iter(batch_size=batch_size):
        yield from batch["src"]
        yield from batch["tgt"]

