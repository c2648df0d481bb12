"""Tokenize a corpus once and cache it as memory-mapped Arrow; training never tokenizes per step."""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

from datasets import Dataset, DatasetDict, load_from_disk

from ..config import DataConfig
from ..io_utils import counted, current_umask
from ..tokenizer import EOS_ID, Tokenizer, load_or_train_tokenizer
from .corpus import corpus_fingerprint, corpus_texts, load_clean_corpus, raw_dir
from .guided import alignment_fingerprint
from .schema import ENCODED_FEATURES, GUIDED_FEATURES, SPLITS

log = logging.getLogger(__name__)

ENCODING_VERSION = 1  # bump when encode_corpus changes its output


def encode_pairs(batch: dict, tokenizer: Tokenizer) -> dict:
    return {
        "src_ids": [ids + [EOS_ID] for ids in tokenizer.encode_batch(batch["src"])],
        "tgt_ids": tokenizer.encode_batch(batch["tgt"]),
    }


def encode_corpus(dd: DatasetDict, tokenizer: Tokenizer, num_proc: int = 1) -> DatasetDict:
    """Add ``src_ids`` (pieces + EOS) and ``tgt_ids`` (pieces only; collate adds BOS/EOS); other
    columns (a training split's guided alignment lines) are kept.

    Uses ``Dataset.map``, so datasets backed by Arrow files are cached by ``datasets`` itself.
    """
    out = {}
    for split, dataset in dd.items():
        if len(dataset) == 0:  # Dataset.map skips empty datasets and would not add the columns
            out[split] = _empty_encoded()
            continue
        procs = num_proc if num_proc > 1 and len(dataset) >= 1000 * num_proc else None
        features = GUIDED_FEATURES if "align" in dataset.column_names else ENCODED_FEATURES
        out[split] = dataset.map(encode_pairs, batched=True, batch_size=1000, num_proc=procs,
                                 fn_kwargs={"tokenizer": tokenizer}, features=features,
                                 desc=f"Encoding {split}")
    return DatasetDict(out)


def _empty_encoded() -> Dataset:
    return Dataset.from_dict({name: [] for name in ENCODED_FEATURES}, features=ENCODED_FEATURES)


def _load_cached(path: Path) -> DatasetDict:
    """``load_from_disk``, restoring the empty splits (``datasets`` cannot save empty ones)."""
    dd = load_from_disk(str(path))
    return DatasetDict({**{split: _empty_encoded() for split in SPLITS}, **dd})


def _load_checked(path: Path) -> DatasetDict:
    """``_load_cached``, checked against the cache's manifest (``seq2seq.json``: the rows of every split),
    so that a truncated or half-written cache fails here (Arrow reads each file's footer when it maps it),
    not in the middle of a run."""
    expected = json.loads((path / "seq2seq.json").read_text(encoding="utf-8"))["rows"]
    dd = _load_cached(path)
    for split, rows in expected.items():
        if len(dd[split]) != rows:
            raise ValueError(f"{split} has {counted(len(dd[split]), 'row')}, the manifest says {rows}")
    return dd


def cache_key(cfg: DataConfig, tokenizer: Tokenizer, alignment_lines: str | Path | None = None) -> str:
    """Fingerprint of (corpus source, cleaning settings, tokenizer model bytes, encoding version, and the
    content of the guided alignment file ``alignment_lines``, if any)."""
    parts = {"corpus": corpus_fingerprint(cfg), "tokenizer": tokenizer.sha256(), "version": ENCODING_VERSION}
    if alignment_lines:  # the alignment lines are columns of the cached training split
        parts["guided_alignment"] = alignment_fingerprint(alignment_lines)
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:20]


def prepare_corpus(
    cfg: DataConfig,
    tokenizer: Tokenizer,
    cache_dir: str | Path,
    corpus: DatasetDict | None = None,
    stats: dict | None = None,
    alignment_lines: str | Path | None = None,
) -> DatasetDict:
    """The encoded corpus, from ``cache_dir/corpus-<key>`` if present, else built and saved there.

    ``corpus`` (and its cleaning ``stats``) may pass the already cleaned corpus for ``cfg`` to avoid
    loading it twice; ``alignment_lines``: guided alignment's file (``load_clean_corpus``). The cleaning
    stats are kept in ``seq2seq.json`` in the cache. The cache is written to a temporary directory and
    renamed into place, so it is complete or absent.
    """
    cache_dir = Path(cache_dir)
    target = cache_dir / f"corpus-{cache_key(cfg, tokenizer, alignment_lines)}"
    if target.is_dir():
        try:
            cached = _load_checked(target)
            log.info("data: reusing encoded corpus %s", target)
            return cached
        except Exception as exc:  # noqa: BLE001 - whatever the Arrow / JSON readers raise on a damaged cache
            log.warning("data: the encoded corpus cache %s is damaged (%s: %s); rebuilding it", target,
                        type(exc).__name__, str(exc).splitlines()[0][:200] if str(exc) else "")
            shutil.rmtree(target, ignore_errors=True)
    if corpus is None:
        corpus, stats = load_clean_corpus(cfg, alignment_lines)
    encoded = encode_corpus(corpus, tokenizer, cfg.num_proc)
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=cache_dir, prefix=f".{target.name}."))
    tmp.chmod(0o777 & ~current_umask())  # what mkdir gives, not mkdtemp's 0700: a shared cache stays readable
    try:
        DatasetDict({split: ds for split, ds in encoded.items() if len(ds)}).save_to_disk(str(tmp))
        info = {"corpus_fingerprint": corpus_fingerprint(cfg), "tokenizer_sha256": tokenizer.sha256(),
                "cleaning": stats, "rows": {split: len(ds) for split, ds in encoded.items()}}
        (tmp / "seq2seq.json").write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
        try:
            os.rename(tmp, target)
        except OSError:
            if not target.is_dir():
                raise
            shutil.rmtree(tmp, ignore_errors=True)  # another process finished first: use theirs
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log.info("data: encoded corpus saved to %s (%s)", target,
             ", ".join(f"{split} {len(ds)}" for split, ds in encoded.items()))
    return _load_cached(target)


def prepare_data(
    cfg: DataConfig, tokenizer_path: str | Path, cache_dir: str | Path, tokenizer: Tokenizer | None = None,
    alignment_lines: str | Path | None = None,
) -> tuple[Tokenizer, DatasetDict]:
    """Tokenizer (``tokenizer`` when given, else reused or trained on the cleaned training split) and
    the encoded corpus (its training pairs with their lines of ``alignment_lines``, guided alignment's file).

    The corpus is loaded at most once, and not at all when both tokenizer and cache are reusable;
    a large local corpus's temporary Arrow copy (``raw_dir``) is removed afterwards.
    """
    loaded: list[tuple[DatasetDict, dict]] = []

    def train_texts():
        if not loaded:
            loaded.append(load_clean_corpus(cfg, alignment_lines))
        return corpus_texts(loaded[0][0]["train"])

    scratch = raw_dir(cfg)
    try:
        tokenizer = load_or_train_tokenizer(
            tokenizer_path, train_texts, cfg.vocab_size, cfg.sp_model_type, cfg.sp_input_sentence_size,
            data_fingerprint=corpus_fingerprint(cfg), given=tokenizer,
        )
        corpus, stats = loaded[0] if loaded else (None, None)
        return tokenizer, prepare_corpus(cfg, tokenizer, cache_dir, corpus=corpus, stats=stats,
                                         alignment_lines=alignment_lines)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
