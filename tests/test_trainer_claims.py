"""What the README and the training guide promise of the real trainer, checked on the real trainer: it
learns, its learning rate follows the documented schedules, ``best.pt`` is the best validation, the
stopping rules hold across a resume, and the configuration layers override in the documented order.
Expected values are written out by hand or read from the run's own log, never from the code under test."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from conftest import interrupt_at

import seq2seq.training.trainer as trainer_module
from seq2seq.checkpoint.file import load_checkpoint
from seq2seq.cli import config_from_flags
from seq2seq.config import RunConfig
from seq2seq.errors import UserError
from seq2seq.training.run import train
from seq2seq.training.trainer import Trainer


def tiny(out: Path, arch: str = "transformer", **train_options) -> RunConfig:
    cfg = RunConfig.from_dict({
        "model": {"arch": arch, "d_model": 32, "heads": 2, "ff_size": 64, "layers": 1, "embed_dim": 32,
                  "hidden_size": 32, "decoder_hidden_size": 48, "dropout": 0.1},
        "data": {"toy_size": 300, "vocab_size": 120, "max_tokens": 400, "cache_dir": str(out.parent / "cache")},
        "train": {"max_steps": 12, "eval_every": 0, "warmup_steps": 5, "lr": 3e-3, "log_every": 1,
                  "eval_max_sentences": 10, "seed": 3, "device": "cpu", "threads": 1, **train_options},
    })
    cfg.output_dir = str(out)
    return cfg


def records(run: Path, kind: str) -> list[dict]:
    lines = (run / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == kind]


# ----------------------------------------------------------------------------- learning and schedules


def test_the_trainer_learns_follows_inverse_sqrt_and_keeps_the_best_validation(tmp_path):
    run = tmp_path / "run"
    train(tiny(run, max_steps=60, eval_every=15, warmup_steps=10, lr=3e-3), quiet=True)
    logged = records(run, "train")
    # inverse square root with warmup (docs/guides/training.md): step t (1-based) runs at
    # lr * min(t / warmup, sqrt(warmup / t)); the line logged after step k shows the rate of step k + 1
    for r in logged:
        t = r["step"] + 1
        assert r["lr"] == pytest.approx(3e-3 * min(t / 10, math.sqrt(10 / t)), rel=1e-9), r["step"]
    assert logged[8]["lr"] == pytest.approx(3e-3)  # step 10 is the peak
    assert logged[38]["lr"] == pytest.approx(3e-3 * 0.5)  # step 40 = 4 x warmup: half the peak
    first, last = sum(r["loss"] for r in logged[:5]) / 5, sum(r["loss"] for r in logged[-5:]) / 5
    assert last < 0.75 * first  # it learns (a trainer that never steps the optimizer stays near first)
    valid = records(run, "valid")
    assert valid[-1]["loss"] < valid[0]["loss"]
    best = max(valid, key=lambda r: (r["bleu"], -r["step"]))  # the first validation with the highest BLEU
    assert load_checkpoint(run / "best.pt")["progress"]["step"] == best["step"]
    assert load_checkpoint(run / "best.pt")["progress"]["best_bleu"] == pytest.approx(best["bleu"])


def test_plateau_halves_the_rate_after_patience_evaluations_without_improvement(tmp_path):
    """An RNN with a rate too small to move the validation loss by the plateau threshold (a relative
    1e-4): ReduceLROnPlateau (patience 2, factor 0.5) halves the rate at every 3rd evaluation after
    the best one, i.e. at the evaluations of steps 8 and 14 (every 2 steps from step 2, the best)."""
    run = tmp_path / "run"
    train(tiny(run, "rnn", max_steps=16, eval_every=2, lr=1e-7, plateau_patience=2, plateau_factor=0.5),
          quiet=True)
    rates = {r["step"]: r["lr"] for r in records(run, "train")}  # logged before the step's validation
    assert [rates[s] / 1e-7 for s in (1, 8, 9, 14, 15, 16)] == pytest.approx([1, 1, 0.5, 0.5, 0.25, 0.25])


def test_linear_decays_to_zero_at_the_step_budget(tmp_path):
    """--schedule linear (docs/guides/training.md): step t (1-based) runs at lr * min(t / warmup, 1) *
    (1 - (t - 1) / max_steps): the last step at 1 / max_steps of the peak, the rate after it 0."""
    run = tmp_path / "run"
    train(tiny(run, max_steps=20, warmup_steps=5, lr=3e-3, schedule="linear"), quiet=True)
    rates = [r["lr"] for r in records(run, "train")]  # the line logged after step k shows the rate of step k + 1
    assert rates == pytest.approx([3e-3 * min((k + 1) / 5, 1) * (1 - k / 20) for k in range(1, 21)], abs=1e-12)
    assert rates[3] == pytest.approx(3e-3 * 0.8) and rates[-1] == 0.0  # step 5: the peak less 4 steps of 20


def test_linear_follows_the_run_clock_across_a_resume(tmp_path, monkeypatch):
    """With --max-minutes the decay reads the run's clock (summed over sessions, as the time limit): each
    step takes 30 s of a 5-minute budget, so the rate after step k is the peak x (1 - 30 (k - 1) / 300)."""
    options = {"max_steps": 0, "max_minutes": 5, "warmup_steps": 1, "schedule": "linear"}
    whole, cut = whole_and_resumed_on_a_fake_clock(tmp_path, monkeypatch, options, interrupt_before_call=5)
    rates = [r["lr"] for r in records(whole, "train")]
    # the rate logged after step k is set from the clock after step k - 1 (30 (k - 1) s): a step's lag
    assert rates == pytest.approx([3e-3 * (1 - 30 * max(k - 1, 0) / 300) for k in range(1, 11)], abs=1e-12)
    assert [r["lr"] for r in records(cut, "train")] == pytest.approx(rates, abs=1e-12)
    assert stopped(cut)[0::2] == (10, "max_minutes")


def test_linear_without_a_budget_is_a_named_error_before_any_data_is_read(tmp_path):
    with pytest.raises(UserError, match="--schedule linear.*--max-minutes.*--max-steps"):
        train(tiny(tmp_path / "run", max_steps=0, max_epochs=2, schedule="linear"), quiet=True)
    preset = config_from_flags(["--preset", "transformer-align", "--data-dir", str(tmp_path / "nowhere"),
                                "--output-dir", str(tmp_path / "align")])
    with pytest.raises(UserError, match="transformer-align preset.*--max-minutes"):  # not the missing corpus
        train(preset, quiet=True)
    assert not (tmp_path / "align").exists() and not (tmp_path / "cache").exists()


# ----------------------------------------------------------------------------- stopping rules across a resume


def stopped(run: Path) -> tuple[int, int, str]:
    progress = load_checkpoint(run / "last.pt")["progress"]
    return progress["step"], progress["epoch"], progress["stopped"]


@pytest.mark.parametrize("limit, options", [
    ("patience", {"max_steps": 40, "eval_every": 2, "patience": 2, "lr": 1e-9}),
    ("max_epochs", {"max_steps": 0, "max_epochs": 2}),
])
def test_a_stopping_rule_holds_across_a_resume(tmp_path, monkeypatch, limit, options):
    train(tiny(tmp_path / "whole", **options), quiet=True)
    whole = stopped(tmp_path / "whole")
    assert whole[2] == {"patience": "early_stopping", "max_epochs": "max_epochs"}[limit]
    interrupt_at(monkeypatch, whole[0] // 2 + 1)
    train(tiny(tmp_path / "cut", **options), quiet=True)
    assert stopped(tmp_path / "cut")[2] == "interrupted"
    monkeypatch.undo()
    train(tiny(tmp_path / "cut", **options), resume=True, quiet=True)
    assert stopped(tmp_path / "cut") == whole


def whole_and_resumed_on_a_fake_clock(tmp_path: Path, monkeypatch, options: dict,
                                      interrupt_before_call: int) -> tuple[Path, Path]:
    """Two runs with ``options`` whose every training step takes 30 s of the trainer's clock: ``whole``
    uninterrupted, ``cut`` interrupted before its ``interrupt_before_call``-th step and resumed an hour later."""
    class Clock:
        now = 1_000.0

        def time(self):
            return self.now

        def perf_counter(self):
            return self.now

    clock, original, calls = Clock(), Trainer.train_step, {"n": 0}

    def timed(self, group):
        clock.now += 30.0
        return original(self, group)

    def cut(self, group):
        calls["n"] += 1
        if calls["n"] == interrupt_before_call:
            raise KeyboardInterrupt
        return timed(self, group)

    monkeypatch.setattr(trainer_module, "time", clock)
    for run, step in (("whole", timed), ("cut", cut)):
        monkeypatch.setattr(Trainer, "train_step", step)
        train(tiny(tmp_path / run, **options), quiet=True)
    clock.now += 3_600  # an hour between the sessions does not count
    monkeypatch.setattr(Trainer, "train_step", timed)
    train(tiny(tmp_path / "cut", **options), resume=True, quiet=True)
    return tmp_path / "whole", tmp_path / "cut"


def test_max_minutes_counts_every_session_of_a_run(tmp_path, monkeypatch):
    whole, cut = whole_and_resumed_on_a_fake_clock(tmp_path, monkeypatch, {"max_steps": 0, "max_minutes": 2.5},
                                                   interrupt_before_call=3)
    assert stopped(whole)[0::2] == (5, "max_minutes")  # 5 steps = 150 s >= 2.5 minutes
    assert stopped(cut)[0::2] == (5, "max_minutes")


# ----------------------------------------------------------------------------- preset < --config < flags


@pytest.mark.parametrize("suffix, text", [
    (".toml", '[train]\nmax_steps = 5\nlr = 0.003\n[model]\nlayers = 3\n'),
    (".yaml", 'train:\n  max_steps: 5\n  lr: 0.003\nmodel:\n  layers: 3\n'),
])
def test_flags_override_the_config_file_which_overrides_the_preset(tmp_path, suffix, text):
    config = tmp_path / f"run{suffix}"
    config.write_text(text, encoding="utf-8")
    cfg = config_from_flags(["--preset", "transformer", "--config", str(config), "--max-steps", "7"])
    assert cfg.train.max_steps == 7  # the flag beats the file
    assert cfg.optim.lr == 0.003 and cfg.model.layers == 3  # the file beats the preset and the defaults
    assert cfg.schedule.warmup_steps == 200  # the preset's own value, set by neither
    assert config_from_flags(["--preset", "transformer"]).optim.lr != 0.003
