"""Streaming training corpora (``--streaming``): read, cleaned, shuffled, tokenized and batched on the fly.

The training split is never stored. It is a ``datasets.IterableDataset`` (``load_dataset(...,
streaming=True)`` for the hub, ``IterableDataset.from_generator`` over the lines of local files),
cleaned by the same rules as the stored path, shuffled through a buffer of ``shuffle_buffer`` pairs
(reshuffled each epoch by ``set_epoch``), dealt out to the ranks (pair ``i`` of the shuffled
stream goes to rank ``i % world_size``), tokenized by ``.map`` and cut into token-budget batches by
``StreamBatcher``. Validation and test are small and are loaded in memory as usual. The tokenizer is
trained on the first ``sp_input_sentence_size`` sentences of the unshuffled stream.
"""
from __future__ import annotations

import logging
from itertools import islice
from pathlib import Path
from typing import Iterator

import numpy as np
from datasets import Dataset, DatasetDict, Features, IterableDataset, Value

from ..config import DataConfig
from ..errors import UserError
from ..tokenizer import Tokenizer, load_or_train_tokenizer
from .batching import Batch, pad_batch, length_order, pack_by_tokens
from .cleaning import drop_reasons, is_kept, clean_corpus
from .corpus import explicit_hub_splits, text_splits, corpus_fingerprint, corpus_source, load_corpus, split_sources
from .files import load_table_files, load_text_dir, parallel_line_pairs, table_pairs
from .hub import load_hub
from .prepare import encode_pairs, encode_corpus
from .schema import PAIR_FEATURES, pairs_dataset

log = logging.getLogger(__name__)

EVAL_SPLITS = ("validation", "test")
_MARKED = Features({**PAIR_FEATURES, "_drop": Value("int64")})


def _in_memory(split: IterableDataset) -> Dataset:
    rows = list(split)  # validation / test: small
    return pairs_dataset([r["src"] for r in rows], [r["tgt"] for r in rows])


def load_stream_corpus(cfg: DataConfig) -> tuple[IterableDataset, DatasetDict]:
    """The cleaned training pairs as a stream, and the stripped validation and test splits in memory."""
    kind = corpus_source(cfg)
    if kind == "toy":
        corpus = load_corpus(cfg)
        train = corpus["train"].to_iterable_dataset()
    elif kind == "dir":
        corpus = load_text_dir(cfg.data_dir, cfg.src, cfg.tgt, text_splits(cfg), skip_train=True)
        paths = [str(Path(cfg.data_dir) / f"{cfg.train_split}.{lang}") for lang in (cfg.src, cfg.tgt)]
        train = IterableDataset.from_generator(parallel_line_pairs, features=PAIR_FEATURES,
                                               gen_kwargs={"src_path": paths[0], "tgt_path": paths[1]})
    elif kind == "files":
        corpus = load_table_files(cfg.train_file, cfg.valid_file, cfg.test_file, cfg.src, cfg.tgt, skip_train=True)
        train = IterableDataset.from_generator(table_pairs, features=PAIR_FEATURES,
                                               gen_kwargs={"path": str(cfg.train_file), "src": cfg.src, "tgt": cfg.tgt})
    else:
        hub = load_hub(cfg.dataset, cfg.dataset_config, cfg.src, cfg.tgt, streaming=True,
                       split_names=explicit_hub_splits(cfg))
        corpus = {split: _in_memory(hub[split]) for split in EVAL_SPLITS}
        train = hub["train"]
    sources = split_sources(cfg)
    evals, _ = clean_corpus(DatasetDict({split: corpus[split] for split in EVAL_SPLITS}), sources=sources)
    cleaned = clean_stream(train, cfg.max_len, cfg.max_len_ratio)
    if next(iter(cleaned), None) is None:  # reads up to the first pair kept, no further
        raise UserError(f"{sources['train']}: no sentence pairs, or none left after cleaning "
                        f"(--max-len {cfg.max_len}, --max-len-ratio {cfg.max_len_ratio}; 0 disables them)")
    return cleaned, evals


def clean_stream(pairs: IterableDataset, max_len: int = 0, max_len_ratio: float = 0.0) -> IterableDataset:
    """``clean_corpus``'s training rules, applied lazily (no statistics: the stream has no end yet)."""
    if max_len < 0 or max_len_ratio < 0:
        raise UserError("--max-len and --max-len-ratio must be >= 0 (0 = no filter)")
    marked = pairs.map(drop_reasons, batched=True, features=_MARKED,
                       fn_kwargs={"max_len": max_len, "max_len_ratio": max_len_ratio})
    return marked.filter(is_kept, batched=True, input_columns="_drop").remove_columns("_drop")


def stream_texts(pairs: IterableDataset, limit: int) -> Iterator[str]:
    """The first ``limit`` sentences of ``pairs`` (source, target, source, ...), read lazily."""
    def texts() -> Iterator[str]:
        for rows in pairs.iter(batch_size=1000):
            for source, target in zip(rows["src"], rows["tgt"]):
                yield source
                yield target

    return islice(texts(), limit)


def _mine(rows: dict, indices: list[int], rank: int, world_size: int) -> list[bool]:
    return [i % world_size == rank for i in indices]


def training_stream(pairs: IterableDataset, tokenizer: Tokenizer, buffer_size: int, seed: int,
                    rank: int = 0, world_size: int = 1) -> IterableDataset:
    """Shuffled (same order on every rank), this rank's share, tokenized: columns src_ids, tgt_ids.

    The share is taken before tokenizing so that each rank encodes only its own pairs.
    """
    stream = pairs.shuffle(seed=seed, buffer_size=buffer_size) if buffer_size > 1 else pairs
    if world_size > 1:
        stream = stream.filter(_mine, batched=True, with_indices=True,
                               fn_kwargs={"rank": rank, "world_size": world_size})
    return stream.map(encode_pairs, batched=True, batch_size=1000, fn_kwargs={"tokenizer": tokenizer},
                      remove_columns=["src", "tgt"])


def prepare_stream(cfg: DataConfig, tokenizer_path: str | Path, seed: int, rank: int = 0,
                   world_size: int = 1, tokenizer: Tokenizer | None = None,
                   ) -> tuple[Tokenizer, IterableDataset, DatasetDict]:
    """Tokenizer (``tokenizer`` when given, else trained on the stream's head or reused), this rank's
    encoded training stream, and the encoded validation and test splits."""
    pairs, evals = load_stream_corpus(cfg)
    tokenizer = load_or_train_tokenizer(
        tokenizer_path, lambda: stream_texts(pairs, cfg.sp_input_sentence_size), cfg.vocab_size,
        cfg.sp_model_type, cfg.sp_input_sentence_size, data_fingerprint=corpus_fingerprint(cfg) + ":stream-head",
        given=tokenizer,
    )
    stream = training_stream(pairs, tokenizer, cfg.shuffle_buffer, seed, rank, world_size)
    return tokenizer, stream, encode_corpus(evals, tokenizer)


class StreamBatcher:
    """Token-budget batches over an encoded stream.

    Pairs are read until they fill ``window`` batches (by the cost ``max(src, tgt)`` per pair), then
    sorted by length (with noise), packed like ``TokenBatchSampler`` and yielded in random order, so
    padding stays low without a pass over the whole corpus. Deterministic for (seed, epoch) given the
    stream, which is what makes resuming by replay exact. Pairs longer than ``max_tokens`` are skipped.
    """

    def __init__(self, stream: IterableDataset, max_tokens: int, seed: int = 1, window: int = 100,
                 fixed_shapes: bool = False) -> None:
        if max_tokens <= 0:
            raise UserError(f"--max-tokens must be positive, got {max_tokens}")
        if window < 1:
            raise UserError(f"--stream-window must be at least 1, got {window}")
        self.stream, self.max_tokens, self.seed, self.window = stream, max_tokens, seed, window
        self.fixed_shapes = fixed_shapes  # pack for the fixed shapes of ``shapes.pad_to_shape``
        self.skipped = 0

    def batches(self, epoch: int, start: int = 0) -> Iterator[Batch]:
        """The batches of ``epoch`` in training order, skipping (without padding) the first ``start``."""
        self.stream.set_epoch(epoch)
        self.skipped, produced = 0, 0
        for window in self._windows():
            for batch in self._pack(window, np.random.default_rng([self.seed, epoch, window[3]])):
                produced += 1
                if produced > start:
                    yield pad_batch(*batch)
        if self.skipped:
            log.warning("data: skipped %d streamed pairs longer than --max-tokens %d in epoch %d",
                        self.skipped, self.max_tokens, epoch)

    def _windows(self) -> Iterator[tuple[list, list, list, int]]:
        budget, number = self.window * self.max_tokens, 0
        src, tgt, positions, filled, position = [], [], [], 0, 0
        for rows in self.stream.iter(batch_size=1000):
            for source, target in zip(rows["src_ids"], rows["tgt_ids"]):
                cost = max(len(source), len(target) + 1)  # target gets BOS / EOS
                position += 1
                if cost > self.max_tokens:
                    self.skipped += 1
                    continue
                src.append(source)
                tgt.append(target)
                positions.append(position - 1)
                filled += cost
            if filled >= budget:
                yield src, tgt, positions, number
                src, tgt, positions, filled, number = [], [], [], 0, number + 1
        if src:
            yield src, tgt, positions, number

    def _pack(self, window: tuple, rng: np.random.Generator) -> Iterator[tuple[list, list, list]]:
        src, tgt, positions, _ = window
        src_cost = np.fromiter(map(len, src), dtype=np.int64, count=len(src))
        tgt_cost = np.fromiter(map(len, tgt), dtype=np.int64, count=len(tgt)) + 1
        order = length_order(src_cost, tgt_cost, np.arange(len(src)), rng)
        packed = pack_by_tokens(src_cost, tgt_cost, order, self.max_tokens, self.fixed_shapes)
        for k in rng.permutation(len(packed)).tolist():
            rows = packed[k].tolist()
            yield [src[i] for i in rows], [tgt[i] for i in rows], [positions[i] for i in rows]
