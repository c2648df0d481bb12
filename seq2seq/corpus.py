"""A run's corpus, ready to train on: cleaned, tokenized once, and batched by tokens.

``prepare_run_corpus`` is the one place that goes from a ``RunConfig`` to batches: through
``seq2seq.data.prepare_data`` it loads the corpus (directory, table files, hub, or the embedded toy
corpus), cleans it, trains or reuses the run's joint SentencePiece model, encodes every split once
through ``datasets.map`` into a cache, and wraps the result in a ``PreparedCorpus``.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from datasets import DatasetDict

from .config import RunConfig
from .data import Batch, TokenBatchSampler, TokenColumns, make_batches, prepare_data
from .errors import UserError
from .runtime import log
from .tokenizer import Tokenizer


@dataclass
class PreparedCorpus:
    tokenizer: Tokenizer
    splits: DatasetDict  # columns src, tgt, src_ids, tgt_ids (memory-mapped Arrow)
    max_tokens: int
    seed: int

    def __post_init__(self) -> None:
        self.columns = {name: TokenColumns(data) for name, data in self.splits.items()}
        self.train_sampler = TokenBatchSampler.for_columns(self.columns["train"], self.max_tokens,
                                                           shuffle=True, seed=self.seed)

    def train_batches(self, epoch: int, start: int = 0) -> Iterator[Batch]:
        """The batches of ``epoch`` in training order, skipping the first ``start``."""
        return make_batches(self.columns["train"], self.train_sampler.batches(epoch)[start:])

    def eval_batches(self, split: str) -> Iterator[Batch]:
        sampler = TokenBatchSampler.for_columns(self.columns[split], self.max_tokens, shuffle=False)
        return make_batches(self.columns[split], sampler.batches(0))

    def texts(self, split: str, limit: int = 0) -> tuple[list[str], list[str]]:
        data = self.splits[split]
        if limit:
            data = data.select(range(min(limit, len(data))))
        return list(data["src"]), list(data["tgt"])


def prepare_run_corpus(cfg: RunConfig, output_dir: Path, quiet: bool = False) -> PreparedCorpus:
    """Tokenizer (``<output_dir>/spm.model``, reused if it matches) and the encoded corpus (cached
    under ``data.cache_dir``, reused across runs with the same corpus, cleaning and tokenizer)."""
    if quiet:
        import datasets

        datasets.disable_progress_bars()
    tokenizer, splits = prepare_data(cfg.data, output_dir / "spm.model", cfg.data.cache_dir)
    if len(splits["train"]) == 0:
        raise UserError("the training split is empty; check --data-dir / --train-file and the filters")
    log("corpus", quiet=quiet, vocab=tokenizer.vocab_size,
        **{f"{name}_pairs": len(data) for name, data in splits.items()})
    return PreparedCorpus(tokenizer, splits, cfg.data.max_tokens, cfg.train.seed)
