"""Per-token confidence: each output's pieces and words with the model's log-probability and the
entropy of its distribution, from the Python API, ``seq2seq translate --output-format jsonl`` and the
server. The defining property: the confidences are the model's log-probabilities, so they add up to
the log-probability the search reports for the whole output."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from seq2seq.cli import main
from seq2seq.decoding.scoring import forced_confidence
from seq2seq.decoding.translator import Translator

OLD_RNN = Path(__file__).parent / "data" / "pre-tiers" / "rnn.pt"
OLD_TRANSFORMER = Path(__file__).parent / "data" / "pre-tiers" / "transformer.pt"
SOURCES = ["twenty-one", "four hundred and two", "seven thousand and nine", ""]


@pytest.fixture(scope="module")
def translator() -> Translator:
    return Translator.from_checkpoint(OLD_TRANSFORMER, device="cpu")


@pytest.mark.parametrize("options", [{"beam_size": 1}, {"beam_size": 4, "n_best": 3},
                                     {"sample": True, "seed": 5, "n_best": 2}])
def test_token_log_probs_add_up_to_the_outputs_log_prob(translator, options):
    for result in translator.translate(SOURCES, confidence=True, **options):
        for t in result.alternatives or [result]:
            if not t.tokens and not t.source:
                assert t.confidence() is None  # an empty input has no output to be sure of
                continue
            assert len(t.token_log_probs) == len(t.token_entropy) == len(t.tgt_pieces) == len(t.tokens) + 1
            assert math.fsum(t.token_log_probs) == pytest.approx(t.log_prob, abs=1e-4)
            assert all(lp <= 0 for lp in t.token_log_probs)
            vocabulary = translator.tokenizer.vocab_size  # entropy of a distribution over V tokens: [0, log V]
            assert all(0 <= h <= math.log(vocabulary) + 1e-4 for h in t.token_entropy)


def test_entropy_is_that_of_the_model_distribution(translator):
    """Against the formula on the model's own teacher-forced distribution, computed here."""
    [t] = translator.translate(["twenty-one"], beam_size=1, confidence=True)
    src = torch.tensor([t.src_tokens])
    tgt_in = torch.tensor([[2] + t.tokens])  # BOS, then the output
    with torch.no_grad():
        logits, _ = translator.model(src, src != 0, tgt_in)
    p = logits[0].float().softmax(-1)  # (T+1, V)
    expected = (-(p * p.log()).sum(-1)).tolist()
    assert t.token_entropy == pytest.approx(expected, abs=1e-5)
    assert t.token_log_probs == pytest.approx(p.log()[range(len(t.tokens) + 1), t.tokens + [3]].tolist(), abs=1e-5)


def test_words_gather_their_pieces(translator):
    [t] = translator.translate(["seven thousand and nine"], beam_size=2, confidence=True)
    confidence = t.confidence()
    assert [c["piece"] for c in confidence["tokens"]] == t.tgt_pieces
    assert "".join(w["word"] for w in confidence["words"][:-1]) == t.text.replace(" ", "")
    assert confidence["words"][-1]["word"] == "</s>"
    assert math.fsum(w["log_prob"] for w in confidence["words"]) == pytest.approx(t.log_prob, abs=1e-4)


def test_ensembles_have_confidence_too():
    ensemble = Translator.from_checkpoints([OLD_TRANSFORMER, OLD_TRANSFORMER], device="cpu")
    [t] = ensemble.translate(["twenty-one"], beam_size=2, confidence=True)
    assert math.fsum(t.token_log_probs) == pytest.approx(t.log_prob, abs=1e-4)


def test_forced_confidence_is_per_row(translator):
    src = torch.tensor([[5, 6, 3], [7, 3, 0]])
    rows = forced_confidence(translator.model.eval(), src, src != 0, [[9, 10, 11], [12]])
    assert [tuple(lp.shape) for lp, _ in rows] == [(4,), (2,)]


def test_translate_writes_jsonl_with_confidence(tmp_path, capsys):
    source = tmp_path / "in.txt"
    source.write_text("\n".join(SOURCES) + "\n", encoding="utf-8")
    out = tmp_path / "out.jsonl"
    assert main(["translate", "--checkpoint", str(OLD_RNN), "--input", str(source), "--output", str(out),
                 "--output-format", "jsonl", "--beam-size", "3", "--n-best", "2", "--device", "cpu"]) == 0
    lines = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert [r["index"] for r in lines] == [0, 1, 2, 3] and [r["source"] for r in lines] == SOURCES
    first = lines[0]
    assert math.fsum(c["log_prob"] for c in first["tokens"]) == pytest.approx(first["log_prob"], abs=1e-4)
    assert first["n_best"][0]["translation"] == first["translation"] and len(first["n_best"]) == 2
    assert lines[3]["translation"] == "" and lines[3]["tokens"] == [] and lines[3]["words"] == []


def test_the_server_returns_confidence_on_request(translator):
    pytest.importorskip("fastapi")
    pytest.importorskip("httpx")
    from fastapi.testclient import TestClient

    from seq2seq.serve import ServeSettings, create_app

    with TestClient(create_app(translator, ServeSettings())) as client:
        plain = client.post("/translate", json={"sentences": ["twenty-one"]}).json()["translations"][0]
        asked = client.post("/translate", json={"sentences": ["twenty-one", ""], "confidence": True, "n_best": 2,
                                                "beam_size": 2}).json()["translations"]
    assert "confidence" not in plain or plain["confidence"] is None
    best = asked[0]
    assert [c["piece"] for c in best["confidence"]["tokens"]][-1] == "</s>"
    assert math.fsum(c["log_prob"] for c in best["confidence"]["tokens"]) == pytest.approx(best["log_prob"], abs=1e-4)
    assert best["alternatives"][0]["confidence"]["words"]
    assert asked[1]["confidence"] == {"tokens": [], "words": []}


def test_the_viewer_shades_target_words_by_confidence(tmp_path):
    import re

    source = tmp_path / "in.txt"
    source.write_text("twenty-one\nfour hundred and two\n", encoding="utf-8")
    html, jsonl = tmp_path / "view.html", tmp_path / "align.jsonl"
    assert main(["translate", "--checkpoint", str(OLD_TRANSFORMER), "--input", str(source), "--output",
                 str(tmp_path / "out.txt"), "--html", str(html), "--alignments", str(jsonl), "--device", "cpu"]) == 0
    text = html.read_text(encoding="utf-8")
    data = json.loads(re.search(r'<script type="application/json" id="viewer-data">(.*?)</script>', text, re.S)[1])
    records = [json.loads(line) for line in jsonl.read_text(encoding="utf-8").splitlines()]
    for sentence, record in zip(data["sentences"], records):
        words = sentence["confidence"]["word"]
        assert len(words["log_prob"]) == len(record["tgt_words"])  # EOS dropped with the labels
        expected = [round(w["log_prob"], 4) for w in record["confidence"]["words"][: len(record["tgt_words"])]]
        assert words["log_prob"] == expected
    assert "sure.log_prob[j]" in text  # the page shades what it is given
