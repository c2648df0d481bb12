"""Target prefixes: every output starts with its prefix verbatim, for greedy, beam, sampling and
ensembles, from the Python API, ``seq2seq translate --prefix`` and the server; a prefix that ends
inside a word is completed; a prefix that ends in whitespace ends a word."""
from __future__ import annotations

import random
from pathlib import Path

import pytest

from seq2seq.cli import main
from seq2seq.decoding.translator import Translator
from seq2seq.errors import UserError
from seq2seq.toy import toy_corpus

DATA = Path(__file__).parent / "data" / "pre-tiers"
MODES = {"greedy": {"beam_size": 1}, "beam": {"beam_size": 3, "n_best": 2},
         "sampling": {"sample": True, "seed": 3, "n_best": 2, "temperature": 1.5}}


@pytest.fixture(scope="module")
def pairs() -> list[tuple[str, str]]:
    test = toy_corpus(n_train=10, n_valid=5, n_test=40, seed=17)["test"]
    return list(zip(test["src"], test["tgt"]))


def random_prefix(reference: str, rng: random.Random) -> str:
    """A cut of the reference at a random character: inside a word, after one, or after a space."""
    return reference[: rng.randrange(1, len(reference) + 1)]


def check_starts_with(output: str, prefix: str) -> None:
    assert output.startswith(prefix.rstrip()), (output, prefix)
    if prefix[-1].isspace():  # the prefix ended a word: no piece glued to it
        assert output == prefix.rstrip() or output[len(prefix.rstrip())] == " ", (output, prefix)


@pytest.mark.parametrize("checkpoint", ["transformer.pt", "rnn.pt"])
@pytest.mark.parametrize("mode", list(MODES))
def test_every_output_starts_with_its_prefix(pairs, checkpoint, mode):
    """Property over random prefixes (seeded): cut from the reference at any character."""
    translator = Translator.from_checkpoint(DATA / checkpoint, device="cpu")
    rng = random.Random(11)
    prefixes = [random_prefix(reference, rng) for _, reference in pairs]
    results = translator.translate([source for source, _ in pairs], prefix=prefixes, **MODES[mode])
    for result, prefix in zip(results, prefixes):
        for hypothesis in result.alternatives:
            check_starts_with(hypothesis.text, prefix)


def test_prefixes_work_for_ensembles_and_keep_attention_and_confidence():
    ensemble = Translator.from_checkpoints([DATA / "transformer.pt", DATA / "rnn.pt"], device="cpu")
    [t] = ensemble.translate(["four hundred and two"], beam_size=2, prefix=["vier hundert zw"], confidence=True)
    check_starts_with(t.text, "vier hundert zw")
    assert t.text.split()[2].startswith("zw")  # the open word is completed, not cut
    single = Translator.from_checkpoint(DATA / "transformer.pt", device="cpu")
    [t] = single.translate(["four hundred and two"], beam_size=2, prefix=["drei "], confidence=True)
    assert t.text.startswith("drei ") and t.attention.shape[2] == len(t.tgt_pieces) == len(t.tokens) + 1
    assert sum(t.token_log_probs) == pytest.approx(t.log_prob, abs=1e-4)  # the prefix's own log-probability


def test_an_empty_prefix_changes_nothing(pairs):
    translator = Translator.from_checkpoint(DATA / "rnn.pt", device="cpu")
    sources = [source for source, _ in pairs[:8]]
    free = [t.text for t in translator.translate(sources, beam_size=3)]
    assert [t.text for t in translator.translate(sources, beam_size=3, prefix=[""] * 8)] == free


def test_prefix_count_must_match(pairs):
    translator = Translator.from_checkpoint(DATA / "rnn.pt", device="cpu")
    with pytest.raises(UserError, match="2 prefixes for 3 sentences"):
        translator.translate(["a", "b", "c"], prefix=["x", "y"])


def test_translate_command_reads_a_prefix_file(tmp_path, capsys):
    source, prefixes, out = tmp_path / "in.txt", tmp_path / "prefix.txt", tmp_path / "out.txt"
    source.write_text("twenty-one\nfour hundred and two\nseven\n", encoding="utf-8")
    prefixes.write_text("drei\n\nacht und \n", encoding="utf-8")
    assert main(["translate", "--checkpoint", str(DATA / "rnn.pt"), "--input", str(source), "--prefix",
                 str(prefixes), "--output", str(out), "--device", "cpu"]) == 0
    lines = out.read_text(encoding="utf-8").splitlines()
    assert lines[0].startswith("drei") and lines[2].startswith("acht und")
    prefixes.write_text("drei\n\n", encoding="utf-8")
    assert main(["translate", "--checkpoint", str(DATA / "rnn.pt"), "--input", str(source), "--prefix",
                 str(prefixes), "--output", str(tmp_path / "short.txt"), "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert f"--prefix {prefixes} has 2 lines but the input {source} has more" in err
    assert not (tmp_path / "short.txt").exists()  # nothing half-written


def test_the_server_takes_prefixes():
    pytest.importorskip("fastapi")
    pytest.importorskip("httpx")
    from fastapi.testclient import TestClient

    from seq2seq.serve import ServeSettings, create_app

    translator = Translator.from_checkpoint(DATA / "rnn.pt", device="cpu")
    with TestClient(create_app(translator, ServeSettings())) as client:
        answer = client.post("/translate", json={"sentences": ["twenty-one", "seven"],
                                                 "prefixes": ["neun und zw", ""], "beam_size": 2})
        wrong = client.post("/translate", json={"sentences": ["twenty-one"], "prefixes": ["a", "b"]})
    assert answer.status_code == 200
    first = answer.json()["translations"][0]["translation"]
    assert first.startswith("neun und zw") and first.split()[2].startswith("zw")
    assert wrong.status_code == 422 and "2 prefixes for 1 sentence;" in wrong.json()["error"]
