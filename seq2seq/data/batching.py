"""Batches by token budget: a length-bucketing sampler, the padded ``Batch`` and its collation.

A batch of ``B`` pairs with longest source ``S`` (EOS included) and longest target ``T`` (pieces
+ 1 for BOS/EOS) costs ``B * S`` source and ``B * T`` target tokens, padding included; both must
fit ``max_tokens``. A training pair that alone exceeds the budget is skipped (counted in
``TokenBatchSampler.skipped`` and logged); with ``drop_oversized=False`` (the default when
``shuffle=False``, i.e. evaluation, where every line must be translated) it gets a batch of its
own instead, over budget.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Iterable, Iterator, Sequence

import numpy as np
import torch
from datasets import Dataset

from ..errors import UserError
from ..io_utils import counted
from ..tokenizer import BOS_ID, EOS_ID, PAD_ID
from .shapes import bucket_lengths

log = logging.getLogger(__name__)


@dataclass
class Batch:
    """A padded batch. Masks are True at real tokens; ``tgt_mask`` holds for tgt_in and tgt_out."""

    src: torch.Tensor  # (batch, src_len) long: pieces + EOS, PAD-padded
    src_mask: torch.Tensor  # (batch, src_len) bool
    tgt_in: torch.Tensor  # (batch, tgt_len) long: BOS y1..yn, PAD-padded
    tgt_out: torch.Tensor  # (batch, tgt_len) long: y1..yn EOS, PAD-padded
    tgt_mask: torch.Tensor  # (batch, tgt_len) bool
    indices: list[int]  # dataset row of each batch entry
    token_counts: tuple[int, int] | None = field(default=None, repr=False)  # cached (src, tgt)
    #: guided alignment training: (batch, tgt_len, src_len) float, row t the gold distribution over the
    #: source of the attention predicting tgt_out[t]; all-zero rows are not supervised
    guide: torch.Tensor | None = field(default=None, repr=False)
    #: (batch,) int64 source lengths (EOS included) kept on the host whatever ``to`` moves: what a
    #: model that needs them there (the RNN's packed sequences) reads without a device sync
    src_lengths: torch.Tensor | None = field(default=None, repr=False)

    def __len__(self) -> int:
        return len(self.indices)

    def _counts(self) -> tuple[int, int]:
        if self.token_counts is None:
            self.token_counts = (int(self.src_mask.sum()), int(self.tgt_mask.sum()))
        return self.token_counts

    @property
    def num_src_tokens(self) -> int:
        return self._counts()[0]

    @property
    def num_tgt_tokens(self) -> int:
        """Non-pad tokens in ``tgt_out`` (the loss normaliser), known without a device sync."""
        return self._counts()[1]

    def to(self, device: torch.device | str, non_blocking: bool = True) -> "Batch":
        """On ``device``; from pinned memory (``pin_memory``) a CUDA copy does not wait for the host."""
        return self._map(lambda t: t.to(device, non_blocking=non_blocking))

    def pin_memory(self) -> "Batch":
        """In page-locked host memory, from which copies to a GPU run asynchronously (CUDA only)."""
        return self._map(torch.Tensor.pin_memory)

    def _map(self, move) -> "Batch":
        return Batch(move(self.src), move(self.src_mask), move(self.tgt_in), move(self.tgt_out),
                     move(self.tgt_mask), self.indices, self._counts(),
                     None if self.guide is None else move(self.guide), self.host_src_lengths())

    def host_src_lengths(self) -> torch.Tensor:
        """``src_lengths``, computed from the mask when the batch was built without them (on a GPU
        that computation is a device sync: batches from ``pad_batch`` carry them)."""
        if self.src_lengths is None:
            self.src_lengths = self.src_mask.sum(1).cpu()
        return self.src_lengths


def pad_batch(src_seqs: Sequence, tgt_seqs: Sequence, indices: list[int]) -> Batch:
    """Build a ``Batch`` from id sequences (lists or numpy arrays) of equal count."""
    count = len(src_seqs)
    src_lens = np.fromiter((len(s) for s in src_seqs), dtype=np.int64, count=count)
    tgt_lens = np.fromiter((len(t) for t in tgt_seqs), dtype=np.int64, count=count)
    src = np.full((count, int(src_lens.max())), PAD_ID, dtype=np.int64)  # (batch, src_len)
    tgt_in = np.full((count, int(tgt_lens.max()) + 1), PAD_ID, dtype=np.int64)  # (batch, tgt_len)
    tgt_out = np.full_like(tgt_in, PAD_ID)
    tgt_in[:, 0] = BOS_ID
    for row, (s, t) in enumerate(zip(src_seqs, tgt_seqs)):
        src[row, : len(s)] = s
        tgt_in[row, 1 : len(t) + 1] = t
        tgt_out[row, : len(t)] = t
    tgt_out[np.arange(count), tgt_lens] = EOS_ID
    src_mask = np.arange(src.shape[1]) < src_lens[:, None]  # (batch, src_len)
    tgt_mask = np.arange(tgt_in.shape[1]) <= tgt_lens[:, None]  # (batch, tgt_len)
    return Batch(torch.from_numpy(src), torch.from_numpy(src_mask), torch.from_numpy(tgt_in),
                 torch.from_numpy(tgt_out), torch.from_numpy(tgt_mask), list(indices),
                 (int(src_lens.sum()), int(tgt_lens.sum()) + count), src_lengths=torch.from_numpy(src_lens))


def collate(examples: list[dict], indices: list[int] | None = None) -> Batch:
    """Rows with ``src_ids`` (ending in EOS) and ``tgt_ids`` (no BOS/EOS) -> a padded ``Batch``."""
    if not examples:
        raise ValueError("collate needs at least one example")
    indices = list(range(len(examples))) if indices is None else list(indices)
    return pad_batch([e["src_ids"] for e in examples], [e["tgt_ids"] for e in examples], indices)


class _ListColumn:
    """One ``list<int>`` Arrow column as per-chunk numpy offsets/values (zero-copy when mapped)."""

    def __init__(self, chunked) -> None:
        self.offsets = [chunk.offsets.to_numpy() for chunk in chunked.chunks]
        self.values = [chunk.values.to_numpy(zero_copy_only=False) for chunk in chunked.chunks]
        self.starts = np.cumsum([0] + [len(chunk) for chunk in chunked.chunks])  # global row of each chunk
        self.lengths = np.concatenate([np.diff(o) for o in self.offsets] or [np.zeros(0, np.int64)])

    def rows(self, indices: np.ndarray) -> list[np.ndarray]:
        chunk_of = np.searchsorted(self.starts, indices, side="right") - 1
        local = indices - self.starts[chunk_of]
        out = []
        for c, i in zip(chunk_of.tolist(), local.tolist()):
            offsets = self.offsets[c]
            out.append(self.values[c][offsets[i] : offsets[i + 1]])
        return out


class TokenColumns:
    """``src_ids``/``tgt_ids`` of an encoded ``Dataset`` held as numpy views for fast batching.

    Built once per dataset (not per batch): row access is a numpy slice, no Python lists.
    """

    def __init__(self, dataset: Dataset) -> None:
        missing = {"src_ids", "tgt_ids"} - set(dataset.column_names)
        if missing:
            raise ValueError(f"dataset has no column(s) {', '.join(sorted(missing))}; "
                             "run encode_corpus first")
        table = dataset.with_format("arrow")[:]  # applies any indices mapping; zero-copy otherwise
        self._src = _ListColumn(table.column("src_ids"))
        self._tgt = _ListColumn(table.column("tgt_ids"))

    def __len__(self) -> int:
        return len(self._src.lengths)

    @property
    def src_lengths(self) -> np.ndarray:
        return self._src.lengths

    @property
    def tgt_lengths(self) -> np.ndarray:
        return self._tgt.lengths

    def pairs(self, indices: Sequence[int]) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """The source and target id arrays of rows ``indices`` (views, no copies)."""
        rows = np.asarray(indices, dtype=np.int64)
        return self._src.rows(rows), self._tgt.rows(rows)

    def batch(self, indices: Sequence[int]) -> Batch:
        rows = np.asarray(indices, dtype=np.int64)
        return pad_batch(self._src.rows(rows), self._tgt.rows(rows), [int(i) for i in indices])


class TokenBatchSampler:
    """Length-bucketed batches under a token budget, reshuffled per epoch, sharded for DDP.

    Deterministic for (seed, epoch): every rank must use the same seed. When shuffling, pairs are
    sorted by target length, then source length, ties broken at random (so equal lengths mix
    differently each epoch), packed greedily, and the batch order is shuffled; without shuffling
    (evaluation) they are sorted by source length, then target length. With
    ``world_size > 1`` rank ``r`` takes batches ``r, r + world_size, ...``; the last
    ``len(batches) % world_size`` batches of the epoch are dropped so all ranks step in lockstep.
    """

    def __init__(
        self,
        src_lengths: Sequence[int] | np.ndarray,
        tgt_lengths: Sequence[int] | np.ndarray,
        max_tokens: int,
        shuffle: bool = True,
        seed: int = 1,
        rank: int = 0,
        world_size: int = 1,
        drop_oversized: bool | None = None,
        fixed_shapes: bool = False,
    ) -> None:
        self.src_cost = np.asarray(src_lengths, dtype=np.int64)  # src_ids already end with EOS
        self.tgt_cost = np.asarray(tgt_lengths, dtype=np.int64) + 1  # BOS / EOS added by collate
        if self.src_cost.shape != self.tgt_cost.shape:
            raise ValueError(f"{len(self.src_cost)} source lengths but {len(self.tgt_cost)} target lengths")
        if max_tokens <= 0:
            raise UserError(f"--max-tokens must be positive, got {max_tokens}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in 0..{world_size - 1}")
        self.max_tokens, self.shuffle, self.seed = max_tokens, shuffle, seed
        self.rank, self.world_size, self.epoch = rank, world_size, 0
        self.fixed_shapes = fixed_shapes  # pack for the fixed shapes of ``shapes.pad_to_shape``
        if drop_oversized is None:
            drop_oversized = shuffle  # training (shuffled) skips; evaluation keeps every line
        cost = np.maximum(self.src_cost, self.tgt_cost)
        oversized = cost > max_tokens if drop_oversized else np.zeros(len(cost), dtype=bool)
        self.skipped = int(oversized.sum())
        self._kept = np.flatnonzero(~oversized)
        if self.skipped:
            log.warning("data: skipped %d of %d pairs longer than --max-tokens %d (longest: %d tokens)",
                        self.skipped, len(cost), max_tokens, int(cost.max()))
        self._cache: tuple[int, list[np.ndarray]] | None = None

    @classmethod
    def for_columns(cls, columns: TokenColumns, max_tokens: int, **kwargs) -> "TokenBatchSampler":
        return cls(columns.src_lengths, columns.tgt_lengths, max_tokens, **kwargs)

    @property
    def num_examples(self) -> int:
        return len(self.src_cost)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def batches(self, epoch: int | None = None) -> list[np.ndarray]:
        """This rank's batches for ``epoch`` (default: current), each an int64 array of dataset
        indices: views into one array of all indices, 8 bytes per pair (Python int lists would
        cost several times that for the whole epoch)."""
        epoch = self.epoch if epoch is None else epoch
        if self._cache is not None and self._cache[0] == epoch:
            return self._cache[1]
        rng = np.random.default_rng([self.seed, epoch]) if self.shuffle else None
        batches = pack_by_tokens(self.src_cost, self.tgt_cost,
                                 length_order(self.src_cost, self.tgt_cost, self._kept, rng), self.max_tokens,
                                 self.fixed_shapes)
        if rng is not None:
            batches = [batches[i] for i in rng.permutation(len(batches))]
        per_rank = len(batches) // self.world_size
        mine = batches[self.rank : per_rank * self.world_size : self.world_size]
        self._cache = (epoch, mine)
        return mine

    def __iter__(self) -> Iterator[np.ndarray]:
        return iter(self.batches(self.epoch))

    def __len__(self) -> int:
        return len(self.batches(self.epoch))


def length_order(src_cost: np.ndarray, tgt_cost: np.ndarray, rows: np.ndarray,
                 rng: np.random.Generator | None) -> np.ndarray:
    """``rows`` sorted by source cost, then target cost; with ``rng`` (training) by target cost, then
    source cost, ties broken at random so that batches mix differently each epoch.

    Training batches are padded to their longest target: target-major order keeps them almost all
    real tokens (the decoder and the vocabulary projection dominate the cost), where source-major
    order leaves much of the target as padding (docs/performance.md)."""
    if rng is None:
        return rows[np.lexsort((rows, tgt_cost[rows], src_cost[rows]))]
    return rows[np.lexsort((rng.random(len(rows)), src_cost[rows], tgt_cost[rows]))]


def pack_by_tokens(src_cost: np.ndarray, tgt_cost: np.ndarray, order: np.ndarray,
                   max_tokens: int, fixed_shapes: bool = False) -> list[np.ndarray]:
    """Greedy: extend the batch while (size + 1) * longest side still fits the budget. With
    ``fixed_shapes`` a pair costs its bucket length (``shapes.bucket_length``), so that every batch
    fits the fixed shape of its bucket (``shapes.pad_to_shape``)."""
    costs = np.maximum(src_cost[order], tgt_cost[order])
    costs = (bucket_lengths(costs) if fixed_shapes else costs).tolist()
    bounds, longest, size = [], 0, 0
    for k, cost in enumerate(costs):
        longest_if_added = cost if cost > longest else longest
        if size and (size + 1) * longest_if_added > max_tokens:
            bounds.append(k)
            longest, size = cost, 1
        else:
            longest, size = longest_if_added, size + 1
    return np.split(order, bounds) if len(order) else []


def make_batches(
    dataset: Dataset | TokenColumns,
    sampler: TokenBatchSampler | Iterable[Sequence[int]],
    epoch: int | None = None,
) -> Iterator[Batch]:
    """Padded batches of ``dataset`` in the sampler's order for ``epoch``.

    ``sampler`` may also be a precomputed list of index lists, e.g. ``sampler.batches(e)[start:]``
    to resume mid-epoch. Pass a ``TokenColumns`` (built once) to avoid re-reading the columns.
    """
    columns = dataset if isinstance(dataset, TokenColumns) else TokenColumns(dataset)
    if isinstance(sampler, TokenBatchSampler):
        if len(columns) != sampler.num_examples:
            raise ValueError(f"sampler was built for {counted(sampler.num_examples, 'example')}, "
                             f"dataset has {len(columns)}")
        sampler = sampler.batches(epoch)
    for indices in sampler:
        yield columns.batch(indices)
