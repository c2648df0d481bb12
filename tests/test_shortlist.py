"""Lexical shortlists: IBM Model 1 tables, batch vocabularies, restricted search, files and CLI."""
from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch

from seq2seq.errors import UserError
from seq2seq.config import DecodeConfig
from seq2seq.decoding.generator import SearchBatch
from seq2seq.decoding.search import translate_batch
from seq2seq.decoding.vocabulary import OutputVocabulary
from seq2seq.cli.shortlist import main as shortlist_main
from seq2seq.decoding.shortlist import Shortlist, ibm1_table
from test_models import BOS, EOS, PAD, VOCAB, reverse_batch, trained_once

V = 40  # token ids 4..39 are ordinary
TRANSLATE = {s: (s * 7) % 36 + 4 for s in range(4, V)}  # a bijection on the ordinary ids


def _parallel(n: int, seed: int = 0) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Sentences of 3-7 random source tokens, targets their word-by-word translations shuffled."""
    rng = np.random.default_rng(seed)
    src, tgt = [], []
    for _ in range(n):
        s = rng.integers(4, V, rng.integers(3, 8))
        src.append(np.append(s, EOS))  # sources end in EOS as encoded corpora do
        tgt.append(rng.permutation([TRANSLATE[int(x)] for x in s]))
    return src, tgt


def test_ibm1_finds_the_translations_and_is_a_distribution():
    src, tgt = _parallel(600)
    pair_src, pair_tgt, prob = ibm1_table(src, tgt, V, iterations=5)
    assert np.allclose(np.bincount(pair_src, weights=prob)[4:V], 1.0)  # sum_t t(t | s) = 1
    for s in range(4, V):
        rows = pair_src == s
        assert pair_tgt[rows][np.argmax(prob[rows])] == TRANSLATE[s]
    assert pair_tgt.min() >= 4  # specials (EOS in the sources) never enter the table


def test_chunked_estimation_equals_one_pass():
    src, tgt = _parallel(300, seed=1)
    whole = ibm1_table(src, tgt, V, chunk=10_000)
    chunked = ibm1_table(src, tgt, V, chunk=7)
    for a, b in zip(whole, chunked):
        np.testing.assert_allclose(a, b)


def test_batch_vocabulary_holds_eos_frequent_sources_and_their_translations():
    src, tgt = _parallel(600)
    shortlist = Shortlist.build(src, tgt, V, "tok", max_translations=3, max_frequent=5).with_sizes(1, 2)
    batch = torch.tensor([[5, 9, EOS, PAD], [6, EOS, PAD, PAD]])
    ids = shortlist.vocabulary(batch, batch != PAD).tolist()
    # the 2 most frequent target tokens counted here (ties: the lower id), not read off the shortlist:
    # catches a wrong frequency ranking (e.g. least frequent first, or counting the sources)
    counts = Counter(int(t) for sentence in tgt for t in sentence)
    frequent = sorted(counts, key=lambda t: (-counts[t], t))[:2]
    assert counts[frequent[1]] > sorted(counts.values(), reverse=True)[2]  # no tie at the cut
    expected = {EOS, 5, 9, 6, TRANSLATE[5], TRANSLATE[9], TRANSLATE[6], *frequent}
    assert ids == sorted(expected)
    assert PAD not in ids and BOS not in ids
    assert len(shortlist.with_sizes(3, 5).vocabulary(batch, batch != PAD)) > len(ids)


def test_save_load_round_trip_and_errors(tmp_path):
    src, tgt = _parallel(100)
    shortlist = Shortlist.build(src, tgt, V, "abc", max_translations=4, max_frequent=6).with_sizes(2, 3)
    path = tmp_path / "shortlist.npz"
    shortlist.save(path)
    back = Shortlist.load(path, tokenizer="abc")
    np.testing.assert_array_equal(back.translations, shortlist.translations)
    np.testing.assert_array_equal(back.frequent, shortlist.frequent)
    assert (back.translations_per_token, back.frequent_tokens) == (2, 3)
    with pytest.raises(UserError, match="another SentencePiece model"):
        Shortlist.load(path, tokenizer="xyz")
    with pytest.raises(UserError, match="no such file.*seq2seq shortlist"):
        Shortlist.load(tmp_path / "absent.npz")
    (tmp_path / "bad.npz").write_bytes(b"not a zip file")
    with pytest.raises(UserError, match="bad.npz"):
        Shortlist.load(tmp_path / "bad.npz")
    with pytest.raises(UserError, match=">= 0"):
        shortlist.with_sizes(-1, 3)


# ------------------------------------------------------------------- search over a vocabulary

ALL = torch.arange(VOCAB)


@pytest.fixture(scope="module", params=["bahdanau", "transformer-pre"])
def model(request):
    return trained_once(request.param, {"bahdanau": 25, "transformer-pre": 40}[request.param], 1e-2)


@pytest.fixture(scope="module")
def batch():
    src, mask, _, _ = reverse_batch(6, torch.Generator().manual_seed(7), 1, 6)
    return src, mask


def test_full_vocabulary_decodes_exactly_like_no_vocabulary(model, batch):
    for decode in (DecodeConfig(beam_size=1), DecodeConfig(beam_size=3, n_best=2)):
        plain = translate_batch(model, SearchBatch(*batch), decode, need_attention=False)
        listed = translate_batch(model, SearchBatch(*batch, vocabulary=ALL), decode, need_attention=False)
        for p_sent, l_sent in zip(plain, listed):
            assert [h.tokens for h in p_sent] == [h.tokens for h in l_sent]
            assert [h.log_prob for h in p_sent] == pytest.approx([h.log_prob for h in l_sent], abs=1e-5)


def test_restricted_search_uses_only_the_vocabulary_renormalised(model, batch):
    src, mask = batch
    ids = torch.tensor([EOS] + sorted(set(src[0].tolist()) - {PAD, EOS, BOS}))  # the first source's tokens
    for hyps in (translate_batch(model, SearchBatch(src, mask, vocabulary=ids)),
                 translate_batch(model, SearchBatch(src, mask, vocabulary=ids), DecodeConfig(beam_size=3, n_best=3))):
        for i, sentence in enumerate(hyps):
            length = int(mask[i].sum())
            for h in sentence:
                assert set(h.tokens) <= set(ids.tolist())
                with torch.no_grad():  # teacher-forced, softmax over the vocabulary only
                    logits, _ = model.eval()(src[i:i + 1, :length], mask[i:i + 1, :length],
                                             torch.tensor([[BOS] + h.tokens]))
                logp = logits[0][:, ids].log_softmax(-1)
                columns = torch.tensor([ids.tolist().index(t) for t in h.tokens + [EOS]])
                assert h.log_prob == pytest.approx(logp.gather(1, columns[:, None]).sum().item(), abs=1e-4)
                assert h.attention is not None  # attention export works as without a shortlist


def test_output_vocabulary_rejects_bad_ids(model):
    for bad in (torch.tensor([EOS, 5, 5]), torch.tensor([5, 6]), torch.tensor([[EOS, 5]])):
        with pytest.raises(ValueError):
            OutputVocabulary(model, bad)


# ------------------------------------------------------------------------------ the CLI


def test_cli_errors_name_the_files(tmp_path, capsys, tiny_tokenizer):
    from seq2seq.checkpoint.file import save_checkpoint
    from seq2seq.checkpoint.parts import bytes_to_tensor

    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("x\ny\n", encoding="utf-8")
    b.write_text("x\n", encoding="utf-8")
    assert shortlist_main(["--checkpoint", str(tmp_path / "none.pt"), "--source", str(a), "--target", str(b)]) == 2
    assert "no such file" in capsys.readouterr().err
    # A readable checkpoint (the CLI reads only its config and tokenizer): now the line counts are what
    # is refused, the message naming both files and their counts (catches a message that drops one).
    checkpoint = tmp_path / "run" / "best.pt"
    checkpoint.parent.mkdir()
    save_checkpoint(checkpoint, {"config": {}, "tokenizer": bytes_to_tensor(tiny_tokenizer.to_bytes()), "model": {}})
    assert shortlist_main(["--checkpoint", str(checkpoint), "--source", str(a), "--target", str(b)]) == 2
    err = " ".join(capsys.readouterr().err.split())  # however the message is wrapped
    assert f"--source {a} has 2 lines but --target {b} has 1; the files must be line-aligned" in err
    assert not (checkpoint.parent / "shortlist.npz").exists()


def test_training_never_fails_because_of_the_shortlist(tmp_path, monkeypatch, capsys):
    from types import SimpleNamespace

    from seq2seq.decoding import shortlist
    from seq2seq.training import run as training

    def fail(*args, **kwargs):
        raise UserError("cannot build a shortlist: the training targets have no ordinary tokens")

    monkeypatch.setattr(shortlist, "build_for_run", fail)
    corpus = SimpleNamespace(tokenizer=SimpleNamespace(sha256=lambda: "x"), columns={"train": None})
    training._write_shortlist(corpus, tmp_path, quiet=False)
    assert not (tmp_path / "shortlist.npz").exists()
    assert "no ordinary tokens" in capsys.readouterr().err


def test_translations_are_counted_among_tokens_not_already_frequent():
    translations = np.full((12, 4), -1, dtype=np.int32)
    translations[5] = [4, 9, 6, 10]  # best first; 4 and 6 are frequent
    shortlist = Shortlist(translations, np.array([4, 6, 7], dtype=np.int32), "tok", translations_per_token=2,
                          frequent_tokens=2)
    batch = torch.tensor([[5, EOS]])
    assert shortlist.vocabulary(batch, batch != PAD).tolist() == [EOS, 4, 5, 6, 9, 10]
    assert shortlist.with_sizes(1, 1).vocabulary(batch, batch != PAD).tolist() == [EOS, 4, 5, 9]
