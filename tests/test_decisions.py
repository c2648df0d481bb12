"""When a run logs, validates, saves and stops (``training.decisions``): each rule on its own, without a model."""
from __future__ import annotations

import pytest

from seq2seq.config import CheckpointConfig, EvalConfig, RunConfig, TrainConfig
from seq2seq.training import decisions
from seq2seq.training.trainer import Progress


def config(train=None, eval=None, checkpoint=None) -> RunConfig:
    """Every limit, validation and periodic save off (a log line every 10 steps) but what is given, by section."""
    return RunConfig(train=TrainConfig(**{"max_steps": 0, "max_epochs": 0, "max_minutes": 0, "log_every": 10,
                                          **(train or {})}),
                     eval=EvalConfig(**{"every": 0, "every_minutes": 0, "patience": 0, **(eval or {})}),
                     checkpoint=CheckpointConfig(**{"save_every": 0, "save_every_minutes": 0, **(checkpoint or {})}))


@pytest.mark.parametrize("progress, config, reason", [
    (Progress(step=5), config({"max_steps": 5}), "max_steps"),
    (Progress(step=4), config({"max_steps": 5}), ""),
    (Progress(epoch=2), config({"max_epochs": 2}), "max_epochs"),
    (Progress(step=9, epoch=3), config({"max_steps": 9, "max_epochs": 3}), "max_steps"),  # the step limit first
    (Progress(step=100, epoch=100), config(), ""),  # no limits: never
])
def test_a_limit_already_reached_stops_a_resumed_run_before_any_step(progress, config, reason):
    assert decisions.limit_reached(progress, config) == reason


def test_stop_reasons_in_their_order_of_precedence():
    p, tc = Progress(step=10, evals_without_improvement=3), config({"max_steps": 10}, {"patience": 3})
    assert decisions.stop_reason(p, tc, out_of_time=True, interrupted=True) == "interrupted"
    assert decisions.stop_reason(p, tc, out_of_time=True, interrupted=False) == "max_steps"
    p.step = 9
    assert decisions.stop_reason(p, tc, out_of_time=True, interrupted=False) == "max_minutes"
    assert decisions.stop_reason(p, tc, out_of_time=False, interrupted=False) == "early_stopping"
    p.evals_without_improvement = 2
    assert decisions.stop_reason(p, tc, out_of_time=False, interrupted=False) == ""
    assert decisions.stop_reason(Progress(evals_without_improvement=99), config(), False, False) == ""  # patience 0


def test_the_time_limit_reads_the_runs_clock_in_minutes():
    ten = config({"max_minutes": 10})
    assert decisions.out_of_time(600.0, ten) and not decisions.out_of_time(599.9, ten)
    assert not decisions.out_of_time(1e9, config())  # 0: no limit


def test_validation_by_steps_by_a_fixed_clock_grid_and_once_at_the_end():
    tc = config(eval={"every": 50})
    assert [s for s in range(1, 201) if decisions.validation_due_by_step(s, tc)] == [50, 100, 150, 200]
    assert not any(decisions.validation_due_by_step(s, config()) for s in range(1, 100))
    clock = config(eval={"every_minutes": 5})
    assert [decisions.clock_slot(t, clock) for t in (0, 299, 300, 301, 899, 900)] == [0, 0, 1, 1, 2, 3]
    assert decisions.clock_slot(1e9, config()) == 0
    # the grid is fixed: a validation late in slot 1 (at 590 s) does not move the next one past 600 s
    assert not decisions.validation_due_by_clock(590, clock, validated_slot=1)
    assert decisions.validation_due_by_clock(601, clock, validated_slot=1)
    assert not decisions.validation_due_by_clock(1e9, config(), validated_slot=0)
    # at the end: once more, unless this step validated or eval_every would have; never without validation
    assert decisions.final_validation_due(120, validated_step=100, cfg=tc)
    assert not decisions.final_validation_due(150, validated_step=100, cfg=tc)  # eval_every validates it
    assert not decisions.final_validation_due(120, validated_step=120, cfg=clock)
    assert decisions.final_validation_due(121, validated_step=120, cfg=clock)
    assert not decisions.final_validation_due(120, validated_step=-1, cfg=config())


def test_the_device_is_read_on_log_and_validation_steps_only():
    tc = config({"log_every": 10}, {"every": 25})
    assert [s for s in range(1, 51) if decisions.device_read_due(s, tc)] == [10, 20, 25, 30, 40, 50]
    assert [s for s in range(1, 31) if decisions.log_due(s, tc)] == [10, 20, 30]
    assert all(decisions.log_due(s, config({"log_every": 0})) for s in range(1, 5))  # 0 counts as every step


def test_periodic_saves_by_steps_or_by_the_clock_never_twice_at_one_step():
    tc = config(checkpoint={"save_every": 100, "save_every_minutes": 10})
    assert decisions.periodic_save_due(200, saved_step=100, cfg=tc, due_by_clock=False)
    assert not decisions.periodic_save_due(200, saved_step=200, cfg=tc, due_by_clock=True)  # validation wrote it
    assert not decisions.periodic_save_due(150, saved_step=100, cfg=tc, due_by_clock=False)
    assert decisions.periodic_save_due(150, saved_step=100, cfg=tc, due_by_clock=True)
    assert decisions.save_due_by_clock(600, tc) and not decisions.save_due_by_clock(599, tc)
    assert not decisions.save_due_by_clock(1e9, config())
    assert not decisions.periodic_save_due(100, saved_step=0, cfg=config(), due_by_clock=False)


def test_a_validation_updates_the_best_and_counts_those_without_improvement():
    p = Progress(step=100)
    assert decisions.record_validation(p, 20.0) and (p.best_bleu, p.best_step) == (20.0, 100)
    p.step = 200
    assert not decisions.record_validation(p, 20.0)  # a tie is no improvement
    assert not decisions.record_validation(p, 19.0) and p.evals_without_improvement == 2
    p.step = 300
    assert decisions.record_validation(p, 21.5)
    assert (p.best_bleu, p.best_step, p.evals_without_improvement) == (21.5, 300, 0)


@pytest.mark.parametrize("step, stopped, advice", [
    (23, "max_minutes", "a larger --max-minutes"),  # issue 64: 23 updates in 4 minutes on a busy machine
    (99, "max_epochs", "a larger --max-epochs"),
    (40, "early_stopping", "a larger --patience"),
    (100, "max_minutes", None),  # enough (FEW_UPDATES = 100)
    (23, "max_steps", None),  # stopped where it was told to
    (23, "interrupted", None),
])
def test_a_run_stopped_after_few_updates_is_warned_with_how_to_train_longer(step, stopped, advice):
    warning = decisions.few_updates_warning(Progress(step=step, stopped=stopped, elapsed=240.0))
    if advice is None:
        assert warning is None
        return
    assert warning.startswith(f"the run stopped ({stopped}) after {step} updates in 4.0 minutes, fewer than the 100 ")
    assert advice in warning
    assert ("--max-steps" in warning) == (stopped != "early_stopping")  # a step budget, where time or epochs stopped it
