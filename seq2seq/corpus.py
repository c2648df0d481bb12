"""A run's corpus, ready to train on: cleaned, tokenized once, and batched by tokens.

``prepare_run_corpus`` is the one place that goes from a ``RunConfig`` to batches: it loads the
corpus (directory, table files, hub, or the embedded toy corpus), cleans it, trains or reuses the
run's joint SentencePiece model (``<output_dir>/spm.model``), encodes every split once through
``datasets.map`` and wraps the result in a ``PreparedCorpus``.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from datasets import DatasetDict

from .config import RunConfig
from .data import Batch, TokenBatchSampler, clean_corpus, encode_corpus, load_corpus, make_batches
from .runtime import log
from .tokenizer import Tokenizer, load_or_train_tokenizer
from .toy import toy_corpus


@dataclass
class PreparedCorpus:
    tokenizer: Tokenizer
    splits: DatasetDict  # columns src, tgt, src_ids, tgt_ids
    train_sampler: TokenBatchSampler
    max_tokens: int

    def train_batches(self, epoch: int, start: int = 0) -> Iterator[Batch]:
        """The batches of ``epoch`` in training order, skipping the first ``start``."""
        order = self.train_sampler.batches(epoch)[start:]
        return make_batches(self.splits["train"], order)

    def eval_batches(self, split: str) -> Iterator[Batch]:
        data = self.splits[split]
        sampler = TokenBatchSampler(_lengths(data, "src_ids"), _lengths(data, "tgt_ids"),
                                    self.max_tokens, shuffle=False, seed=0)
        return make_batches(data, sampler.batches(0))

    def texts(self, split: str, limit: int = 0) -> tuple[list[str], list[str]]:
        data = self.splits[split]
        if limit:
            data = data.select(range(min(limit, len(data))))
        return list(data["src"]), list(data["tgt"])


def _lengths(data, column: str) -> list[int]:
    return [len(ids) for ids in data[column]]


def prepare_run_corpus(cfg: RunConfig, output_dir: Path, quiet: bool = False) -> PreparedCorpus:
    dc = cfg.data
    if dc.toy_size:
        raw = toy_corpus(n_train=dc.toy_size, seed=cfg.train.seed)
        cfg.data.src, cfg.data.tgt = "en", "de"
    else:
        raw = load_corpus(dc)
    cleaned, report = clean_corpus(raw, max_len=dc.max_len, max_len_ratio=dc.max_len_ratio)
    log("corpus", quiet=quiet, **{f"{split}_pairs": len(cleaned[split]) for split in cleaned},
        dropped=report)
    tokenizer = load_or_train_tokenizer(
        output_dir / "spm.model",
        lambda: _training_text(cleaned),
        vocab_size=dc.vocab_size, model_type=dc.sp_model_type, input_sentence_size=dc.sp_input_sentence_size,
    )
    encoded = encode_corpus(cleaned, tokenizer, num_proc=dc.num_proc)
    train = encoded["train"]
    sampler = TokenBatchSampler(_lengths(train, "src_ids"), _lengths(train, "tgt_ids"), dc.max_tokens,
                                shuffle=True, seed=cfg.train.seed)
    return PreparedCorpus(tokenizer, encoded, sampler, dc.max_tokens)


def _training_text(splits: DatasetDict) -> Iterator[str]:
    train = splits["train"]
    yield from train["src"]
    yield from train["tgt"]
