import json
import os
import stat
from pathlib import Path

import datasets
import numpy as np
import pytest
import torch
from datasets import Dataset, DatasetDict, concatenate_datasets

from seq2seq.config import DataConfig
from seq2seq.data import (
    Batch, TokenBatchSampler, TokenColumns, clean_corpus, collate, corpus_fingerprint, encode_corpus, hub_to_pairs,
    load_corpus, load_hub, load_table_files, load_text_dir, make_batches, pairs_dataset, prepare_corpus,
    prepare_data,
)
from seq2seq.data import prepare as prepare_module
from seq2seq.errors import UserError
from seq2seq.tokenizer import BOS_ID, EOS_ID, PAD_ID


def write(path: Path, lines: list[str], end: str = "\n") -> Path:
    path.write_text("".join(line + end for line in lines), encoding="utf-8")
    return path


def multi30k_like(directory: Path, n: int = 4, test: bool = True) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for stem, count in (("train", n), ("val", 2)) + ((("test_2016_flickr", 2),) if test else ()):
        write(directory / f"{stem}.de", [f"{stem} satz {i} über" for i in range(count)])
        write(directory / f"{stem}.en", [f"{stem} sentence {i}" for i in range(count)])
    return directory


# ---- plain text directories -------------------------------------------------------------------

def test_load_text_dir(tmp_path):
    dd = load_text_dir(multi30k_like(tmp_path), "de", "en")
    assert {k: len(v) for k, v in dd.items()} == {"train": 4, "validation": 2, "test": 2}
    assert dd["train"][1] == {"src": "train satz 1 über", "tgt": "train sentence 1"}
    assert dd["validation"].column_names == ["src", "tgt"]


def test_text_dir_crlf_bom_and_missing_final_newline(tmp_path):
    (tmp_path / "train.de").write_bytes("\ufeffa\r\nb\r\n".encode())
    (tmp_path / "train.en").write_bytes(b"x\ny")
    dd = load_text_dir(tmp_path, "de", "en")
    assert dd["train"]["src"] == ["a", "b"] and dd["train"]["tgt"] == ["x", "y"]


def test_text_dir_absent_eval_splits_are_empty(tmp_path):
    write(tmp_path / "train.de", ["a"]), write(tmp_path / "train.en", ["b"])
    dd = load_text_dir(tmp_path, "de", "en")
    assert len(dd["validation"]) == 0 and len(dd["test"]) == 0
    assert dd["test"].column_names == ["src", "tgt"]


def test_text_dir_missing_train_file_lists_directory(tmp_path):
    multi30k_like(tmp_path)
    with pytest.raises(UserError) as err:
        load_text_dir(tmp_path, "fr", "en")
    message = str(err.value)
    assert str(tmp_path / "train.fr") in message and "train.de" in message and "--src" in message


def test_text_dir_one_side_of_eval_split_missing(tmp_path):
    multi30k_like(tmp_path)
    os.remove(tmp_path / "val.en")
    with pytest.raises(UserError, match=r"val\.en.*--valid-split"):
        load_text_dir(tmp_path, "de", "en")


def test_mismatched_line_counts_name_both_files(tmp_path):
    multi30k_like(tmp_path)
    write(tmp_path / "train.en", ["one", "two", "three"])
    with pytest.raises(UserError) as err:
        load_text_dir(tmp_path, "de", "en")
    message = str(err.value)
    assert str(tmp_path / "train.de") in message and str(tmp_path / "train.en") in message
    assert "4 lines" in message and "has 3" in message


def test_undecodable_bytes_name_file_and_line(tmp_path):
    multi30k_like(tmp_path)
    (tmp_path / "train.de").write_bytes(b"eins\nzwei\ndrei \xfcber\nvier\n")
    with pytest.raises(UserError, match=r"train\.de, line 3: not valid UTF-8"):
        load_text_dir(tmp_path, "de", "en")


def test_missing_directory(tmp_path):
    with pytest.raises(UserError, match="--data-dir"):
        load_text_dir(tmp_path / "nope", "de", "en")


# ---- TSV / JSONL --------------------------------------------------------------------------------

def test_tsv_plain_and_with_header(tmp_path):
    plain = write(tmp_path / "train.tsv", ["Hallo\tHello", "", "Welt\tWorld"])
    header = write(tmp_path / "valid.tsv", ["id\ten\tde", "1\tHi\tHallo"])
    dd = load_table_files(plain, header, None, src="de", tgt="en")
    assert dd["train"]["src"] == ["Hallo", "Welt"] and dd["train"]["tgt"] == ["Hello", "World"]
    assert dd["validation"][0] == {"src": "Hallo", "tgt": "Hi"}
    assert len(dd["test"]) == 0


def test_tsv_wrong_column_count_names_line(tmp_path):
    bad = write(tmp_path / "train.tsv", ["a\tb", "c\td\te"])
    with pytest.raises(UserError, match=r"train\.tsv, line 2: found 3 tab-separated columns"):
        load_table_files(bad)


def test_jsonl_layouts(tmp_path):
    path = write(tmp_path / "train.jsonl", [
        json.dumps({"de": "Hallo", "en": "Hello"}),
        json.dumps({"src": "Welt", "tgt": "World"}),
        json.dumps({"translation": {"de": "Haus", "en": "House"}}),
        "",
    ])
    dd = load_table_files(path, src="de", tgt="en")
    assert dd["train"]["src"] == ["Hallo", "Welt", "Haus"]
    assert dd["train"]["tgt"] == ["Hello", "World", "House"]


def test_jsonl_bad_json_and_missing_key(tmp_path):
    bad = write(tmp_path / "train.jsonl", [json.dumps({"src": "a", "tgt": "b"}), "{not json"])
    with pytest.raises(UserError, match=r"train\.jsonl, line 2: invalid JSON"):
        load_table_files(bad)
    nokey = write(tmp_path / "t2.jsonl", [json.dumps({"de": "a", "fr": "b"})])
    with pytest.raises(UserError, match=r"line 1: no key 'en' or 'tgt'; keys found: de, fr"):
        load_table_files(nokey, src="de", tgt="en")


def test_table_unknown_suffix(tmp_path):
    with pytest.raises(UserError, match="unknown format"):
        load_table_files(write(tmp_path / "train.csv", ["a,b"]))


# ---- hub mapping (no network) -------------------------------------------------------------------

def test_hub_flat_layout():
    raw = DatasetDict({
        "train": Dataset.from_dict({"en": ["Hello", "Hi"], "de": ["Hallo", "Servus"], "id": [1, 2]}),
        "validation": Dataset.from_dict({"en": ["House"], "de": ["Haus"], "id": [3]}),
        "test": Dataset.from_dict({"en": ["Tree"], "de": ["Baum"], "id": [4]}),
    })
    dd = hub_to_pairs(raw, "de", "en")
    assert dd["train"].column_names == ["src", "tgt"]
    assert dd["train"]["src"] == ["Hallo", "Servus"] and dd["validation"][0] == {"src": "Haus", "tgt": "House"}
    reverse = hub_to_pairs(raw, "en", "de")
    assert reverse["test"][0] == {"src": "Tree", "tgt": "Baum"}


def test_hub_translation_layout_and_split_names():
    features = datasets.Features({"translation": datasets.Translation(languages=["de", "en"])})
    rows = lambda pairs: Dataset.from_dict(  # noqa: E731
        {"translation": [{"de": d, "en": e} for d, e in pairs]}, features=features)
    raw = DatasetDict({"train": rows([("Hallo", "Hello")]), "dev": rows([("Haus", "House")])})
    dd = hub_to_pairs(raw, "en", "de")
    assert dd["train"][0] == {"src": "Hello", "tgt": "Hallo"}
    assert dd["validation"][0] == {"src": "House", "tgt": "Haus"}
    assert len(dd["test"]) == 0
    with pytest.raises(UserError, match="no language fr .* available: de, en"):
        hub_to_pairs(raw, "fr", "de")


def test_hub_streaming_layout():
    flat = Dataset.from_dict({"de": ["Haus"], "en": ["House"]})
    dd = hub_to_pairs(datasets.IterableDatasetDict({"train": flat.to_iterable_dataset()}), "en", "de")
    assert list(dd["train"]) == [{"src": "House", "tgt": "Haus"}] and list(dd["test"]) == []


def test_hub_unknown_column_and_split():
    raw = DatasetDict({"training": Dataset.from_dict({"en": ["a"], "de": ["b"]})})
    with pytest.raises(UserError, match="no split train; available splits: training"):
        hub_to_pairs(raw, "de", "en")
    raw = DatasetDict({"train": Dataset.from_dict({"en": ["a"], "de": ["b"]})})
    with pytest.raises(UserError, match="available columns: en, de"):
        hub_to_pairs(raw, "fr", "en")
    with pytest.raises(UserError, match="no split newstest2014; available splits: train"):
        hub_to_pairs(raw, "de", "en", split_names={"test": "newstest2014"})


def test_hub_unreachable_is_user_error(monkeypatch):
    def offline(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'bentrevett/multi30k' on the Hub (OfflineModeIsEnabled)")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(UserError, match=r"could not reach the Hugging Face hub.*--data-dir DIR"):
        load_hub("bentrevett/multi30k", None, "de", "en")


# ---- dispatch and cleaning ----------------------------------------------------------------------

def test_load_corpus_dispatch(tmp_path):
    with pytest.raises(UserError, match="no corpus given"):
        load_corpus(DataConfig())
    with pytest.raises(UserError, match="not --toy-size and --dataset"):
        load_corpus(DataConfig(toy_size=10, dataset="x/y"))
    dd = load_corpus(DataConfig(data_dir=str(multi30k_like(tmp_path)), src="de", tgt="en"))
    assert len(dd["train"]) == 4
    toy = load_corpus(DataConfig(toy_size=100))
    assert {k: len(v) for k, v in toy.items()} == {"train": 100, "validation": 10, "test": 10}


def test_fingerprint_tracks_files_and_settings(tmp_path):
    cfg = DataConfig(data_dir=str(multi30k_like(tmp_path)), src="de", tgt="en")
    first = corpus_fingerprint(cfg)
    assert corpus_fingerprint(DataConfig(**{**cfg.__dict__, "max_len": 50})) != first
    write(tmp_path / "train.en", ["changed"] * 5)
    assert corpus_fingerprint(cfg) != first


def test_clean_corpus_train_only():
    dd = DatasetDict({
        "train": pairs_dataset(
            [" a b ", "", "a", "a b c d e f", "a", "x y"],
            ["c d", "e", " ", "f", "a b c d", "z"],
        ),
        "validation": pairs_dataset([" v ", ""], ["w", ""]),
        "test": pairs_dataset(["", "t"], ["", "u "]),
    })
    cleaned, stats = clean_corpus(dd, max_len=5, max_len_ratio=3.0)
    assert cleaned["train"]["src"] == ["a b", "x y"] and cleaned["train"]["tgt"] == ["c d", "z"]
    assert stats["train"] == {"read": 6, "kept": 2, "empty": 2, "too_long": 1, "ratio": 1}
    assert cleaned["validation"]["src"] == ["v", ""] and cleaned["test"]["tgt"] == ["", "u"]
    assert cleaned["train"].column_names == ["src", "tgt"]


def test_empty_after_cleaning_names_filters():
    dd = DatasetDict({"train": pairs_dataset(["a b c", " "], ["x y z", "q"])})
    with pytest.raises(UserError, match=r"empty after cleaning.*relax --max-len"):
        clean_corpus(dd, max_len=2)


def _empty_corpus_case(tmp_path: Path, case: str) -> DataConfig:
    """A corpus with one split holding no pairs (from the start, or after cleaning)."""
    good = multi30k_like(tmp_path / "good")
    if case.startswith("dir-"):
        split = case.removeprefix("dir-")
        stem = {"train": "train", "validation": "val", "test": "test_2016_flickr"}[split]
        for lang in ("de", "en"):
            write(good / f"{stem}.{lang}", [])
        return DataConfig(data_dir=str(good), src="de", tgt="en")
    tsv = write(tmp_path / "ok.tsv", ["a b\tc d"])
    empty = {"tsv": write(tmp_path / "empty.tsv", []), "blank-tsv": write(tmp_path / "blank.tsv", ["", "  "]),
             "jsonl": write(tmp_path / "empty.jsonl", [])}
    kind, split = case.split(":")
    files = {"train_file": str(tsv), "valid_file": str(tsv), "test_file": None}
    files[{"train": "train_file", "validation": "valid_file", "test": "test_file"}[split]] = str(empty[kind])
    return DataConfig(**files)


@pytest.mark.parametrize("case, message", [
    ("dir-train", r"--data-dir: .*train.de / train.en: no sentence pairs"),
    ("dir-validation", r"--data-dir: .*val.de / val.en: no sentence pairs.*needs validation pairs"),
    ("dir-test", r"--data-dir: .*test_2016_flickr.de / test_2016_flickr.en: no sentence pairs"),
    ("tsv:train", r"--train-file .*empty.tsv: no sentence pairs"),
    ("blank-tsv:train", r"--train-file .*blank.tsv: no sentence pairs"),
    ("jsonl:train", r"--train-file .*empty.jsonl: no sentence pairs"),
    ("tsv:validation", r"--valid-file .*empty.tsv: no sentence pairs"),
    ("jsonl:test", r"--test-file .*empty.jsonl: no sentence pairs"),
])
@pytest.mark.parametrize("streaming", [False, True])
def test_an_empty_split_is_a_named_error_from_every_source(tmp_path, case, message, streaming):
    from seq2seq.data.corpus import load_clean_corpus
    from seq2seq.data.streaming import load_stream_corpus

    cfg = _empty_corpus_case(tmp_path, case)
    cfg.streaming = streaming
    with pytest.raises(UserError, match=message):
        load_stream_corpus(cfg) if streaming else load_clean_corpus(cfg)


@pytest.mark.parametrize("streaming", [False, True])
def test_empty_after_cleaning_and_absent_validation_are_named(tmp_path, streaming):
    from seq2seq.data.corpus import load_clean_corpus
    from seq2seq.data.streaming import load_stream_corpus

    load = load_stream_corpus if streaming else load_clean_corpus
    good = multi30k_like(tmp_path / "good")
    with pytest.raises(UserError, match=r"train.de / train.en: .*(after cleaning|none left after cleaning)"):
        load(DataConfig(data_dir=str(good), src="de", tgt="en", max_len=1, streaming=streaming))
    no_eval = multi30k_like(tmp_path / "no-eval", test=False)
    for lang in ("de", "en"):
        (no_eval / f"val.{lang}").unlink()
    with pytest.raises(UserError, match=r"no validation data.*--valid-file"):
        load(DataConfig(data_dir=str(no_eval), src="de", tgt="en", streaming=streaming))
    with_val = multi30k_like(tmp_path / "no-test", test=False)  # an absent test split is allowed
    corpus = load(DataConfig(data_dir=str(with_val), src="de", tgt="en", streaming=streaming))
    assert len((corpus[1] if streaming else corpus[0])["test"]) == 0


def test_an_empty_hub_split_names_the_dataset():
    from seq2seq.data.corpus import split_sources

    raw = DatasetDict({"train": Dataset.from_dict({"en": ["a"], "de": ["b"]}),
                       "validation": Dataset.from_dict({"en": [], "de": []})})
    sources = split_sources(DataConfig(dataset="someone/corpus", src="de", tgt="en"))
    with pytest.raises(UserError, match=r"--dataset someone/corpus, validation split: no sentence pairs"):
        clean_corpus(hub_to_pairs(raw, "de", "en"), sources=sources)


def test_train_py_on_empty_files_says_so_without_a_traceback(tmp_path):
    import subprocess
    import sys

    data = multi30k_like(tmp_path / "data")
    for lang in ("de", "en"):
        write(data / f"train.{lang}", [])
    proc = subprocess.run([sys.executable, str(Path(__file__).parents[1] / "train.py"), "--data-dir", str(data),
                           "--src", "de", "--tgt", "en", "--quiet", "--cache-dir", str(tmp_path / "cache"),
                           "--output-dir", str(tmp_path / "run")], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f"{data / 'train.de'} / train.en: no sentence pairs" in proc.stderr


# ---- encoding and the cache ---------------------------------------------------------------------

def test_encode_corpus(toy_dd, tiny_tokenizer):
    encoded = encode_corpus(toy_dd, tiny_tokenizer)
    row = encoded["train"][0]
    assert row["src_ids"] == tiny_tokenizer.encode(row["src"]) + [EOS_ID]
    assert row["tgt_ids"] == tiny_tokenizer.encode(row["tgt"])
    assert encoded["train"].features["src_ids"].feature.dtype == "int32"


def test_empty_eval_split_encodes_and_batches(tiny_tokenizer):
    dd = DatasetDict({"train": pairs_dataset(["eins"], ["one"]), "test": pairs_dataset([], [])})
    encoded = encode_corpus(dd, tiny_tokenizer)
    columns = TokenColumns(encoded["test"])
    sampler = TokenBatchSampler.for_columns(columns, 100, shuffle=False)
    assert len(columns) == 0 and list(make_batches(columns, sampler)) == []


def test_prepare_corpus_caches_atomically(tmp_path, tiny_tokenizer, monkeypatch):
    cfg = DataConfig(toy_size=60)
    cache = tmp_path / "cache"
    monkeypatch.setattr(Dataset, "save_to_disk", lambda *a, **k: (_ for _ in ()).throw(OSError("disk full")))
    with pytest.raises(OSError):
        prepare_corpus(cfg, tiny_tokenizer, cache)
    assert list(cache.iterdir()) == []  # nothing half-written
    monkeypatch.undo()

    first = prepare_corpus(cfg, tiny_tokenizer, cache)
    assert [p.name.startswith("corpus-") for p in cache.iterdir()] == [True]
    from seq2seq.io_utils import current_umask
    # a shared cache stays usable by others as the umask allows (not tempfile.mkdtemp's 0700)
    assert stat.S_IMODE(next(cache.iterdir()).stat().st_mode) == 0o777 & ~current_umask()
    monkeypatch.setattr(prepare_module, "encode_corpus", lambda *a: pytest.fail("re-encoded"))
    again = prepare_corpus(cfg, tiny_tokenizer, cache)
    assert again["train"]["src_ids"] == first["train"]["src_ids"]
    assert again["train"].cache_files  # memory-mapped Arrow on disk


def test_prepare_data_end_to_end(tmp_path):
    cfg = DataConfig(data_dir=str(multi30k_like(tmp_path / "corpus", n=30, test=False)), src="de",
                     tgt="en", vocab_size=60)
    tokenizer, dd = prepare_data(cfg, tmp_path / "run" / "spm.model", tmp_path / "cache")
    assert (tmp_path / "run" / "spm.json").is_file()
    assert tokenizer.decode(dd["train"][3]["src_ids"]) == "train satz 3 über"
    assert len(dd["test"]) == 0 and "tgt_ids" in dd["test"].column_names  # absent split: empty
    again_tokenizer, again = prepare_data(cfg, tmp_path / "run" / "spm.model", tmp_path / "cache")
    assert again_tokenizer == tokenizer and list(again) == ["train", "validation", "test"]
    assert again["validation"]["src_ids"] == dd["validation"]["src_ids"] and len(again["test"]) == 0
    info = json.loads(next((tmp_path / "cache").glob("corpus-*/seq2seq.json")).read_text())
    assert info["cleaning"]["train"]["kept"] == 30


# ---- batches ------------------------------------------------------------------------------------

def test_collate_layout():
    batch = collate([{"src_ids": [5, 6, EOS_ID], "tgt_ids": [7]},
                     {"src_ids": [8, EOS_ID], "tgt_ids": [9, 10, 11]}], indices=[4, 2])
    assert batch.src.tolist() == [[5, 6, EOS_ID], [8, EOS_ID, PAD_ID]]
    assert batch.src_mask.tolist() == [[True, True, True], [True, True, False]]
    assert batch.tgt_in.tolist() == [[BOS_ID, 7, PAD_ID, PAD_ID], [BOS_ID, 9, 10, 11]]
    assert batch.tgt_out.tolist() == [[7, EOS_ID, PAD_ID, PAD_ID], [9, 10, 11, EOS_ID]]
    assert batch.tgt_mask.tolist() == [[True, True, False, False], [True] * 4]
    assert batch.src.dtype == torch.long and batch.tgt_mask.dtype == torch.bool
    assert (batch.num_src_tokens, batch.num_tgt_tokens, batch.indices, len(batch)) == (5, 6, [4, 2], 2)
    moved = batch.to("cpu")
    assert isinstance(moved, Batch) and moved.num_tgt_tokens == 6
    assert torch.equal(moved.tgt_out, batch.tgt_out)


def random_lengths(n=3000, seed=0):
    rng = np.random.default_rng(seed)
    return rng.integers(1, 60, n), rng.integers(0, 60, n)


def test_sampler_budget_and_coverage():
    src, tgt = random_lengths()
    src[[10, 20]] = 500  # longer than the budget alone
    sampler = TokenBatchSampler(src, tgt, max_tokens=400, seed=3)  # shuffle=True: drops oversized
    assert sampler.skipped == 2
    for epoch in range(3):
        batches = sampler.batches(epoch)
        for b in batches:
            assert len(b) * src[b].max() <= 400 and len(b) * (tgt[b].max() + 1) <= 400
        seen = sorted(i for b in batches for i in b)
        assert seen == sorted(set(range(len(src))) - {10, 20})  # each example exactly once


def test_sampler_determinism_and_epochs():
    src, tgt = random_lengths()
    a, b = TokenBatchSampler(src, tgt, 500, seed=1), TokenBatchSampler(src, tgt, 500, seed=1)
    as_lists = lambda batches: [batch.tolist() for batch in batches]  # noqa: E731
    assert as_lists(a.batches(4)) == as_lists(b.batches(4))
    assert as_lists(a.batches(4)) != as_lists(a.batches(5))
    assert as_lists(a.batches(4)) != as_lists(TokenBatchSampler(src, tgt, 500, seed=2).batches(4))
    a.set_epoch(5)
    assert as_lists(a) == as_lists(b.batches(5)) and len(a) == len(b.batches(5))
    fixed = TokenBatchSampler(src, tgt, 500, shuffle=False)
    assert as_lists(fixed.batches(0)) == as_lists(fixed.batches(1))
    flat = [i for batch in fixed.batches(0) for i in batch]
    assert np.all(np.diff(src[flat]) >= 0)  # sorted by source length


def test_training_batches_have_little_target_padding():
    src, tgt = random_lengths(20000)  # source and target lengths independent: the worst case
    sampler = TokenBatchSampler(src, tgt, 2000, seed=1)
    batches = [np.asarray(b) for b in sampler.batches(0)]
    real = sum(int((tgt[b] + 1).sum()) for b in batches)
    padded = sum(len(b) * int(tgt[b].max() + 1) for b in batches)
    assert real / padded > 0.97  # target-major order: the decoder computes on real tokens
    # ties are broken at random: equal-length pairs are grouped differently in another epoch
    pairs = lambda e: {frozenset(b.tolist()) for b in sampler.batches(e)}  # noqa: E731
    assert len(pairs(0) & pairs(1)) < len(batches) // 2


def test_sampler_keeps_oversized_for_evaluation():
    sampler = TokenBatchSampler([3, 50, 4], [2, 2, 2], max_tokens=10, shuffle=False)  # keeps by default
    assert sampler.skipped == 0 and [1] in [b.tolist() for b in sampler.batches(0)]
    assert sorted(i for b in sampler.batches(0) for i in b) == [0, 1, 2]
    assert TokenBatchSampler([3, 50, 4], [2, 2, 2], 10, shuffle=False, drop_oversized=True).skipped == 1


def test_sampler_ddp_shards():
    src, tgt = random_lengths()
    full = TokenBatchSampler(src, tgt, 500, seed=9).batches(2)
    shards = [TokenBatchSampler(src, tgt, 500, seed=9, rank=r, world_size=3).batches(2) for r in range(3)]
    assert len({len(s) for s in shards}) == 1 and len(shards[0]) == len(full) // 3
    indices = [i for shard in shards for b in shard for i in b]
    assert len(indices) == len(set(indices))  # disjoint
    dropped = len(src) - len(indices)
    assert dropped == sum(len(b) for b in full[len(shards[0]) * 3:])  # only the remainder


def test_make_batches_matches_rows(toy_dd, tiny_tokenizer):
    encoded = encode_corpus(toy_dd, tiny_tokenizer)["train"]
    # several Arrow chunks and an indices mapping, as after concatenation and filtering
    dataset = concatenate_datasets([encoded.select(range(150)), encoded.select(range(150, 300))])
    dataset = dataset.filter(lambda row: len(row["tgt_ids"]) > 2)
    columns = TokenColumns(dataset)
    assert len(columns) == len(dataset)
    sampler = TokenBatchSampler.for_columns(columns, max_tokens=300, seed=1)
    total = 0
    for batch in make_batches(columns, sampler, epoch=1):
        assert batch.src.numel() <= 300 and batch.tgt_in.numel() <= 300
        for row, index in enumerate(batch.indices[:3]):
            example = dataset[index]
            assert tiny_tokenizer.decode(batch.src[row]) == example["src"]
            assert tiny_tokenizer.decode(batch.tgt_out[row]) == example["tgt"]
        total += len(batch)
    assert total == len(dataset) - sampler.skipped
    assert sum(len(b) for b in make_batches(dataset, sampler, epoch=1)) == total
    resumed = list(make_batches(columns, sampler.batches(1)[2:]))  # precomputed order, mid-epoch
    assert [b.indices for b in resumed] == [b.tolist() for b in sampler.batches(1)[2:]]


# ---- real data (skips when absent) --------------------------------------------------------------

def multi30k_dir() -> Path:
    override = os.environ.get("SEQ2SEQ_MULTI30K")
    return Path(override) if override else Path(__file__).resolve().parents[2] / "shared/data/multi30k"


@pytest.mark.skipif(not (multi30k_dir() / "train.de").is_file(), reason="Multi30k not available")
def test_multi30k_loads():
    dd = load_text_dir(multi30k_dir(), "de", "en")
    assert {k: len(v) for k, v in dd.items()} == {"train": 29000, "validation": 1014, "test": 1000}
    cleaned, stats = clean_corpus(dd)
    assert stats["train"]["kept"] > 28900 and len(cleaned["test"]) == 1000
    assert "Männer" in cleaned["train"][0]["src"]
