import json
import logging
import pickle

import pytest
import torch

from conftest import TINY_TEXTS
from seq2seq.errors import UserError
from seq2seq.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID, Tokenizer, load_or_train_tokenizer


def test_special_ids_and_pieces(tiny_tokenizer):
    assert (PAD_ID, UNK_ID, BOS_ID, EOS_ID) == (0, 1, 2, 3)
    assert tiny_tokenizer.pieces([0, 1, 2, 3]) == ["<pad>", "<unk>", "<s>", "</s>"]
    assert 50 < tiny_tokenizer.vocab_size <= 200


def test_encode_never_produces_specials(tiny_tokenizer):
    for text in TINY_TEXTS + ["three hundred and forty-five", "drei hundert fünf und vierzig"]:
        ids = tiny_tokenizer.encode(text)
        assert ids and min(ids) >= 4, (text, ids)  # no pad/unk/bos/eos for seen characters
    assert tiny_tokenizer.encode_batch(TINY_TEXTS) == [tiny_tokenizer.encode(t) for t in TINY_TEXTS]


@pytest.mark.parametrize("text", TINY_TEXTS + ["Größere Mädchen über 15; süße Hunde (12,50 Euro)?!"])
def test_round_trip_exact(tiny_tokenizer, text):
    assert tiny_tokenizer.decode(tiny_tokenizer.encode(text)) == text


def test_whitespace_is_normalized(tiny_tokenizer):
    """Documented: nmt_nfkc collapses runs of spaces and strips the ends."""
    assert tiny_tokenizer.decode(tiny_tokenizer.encode("  zwei   Männer ")) == "zwei Männer"


def test_unseen_characters_become_unk(tiny_tokenizer):
    assert UNK_ID in tiny_tokenizer.encode("Ωmega")


def test_decode_drops_specials_and_stops_at_eos(tiny_tokenizer):
    ids = tiny_tokenizer.encode("Bigger dogs play.")
    assert tiny_tokenizer.decode([BOS_ID] + ids + [EOS_ID] + ids + [PAD_ID]) == "Bigger dogs play."
    assert tiny_tokenizer.decode(torch.tensor([BOS_ID] + ids + [EOS_ID, PAD_ID])) == "Bigger dogs play."
    assert tiny_tokenizer.decode_batch([ids + [EOS_ID], [EOS_ID] + ids]) == ["Bigger dogs play.", ""]


def test_bytes_pickle_save_load(tiny_tokenizer, tmp_path):
    text = TINY_TEXTS[0]
    clone = Tokenizer.from_bytes(tiny_tokenizer.to_bytes())
    assert clone.encode(text) == tiny_tokenizer.encode(text) and clone == tiny_tokenizer
    assert pickle.loads(pickle.dumps(tiny_tokenizer)).encode(text) == tiny_tokenizer.encode(text)
    path = tmp_path / "sub" / "spm.model"
    tiny_tokenizer.save(path)
    assert Tokenizer.load(path).encode(text) == tiny_tokenizer.encode(text)
    assert [p.name for p in path.parent.iterdir()] == ["spm.model"]  # no temp file left


def test_load_missing_or_corrupt(tmp_path):
    with pytest.raises(UserError, match="no such file"):
        Tokenizer.load(tmp_path / "nope.model")
    bad = tmp_path / "bad.model"
    bad.write_bytes(b"not a model")
    with pytest.raises(UserError, match="bad.model"):
        Tokenizer.load(bad)


@pytest.mark.parametrize("model_type", ["unigram", "bpe"])
def test_tiny_corpus_with_big_vocab_works(model_type):
    tok = Tokenizer.train(["hallo welt", "hello world"] * 3, vocab_size=8000, model_type=model_type)
    assert tok.vocab_size < 8000
    assert tok.decode(tok.encode("hello welt")) == "hello welt"


def test_bad_settings_are_user_errors():
    with pytest.raises(UserError, match="--vocab-size"):
        Tokenizer.train(["abcdefghijklmnopqrstuvwxyz"] * 3, vocab_size=12)
    with pytest.raises(UserError, match="--sp-model-type"):
        Tokenizer.train(["abc"], model_type="word-piece")
    with pytest.raises(UserError, match="empty"):
        Tokenizer.train(["", "  "], vocab_size=100)


def test_load_or_train_reuses_and_retrains(tmp_path, monkeypatch, caplog):
    path = tmp_path / "spm.model"
    calls = []

    def texts():
        calls.append(1)
        return iter(TINY_TEXTS * 3)

    caplog.set_level(logging.INFO, logger="seq2seq.tokenizer")
    first = load_or_train_tokenizer(path, texts, vocab_size=120, model_type="unigram", input_sentence_size=1000)
    assert path.is_file() and path.with_suffix(".json").is_file()
    assert "training" in caplog.text

    real_train = Tokenizer.train
    monkeypatch.setattr(Tokenizer, "train", classmethod(lambda *a, **k: pytest.fail("retrained")))
    caplog.clear()
    again = load_or_train_tokenizer(path, texts, vocab_size=120, model_type="unigram", input_sentence_size=1000)
    assert again == first and "reusing" in caplog.text

    monkeypatch.setattr(Tokenizer, "train", real_train)
    caplog.clear()
    bigger = load_or_train_tokenizer(path, texts, vocab_size=150, model_type="unigram", input_sentence_size=1000)
    assert "changed: vocab_size" in caplog.text
    assert json.loads(path.with_suffix(".json").read_text())["vocab_size"] == 150
    assert bigger.vocab_size <= 150  # a tiny corpus may give fewer pieces than asked for

    caplog.clear()
    other_data = load_or_train_tokenizer(path, lambda: iter(TINY_TEXTS[:4] * 3), vocab_size=150,
                                         model_type="unigram", input_sentence_size=1000)
    assert "changed: data_fingerprint" in caplog.text and other_data.vocab_size < bigger.vocab_size
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spm.json", "spm.model"]


def test_load_or_train_with_given_fingerprint_skips_reading_texts(tmp_path):
    path = tmp_path / "spm.model"
    load_or_train_tokenizer(path, lambda: iter(TINY_TEXTS), 100, data_fingerprint="abc")
    reused = load_or_train_tokenizer(path, lambda: pytest.fail("texts read"), 100, data_fingerprint="abc")
    assert reused.vocab_size > 4


def test_load_or_train_failure_leaves_nothing(tmp_path):
    with pytest.raises(UserError, match="--vocab-size"):
        load_or_train_tokenizer(tmp_path / "spm.model", lambda: iter(TINY_TEXTS), vocab_size=10)
    assert list(tmp_path.iterdir()) == []
