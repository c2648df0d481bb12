"""Shared fixtures: a tiny parallel corpus and a SentencePiece model trained on it (fast)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from seq2seq.tokenizer import Tokenizer
from seq2seq.toy import toy_corpus

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))  # the benchmark scripts

TINY_TEXTS = [
    "Zwei junge weiße Männer sind im Freien in der Nähe vieler Büsche.",
    "Two young, white males are outside near many bushes.",
    "Ein Mädchen (7 Jahre alt) läuft über die Straße!",
    "A girl (7 years old) runs across the street!",
    "Größere Hunde spielen am Fluss; 3 Kinder schauen zu.",
    "Bigger dogs play by the river; 3 children watch.",
    "Der Preis beträgt 12,50 Euro – oder 15 Dollar?",
    "The price is 12.50 euros - or 15 dollars?",
]


@pytest.fixture(scope="session")
def toy_dd():
    """A small toy corpus (English -> German number words)."""
    return toy_corpus(n_train=300, n_valid=20, n_test=20, seed=3)


@pytest.fixture(scope="session")
def tiny_tokenizer(toy_dd) -> Tokenizer:
    """A joint model over the toy corpus plus a few German/English sentences."""
    texts = list(toy_dd["train"]["src"]) + list(toy_dd["train"]["tgt"]) + TINY_TEXTS * 5
    return Tokenizer.train(texts, vocab_size=200, model_type="unigram")


@pytest.fixture(scope="module")
def batch():
    """Six reversal-task sources of 1-6 symbols (+ EOS), padded: (src, mask) for the search tests."""
    from test_models import reverse_batch

    src, mask, _, _ = reverse_batch(6, torch.Generator().manual_seed(7), 1, 6)
    return src, mask


@pytest.fixture(autouse=True, scope="session")
def _one_thread():
    """Tests use tiny tensors: one thread is fastest and does not fight other processes for cores."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
