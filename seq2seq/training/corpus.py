"""A run's corpus, ready to train on: cleaned, tokenized once, and batched by tokens.

``prepare_run_corpus`` is the one place that goes from a ``RunConfig`` to batches: through
``seq2seq.data.prepare_data`` it loads the corpus (directory, table files, hub, or the embedded toy
corpus), cleans it, trains or reuses the run's joint SentencePiece model, encodes every split once
through ``datasets.map`` into a cache, and wraps the result in a ``PreparedCorpus``. With
``data.streaming`` the training split is instead read, tokenized and batched on the fly
(``StreamingCorpus``, see ``seq2seq.data.streaming``).

Under ``torchrun`` rank 0 prepares first (tokenizer, cache) while the others wait; they then reuse
what it wrote, so ``--output-dir`` (and ``--cache-dir``) must be on a filesystem all nodes share.
The training process reads the cached corpus memory-mapped: only the token-id columns are touched
(zero-copy), and the text columns only for validation/test translation.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, TypeVar

from datasets import DatasetDict, IterableDataset

from ..alignment.guided import GuidedAlignments
from ..alignment.links import to_pharaoh
from ..config import RunConfig
from ..data import Batch, TokenBatchSampler, TokenColumns, make_batches, prepare_data
from ..data.corpus import corpus_fingerprint, load_corpus
from ..data.shapes import pad_to_shape
from ..errors import UserError
from ..io_utils import atomic_output, counted
from ..runtime import is_terminal, log
from ..tokenizer import EOS_ID, Tokenizer
from . import distributed

T = TypeVar("T")
EFLOMAL = "eflomal"  # --guided-alignment eflomal: compute the links (``alignment_file``)


@dataclass
class PreparedCorpus:
    tokenizer: Tokenizer
    splits: DatasetDict  # columns src, tgt, src_ids, tgt_ids (memory-mapped Arrow)
    max_tokens: int
    seed: int
    rank: int = 0  # this process's shard of the training batches ...
    world_size: int = 1  # ... out of this many (see TokenBatchSampler)
    subword_alpha: float = 0.0  # > 0: each epoch's segmentation of the training split is sampled
    guided: GuidedAlignments | None = None  # guided alignment: the training pairs' word links
    fixed_shapes: bool = False  # training batches padded to fixed shapes (``data.shapes``)

    def __post_init__(self) -> None:
        self.columns = {name: TokenColumns(data) for name, data in self.splits.items()}
        self.train_sampler = self._sampler(self.columns["train"])
        self._sampled: tuple[int, TokenColumns, TokenBatchSampler] | None = None  # the last epoch's

    def _sampler(self, columns: TokenColumns) -> TokenBatchSampler:
        return TokenBatchSampler.for_columns(columns, self.max_tokens, shuffle=True, seed=self.seed,
                                             rank=self.rank, world_size=self.world_size,
                                             fixed_shapes=self.fixed_shapes)

    def train_batches(self, epoch: int, start: int = 0) -> Iterator[Batch]:
        """This rank's batches of ``epoch`` in training order, skipping the first ``start``."""
        columns, sampler = self.epoch_columns(epoch)
        batches = make_batches(columns, sampler.batches(epoch)[start:])
        return self._shaped(batches if self.guided is None else self._with_gold(columns, batches))

    def _shaped(self, batches: Iterator[Batch]) -> Iterator[Batch]:
        """``fixed_shapes``: each batch padded to its bucket's shape; else the batches as they are."""
        if not self.fixed_shapes:
            return batches
        return (pad_to_shape(batch, self.max_tokens) for batch in batches)

    def _with_gold(self, columns: TokenColumns, batches: Iterator[Batch]) -> Iterator[Batch]:
        """Guided alignment: each batch with its gold attention (``Batch.guide``), mapped to the
        pieces it holds (the epoch's sampled segmentation too)."""
        for batch in batches:
            src, tgt = columns.pairs(batch.indices)
            batch.guide = self.guided.gold(batch.indices, src, tgt, (batch.tgt_in.size(1), batch.src.size(1)))
            yield batch

    def epoch_columns(self, epoch: int) -> tuple[TokenColumns, TokenBatchSampler]:
        """The training split's ids for ``epoch``: the cached best segmentation, or with
        ``subword_alpha`` a segmentation sampled for this epoch (seeded by the run's seed and the
        epoch, so every rank and a resumed run see the same one; token budgets re-packed to it)."""
        if not self.subword_alpha:
            return self.columns["train"], self.train_sampler
        if self._sampled is None or self._sampled[0] != epoch:
            import datasets

            train = self.splits["train"]
            seed = self.seed * 1_000_003 + epoch
            src = [ids + [EOS_ID] for ids in self.tokenizer.encode_sampled(train["src"], self.subword_alpha, seed)]
            tgt = self.tokenizer.encode_sampled(train["tgt"], self.subword_alpha, seed + 1)
            columns = TokenColumns(datasets.Dataset.from_dict({"src_ids": src, "tgt_ids": tgt}))
            self._sampled = (epoch, columns, self._sampler(columns))
        return self._sampled[1], self._sampled[2]

    def eval_batches(self, split: str) -> Iterator[Batch]:
        sampler = TokenBatchSampler.for_columns(self.columns[split], self.max_tokens, shuffle=False)
        return make_batches(self.columns[split], sampler.batches(0))

    def texts(self, split: str, limit: int = 0) -> tuple[list[str], list[str]]:
        data = self.splits[split]
        if limit:
            data = data.select(range(min(limit, len(data))))
        return list(data["src"]), list(data["tgt"])


@dataclass
class StreamingCorpus(PreparedCorpus):
    """The training split as this rank's encoded stream; ``splits`` holds only validation and test.

    Resuming mid-epoch replays the epoch's stream up to the saved position (reading and tokenizing
    it again, without training): exact, at the cost of that re-read.
    """

    stream: IterableDataset | None = None
    window: int = 100

    def __post_init__(self) -> None:
        from ..data.streaming import StreamBatcher

        self.columns = {name: TokenColumns(data) for name, data in self.splits.items()}
        self.batcher = StreamBatcher(self.stream, self.max_tokens, self.seed, self.window, self.fixed_shapes)

    def train_batches(self, epoch: int, start: int = 0) -> Iterator[Batch]:
        return self._shaped(self.batcher.batches(epoch, start))


def prepare_run_corpus(cfg: RunConfig, output_dir: Path, quiet: bool = False,
                       tokenizer: Tokenizer | None = None) -> PreparedCorpus:
    """Tokenizer (``<output_dir>/spm.model``: ``tokenizer`` when given, e.g. the one of a model being
    fine-tuned, else reused if it matches or trained) and the encoded corpus (cached under
    ``data.cache_dir``, reused across runs with the same corpus, cleaning and tokenizer)."""
    given = tokenizer
    if quiet or not is_terminal():  # datasets' bars redraw with carriage returns: fine on a terminal only
        import datasets

        datasets.disable_progress_bars()
    rank, world, tokenizer_path = distributed.rank(), distributed.world_size(), output_dir / "spm.model"
    if cfg.data.streaming and cfg.data.subword_alpha:
        raise UserError("--subword-alpha samples a segmentation of the whole training split per epoch; it "
                        "needs a prepared corpus, not --streaming")
    if cfg.data.streaming and cfg.guided.alignment_lines:
        raise UserError("--guided-alignment pairs each training pair with its alignment line by position in the "
                        "training data; it needs a prepared corpus, not --streaming")
    if cfg.data.streaming:
        from ..data.streaming import prepare_stream

        tokenizer, stream, splits = distributed.main_first(lambda: _reuse_main(tokenizer_path, lambda: prepare_stream(
            cfg.data, tokenizer_path, cfg.train.seed, rank, world, tokenizer=given)))
        log("corpus", quiet=quiet, vocab=tokenizer.vocab_size, train_pairs="stream",
            **{f"{name}_pairs": len(data) for name, data in splits.items()})
        return StreamingCorpus(tokenizer, splits, cfg.data.max_tokens, cfg.train.seed, rank, world,
                               fixed_shapes=bool(cfg.data.fixed_shapes), stream=stream, window=cfg.data.stream_window)
    lines = alignment_file(cfg) if cfg.guided.alignment_lines else None
    tokenizer, splits = distributed.main_first(lambda: _reuse_main(tokenizer_path, lambda: prepare_data(
        cfg.data, tokenizer_path, cfg.data.cache_dir, tokenizer=given, alignment_lines=_computed(cfg, lines))))
    if len(splits["train"]) == 0:
        raise UserError("the training split is empty; check --data-dir / --train-file and the filters")
    log("corpus", quiet=quiet, vocab=tokenizer.vocab_size,
        **{f"{name}_pairs": len(data) for name, data in splits.items()})
    guided = None
    if lines is not None:
        guided = GuidedAlignments.from_split(splits["train"], tokenizer, str(lines),
                                             null=cfg.guided.unaligned == "eos")
    return PreparedCorpus(tokenizer, splits, cfg.data.max_tokens, cfg.train.seed, rank, world,
                          subword_alpha=cfg.data.subword_alpha, guided=guided, fixed_shapes=bool(cfg.data.fixed_shapes))


def alignment_file(cfg: RunConfig) -> Path:
    """The Pharaoh file of ``--guided-alignment``: the one given, or with ``eflomal`` the links computed
    for the training pairs, kept in the cache directory under the corpus fingerprint (``cache_dir /
    guided-eflomal-<fingerprint>.talp``)."""
    if cfg.guided.links != EFLOMAL:
        return Path(cfg.guided.links)
    return Path(cfg.data.cache_dir) / f"guided-eflomal-{corpus_fingerprint(cfg.data)[:20]}.talp"


def _computed(cfg: RunConfig, path: Path | None) -> Path | None:
    """``path`` (the run's alignment file, or None), after computing it with eflomal on the raw training pairs
    if the run asks for it and the cache has none, or a damaged one: a file whose lines are not the count its
    manifest recorded (rank 0 only: ``main_first``)."""
    if path is None or cfg.guided.links != EFLOMAL:
        return path
    manifest = path.with_suffix(".json")  # {"lines": training pairs}, written after the links
    if path.is_file() and manifest.is_file():
        text, pairs = path.read_bytes(), json.loads(manifest.read_text(encoding="utf-8"))["lines"]
        lines = text.count(b"\n")
        if lines != pairs or pairs and not text.endswith(b"\n"):  # truncated or half-written
            log("warning", message=f"{path}: the cached eflomal alignments are damaged ({counted(lines, 'line')} for "
                                   f"{counted(pairs, 'training pair')}); computing them again")
            path.unlink()
    if not path.is_file():
        from ..alignment.eflomal import eflomal_links

        train = load_corpus(cfg.data)["train"]  # line N of the file = raw training pair N, as for a given file
        log("guided_alignment", computing="eflomal", pairs=len(train), output=path)
        links = eflomal_links(list(train["src"]), list(train["tgt"]))
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_output(path) as out:
            out.writelines(to_pharaoh(pair) + "\n" for pair in links)
        with atomic_output(manifest) as out:
            out.write(json.dumps({"lines": len(links)}) + "\n")
    return path


def _reuse_main(tokenizer_path: Path, prepare: Callable[[], T]) -> T:
    """``prepare()``; on ranks other than 0, first check that rank 0's tokenizer is visible here."""
    if not distributed.is_main() and not tokenizer_path.is_file():
        raise UserError(f"rank {distributed.rank()}: {tokenizer_path}, written by rank 0, is not visible "
                        "here; multi-node runs need --output-dir and --cache-dir on a filesystem shared "
                        "by all nodes")
    return prepare()
