import numpy as np
import pytest

from seq2seq.data import load_text_dir
from seq2seq.toy import english, german, sample_numbers, toy_corpus, write_toy_corpus

KNOWN = {
    0: ("zero", "null", "null"),
    1: ("one", "eins", "eins"),
    16: ("sixteen", "sechzehn", "sechzehn"),
    17: ("seventeen", "siebzehn", "siebzehn"),
    21: ("twenty-one", "ein und zwanzig", "einundzwanzig"),
    30: ("thirty", "dreißig", "dreißig"),
    67: ("sixty-seven", "sieben und sechzig", "siebenundsechzig"),
    76: ("seventy-six", "sechs und siebzig", "sechsundsiebzig"),
    101: ("one hundred and one", "ein hundert eins", "einhunderteins"),
    1001: ("one thousand and one", "ein tausend eins", "eintausendeins"),
    21000: ("twenty-one thousand", "ein und zwanzig tausend", "einundzwanzigtausend"),
    101001: ("one hundred and one thousand and one", "ein hundert ein tausend eins",
             "einhunderteintausendeins"),
    345607: ("three hundred and forty-five thousand six hundred and seven",
             "drei hundert fünf und vierzig tausend sechs hundert sieben",
             "dreihundertfünfundvierzigtausendsechshundertsieben"),
    999999: ("nine hundred and ninety-nine thousand nine hundred and ninety-nine",
             "neun hundert neun und neunzig tausend neun hundert neun und neunzig",
             "neunhundertneunundneunzigtausendneunhundertneunundneunzig"),
}
GERMAN_WORDS = set(
    "null eins ein zwei drei vier fünf sechs sieben acht neun zehn elf zwölf dreizehn vierzehn "
    "fünfzehn sechzehn siebzehn achtzehn neunzehn zwanzig dreißig vierzig fünfzig sechzig siebzig "
    "achtzig neunzig und hundert tausend".split()
)


@pytest.mark.parametrize("n", sorted(KNOWN))
def test_known_numbers(n):
    en, de_spaced, de_compound = KNOWN[n]
    assert english(n) == en
    assert german(n) == de_spaced
    assert german(n, spaced=False) == de_compound


def test_spelling_and_compounds_over_a_range():
    for n in list(range(0, 1200)) + list(range(20_000, 1_000_000, 7919)):
        words = german(n).split()
        assert set(words) <= GERMAN_WORDS, n
        assert german(n, spaced=False) == "".join(words)
        assert words[-1] != "ein" and "eins" not in words[:-1], n  # "eins" only at the very end
    with pytest.raises(ValueError):
        german(1_000_000)


def test_toy_corpus_deterministic_and_disjoint():
    a = toy_corpus(n_train=500, n_valid=50, n_test=50, seed=7)
    b = toy_corpus(n_train=500, n_valid=50, n_test=50, seed=7)
    c = toy_corpus(n_train=500, n_valid=50, n_test=50, seed=8)
    assert {k: len(v) for k, v in a.items()} == {"train": 500, "validation": 50, "test": 50}
    assert a["train"]["src"] == b["train"]["src"] and a["test"]["tgt"] == b["test"]["tgt"]
    assert a["train"]["src"] != c["train"]["src"]
    splits = [set(a[s]["src"]) for s in ("train", "validation", "test")]
    assert sum(map(len, splits)) == 600 == len(set.union(*splits))
    numbers = sample_numbers(600, seed=7)[:500]
    assert a["train"]["src"] == [english(int(n)) for n in numbers]
    assert a["train"]["tgt"] == [german(int(n)) for n in numbers]


def test_magnitudes_are_mixed():
    digits = np.bincount([len(str(n)) for n in sample_numbers(2000, seed=1)], minlength=7)[1:]
    assert digits[0] == 10 and all(digits[1:] > 50)  # all of 0..9, and plenty of each magnitude


def test_write_toy_corpus_round_trips(tmp_path):
    write_toy_corpus(tmp_path, n_train=40, n_valid=5, n_test=5, seed=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        f"{s}.{l}" for s in ("train", "val", "test") for l in ("en", "de"))
    loaded = load_text_dir(tmp_path, "en", "de", {"test": "test"})
    expected = toy_corpus(n_train=40, n_valid=5, n_test=5, seed=2)
    for split in ("train", "validation", "test"):
        assert loaded[split]["src"] == expected[split]["src"]
        assert loaded[split]["tgt"] == expected[split]["tgt"]


def test_the_toy_vocabulary_is_what_the_training_guide_says():
    """The toy preset asks for 400 pieces, an upper bound: its corpus's number words and letters make 101
    (SentencePiece with ``hard_vocab_limit`` off), and the training guide says so (it said "a 400-piece
    vocabulary" while the log said 101)."""
    from pathlib import Path

    from seq2seq.config import PRESETS
    from seq2seq.tokenizer import Tokenizer

    train = toy_corpus()["train"]
    asked = PRESETS["toy"]["data"]["vocab_size"]
    pieces = Tokenizer.train([*train["src"], *train["tgt"]], asked).vocab_size
    assert (asked, pieces) == (400, 101)
    guide = (Path(__file__).resolve().parents[1] / "docs" / "guides" / "training.md").read_text(encoding="utf-8")
    guide = " ".join(guide.split())
    assert "at most 400 pieces" in guide and "400-piece" not in guide
    assert "(vocab 101, fewer than the 400 asked" in guide


def test_the_tokenizer_log_says_when_the_corpus_made_fewer_pieces_than_asked(tmp_path, caplog):
    import logging

    from seq2seq.tokenizer import load_or_train_tokenizer

    train = toy_corpus(n_train=2000, n_valid=5, n_test=5)["train"]
    with caplog.at_level(logging.INFO, logger="seq2seq"):
        tokenizer = load_or_train_tokenizer(tmp_path / "spm.model", lambda: [*train["src"], *train["tgt"]], 400)
    assert f"(vocab {tokenizer.vocab_size}, fewer than the 400 asked: all this corpus supports)" in caplog.text
