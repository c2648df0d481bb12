"""Files written before the package moved into tiers (tests/data/pre-tiers/, commit 054d7a0) load and
translate exactly as that version did: the same outputs, the same scores, the same alignment."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from seq2seq.decoding.translator import Translator

DATA = Path(__file__).parent / "data" / "pre-tiers"
EXPECTED = json.loads((DATA / "expected.json").read_text(encoding="utf-8"))


@pytest.mark.parametrize("name, arch", [("transformer.pt", "transformer"), ("rnn.pt", "rnn"),
                                        ("transformer-export", "transformer")])
def test_old_checkpoints_translate_as_before(name, arch):
    expected = EXPECTED[arch]
    translator = Translator.from_checkpoint(DATA / name, device="cpu")
    results = translator.translate(expected["sources"], beam_size=3)
    assert [r.text for r in results] == expected["texts"]
    # same kernels, but another CPU may round differently: far below any score gap between beams
    assert [r.score for r in results] == pytest.approx(expected["scores"], abs=1e-4)
    # argmax: the default link method when the expected links were written (it is grow now)
    assert results[0].alignment_record(0, method="argmax").to_json()["pharaoh_word"] == expected["alignment_word_0"]
