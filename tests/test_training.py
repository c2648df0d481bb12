"""End to end on tiny data: train -> checkpoint -> translate -> BLEU; exact resume; Ctrl-C; bad config."""
from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from seq2seq.checkpoint.file import load_checkpoint
from seq2seq.config import RunConfig
from seq2seq.errors import UserError
from seq2seq.training.trainer import Trainer
from seq2seq.training.run import train
from seq2seq.decoding.translator import Translator


def tiny_config(out: Path, arch: str = "transformer", **train_overrides) -> RunConfig:
    cfg = RunConfig.from_dict({
        "model": {"arch": arch, "d_model": 32, "heads": 2, "ff_size": 64, "layers": 1, "embed_dim": 32,
                  "hidden_size": 32, "decoder_hidden_size": 48, "dropout": 0.1},
        "data": {"toy_size": 300, "vocab_size": 120, "max_tokens": 400, "cache_dir": str(out.parent / "cache")},
        "train": {"max_steps": 12, "eval_every": 6, "warmup_steps": 5, "lr": 3e-3, "log_every": 3,
                  "eval_max_sentences": 10, "seed": 3, **train_overrides},
    })
    cfg.output_dir = str(out)
    return cfg


def weights(path: Path) -> dict[str, torch.Tensor]:
    return load_checkpoint(path)["model"]


def assert_same_weights(a: Path, b: Path) -> None:
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys()
    for key in wa:
        torch.testing.assert_close(wa[key], wb[key], rtol=0, atol=0, msg=key)


@pytest.mark.parametrize("arch", ["transformer", "rnn"])
def test_train_checkpoint_translate_bleu(tmp_path, arch):
    result = train(tiny_config(tmp_path / "run", arch), quiet=True, final_test=True)
    assert result.progress.step == 12
    for name in ("best.pt", "last.pt", "spm.model", "metrics.jsonl", "test.hyp"):
        assert (tmp_path / "run" / name).is_file(), name
    assert 0.0 <= result.test_scores["bleu"].score <= 100.0
    assert "nrefs:1" in result.test_scores["bleu"].signature
    assert list((tmp_path / "run" / "plots").glob("*.png"))
    translator = Translator.from_checkpoint(tmp_path / "run" / "best.pt", device="cpu")
    [out] = translator.translate(["twenty-one"], beam_size=2)
    assert isinstance(out.text, str) and out.attention is not None
    assert out.attention.shape[-2:] == (len(out.tgt_pieces), len(out.src_pieces))
    sentences = ["twenty-one", "", "three hundred and four", "seven"]
    wide = translator.translate(sentences, beam_size=1, need_attention=False)  # default: one batch
    alone = translator.translate(sentences, beam_size=1, batch_size=1, need_attention=False)
    assert [t.text for t in wide] == [t.text for t in alone] and wide[1].text == ""
    half = Translator.from_checkpoint(tmp_path / "run" / "best.pt", device="cpu", precision="fp16")
    assert all(p.dtype == torch.float16 for p in half.model.parameters())
    [out] = half.translate(["twenty-one"], beam_size=2, batch_size=1)  # attention export included
    assert isinstance(out.text, str) and out.attention.dtype == np.float32
    int8 = Translator.from_checkpoint(tmp_path / "run" / "best.pt", device="cpu", precision="int8")
    assert isinstance(int8.model.generator, torch.ao.nn.quantized.dynamic.Linear)
    assert isinstance(translator.model.generator, torch.nn.Linear)  # the checkpoint's model is not changed
    [out] = int8.translate(["twenty-one"], beam_size=2)  # attention export included
    assert isinstance(out.text, str) and out.attention.shape[-2:] == (len(out.tgt_pieces), len(out.src_pieces))
    with pytest.raises(UserError, match="--precision must be one of fp32, fp16, bf16, int8"):
        Translator.from_checkpoint(tmp_path / "run" / "best.pt", device="cpu", precision="int4")
    import seq2seq.runtime

    for native in (True, False):  # bf16 decodes either way; without native support it warns first
        with pytest.MonkeyPatch.context() as patch, warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            patch.setattr(seq2seq.runtime, "cpu_has_native_bf16", lambda: native)
            brain = Translator.from_checkpoint(tmp_path / "run" / "best.pt", device="cpu", precision="bf16")
        expected = [] if native else ["--precision bf16: this CPU has no native bf16"]
        assert [str(w.message)[:45] for w in caught] == expected
        assert all(p.dtype == torch.bfloat16 for p in brain.model.parameters())
        assert isinstance(brain.translate(["seven"], beam_size=2, need_attention=False)[0].text, str)


def test_default_decoding_batch_is_320_rows():
    """Greedy batches of 320 sentences, beam 5 of 64 (see translator.DECODER_ROWS); never 0."""
    from seq2seq.decoding.translator import default_batch_size

    assert (default_batch_size(1), default_batch_size(5), default_batch_size(1000)) == (320, 64, 1)


def test_resume_gives_the_same_weights_as_an_uninterrupted_run(tmp_path):
    train(tiny_config(tmp_path / "full"), quiet=True)
    train(tiny_config(tmp_path / "split", max_steps=6), quiet=True)
    assert load_checkpoint(tmp_path / "split" / "last.pt")["progress"]["step"] == 6
    resumed = train(tiny_config(tmp_path / "split", max_steps=12), resume=True, quiet=True)
    assert resumed.progress.step == 12
    assert_same_weights(tmp_path / "full" / "last.pt", tmp_path / "split" / "last.pt")


def test_ctrl_c_leaves_a_resumable_checkpoint(tmp_path, monkeypatch):
    train(tiny_config(tmp_path / "full", eval_every=0), quiet=True)
    original = Trainer.train_step
    calls = {"n": 0}

    def interrupted_step(self, group):
        calls["n"] += 1
        if calls["n"] == 5:
            raise KeyboardInterrupt
        return original(self, group)

    monkeypatch.setattr(Trainer, "train_step", interrupted_step)
    result = train(tiny_config(tmp_path / "cut", eval_every=0), quiet=True)
    assert result.progress.stopped == "interrupted" and result.progress.step == 4
    monkeypatch.setattr(Trainer, "train_step", original)
    train(tiny_config(tmp_path / "cut", eval_every=0), resume=True, quiet=True)
    assert_same_weights(tmp_path / "full" / "last.pt", tmp_path / "cut" / "last.pt")


class SteppedClock:
    """A stand-in for the trainer's ``time`` module: each training step takes ``step_s`` seconds."""

    def __init__(self, step_s: float) -> None:
        self.now, self.step_s = 1_000.0, step_s

    def time(self) -> float:
        return self.now

    def perf_counter(self) -> float:
        return self.now


def validated_steps(run: Path) -> list[int]:
    import json

    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r["step"] for r in records if r["kind"] == "valid"]


def test_eval_every_minutes_validates_on_a_fixed_grid_of_the_run_clock_across_a_resume(tmp_path, monkeypatch):
    import seq2seq.training.trainer as trainer_module

    clock = SteppedClock(step_s=30.0)  # 2 steps a minute
    monkeypatch.setattr(trainer_module, "time", clock)
    original = Trainer.train_step

    def timed_step(self, group):
        clock.now += clock.step_s
        return original(self, group)

    monkeypatch.setattr(Trainer, "train_step", timed_step)
    run = tmp_path / "run"
    train(tiny_config(run, max_steps=5, eval_every=0, eval_every_minutes=1.0), quiet=True)
    assert validated_steps(run) == [2, 4, 5]  # minutes 1 and 2, then the run's end
    clock.now += 3_600  # an hour between the sessions does not count
    train(tiny_config(run, max_steps=12, eval_every=0, eval_every_minutes=1.0), resume=True, quiet=True)
    assert validated_steps(run) == [2, 4, 5, 6, 8, 10, 12]  # minutes 3, 4, 5, 6: the grid held
    train(tiny_config(tmp_path / "both", max_steps=12, eval_every=6, eval_every_minutes=1.5), quiet=True)
    assert validated_steps(tmp_path / "both") == [3, 6, 9, 12]  # with --eval-every too, a step validates once
    train(tiny_config(tmp_path / "none", max_steps=4, eval_every=0), quiet=True)
    assert validated_steps(tmp_path / "none") == []  # neither flag: the run never validates


def test_existing_run_needs_resume(tmp_path):
    train(tiny_config(tmp_path / "run", max_steps=2, eval_every=0), quiet=True)
    with pytest.raises(UserError, match="--resume"):
        train(tiny_config(tmp_path / "run", max_steps=2), quiet=True)


def test_unknown_config_key_fails_loudly():
    with pytest.raises(UserError, match="unknown key.*hiden_size"):
        RunConfig.from_dict({"model": {"hiden_size": 3}})


def test_checkpoint_loading_never_unpickles_code(tmp_path):
    class Evil:
        def __reduce__(self):
            return (exec, ("raise SystemExit('pwned')",))

    path = tmp_path / "evil.pt"
    torch.save({"format_version": 1, "config": {}, "tokenizer": Evil(), "model": {}}, path)
    with pytest.raises(UserError, match="cannot be read"):
        load_checkpoint(path)


def test_corrupt_and_foreign_checkpoints_are_clear_errors(tmp_path):
    (tmp_path / "bad.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(UserError, match="bad.pt"):
        load_checkpoint(tmp_path / "bad.pt")
    torch.save({"format_version": 99, "config": {}, "tokenizer": torch.zeros(1), "model": {}},
               tmp_path / "future.pt")
    with pytest.raises(UserError, match="format version 99"):
        load_checkpoint(tmp_path / "future.pt")
    with pytest.raises(UserError, match="no such file"):
        load_checkpoint(tmp_path / "missing.pt")


@pytest.mark.parametrize("native", [True, False])
def test_bf16_on_a_cpu_without_native_bf16_warns_before_training(tmp_path, monkeypatch, capsys, native):
    monkeypatch.setattr("seq2seq.runtime.cpu_has_native_bf16", lambda: native)
    train(tiny_config(tmp_path / "run", precision="bf16", max_steps=1, eval_every=0), quiet=True)
    err = capsys.readouterr().err
    assert ("no native bf16 support" in err and "--precision fp32" in err) != native


def test_fp16_on_cpu_is_a_clear_error_before_any_work(tmp_path):
    with pytest.raises(UserError, match="--precision fp16 needs a CUDA device"):
        train(tiny_config(tmp_path / "run", precision="fp16", device="cpu"), quiet=True)
    assert not (tmp_path / "run").exists()


def test_speed_benchmark_refuses_emulated_bf16(tmp_path, monkeypatch, capsys):
    import bench

    monkeypatch.setattr("seq2seq.runtime.cpu_has_native_bf16", lambda: False)
    monkeypatch.setattr(bench, "matmul_peak", lambda *a: pytest.fail("must refuse before measuring"))
    (tmp_path / "train.de").write_text("ein Satz\n", encoding="utf-8")
    assert bench.main(["speed", "--precision", "bf16", "--data-dir", str(tmp_path),
                       "--out", str(tmp_path / "out")]) == 2
    assert "no native bf16" in capsys.readouterr().err


@pytest.mark.parametrize("system, peer_millions", [("rnn-bahdanau", 12.0), ("rnn-luong-general", 12.0),
                                                   ("transformer", 9.6)])
def test_speed_benchmark_models_have_the_peers_parameter_counts(system, peer_millions):
    """The peers' RNN: separate source/target embeddings, untied 512 -> V output layer (12.0 M);
    their Transformer: target embeddings tied to the output layer only (9.6 M)."""
    import bench
    from seq2seq.cli import config_from_flags
    from seq2seq.models import build_model

    cfg = config_from_flags(["--data-dir", "x", *bench.system_flags(system, peer_sizes=True)])
    cfg.model.vocab_size = 8000
    assert build_model(cfg.model).num_parameters() / 1e6 == pytest.approx(peer_millions, rel=0.04)


class SkippingScaler:
    """A stand-in for fp16's gradient scaler that finds an overflow at its 2nd and 4th step: it
    skips optimizer.step() and halves its scale, as torch.amp.GradScaler does (fp16 needs CUDA)."""

    def __init__(self, *args, **kwargs) -> None:
        self.calls, self.value = 0, 1024.0

    def scale(self, loss):
        return loss

    def unscale_(self, optimizer) -> None:
        pass

    def step(self, optimizer) -> None:
        self.calls += 1
        if self.calls in (2, 4):
            self.value /= 2
            return
        optimizer.step()

    def update(self) -> None:
        pass

    def get_scale(self) -> float:
        return self.value

    def is_enabled(self) -> bool:
        return True

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state) -> None:
        pass


def test_skipped_fp16_steps_advance_neither_the_schedule_nor_the_step_count(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(torch.amp, "GradScaler", SkippingScaler)
    result = train(tiny_config(tmp_path / "run", max_steps=6, eval_every=0), quiet=True)
    assert result.progress.step == 6  # six updates taken, from eight batches
    payload = load_checkpoint(tmp_path / "run" / "last.pt")
    assert payload["scheduler"]["last_epoch"] == 6  # the learning rate followed the updates only
    err = capsys.readouterr().err
    assert err.count("skipped step=") == 2 and "fp16 gradient overflow" in err


def test_rng_state_holds_only_the_training_device_and_restores_on_fewer_gpus():
    """A CPU rank saves no GPU state (and never initialises CUDA); a checkpoint saved with more GPUs
    (older format: every visible GPU's state) restores on a CPU or on a GPU index it lacks without
    an IndexError from torch.cuda.set_rng_state_all."""
    from seq2seq.training.rng import rng_state, set_rng_state

    state = rng_state("cpu")
    assert "cuda" not in state
    expected = torch.rand(3)
    for device in ("cpu", "cuda:5"):
        set_rng_state({**state, "cuda": [torch.zeros(16, dtype=torch.uint8)] * 2}, device)
        torch.testing.assert_close(torch.rand(3), expected)  # the CPU stream is restored either way
