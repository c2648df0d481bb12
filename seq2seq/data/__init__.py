"""The data layer: corpora -> ``datasets.DatasetDict`` (train/validation/test of src/tgt strings),
cleaning, one-off tokenization cached as Arrow, and token-budget batching.

Typical use (what training does)::

    tokenizer, corpus = prepare_data(cfg.data, run_dir / "spm.model", cache_dir)
    columns = TokenColumns(corpus["train"])
    sampler = TokenBatchSampler.for_columns(columns, cfg.data.max_tokens, seed=seed)
    for batch in make_batches(columns, sampler, epoch):
        ...

Corpora past RAM: large local training files are read into Arrow on disk (``corpus.IN_MEMORY_BYTES``),
and ``streaming.prepare_stream`` / ``streaming.StreamBatcher`` read, tokenize and batch the training
split on the fly (``--streaming``).
"""
from .batching import Batch, TokenBatchSampler, TokenColumns, collate, make_batches
from .cleaning import clean_corpus
from .corpus import corpus_fingerprint, corpus_source, corpus_texts, load_clean_corpus, load_corpus
from .files import load_table_files, load_text_dir, read_lines
from .hub import hub_to_pairs, load_hub
from .prepare import encode_corpus, prepare_corpus, prepare_data
from .schema import ENCODED_FEATURES, PAIR_FEATURES, SPLITS, empty_pairs, pairs_dataset

__all__ = [
    "Batch", "TokenBatchSampler", "TokenColumns", "collate", "make_batches",
    "clean_corpus",
    "corpus_fingerprint", "corpus_source", "corpus_texts", "load_clean_corpus", "load_corpus",
    "load_table_files", "load_text_dir", "read_lines",
    "hub_to_pairs", "load_hub",
    "encode_corpus", "prepare_corpus", "prepare_data",
    "ENCODED_FEATURES", "PAIR_FEATURES", "SPLITS", "empty_pairs", "pairs_dataset",
]
