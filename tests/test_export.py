"""seq2seq export: the safetensors directory round trip and the CTranslate2 conversion (same
log-probabilities, same greedy and beam outputs), with their error paths."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from seq2seq.cli.export import main as export_main
from seq2seq.config import ModelConfig, RunConfig
from seq2seq.decoding.scoring import teacher_force
from seq2seq.decoding.translator import Translator
from seq2seq.models import build_model
from seq2seq.tokenizer import EOS_ID
from seq2seq.checkpoint.file import load_checkpoint, save_checkpoint
from seq2seq.checkpoint.parts import bytes_to_tensor
from seq2seq.training.run import train
from seq2seq.toy import toy_corpus

TRANSFORMER = {"arch": "transformer", "d_model": 32, "heads": 2, "ff_size": 64, "layers": 2, "dropout": 0.1}
RNN = {"arch": "rnn", "embed_dim": 16, "hidden_size": 16, "decoder_hidden_size": 32}


def _train(root: Path, model: dict, steps: int) -> Path:
    out = root / "run"
    cfg = RunConfig.from_dict({
        "model": model,
        "data": {"toy_size": 300, "vocab_size": 120, "max_tokens": 600, "cache_dir": str(root / "cache")},
        "train": {"max_steps": steps, "eval_every": 0, "warmup_steps": 10, "lr": 3e-3, "log_every": 50,
                  "seed": 3, "threads": 1, "device": "cpu"},
    })
    cfg.output_dir = str(out)
    train(cfg, quiet=True)
    return out


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """A 2-layer Transformer trained long enough on the toy task that its outputs are peaked."""
    return _train(tmp_path_factory.mktemp("export"), TRANSFORMER, 120)


@pytest.fixture(scope="module")
def sources() -> list[str]:
    return list(toy_corpus(n_train=10, n_valid=10, n_test=40, seed=11)["test"]["src"])


def _random_checkpoint(path: Path, tokenizer, seed: int, **model) -> Path:
    """An untrained checkpoint of any configuration (the conversion must hold for every variant)."""
    config = RunConfig(model=ModelConfig(vocab_size=tokenizer.vocab_size, **model)).resolved()
    torch.manual_seed(seed)
    net = build_model(config.model)
    for name, p in net.named_parameters():  # random non-trivial norms and biases, not the 1 / 0 of the init
        if "norm" in name or name.endswith("bias"):
            torch.nn.init.normal_(p, mean=1.0 if name.endswith("norm.weight") else 0.0, std=0.1)
    save_checkpoint(path, {"config": config.to_dict(), "tokenizer": bytes_to_tensor(tokenizer.to_bytes()),
                           "model": net.state_dict()})
    return path


# ------------------------------------------------------------------------------------------ safetensors


@pytest.mark.parametrize("arch", ["transformer", "rnn"])
def test_safetensors_round_trip_translates_the_same_and_holds_no_pickle(tmp_path, tiny_tokenizer, sources, arch):
    options = TRANSFORMER if arch == "transformer" else RNN
    run = tmp_path / "run"
    run.mkdir()
    checkpoint = _random_checkpoint(run / "best.pt", tiny_tokenizer, 4, **{**options, "dropout": 0.0})
    (run / "shortlist.npz").write_bytes(b"stand-in")  # copied verbatim when the run has one
    assert export_main(["--format", "safetensors", str(run), str(tmp_path / "out")]) == 0
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors", "shortlist.npz", "spm.model"]
    assert json.loads((out / "config.json").read_text())["model"]["arch"] == arch
    assert b"\x80\x04" not in (out / "model.safetensors").read_bytes()[:64]  # no pickle protocol header
    original, exported = Translator.from_checkpoint(checkpoint), Translator.from_checkpoint(out)
    for beam in (1, 3):
        a = original.translate(sources[:12], beam_size=beam)
        b = exported.translate(sources[:12], beam_size=beam)
        assert [t.tokens for t in a] == [t.tokens for t in b]
        assert [t.score for t in a] == [t.score for t in b]
    payload = load_checkpoint(out)
    if options is TRANSFORMER:  # the tied output layer is stored once and restored as the same weights
        assert torch.equal(payload["model"]["generator.weight"], payload["model"]["tgt_embed.tokens.weight"])


def test_safetensors_is_smaller_than_the_training_checkpoint(run_dir, tmp_path):
    assert export_main(["--format", "safetensors", str(run_dir), str(tmp_path / "out")]) == 0
    exported = (tmp_path / "out" / "model.safetensors").stat().st_size
    assert exported < (run_dir / "best.pt").stat().st_size / 2  # no optimizer moments, no RNG state


def test_corrupt_or_foreign_safetensors_is_a_clear_error(tmp_path, tiny_tokenizer):
    from seq2seq.errors import UserError

    run = tmp_path / "run"
    run.mkdir()
    _random_checkpoint(run / "best.pt", tiny_tokenizer, 1, **TRANSFORMER)
    out = tmp_path / "out"
    assert export_main(["--format", "safetensors", str(run), str(out)]) == 0
    weights = out / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    with pytest.raises(UserError, match="model.safetensors.*truncated or corrupt"):
        load_checkpoint(out)
    from safetensors.torch import save_file

    save_file({"x": torch.zeros(2)}, str(weights), metadata={"format": "seq2seq-safetensors", "format_version": "99"})
    with pytest.raises(UserError, match="format version 99"):
        load_checkpoint(out)
    (out / "spm.model").unlink()
    with pytest.raises(UserError, match="spm.model is missing"):
        load_checkpoint(out)


def test_translate_command_reads_an_exported_directory(run_dir, tmp_path, capsys):
    from seq2seq.cli.translate import main as translate_main

    assert export_main(["--format", "safetensors", str(run_dir), str(tmp_path / "out")]) == 0
    source = tmp_path / "in.txt"
    source.write_text("twenty-one\nthree hundred and five\n")
    outputs = []
    for checkpoint in (run_dir / "best.pt", tmp_path / "out"):
        assert translate_main(["--checkpoint", str(checkpoint), "--input", str(source), "--beam-size", "2",
                               "--quiet"]) == 0
        outputs.append(capsys.readouterr().out)
    assert outputs[0] == outputs[1] and outputs[0].count("\n") == 2


# --------------------------------------------------------------------------------------------- errors


def test_existing_output_is_refused_unless_force(run_dir, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    assert export_main(["--format", "safetensors", str(run_dir), str(out)]) == 2
    assert "already exists" in capsys.readouterr().err and (out / "keep.txt").read_text() == "mine"
    assert export_main(["--format", "safetensors", str(run_dir), str(out), "--force"]) == 0
    assert not (out / "keep.txt").exists() and (out / "model.safetensors").is_file()


def test_corrupt_checkpoint_leaves_no_output(tmp_path, capsys):
    bad = tmp_path / "best.pt"
    bad.write_bytes(b"not a checkpoint")
    for fmt in ("safetensors", "ctranslate2"):
        assert export_main(["--format", fmt, str(bad), str(tmp_path / "out")]) == 2
        assert "not a seq2seq checkpoint (not a file that torch.save writes)" in capsys.readouterr().err
        assert not (tmp_path / "out").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["best.pt"]  # no temp directory left behind either


def test_unknown_checkpoint_version_is_refused(tmp_path, capsys, tiny_tokenizer):
    path = _random_checkpoint(tmp_path / "best.pt", tiny_tokenizer, 1, **TRANSFORMER)
    payload = torch.load(path, weights_only=True)
    payload["format_version"] = 7
    torch.save(payload, path)
    assert export_main(["--format", "ctranslate2", str(path), str(tmp_path / "out")]) == 2
    assert "format version 7" in capsys.readouterr().err and not (tmp_path / "out").exists()


def test_rnn_to_ctranslate2_is_a_clear_error(tmp_path, capsys, tiny_tokenizer):
    path = _random_checkpoint(tmp_path / "best.pt", tiny_tokenizer, 1, **RNN)
    assert export_main(["--format", "ctranslate2", str(path), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "rnn model" in err and "no recurrent" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_missing_ctranslate2_names_the_extra(tmp_path, capsys, tiny_tokenizer, monkeypatch):
    path = _random_checkpoint(tmp_path / "best.pt", tiny_tokenizer, 1, **TRANSFORMER)
    monkeypatch.setitem(sys.modules, "ctranslate2", None)  # import ctranslate2 -> ImportError
    assert export_main(["--format", "ctranslate2", str(path), str(tmp_path / "out")]) == 2
    assert "pip install 'seq2seq[export]'" in capsys.readouterr().err and not (tmp_path / "out").exists()


# ---------------------------------------------------------------------------------------- CTranslate2

VARIANTS = {
    "pre-norm, sinusoidal, tied, shared": {},
    "post-norm, learned, untied, separate": {"norm_first": False, "positional": "learned", "max_positions": 64,
                                             "tie_embeddings": False, "share_source_embeddings": False},
    "relative keys and values": {"positional": "relative", "relative_clip": 3, "relative_values": True},
    "relative keys only, post-norm": {"positional": "relative", "relative_clip": 2, "norm_first": False},
    "rotary": {"positional": "rope"},
}


@pytest.mark.parametrize("variant", VARIANTS)
def test_ctranslate2_gives_our_log_probabilities(tmp_path, tiny_tokenizer, sources, variant):
    """Teacher-forced log p of every target token and EOS, ours vs CTranslate2's, on the same pairs:
    the conversion is the same function (to float rounding) in every supported variant."""
    pytest.importorskip("ctranslate2")
    from seq2seq.decoding.ctranslate2 import CTranslate2Translator

    path = _random_checkpoint(tmp_path / "best.pt", tiny_tokenizer, 5, **{**TRANSFORMER, **VARIANTS[variant]})
    assert export_main(["--format", "ctranslate2", str(path), str(tmp_path / "ct2")]) == 0
    targets = list(reversed(sources[:10]))  # any target will do: every position's distribution is compared
    ours, _ = teacher_force(Translator.from_checkpoint(path).model,
                            [tiny_tokenizer.encode(s) + [EOS_ID] for s in sources[:10]],
                            [tiny_tokenizer.encode(t) for t in targets])
    theirs = CTranslate2Translator(tmp_path / "ct2").score(sources[:10], targets)
    for a, b in zip(ours, theirs):
        assert len(a) == len(b)
        np.testing.assert_allclose(a, b, atol=2e-4, rtol=1e-4)


@pytest.mark.parametrize("beam", [1, 4])
def test_ctranslate2_outputs_equal_ours_on_every_test_sentence(run_dir, tmp_path, sources, beam):
    """Greedy and beam search (length penalty 0: both rank by log-probability) on a trained model:
    the same output for every sentence, or, where they differ, two outputs whose scores tie."""
    pytest.importorskip("ctranslate2")
    from seq2seq.decoding.ctranslate2 import CTranslate2Translator

    assert export_main(["--format", "ctranslate2", str(run_dir), str(tmp_path / "ct2")]) == 0
    translator = Translator.from_checkpoint(run_dir)
    ours = [t.text for t in translator.translate(sources, beam_size=beam, length_penalty=0.0)]
    theirs = CTranslate2Translator(tmp_path / "ct2").translate(sources, beam_size=beam, length_penalty=0.0)
    differ = [i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b]
    tok = translator.tokenizer
    for i in differ:  # a tie within float error is the only acceptable difference
        scores, _ = teacher_force(translator.model, [tok.encode(sources[i]) + [EOS_ID]] * 2,
                                  [tok.encode(ours[i]), tok.encode(theirs[i])])
        assert abs(scores[0].sum() - scores[1].sum()) < 1e-4, (sources[i], ours[i], theirs[i])
    assert len(differ) <= len(sources) // 20
    assert len(set(ours)) > 5  # a trained model: the outputs depend on the input


def test_ctranslate2_int8_quantized_export_loads_and_translates(run_dir, tmp_path, sources):
    pytest.importorskip("ctranslate2")
    from seq2seq.decoding.ctranslate2 import CTranslate2Translator

    assert export_main(["--format", "ctranslate2", str(run_dir), str(tmp_path / "ct2"), "--quantization", "int8"]) == 0
    fp32 = tmp_path / "fp32"
    assert export_main(["--format", "ctranslate2", str(run_dir), str(fp32)]) == 0
    assert (tmp_path / "ct2" / "model.bin").stat().st_size < 0.75 * (fp32 / "model.bin").stat().st_size
    outputs = CTranslate2Translator(tmp_path / "ct2").translate(sources[:10], beam_size=2)
    # the tiny model's distributions are too flat for int8 to keep its outputs (the Multi30k figures are
    # in docs/guides/deploying.md): it must load and translate
    assert len(outputs) == 10 and all(isinstance(o, str) for o in outputs) and any(outputs)


# ------------------------------------------------------------------------------ CTranslate2 as an engine


@pytest.fixture()
def own_run(run_dir, tmp_path) -> Path:
    """A copy of the trained run: the engine writes its converted model beside the checkpoint."""
    import shutil

    return Path(shutil.copytree(run_dir, tmp_path / "run"))


def test_the_ctranslate2_engine_translates_like_ours_with_our_attention_and_confidence(own_run, sources):
    """Length penalty 0: the same outputs (but for float ties); GNMT alpha 1 (CTranslate2's beam re-ranked
    by ours): nearly always; the n-best lists, attention and confidence are ours, as our engine gives them."""
    pytest.importorskip("ctranslate2")
    ours = Translator.from_checkpoint(own_run)
    theirs = Translator.from_checkpoint(own_run, engine="ctranslate2")
    assert ours.engine is None and theirs.engine.name == "ctranslate2"
    assert (own_run / "best.ct2" / "model.bin").is_file()
    for options, allowed in (({"beam_size": 1, "length_penalty": 0.0}, 0.05), ({"beam_size": 4, "n_best": 3}, 0.1)):
        a = ours.translate(sources, confidence=True, **options)
        b = theirs.translate(sources, confidence=True, **options)
        same = [i for i in range(len(sources)) if a[i].text == b[i].text]
        assert len(same) >= (1 - allowed) * len(sources), options
        for i in same:
            assert b[i].log_prob == pytest.approx(a[i].log_prob, abs=1e-3)
            assert b[i].score == pytest.approx(a[i].score, abs=1e-3)
            np.testing.assert_allclose(b[i].attention, a[i].attention, atol=1e-5)
            np.testing.assert_allclose(b[i].token_log_probs, a[i].token_log_probs, atol=1e-5)
            scores = [h.score for h in b[i].alternatives]  # the n-best list, best first
            assert len(scores) == options.get("n_best", 1) and scores == sorted(scores, reverse=True)
    prefixed = theirs.translate(sources[:5], prefix=["a b "] * 5, beam_size=2)
    assert all(t.text.startswith("a b") for t in prefixed)
    assert theirs.translate(["", sources[0]], beam_size=2)[0].text == ""  # an empty line stays empty


def test_the_converted_model_is_cached_beside_the_checkpoint_and_redone_when_it_changes(own_run, monkeypatch,
                                                                                          tmp_path):
    pytest.importorskip("ctranslate2")
    from seq2seq.decoding import ctranslate2 as engine

    Translator.from_checkpoint(own_run, engine="ctranslate2")
    cache = own_run / "best.ct2"
    written = (cache / "model.bin").stat().st_mtime_ns
    converted = []
    import seq2seq.checkpoint.ctranslate2 as conversion  # cached_export imports it when it converts

    real = conversion.write_ctranslate2
    monkeypatch.setattr(conversion, "write_ctranslate2", lambda *a, **k: (converted.append(1), real(*a, **k))[1])
    Translator.from_checkpoint(own_run, engine="ctranslate2")
    assert converted == [] and (cache / "model.bin").stat().st_mtime_ns == written  # reused
    (own_run / "best.pt").write_bytes((own_run / "best.pt").read_bytes())  # rewritten: a newer checkpoint
    Translator.from_checkpoint(own_run, engine="ctranslate2")
    assert converted == [1] and sorted(p.name for p in own_run.iterdir() if "ct2" in p.name) == ["best.ct2"]
    monkeypatch.setattr(engine.os, "access", lambda path, mode: False)  # a read-only run directory
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    (own_run / "best.pt").write_bytes((own_run / "best.pt").read_bytes())  # RUN/best.ct2 is stale now
    Translator.from_checkpoint(own_run, engine="ctranslate2")  # converted into the user's cache instead
    assert converted == [1, 1] and [p.name.split("-", 1)[1] for p in
                                    (tmp_path / "cache" / "seq2seq" / "ctranslate2").iterdir()] == ["best.ct2"]


def test_what_the_ctranslate2_engine_cannot_do_is_a_named_error_and_auto_falls_back(
        own_run, tmp_path, tiny_tokenizer, caplog):
    pytest.importorskip("ctranslate2")
    from seq2seq.errors import UserError

    rnn = _random_checkpoint(tmp_path / "rnn" / "best.pt", tiny_tokenizer, 1, **RNN)
    with pytest.raises(UserError, match="cannot decode a rnn model.*--engine seq2seq"):
        Translator.from_checkpoint(rnn, engine="ctranslate2")
    with pytest.raises(UserError, match="cannot decode an ensemble"):
        Translator.from_checkpoints([own_run, own_run], engine="ctranslate2")
    with pytest.raises(UserError, match="compiles our engine's decoding step"):
        Translator.from_checkpoint(own_run, engine="ctranslate2", compile=True)
    with pytest.raises(UserError, match="--engine must be one of"):
        Translator.from_checkpoint(own_run, engine="fast")
    with caplog.at_level("INFO", logger="seq2seq"):
        assert Translator.from_checkpoint(rnn, engine="auto").engine is None
    assert "engine name=seq2seq reason='a rnn model" in caplog.text
    assert not (tmp_path / "rnn" / "best.ct2").exists()
    theirs = Translator.from_checkpoint(own_run, engine="auto")
    assert theirs.engine is not None
    with pytest.raises(UserError, match="--constraints: --engine ctranslate2 has no constrained search"):
        theirs.translate(["a b"], constraints=[["c"]])
    with pytest.raises(UserError, match="does not sample"):
        theirs.translate(["a b"], sample=True, beam_size=1)


def test_translate_and_serve_take_the_engine_flag(own_run, tmp_path, sources, capsys):
    pytest.importorskip("ctranslate2")
    from seq2seq.cli.translate import main as translate_main

    (tmp_path / "in.txt").write_text("\n".join(sources[:8]) + "\n", encoding="utf-8")
    outputs = {}
    for engine in ("seq2seq", "ctranslate2"):
        out = tmp_path / f"{engine}.txt"
        assert translate_main(["--checkpoint", str(own_run), "--input", str(tmp_path / "in.txt"), "--output", str(out),
                               "--engine", engine, "--beam-size", "1", "--device", "cpu", "--quiet"]) == 0
        outputs[engine] = out.read_text(encoding="utf-8")
    assert outputs["ctranslate2"] == outputs["seq2seq"]  # greedy: no length penalty, no ties on 8 lines


@pytest.mark.parametrize("slow_threads, expected", [(2, 1), (1, 2)])
def test_ctranslate2_decodes_on_the_thread_count_that_is_faster_here(monkeypatch, tiny_tokenizer, slow_threads,
                                                                      expected):
    """On a CPU our engine times CTranslate2 on every core and on one with the same forced-length probe and keeps
    the faster (on some CPUs its multi-threaded products are 5x slower); asked for fixed threads, or given one,
    it does not probe."""
    from types import SimpleNamespace

    import time

    from seq2seq.checkpoint import ctranslate2 as conversion
    from seq2seq.decoding.ctranslate2 import PROBE_STEPS, CTranslate2Search

    calls = []

    class Timed:  # CTranslate2's Translator, slow on ``slow_threads`` threads
        def __init__(self, path, device, compute_type, inter_threads, intra_threads):
            self.threads = intra_threads

        def translate_batch(self, batch, beam_size, min_decoding_length, max_decoding_length):
            calls.append((self.threads, beam_size, min_decoding_length, max_decoding_length))
            time.sleep(0.02 if self.threads == slow_threads else 0.0)

    monkeypatch.setattr(conversion, "require_ctranslate2", lambda: SimpleNamespace(Translator=Timed))
    search = CTranslate2Search("ct2", tiny_tokenizer, "cpu", "fp32", threads=2)
    assert search.threads == expected and search.translator.threads == expected
    assert sorted(calls) == sorted([(2, 1, PROBE_STEPS, PROBE_STEPS)] * 4 + [(1, 1, PROBE_STEPS, PROBE_STEPS)] * 4)
    for threads, fastest in ((2, False), (1, True)):
        calls.clear()
        search = CTranslate2Search("ct2", tiny_tokenizer, "cpu", "fp32", threads=threads, fastest_threads=fastest)
        assert search.threads == threads and not calls
