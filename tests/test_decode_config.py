"""One decoding configuration down to the search: every ``DecodeConfig`` field given to
``Translator.translate`` (or as the translator's default) reaches the search or the encoding, and the
CTranslate2 engine reads the same fields with the same defaults."""
from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import pytest

import seq2seq.decoding.translator as translator_module
from seq2seq.config import DecodeConfig
from seq2seq.decoding.translator import Translator

TRANSFORMER = Path(__file__).parent / "data" / "pre-tiers" / "transformer.pt"
LONG = " ".join(["nine hundred and ninety-nine thousand"] * 8)

#: a value other than the default for every field (sampling fields with sample=True, searches without)
SEARCH_VALUES = {"beam_size": 3, "length_penalty": 0.6, "n_best": 2, "batch_size": 7, "max_output_ratio": 2.5,
                 "max_output_offset": 4, "max_input_tokens": 9, "ordered_constraints": True, "beam_stop": "likely"}
SAMPLE_VALUES = {"sample": True, "top_k": 3, "top_p": 0.8, "temperature": 1.7, "seed": 5}


@pytest.fixture(scope="module")
def translator() -> Translator:
    return Translator.from_checkpoint(TRANSFORMER, device="cpu")


def test_every_field_is_covered_here():
    assert set(SEARCH_VALUES) | set(SAMPLE_VALUES) == {f.name for f in dataclasses.fields(DecodeConfig)}


@pytest.mark.parametrize("values", [SEARCH_VALUES, SAMPLE_VALUES], ids=["search", "sampling"])
def test_every_decode_field_given_to_translate_reaches_the_search(translator, monkeypatch, values):
    """The DecodeConfig the search receives carries every field as given (a field dropped or renamed on
    the way, as ``max_input_tokens`` once was, fails here)."""
    seen = []
    real = translator_module.translate_batch
    monkeypatch.setattr(translator_module, "translate_batch",
                        lambda model, batch, decode, **kw: seen.append(decode) or real(model, batch, decode, **kw))
    translator.translate(["twenty-one", "three hundred and five"], need_attention=False, **values)
    assert seen and all(getattr(decode, name) == value for decode in seen for name, value in values.items())


def test_max_input_tokens_cuts_the_input_per_call_and_by_default(translator, caplog):
    with caplog.at_level(logging.WARNING, logger="seq2seq"):
        (cut,) = translator.translate([LONG], beam_size=1, max_input_tokens=5)
    assert cut.attention.shape[-1] == 5 + 1  # five subwords and the EOS
    assert "first 5" in caplog.text
    (whole,) = translator.translate([LONG], beam_size=1)
    assert whole.attention.shape[-1] == len(translator.tokenizer.encode(LONG)) + 1 > 6
    default = Translator.from_checkpoint(TRANSFORMER, device="cpu", max_input_tokens=7)
    assert default.translate([LONG], beam_size=1)[0].attention.shape[-1] == 7 + 1
    assert default.translate([LONG], beam_size=1, max_input_tokens=12)[0].attention.shape[-1] == 12 + 1


def test_the_output_bound_is_ratio_times_source_plus_offset(translator):
    """An untrained-looking long output is cut at ceil(ratio x source subwords with EOS) + offset."""
    for ratio, offset in ((0.5, 0), (0.5, 3), (1.0, 1)):
        (t,) = translator.translate([LONG], beam_size=1, max_input_tokens=6, max_output_ratio=ratio,
                                    max_output_offset=offset)
        assert len(t.tokens) <= -(-7 * ratio // 1) + offset


def test_translator_options_are_named_errors(translator):
    from seq2seq.errors import UserError

    with pytest.raises(UserError, match="unknown option.*beam_sise"):
        Translator.from_checkpoint(TRANSFORMER, device="cpu", beam_sise=3)
    with pytest.raises(UserError, match="--max-output-offset must be >= 0"):
        translator.translate(["seven"], max_output_offset=-1)


def test_ctranslate2_reads_the_same_decoding_defaults(tmp_path):
    """``CTranslate2Translator.translate`` with no options decodes as ``DecodeConfig()`` says (beam 5, GNMT
    alpha 1), as ``Translator(engine="ctranslate2")`` does; and its bound is ratio x source + offset."""
    pytest.importorskip("ctranslate2")
    import shutil

    from seq2seq.cli.export import main as export_main
    from seq2seq.decoding.ctranslate2 import CTranslate2Translator
    from seq2seq.toy import toy_corpus

    checkpoint = Path(shutil.copy(TRANSFORMER, tmp_path / "model.pt"))
    assert export_main(["--format", "ctranslate2", str(checkpoint), str(tmp_path / "ct2")]) == 0
    sources = list(toy_corpus(n_train=10, n_valid=10, n_test=20, seed=11)["test"]["src"])
    plain = CTranslate2Translator(tmp_path / "ct2").translate(sources)
    engine = Translator.from_checkpoint(checkpoint, device="cpu", engine="ctranslate2")
    assert plain == [t.text for t in engine.translate(sources, need_attention=False)]
    assert plain == CTranslate2Translator(tmp_path / "ct2").translate(sources, DecodeConfig())
    short = CTranslate2Translator(tmp_path / "ct2").translate([LONG], beam_size=1, max_input_tokens=6,
                                                            max_output_ratio=0.5, max_output_offset=0)
    assert len(engine.tokenizer.encode(short[0])) <= 4  # ceil(7 x 0.5) + 0
