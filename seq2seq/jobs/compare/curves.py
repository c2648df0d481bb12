"""Learning curves as numbers: validation BLEU at given training budgets, and where two curves cross.

A curve is a run's validation lines (``metrics.jsonl``: ``step``, ``elapsed`` in seconds, ``bleu``).

- **At a budget** of m minutes a run scores the BLEU of its validation nearest to m minutes on its
  clock (all sessions of a resumed run, validation included), provided the run lasted that long
  (its last validation reaches m minutes less ``slack``): a run validating on a fixed wall-clock grid
  (``--eval-every-minutes``) has one just after every multiple of its interval.
- **Crossings** of curves a(x) and b(x), x being minutes or updates: both are interpolated linearly
  on the union of their x values inside the range both cover, and d(x) = b(x) - a(x) is followed;
  between consecutive points x0 < x1 with d(x0) d(x1) < 0 the crossing is
  x* = x0 + (x1 - x0) d(x0) / (d(x0) - d(x1)). Zeros are stepped over (a touch is no crossing).
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

#: the budgets (minutes) reported by default: the curve points of the issue-26 race
BUDGET_MINUTES = (5, 10, 20, 40, 90)


def at_budgets(curve: Sequence[dict[str, Any]], minutes: Sequence[float] = BUDGET_MINUTES,
               slack: float = 0.05) -> dict[float, dict[str, Any] | None]:
    """For each budget, the validation line nearest to it (None where the run stopped short of it:
    its last validation is earlier than ``(1 - slack)`` times the budget)."""
    timed = [r for r in curve if r.get("elapsed") is not None]
    out: dict[float, dict[str, Any] | None] = {}
    for m in minutes:
        seconds = m * 60
        if not timed or timed[-1]["elapsed"] < (1 - slack) * seconds:
            out[m] = None
            continue
        out[m] = min(timed, key=lambda r: (abs(r["elapsed"] - seconds), r["elapsed"]))
    return out


def crossings(a: Sequence[tuple[float, float]], b: Sequence[tuple[float, float]]) -> list[dict[str, Any]]:
    """Where curve ``b`` passes curve ``a`` or falls behind it: ``[{"x", "leader": "a" | "b"}]`` in
    order of x, ``leader`` being the curve ahead after the crossing (points are (x, y), any order)."""
    a, b = sorted(a), sorted(b)
    if len(a) < 2 or len(b) < 2:
        return []
    low, high = max(a[0][0], b[0][0]), min(a[-1][0], b[-1][0])
    xs = sorted({x for x, _ in (*a, *b) if low <= x <= high})
    if len(xs) < 2:
        return []
    d = np.interp(xs, *zip(*b)) - np.interp(xs, *zip(*a))
    found, previous = [], None  # previous: the last point where d was not 0
    for x, diff in zip(xs, d):
        if diff == 0:
            continue
        if previous is not None and (previous[1] > 0) != (diff > 0):
            x0, d0 = previous
            found.append({"x": float(x0 + (x - x0) * d0 / (d0 - diff)), "leader": "b" if diff > 0 else "a"})
        previous = (x, diff)
    return found


def curve_points(curve: Sequence[dict[str, Any]], axis: str) -> list[tuple[float, float]]:
    """(x, BLEU) of a curve, x being ``"minutes"`` (of ``elapsed``) or ``"steps"``."""
    if axis == "minutes":
        return [(r["elapsed"] / 60, r["bleu"]) for r in curve if r.get("elapsed") is not None]
    return [(r["step"], r["bleu"]) for r in curve]


def budget_summary(names: Sequence[str], curves: Sequence[Sequence[dict[str, Any]]],
                   minutes: Sequence[float] = BUDGET_MINUTES) -> dict[str, Any]:
    """What the comparison report says about budgets: each system's validation BLEU at each budget,
    and where each later system's curve crosses the first system's, in minutes and in updates."""
    table = {name: {f"{m:g}": None if r is None else {"bleu": r["bleu"], "elapsed": r["elapsed"], "step": r["step"]}
                    for m, r in at_budgets(curve, minutes).items()}
             for name, curve in zip(names, curves)}
    crossed = [{"system": name, "baseline": names[0],
                **{axis: crossings(curve_points(curves[0], axis), curve_points(curve, axis))
                   for axis in ("minutes", "steps")}}
               for name, curve in zip(names[1:], curves[1:])]
    return {"minutes": [float(m) for m in minutes], "systems": table, "crossings": crossed}
