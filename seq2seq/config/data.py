"""The data section: ``DataConfig`` (where the corpus comes from and how it is cleaned, tokenized and
batched; the word links of guided alignment are the ``guided`` section's, ``guided.py``)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import Field

from .fields import STRICT, option


@dataclass
class DataConfig:
    """Where the corpus comes from and how it is cleaned, tokenized and batched."""

    __pydantic_config__ = STRICT

    data_dir: str | None = option(None, "directory of {split}.{lang} text files (e.g. Multi30k)")
    dataset: str | None = option(None, "Hugging Face hub dataset name, e.g. bentrevett/multi30k")
    dataset_config: str | None = option(None, "hub dataset configuration, e.g. de-en for wmt14")
    train_file: str | None = option(None, "TSV or JSONL file of training pairs (overrides --data-dir)")
    valid_file: str | None = option(None, "TSV or JSONL file of validation pairs (with --train-file)")
    test_file: str | None = option(None, "TSV or JSONL file of test pairs (with --train-file)")
    src: str = option("src", "source language code (file suffix, hub column or JSONL key)")
    tgt: str = option("tgt", "target language code")
    train_split: str = option("train", "file stem / hub split of the training data")
    valid_split: str = option("val", "file stem / hub split of the validation data")
    test_split: str = option("test_2016_flickr", "file stem / hub split of the test data")
    max_len: int = option(0, "training filter: drop pairs with a side longer than this many words (0 = keep all)")
    max_len_ratio: float = option(0.0, "training filter: drop pairs whose word-length ratio exceeds this "
                                       "(0 = keep all)")
    vocab_size: int = option(8000, "SentencePiece vocabulary size (joint source + target), an upper "
                                   "bound: a small corpus gives fewer pieces (the log says how many)")
    sp_model_type: Literal["unigram", "bpe"] = option("unigram", "SentencePiece model type")
    sp_input_sentence_size: int = option(2_000_000, "sentences sampled to train SentencePiece")
    max_tokens: int | None = option(None, "tokens per batch, padding included (per side); unset: sized for the "
                                          "architecture and the device (DEVICE_DEFAULTS)")
    fixed_shapes: bool | None = option(
        None, "pad training batches to a few fixed shapes (length buckets, seq2seq.data.shapes) so that a compiled "
              "step and its CUDA graphs are built once per shape; unset: on with --compile")
    num_proc: int = option(1, "processes for tokenizing the corpus")
    cache_dir: str = option("data/cache", "where encoded corpora are kept and reused across runs")
    toy_size: int = option(0, "train on the embedded English->German number-word corpus with this many pairs")
    streaming: bool = option(False, "read, tokenize and batch the training split on the fly (corpora past RAM)")
    subword_alpha: Annotated[float, Field(ge=0.0, le=1.0)] = option(
        0.0, "subword regularization (Kudo 2018): each epoch trains on a freshly sampled SentencePiece "
             "segmentation of the training split, smoothing alpha (unigram; BPE: dropout probability); "
             "validation, test and translation use the best segmentation (0 = off)")
    shuffle_buffer: int = option(10_000, "streaming: pairs held in the shuffle buffer")
    stream_window: int = option(100, "streaming: sort by length within windows of this many batches")
