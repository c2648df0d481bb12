"""Terminology constraints: every output contains every phrase of its sentence (property over random
inputs and phrases, ordered and unordered, beam and greedy, with a shortlist, a prefix and an ensemble),
from the Python API, ``seq2seq translate --constraints`` and the server; the constraint state machine;
the errors a user meets."""
from __future__ import annotations

import random
from pathlib import Path

import pytest

from seq2seq.cli import main
from seq2seq.decoding.constraints import SentenceConstraints, satisfied
from seq2seq.decoding.translator import Translator
from seq2seq.errors import UserError
from seq2seq.toy import toy_corpus

DATA = Path(__file__).parent / "data" / "pre-tiers"


@pytest.fixture(scope="module")
def sources() -> list[str]:
    return toy_corpus(n_train=10, n_valid=5, n_test=24, seed=23)["test"]["src"]


@pytest.fixture(scope="module")
def words() -> list[str]:
    """Target words of the toy language (German number words)."""
    train = toy_corpus(n_train=300, n_valid=5, n_test=5, seed=3)["train"]["tgt"]
    return sorted({w for line in train for w in line.split()})


def random_constraints(words: list[str], count: int, rng: random.Random) -> list[list[str]]:
    """0-2 phrases of 1-2 words per sentence, unrelated to the source (the hard case)."""
    return [[" ".join(rng.sample(words, rng.randint(1, 2))) for _ in range(rng.randint(0, 2))] for _ in range(count)]


def in_order(text: str, phrases: list[str]) -> bool:
    """Whether the phrases occur one after another (each after the end of the one before)."""
    start = 0
    for phrase in phrases:
        found = text.find(phrase, start)
        if found < 0:
            return False
        start = found + len(phrase)
    return True


def check(translator: Translator, result, phrases: list[str], ordered: bool) -> None:
    for hypothesis in result.alternatives:
        for phrase in phrases:
            assert phrase in hypothesis.text, (hypothesis.text, phrases)
        wanted = SentenceConstraints(tuple(tuple(translator.tokenizer.encode(p)) for p in phrases), ordered)
        assert satisfied(hypothesis.tokens, wanted), (hypothesis.text, phrases)
        if ordered:
            assert in_order(hypothesis.text, phrases), (hypothesis.text, phrases)


# ----------------------------------------------------------------------------- the state machine


def test_a_state_tracks_phrases_met_the_phrase_in_progress_and_what_is_still_needed():
    constraints = SentenceConstraints(((5, 6, 7), (9,)))
    state = constraints.start()
    assert state.needed() == 4 and state.met_tokens() == 0 and state.progress_tokens() == {5, 9}
    state = state.advance(5).advance(6)
    assert state.current == 0 and state.needed() == 2 and state.progress_tokens() == {7, 9}
    assert state.advance(8).needed() == 4  # a different token abandons the phrase: its progress is lost
    assert state.advance(9).met == {1} and state.advance(9).needed() == 3  # ... or starts another one
    state = state.advance(7)
    assert state.met == {0} and state.current == -1 and not state.done and state.progress_tokens() == {9}
    assert state.advance(9).done and state.advance(9).advance(5).done  # met stays met
    assert state.advance(3) == state  # nothing in progress: an unrelated token changes nothing


def test_ordered_constraints_start_only_after_every_earlier_phrase():
    ordered = SentenceConstraints(((5, 6), (9,)), ordered=True)
    state = ordered.start()
    assert state.progress_tokens() == {5} and state.advance(9).met == frozenset()
    assert satisfied([5, 6, 1, 9], ordered) and not satisfied([9, 5, 6], ordered)
    assert satisfied([9, 5, 6], SentenceConstraints(((5, 6), (9,))))
    assert satisfied([1, 2], SentenceConstraints(()))


# ----------------------------------------------------------------------------- the search


@pytest.mark.parametrize("checkpoint", ["transformer.pt", "rnn.pt"])
@pytest.mark.parametrize("mode", [{"beam_size": 4, "n_best": 2}, {"beam_size": 1}])
@pytest.mark.parametrize("ordered", [False, True])
def test_every_output_contains_every_phrase(sources, words, checkpoint, mode, ordered):
    """Property over random inputs and random phrases (seeded), unrelated to the source."""
    translator = Translator.from_checkpoint(DATA / checkpoint, device="cpu")
    rng = random.Random(f"{checkpoint} {ordered} {mode['beam_size']}")  # str seeds are stable; hash() of a str is not
    constraints = random_constraints(words, len(sources), rng)
    results = translator.translate(sources, constraints=constraints, ordered_constraints=ordered,
                                   batch_size=7, **mode)
    for result, phrases in zip(results, constraints):
        check(translator, result, phrases, ordered)


def test_without_phrases_the_search_is_plain_beam_search(sources):
    translator = Translator.from_checkpoint(DATA / "transformer.pt", device="cpu")
    plain = translator.translate(sources, beam_size=4, n_best=2)
    free = translator.translate(sources, beam_size=4, n_best=2, constraints=[[]] * len(sources))
    assert [[h.text for h in t.alternatives] for t in free] == [[h.text for h in t.alternatives] for t in plain]


def test_a_phrase_the_model_would_produce_anyway_costs_nothing(sources):
    translator = Translator.from_checkpoint(DATA / "rnn.pt", device="cpu")
    plain = translator.translate(sources, beam_size=4)
    met = translator.translate(sources, beam_size=4, constraints=[t.text.split()[:1] for t in plain])
    same = sum(a.text == b.text for a, b in zip(plain, met))
    assert same >= 0.8 * len(sources)  # dynamic beam allocation keeps the unconstrained best in reach


def test_constraints_with_a_shortlist_a_prefix_an_ensemble_attention_and_confidence(words, sources):
    from seq2seq.decoding.shortlist import build_from_text

    single = Translator.from_checkpoint(DATA / "rnn.pt", device="cpu")
    train = toy_corpus(n_train=300, n_valid=5, n_test=5, seed=3)["train"]
    shortlist = build_from_text(single.tokenizer, train["src"], train["tgt"])
    single.shortlist = shortlist.with_sizes(1, 2)  # a tiny shortlist that lacks most constraint tokens
    constraints = random_constraints(words, len(sources), random.Random(5))
    for result, phrases in zip(single.translate(sources, beam_size=3, constraints=constraints), constraints):
        check(single, result, phrases, False)
    single.shortlist = None  # log-probabilities over the whole vocabulary, as the confidence pass computes them
    [t] = single.translate(["four hundred and two"], beam_size=3, prefix=["drei "], constraints=[["elf", "acht"]],
                           confidence=True)
    assert t.text.startswith("drei ") and "elf" in t.text and "acht" in t.text
    assert sum(t.token_log_probs) == pytest.approx(t.log_prob, abs=1e-4)
    assert t.attention.shape[2] == len(t.tokens) + 1
    ensemble = Translator.from_checkpoints([DATA / "transformer.pt", DATA / "rnn.pt"], device="cpu")
    [t] = ensemble.translate(["seven"], beam_size=3, constraints=[["tausend neun"]], ordered_constraints=True)
    assert "tausend neun" in t.text


def test_constraint_errors_name_the_line_and_the_fix(sources):
    translator = Translator.from_checkpoint(DATA / "rnn.pt", device="cpu")
    long = " ".join(["neun hundert"] * 12)
    with pytest.raises(UserError, match=r"--constraints line 3: the phrases need \d+ target pieces, but this "
                                        r"input's output may have at most \d+ .*--max-output-ratio"):
        translator.translate(["one", "two", "three"], constraints=[[], [], [long]], first_line=1)
    with pytest.raises(UserError, match="2 constraint lists for 3 sentences"):
        translator.translate(["one", "two", "three"], constraints=[[], []])
    with pytest.raises(UserError, match="not with --sample"):
        translator.translate(["one"], constraints=[["elf"]], sample=True, seed=1)
    with pytest.raises(UserError, match="a list of phrases, got a string"):
        translator.translate(["one"], constraints=["elf"])


def test_translate_command_reads_a_constraints_file(tmp_path, capsys):
    source, constraints, out = tmp_path / "in.txt", tmp_path / "terms.tsv", tmp_path / "out.txt"
    source.write_text("twenty-one\nfour hundred and two\nseven\n", encoding="utf-8")
    constraints.write_text("acht\telf\n\nzwei hundert\tdrei\n", encoding="utf-8")
    assert main(["translate", "--checkpoint", str(DATA / "rnn.pt"), "--input", str(source), "--constraints",
                 str(constraints), "--ordered-constraints", "--output", str(out), "--device", "cpu"]) == 0
    lines = out.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 3 and "acht" in lines[0] and "elf" in lines[0]
    assert in_order(lines[2], ["zwei hundert", "drei"])
    constraints.write_text("acht\n", encoding="utf-8")
    assert main(["translate", "--checkpoint", str(DATA / "rnn.pt"), "--input", str(source), "--constraints",
                 str(constraints), "--output", str(tmp_path / "short.txt"), "--device", "cpu"]) == 2
    assert f"--constraints {constraints} has 1 line but the input {source} has" in capsys.readouterr().err
    assert not (tmp_path / "short.txt").exists()
    assert main(["translate", "--checkpoint", str(DATA / "rnn.pt"), "--ordered-constraints"]) == 2
    assert "give --constraints too" in capsys.readouterr().err


def test_the_server_takes_constraints():
    pytest.importorskip("fastapi")
    pytest.importorskip("httpx")
    from fastapi.testclient import TestClient

    from seq2seq.serve import ServeSettings, create_app

    translator = Translator.from_checkpoint(DATA / "rnn.pt", device="cpu")
    with TestClient(create_app(translator, ServeSettings())) as client:
        answer = client.post("/translate", json={"sentences": ["twenty-one", "seven"], "beam_size": 3,
                                                 "constraints": [["elf", "acht"], []], "ordered_constraints": True})
        wrong = client.post("/translate", json={"sentences": ["twenty-one"], "constraints": [["a"], ["b"]]})
    assert answer.status_code == 200
    first = answer.json()["translations"][0]["translation"]
    assert in_order(first, ["elf", "acht"])
    assert wrong.status_code == 422 and "2 constraint lists for 1 sentence;" in wrong.json()["error"]
