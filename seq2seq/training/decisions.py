"""When a training run logs, validates, saves and stops: plain functions of its progress (``Progress``:
steps, epochs, the run's clock summed over sessions, the best BLEU) and its config (the limits and log rhythm of
``train``, the validation rhythm and patience of ``eval``, the periodic saves of ``checkpoint``), each rule
stated once and testable without a model. ``Trainer`` asks them; in a distributed run rank 0's clock
decides and every rank follows (``distributed.agree``).

Validation: every ``eval.every`` steps and/or at the first step after each multiple of
``eval.every_minutes`` of the run's clock (a fixed grid: resumes and the validations themselves do not
shift it), and once more at the end if the last step was not validated. ``last.pt``: at every
validation, every ``checkpoint.save_every`` steps or ``checkpoint.save_every_minutes`` of wall time, and at the
end. Stops: ``train.max_steps``, ``max_epochs``, ``max_minutes`` (the run's clock), ``eval.patience`` validations
without a better BLEU (early stopping), or an interrupt. A run that a limit stops after fewer than ``FEW_UPDATES``
updates is warned about (``few_updates_warning``): its model cannot translate yet.
"""
from __future__ import annotations

import math
from typing import Any

from ..config import RunConfig

#: Fewer updates than this and a run's model has not learnt to translate: the toy preset trains 1,000 for its
#: test BLEU of 100 (docs/guides/training.md), a Multi30k run thousands; after a few dozen the outputs are
#: empty or one word repeated and test BLEU is 0 (1 update of the toy preset: "forty forty ...", 8 of the
#: tests' tiny Transformer: every output empty).
FEW_UPDATES = 100
#: How to train longer, by what stopped the run (``few_updates_warning``)
LONGER = {"max_minutes": "a larger --max-minutes (on a slow or busy machine each update takes longer), or "
                         "--max-steps N with --max-minutes 0 for a budget of updates instead of time",
          "max_epochs": "a larger --max-epochs, or --max-steps N", "early_stopping": "a larger --patience"}


def limit_reached(progress: Any, cfg: RunConfig) -> str:
    """The step or epoch limit a run (a resumed one) has already reached, or ""."""
    if cfg.train.max_steps and progress.step >= cfg.train.max_steps:
        return "max_steps"
    if cfg.train.max_epochs and progress.epoch >= cfg.train.max_epochs:
        return "max_epochs"
    return ""


def stop_reason(progress: Any, cfg: RunConfig, out_of_time: bool, interrupted: bool) -> str:
    """Why the run stops after this step ("" to go on), in order of precedence: an interrupt, the step
    limit, the time limit (``out_of_time``: the run's clock passed ``max_minutes``), early stopping."""
    if interrupted:
        return "interrupted"
    if cfg.train.max_steps and progress.step >= cfg.train.max_steps:
        return "max_steps"
    if out_of_time:
        return "max_minutes"
    if cfg.eval.patience and progress.evals_without_improvement >= cfg.eval.patience:
        return "early_stopping"
    return ""


def out_of_time(elapsed: float, cfg: RunConfig) -> bool:
    """Whether the run's clock (seconds, summed over sessions) has passed ``max_minutes``."""
    return bool(cfg.train.max_minutes) and elapsed >= cfg.train.max_minutes * 60


def device_read_due(next_step: int, cfg: RunConfig) -> bool:
    """Whether step ``next_step`` logs or validates, so the loop waits for the device there (its backlog
    counts as training time where throughput is read)."""
    return next_step % max(cfg.train.log_every, 1) == 0 or validation_due_by_step(next_step, cfg)


def log_due(step: int, cfg: RunConfig) -> bool:
    """Whether step ``step`` logs the training loss (``train.log_every``)."""
    return step % max(cfg.train.log_every, 1) == 0


def validation_due_by_step(step: int, cfg: RunConfig) -> bool:
    """``eval.every``: whether step ``step`` validates."""
    return bool(cfg.eval.every) and step % cfg.eval.every == 0


def clock_slot(elapsed: float, cfg: RunConfig) -> int:
    """How many whole ``eval.every_minutes`` intervals the run's clock has passed (0 without them)."""
    return int(elapsed // (cfg.eval.every_minutes * 60 or math.inf))


def validation_due_by_clock(elapsed: float, cfg: RunConfig, validated_slot: int) -> bool:
    """``eval.every_minutes``: whether the run's clock has entered a later slot of the grid than the last
    validation's (``validated_slot``)."""
    return bool(cfg.eval.every_minutes) and clock_slot(elapsed, cfg) > validated_slot


def final_validation_due(step: int, validated_step: int, cfg: RunConfig) -> bool:
    """Whether a run that stops at ``step`` validates once more: it validates at all, and neither did this
    step already (``validated_step``) nor would ``eval.every`` have."""
    validating = bool(cfg.eval.every or cfg.eval.every_minutes)
    return validating and step != validated_step and not validation_due_by_step(step, cfg)


def save_due_by_clock(seconds_since_save: float, cfg: RunConfig) -> bool:
    """``checkpoint.save_every_minutes``: whether ``last.pt`` is older than that."""
    return bool(cfg.checkpoint.save_every_minutes) and seconds_since_save >= cfg.checkpoint.save_every_minutes * 60


def periodic_save_due(step: int, saved_step: int, cfg: RunConfig, due_by_clock: bool) -> bool:
    """Whether step ``step`` writes ``last.pt`` between validations: ``checkpoint.save_every`` steps or the clock
    (``save_due_by_clock``), unless this step already wrote it (``saved_step``)."""
    every = cfg.checkpoint.save_every
    due = due_by_clock or bool(every) and step % every == 0
    return due and step != saved_step


def record_validation(progress: Any, bleu: float) -> bool:
    """Update the best BLEU and the early-stopping count of ``progress`` with a validation's ``bleu``;
    whether it improved on the best (ties do not)."""
    improved = bleu > progress.best_bleu
    if improved:
        progress.best_bleu, progress.best_step, progress.evals_without_improvement = bleu, progress.step, 0
    else:
        progress.evals_without_improvement += 1
    return improved


def few_updates_warning(progress: Any) -> str | None:
    """Why a finished run's model will not translate yet, if it stopped after fewer than ``FEW_UPDATES``
    updates, and how to train longer; None otherwise, and for runs that stopped where they were told to
    (``--max-steps``) or were interrupted."""
    if progress.step >= FEW_UPDATES or progress.stopped not in LONGER:
        return None
    return (f"the run stopped ({progress.stopped}) after {progress.step} updates in {progress.elapsed / 60:.1f} "
            f"minutes, fewer than the {FEW_UPDATES} a model needs to start translating: expect a test BLEU near 0 "
            f"and empty or repeated outputs; train longer: {LONGER[progress.stopped]}")
