"""The report's figures: BLEU by length, learning curves, attention side by side."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Sequence

from ...alignment.records import AlignmentRecord
from .decode import System


def plot_length_buckets(rows: list[dict[str, Any]], names: Sequence[str], plots: Path) -> list[Path]:
    from ...alignment.plotting import plot_grouped_bars

    groups = [f"{row['label']}\n(n={row['sentences']})" for row in rows]
    series = {name: [row["bleu"][name] for row in rows] for name in names}
    return plot_grouped_bars(groups, series, "source words", "BLEU", plots / "bleu_by_length",
                             title="BLEU by source length")


def plot_learning(systems: Sequence[System], plots: Path) -> dict[str, list[Path]]:
    """Validation BLEU against steps and against wall-clock minutes, one line per system."""
    from ...alignment.plotting import plot_learning_curves

    by_step = {s.name: ([r["step"] for r in s.curve], [r["bleu"] for r in s.curve]) for s in systems}
    longest = max((r.get("elapsed", 0.0) for s in systems for r in s.curve), default=0.0)
    divisor, unit = (1, "s") if longest < 120 else (60, "min") if longest < 3 * 3600 else (3600, "h")
    by_time = {s.name: ([r.get("elapsed", math.nan) / divisor for r in s.curve], [r["bleu"] for r in s.curve])
               for s in systems}
    return {
        "steps": plot_learning_curves(by_step, "training step", "validation BLEU",
                                      plots / "valid_bleu_vs_steps", title="Validation BLEU by step"),
        "time": plot_learning_curves(by_time, f"wall-clock training time ({unit})", "validation BLEU",
                                     plots / "valid_bleu_vs_time", title="Validation BLEU by time"),
    }


def plot_sentence(index: int, names: Sequence[str], records: Sequence[AlignmentRecord], kind: str,
                  plots: Path) -> list[Path]:
    """One figure: the systems' word-level heatmaps of sentence ``index`` side by side."""
    from ...alignment.plotting import plot_side_by_side

    return plot_side_by_side([r.words for r in records], list(names), [r.src_words for r in records],
                             [r.tgt_words for r in records], plots / f"align_{index:05d}_{kind}")
