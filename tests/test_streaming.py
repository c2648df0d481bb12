"""Corpora past RAM: streaming (--streaming), large local files prepared on disk, the prepared-corpus cache."""
from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import pytest
from datasets import IterableDataset

from seq2seq.config import DataConfig
from seq2seq.data import corpus as corpus_module
from seq2seq.data import prepare, prepare_data
from seq2seq.data.streaming import StreamBatcher, load_stream_corpus, prepare_stream, stream_texts, training_stream
from seq2seq.errors import UserError
from seq2seq.tokenizer import Tokenizer
from seq2seq.toy import write_toy_corpus
from seq2seq.training.run import train

sys.path.insert(0, str(Path(__file__).parent))
from test_training import assert_same_weights, tiny_config  # noqa: E402


@pytest.fixture(scope="module")
def toy_dir(tmp_path_factory) -> Path:
    return write_toy_corpus(tmp_path_factory.mktemp("toy"), n_train=400, n_valid=20, n_test=20, seed=2)


def stream_config(directory: Path) -> DataConfig:
    return DataConfig(data_dir=str(directory), src="en", tgt="de", test_split="test", vocab_size=150,
                      streaming=True, shuffle_buffer=64)


def sources(batches, tokenizer: Tokenizer) -> list[str]:
    return [tokenizer.decode(row) for batch in batches for row in batch.src.tolist()]


def test_a_stream_yields_every_example_once_per_pass(toy_dir, tmp_path):
    tokenizer, stream, evals = prepare_stream(stream_config(toy_dir), tmp_path / "spm.model", seed=1)
    assert len(evals["validation"]) == len(evals["test"]) == 20
    expected = Counter((toy_dir / "train.en").read_text(encoding="utf-8").splitlines())
    batcher = StreamBatcher(stream, max_tokens=300, seed=1, window=4)
    epoch0, epoch1 = list(batcher.batches(0)), list(batcher.batches(1))
    assert Counter(sources(epoch0, tokenizer)) == expected == Counter(sources(epoch1, tokenizer))
    assert sources(epoch0, tokenizer) != sources(epoch1, tokenizer)  # reshuffled per epoch
    assert all(b.num_src_tokens <= 300 and b.num_tgt_tokens <= 300 for b in epoch0)
    resumed = list(batcher.batches(1, start=3))  # resume = replay the epoch up to the position
    assert [b.indices for b in resumed] == [b.indices for b in epoch1[3:]]

    pairs, _ = load_stream_corpus(stream_config(toy_dir))
    shares = [sources(StreamBatcher(training_stream(pairs, tokenizer, 64, 1, rank, 2), 300).batches(0), tokenizer)
              for rank in (0, 1)]
    assert abs(len(shares[0]) - len(shares[1])) <= 1
    assert Counter(shares[0]) + Counter(shares[1]) == expected  # the ranks split the pairs


def test_the_tokenizer_reads_only_the_head_of_a_stream():
    def rows():
        for i in range(3000):
            yield {"src": f"s{i}", "tgt": f"t{i}"}
        raise AssertionError("read past the head")

    head = stream_texts(IterableDataset.from_generator(rows), 10)
    assert list(head) == [f"{side}{i}" for i in range(5) for side in "st"]


def test_stream_errors_name_the_file_and_line(tmp_path):
    (tmp_path / "train.en").write_text("one\ntwo\nthree\n", encoding="utf-8")
    (tmp_path / "train.de").write_text("eins\nzwei\n", encoding="utf-8")
    (tmp_path / "val.en").write_text("four\n", encoding="utf-8")  # training needs validation pairs
    (tmp_path / "val.de").write_text("vier\n", encoding="utf-8")
    with pytest.raises(UserError, match=r"train\.de ends at line 2"):  # the first read (a batch) finds it
        list(load_stream_corpus(DataConfig(data_dir=str(tmp_path), src="en", tgt="de", streaming=True))[0])
    table = tmp_path / "train.tsv"
    table.write_text("a\tb\nc\td\te\n", encoding="utf-8")
    valid = tmp_path / "valid.tsv"
    valid.write_text("f\tg\n", encoding="utf-8")
    with pytest.raises(UserError, match=r"train\.tsv, line 2: found 3 tab-separated columns"):
        list(load_stream_corpus(DataConfig(train_file=str(table), valid_file=str(valid), streaming=True))[0])


def test_streaming_training_resumes_exactly(tmp_path):
    def config(name: str, max_steps: int):
        cfg = tiny_config(tmp_path / name, max_steps=max_steps, eval_every=7)
        cfg.data.streaming, cfg.data.shuffle_buffer, cfg.data.stream_window = True, 50, 3
        return cfg

    full = train(config("full", 13), quiet=True)
    assert full.progress.epoch == 1  # crossed an epoch boundary of the stream
    train(config("split", 8), quiet=True)
    train(config("split", 13), resume=True, quiet=True)
    assert_same_weights(tmp_path / "full" / "last.pt", tmp_path / "split" / "last.pt")


def test_preparing_a_corpus_twice_reuses_tokenizer_and_cache(tmp_path, monkeypatch):
    cfg = DataConfig(toy_size=200, src="en", tgt="de", vocab_size=120, cache_dir=str(tmp_path / "cache"))
    tokenizer, first = prepare_data(cfg, tmp_path / "spm.model", cfg.cache_dir)

    def fail(*args, **kwargs):
        raise AssertionError("prepared again")

    monkeypatch.setattr(prepare, "encode_corpus", fail)
    monkeypatch.setattr(prepare, "load_clean_corpus", fail)
    monkeypatch.setattr(Tokenizer, "train", fail)
    again, second = prepare_data(cfg, tmp_path / "spm.model", cfg.cache_dir)
    assert again == tokenizer and len(list((tmp_path / "cache").iterdir())) == 1
    assert second["train"]["src_ids"] == first["train"]["src_ids"]
    assert second["train"].cache_files  # memory-mapped from the cache, not held in RAM


def test_large_local_files_are_prepared_on_disk(toy_dir, tmp_path, monkeypatch):
    cfg = DataConfig(data_dir=str(toy_dir), src="en", tgt="de", test_split="test", vocab_size=150,
                     cache_dir=str(tmp_path / "cache"))
    _, in_memory = prepare_data(cfg, tmp_path / "a" / "spm.model", cfg.cache_dir)
    monkeypatch.setattr(corpus_module, "IN_MEMORY_BYTES", 0)  # every file counts as large
    loaded = corpus_module.load_corpus(cfg)
    assert loaded["train"].cache_files and not loaded["validation"].cache_files
    assert loaded["train"]["src"] == (toy_dir / "train.en").read_text(encoding="utf-8").splitlines()
    cfg.cache_dir = str(tmp_path / "cache2")
    _, on_disk = prepare_data(cfg, tmp_path / "a" / "spm.model", cfg.cache_dir)
    assert on_disk["train"]["src_ids"] == in_memory["train"]["src_ids"]
    assert [p.name.startswith("corpus-") for p in (tmp_path / "cache2").iterdir()] == [True]  # scratch removed
    for lang, lines in (("en", "a\nb\n"), ("de", "x\n")):
        (tmp_path / f"train.{lang}").write_text(lines, encoding="utf-8")
    with pytest.raises(UserError, match=r"train\.de ends at line 1"):
        corpus_module.load_corpus(DataConfig(data_dir=str(tmp_path), src="en", tgt="de",
                                             cache_dir=str(tmp_path / "cache3")))
