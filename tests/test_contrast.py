"""Contrastive attribution ("why this output rather than that one", Yin & Neubig 2022): every method
but grad-attention explains f_t = log p(y_t | y_<t, x) - log p(y'_t | y'_<t, x). The defining
property: a contrastive attribution is the difference of the two outputs' attributions, row by row,
because each method is linear in the scores it explains (gradients; leave-one-out differences; the
LIME / KernelSHAP least-squares fit over the same seeded coalitions)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from seq2seq.attribution.attribute import attribute, attribute_translation
from seq2seq.attribution.base import subtract_contrast
from seq2seq.cli import main
from seq2seq.config import AttributionConfig
from seq2seq.decoding.translator import Translator
from seq2seq.errors import UserError

DATA = Path(__file__).parent / "data" / "pre-tiers"
OPTIONS = {"gradient": AttributionConfig(), "integrated-gradients": AttributionConfig(ig_steps=4),
           "occlusion": AttributionConfig(), "lime": AttributionConfig(samples=40, seed=2),
           "kernel-shap": AttributionConfig(samples=40, seed=2)}


@pytest.fixture(scope="module")
def translated():
    translator = Translator.from_checkpoint(DATA / "transformer.pt", device="cpu")
    [t] = translator.translate(["four hundred and twenty-two"], beam_size=2)
    return translator, t


@pytest.mark.parametrize("method", list(OPTIONS))
def test_a_contrastive_attribution_is_the_difference_of_the_two(translated, method):
    if method in ("lime", "kernel-shap"):
        pytest.importorskip("captum")
    translator, t = translated
    foil = list(t.tokens)
    foil[0] = next(i for i in range(4, translator.tokenizer.vocab_size) if i != foil[0])  # another first piece
    model, src = translator.model, t.src_tokens
    both = attribute(model, src, t.tokens, method, OPTIONS[method], src_pieces=t.src_pieces, contrast_ids=foil)
    mine = attribute(model, src, t.tokens, method, OPTIONS[method], src_pieces=t.src_pieces)
    theirs = attribute(model, src, foil, method, OPTIONS[method], src_pieces=t.src_pieces)
    np.testing.assert_allclose(both.raw, mine.raw - theirs.raw, rtol=1e-4, atol=1e-6)


def test_rows_past_the_contrasts_end_keep_the_plain_score():
    mine, theirs = np.array([-1.0, -2.0, -3.0]), np.array([-0.5])
    np.testing.assert_array_equal(subtract_contrast(mine, theirs), [-0.5, -2.0, -3.0])
    np.testing.assert_array_equal(subtract_contrast(mine[None], theirs[None]), [[-0.5, -2.0, -3.0]])


def test_grad_attention_has_no_contrast(translated):
    translator, t = translated
    with pytest.raises(UserError, match="no contrastive form"):
        attribute_translation(translator, t, "grad-attention", contrast="drei")


def test_translate_exports_contrastive_attributions(tmp_path, capsys):
    source, contrast, out = tmp_path / "in.txt", tmp_path / "contrast.txt", tmp_path / "align.jsonl"
    source.write_text("twenty-one\nseven\n", encoding="utf-8")
    contrast.write_text("ein und zwanzig\n\n", encoding="utf-8")
    assert main(["translate", "--checkpoint", str(DATA / "rnn.pt"), "--input", str(source), "--output",
                 str(tmp_path / "hyp"), "--alignments", str(out), "--attribution", "gradient", "occlusion",
                 "--contrast", str(contrast), "--device", "cpu"]) == 0
    first, second = (json.loads(line) for line in out.read_text(encoding="utf-8").splitlines())
    assert first["attribution"]["gradient"]["contrast"] == "ein und zwanzig"
    assert first["attribution"]["occlusion"]["contrast"] == "ein und zwanzig"
    assert "contrast" not in second["attribution"]["gradient"]  # an empty line: a plain attribution
    assert main(["translate", "--checkpoint", str(DATA / "rnn.pt"), "--input", str(source), "--output",
                 str(tmp_path / "hyp2"), "--contrast", str(contrast)]) == 2
    assert "--contrast explains translations against alternatives: it needs --attribution" in capsys.readouterr().err
    contrast.write_text("one line\n", encoding="utf-8")
    assert main(["translate", "--checkpoint", str(DATA / "rnn.pt"), "--input", str(source), "--output",
                 str(tmp_path / "hyp3"), "--alignments", str(tmp_path / "a3.jsonl"), "--attribution", "gradient",
                 "--contrast", str(contrast)]) == 2
    assert f"--contrast {contrast} has 1 line but the input {source} has more" in capsys.readouterr().err
    assert not (tmp_path / "hyp3").exists() and not (tmp_path / "a3.jsonl").exists()
