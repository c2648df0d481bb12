"""Matplotlib heatmaps of attention/alignments and learning curves; never needs a display.

Figures are built with ``matplotlib.figure.Figure`` (no pyplot, no global figure registry), so
PNG goes through the Agg renderer and SVG through the SVG backend whatever backend is active.
Every file is written to a temp name and renamed into place.

Output paths: a path with a known suffix (``.png``, ``.svg``, ``.pdf``) is written as is; a
path without one is a base name and gets one file per entry of ``formats``; a list of paths is
written file by file. Every plotting function returns the paths it wrote.

Fonts: DejaVu Sans (matplotlib's default) covers German umlauts and most European scripts.
Chinese/Japanese/Korean labels need a CJK font: ``cjk_font()`` looks for one, and the labels
are drawn with [that font, DejaVu Sans]; without one we warn once per process and plot anyway
(the missing glyphs show as boxes).
"""
from __future__ import annotations

import contextlib
import functools
import os
import warnings
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import numpy as np
from matplotlib import font_manager, rc_context
from matplotlib.figure import Figure

from ..io_utils import temp_path_beside
from .matrices import as_array
from .records import AlignmentRecord

KNOWN_FORMATS = ("png", "svg", "pdf")
ANNOTATE_MAX = 12  # write the weights into the cells up to this many rows and columns
CMAP = "Blues"

# Preferred CJK-capable families, most complete first; any family containing "CJK" also counts.
CJK_FONTS = (
    "Noto Sans CJK JP", "Noto Sans CJK SC", "Noto Sans CJK TC", "Noto Sans CJK KR",
    "Noto Serif CJK JP", "Noto Serif CJK SC", "Source Han Sans", "Source Han Sans SC",
    "Source Han Sans JP", "WenQuanYi Zen Hei", "WenQuanYi Micro Hei", "Droid Sans Fallback",
    "Noto Sans SC", "Noto Sans JP", "Noto Sans KR", "IPAGothic", "IPAPGothic", "IPAexGothic",
    "TakaoPGothic", "NanumGothic", "UnDotum", "AR PL UMing CN", "AR PL UKai CN",
    "Microsoft YaHei", "SimHei", "MS Gothic", "Malgun Gothic", "PingFang SC",
    "Hiragino Sans", "Heiti TC", "AppleGothic", "Arial Unicode MS",
)
CJK_PACKAGE_HINT = "install a CJK font, e.g. Debian/Ubuntu: apt-get install fonts-noto-cjk"
_CJK_RANGES = (
    (0x1100, 0x11FF), (0x2E80, 0x2FDF), (0x3000, 0x30FF), (0x3130, 0x318F), (0x31F0, 0x31FF),
    (0x3400, 0x4DBF), (0x4E00, 0x9FFF), (0xAC00, 0xD7AF), (0xF900, 0xFAFF), (0xFF00, 0xFFEF),
    (0x20000, 0x3134F),
)
_cjk_warned = False


# ----------------------------------------------------------------------------- fonts


def has_cjk(text: str) -> bool:
    """True if ``text`` contains Han, Kana, Hangul or CJK punctuation / full-width forms."""
    return any(lo <= ord(ch) <= hi for ch in text for lo, hi in _CJK_RANGES)


@functools.lru_cache(maxsize=1)
def cjk_font() -> str | None:
    """Name of an installed CJK-capable font family known to matplotlib, or None."""
    installed = {entry.name for entry in font_manager.fontManager.ttflist}
    for name in CJK_FONTS:
        if name in installed:
            return name
    return next((name for name in sorted(installed) if "CJK" in name), None)


@contextlib.contextmanager
def label_fonts(labels: Iterable[str]) -> Iterator[None]:
    """Font settings for drawing and saving a figure whose text includes ``labels``."""
    global _cjk_warned
    if not any(has_cjk(label) for label in labels):
        yield
        return
    font = cjk_font()
    if font is not None:
        with rc_context({"font.family": [font, "DejaVu Sans"]}):
            yield
        return
    if not _cjk_warned:
        _cjk_warned = True
        warnings.warn(
            f"labels contain CJK characters but no CJK font is installed; they will show as "
            f"boxes. To fix: {CJK_PACKAGE_HINT}, then delete matplotlib's font cache",
            stacklevel=4,
        )
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"Glyph \d+ .*missing from")
        yield


# ----------------------------------------------------------------------------- output


def output_paths(path_or_paths: str | os.PathLike | Sequence[str | os.PathLike],
                 formats: Sequence[str] = ("png", "svg")) -> list[Path]:
    """Resolve the paths to write (see the module docstring)."""
    if isinstance(path_or_paths, (str, os.PathLike)):
        path = Path(path_or_paths)
        if path.suffix.lstrip(".").lower() in KNOWN_FORMATS:
            return [path]
        return [path.with_name(f"{path.name}.{fmt.lstrip('.')}") for fmt in formats]
    return [p for item in path_or_paths for p in output_paths(item, formats)]


def _save(fig: Figure, paths: list[Path]) -> list[Path]:
    """Save ``fig`` to each path via a temp file + rename."""
    for path in paths:
        fmt = path.suffix.lstrip(".").lower()
        if fmt not in KNOWN_FORMATS:
            raise ValueError(f"cannot write {path}: use one of .{', .'.join(KNOWN_FORMATS)}")
        tmp = temp_path_beside(path)
        try:
            fig.savefig(tmp, format=fmt, dpi=150, bbox_inches="tight")
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
    return paths


# ----------------------------------------------------------------------------- heatmaps


def _heatmap(ax, matrix: np.ndarray, src_labels: Sequence[str], tgt_labels: Sequence[str],
             annotate: bool, ticks: str = "both", vmax: float = 1.0):
    """Draw one (T, S) heatmap: source along the top, target down the left. Returns the image
    (None for an empty matrix). ``ticks``: which axes get labels ("both", "x", "y", "none")."""
    rows, cols = matrix.shape
    image = None
    ax.xaxis.tick_top()
    if matrix.size == 0:  # e.g. an empty translation: keep the labels of the other side
        ax.text(0.5, 0.5, "(empty)", ha="center", va="center", transform=ax.transAxes)
        ax.set_xlim(-0.5, max(cols, 1) - 0.5)
        ax.set_ylim(max(rows, 1) - 0.5, -0.5)
    else:
        image = ax.imshow(matrix, cmap=CMAP, vmin=0.0, vmax=vmax, aspect="auto",
                          interpolation="nearest")
    ax.set_xticks(range(cols), list(src_labels) if ticks in ("both", "x") else [""] * cols,
                  rotation=70, ha="left", rotation_mode="anchor", fontsize=8)
    ax.set_yticks(range(rows), list(tgt_labels) if ticks in ("both", "y") else [""] * rows,
                  fontsize=8)
    ax.tick_params(length=0)
    if annotate:
        for (j, i), value in np.ndenumerate(matrix):
            ax.text(i, j, f"{value:.2f}", ha="center", va="center", fontsize=7,
                    color="white" if value > 0.6 * vmax else "black")
    return image


def _check(matrix, src_labels: Sequence[str], tgt_labels: Sequence[str]) -> np.ndarray:
    m = as_array(matrix).astype(np.float64)
    if m.ndim != 2 or m.shape != (len(tgt_labels), len(src_labels)):
        raise ValueError(f"matrix shape {m.shape} does not match {len(tgt_labels)} target x "
                         f"{len(src_labels)} source labels")
    return m


def _cell_inches(n: int, per_cell: float, minimum: float, maximum: float = 30.0) -> float:
    return min(max(minimum, per_cell * n), maximum)


def _label_room(labels: Sequence[str]) -> float:
    """Inches taken by rotated source labels above the plot."""
    return 0.07 * max((len(label) for label in labels), default=0) + 0.3


def _row_label_room(labels: Sequence[str]) -> float:
    """Inches taken by target labels left of a plot (fontsize 8: ~0.065 in a character)."""
    return 0.065 * max((len(label) for label in labels), default=0) + 0.2


def _vmax(*matrices: np.ndarray) -> float:
    peak = max((float(m.max()) for m in matrices if m.size), default=1.0)
    return max(1.0, peak)


def plot_alignment(matrix, src_labels: Sequence[str], tgt_labels: Sequence[str],
                   path_or_paths, title: str | None = None,
                   formats: Sequence[str] = ("png", "svg"),
                   annotate: bool | None = None) -> list[Path]:
    """Heatmap of a (T, S) attention/alignment matrix with a colour bar; returns written paths.

    ``annotate`` (default: when both sides have at most 12 labels) writes each weight in its cell.
    """
    with label_fonts([*src_labels, *tgt_labels, title or ""]):  # drawing and saving
        return _save(alignment_figure(matrix, src_labels, tgt_labels, title, annotate),
                     output_paths(path_or_paths, formats))


def alignment_figure(matrix, src_labels: Sequence[str], tgt_labels: Sequence[str], title: str | None = None,
                     annotate: bool | None = None) -> Figure:
    """The figure ``plot_alignment`` saves (also for TensorBoard's ``add_figure``); render it inside
    ``label_fonts`` of the same labels when they may hold CJK text."""
    m = _check(matrix, src_labels, tgt_labels)
    annotate = max(m.shape) <= ANNOTATE_MAX if annotate is None else annotate
    width = _cell_inches(len(src_labels), 0.5 if annotate else 0.3, 3.0) + 1.8
    height = _cell_inches(len(tgt_labels), 0.4 if annotate else 0.3, 2.0) + _label_room(src_labels)
    fig = Figure(figsize=(width, height))
    ax = fig.add_subplot()
    image = _heatmap(ax, m, src_labels, tgt_labels, annotate, vmax=_vmax(m))
    if title:  # below the plot: the rotated source labels take the space above it
        ax.set_xlabel(title, fontsize=10)
    if image is not None:
        fig.colorbar(image, ax=ax, fraction=0.05, pad=0.03)
    return fig


def plot_attention_grid(attn, src_labels: Sequence[str], tgt_labels: Sequence[str],
                        path_or_paths, title: str | None = None,
                        formats: Sequence[str] = ("png",)) -> list[Path]:
    """Layers x heads grid of small heatmaps for an (L, H, T, S) array, one shared colour bar.
    Labels appear on the outer axes only (source on the top row, target on the left column)."""
    a = as_array(attn).astype(np.float64)
    if a.ndim != 4:
        raise ValueError(f"plot_attention_grid expects (layers, heads, tgt, src), got {a.shape}")
    layers, heads = a.shape[:2]
    for layer in range(layers):
        _check(a[layer, 0], src_labels, tgt_labels)
    cell_w = _cell_inches(len(src_labels), 0.22, 1.6, 8.0)
    cell_h = _cell_inches(len(tgt_labels), 0.22, 1.2, 8.0)
    with label_fonts([*src_labels, *tgt_labels, title or ""]):
        fig = Figure(figsize=(cell_w * heads + 1.5, cell_h * layers + _label_room(src_labels) + 0.6))
        axes = fig.subplots(layers, heads, squeeze=False)
        image, vmax = None, _vmax(a)
        for (layer, head), ax in np.ndenumerate(axes):
            ticks = {(True, True): "both", (True, False): "x", (False, True): "y"}.get(
                (layer == 0, head == 0), "none")
            drawn = _heatmap(ax, a[layer, head], src_labels, tgt_labels, annotate=False,
                             ticks=ticks, vmax=vmax)
            ax.set_xlabel(f"layer {layer} head {head}", fontsize=7)
            image = drawn or image
        if title:
            fig.supxlabel(title, fontsize=10)
        if image is not None:
            fig.colorbar(image, ax=axes.ravel().tolist(), fraction=0.03, pad=0.02)
        return _save(fig, output_paths(path_or_paths, formats))


def plot_side_by_side(matrices: Sequence, titles: Sequence[str], src_labels: Sequence,
                      tgt_labels_list: Sequence[Sequence[str]], path_or_paths,
                      formats: Sequence[str] = ("png", "svg"),
                      annotate: bool | None = None) -> list[Path]:
    """Several systems' (T_k, S) matrices next to each other, same colour scale.

    ``src_labels`` is one label list shared by all, or one list per matrix. Every panel has its own
    target labels on its left: the figure is widened by their length, and its constrained layout places
    the panels by the labels' drawn extent, so that none reaches into the panel beside it."""
    shared = not src_labels or isinstance(src_labels[0], str)
    src_list = [list(src_labels)] * len(matrices) if shared else [list(s) for s in src_labels]
    if not len(matrices) == len(titles) == len(tgt_labels_list) == len(src_list):
        raise ValueError("plot_side_by_side: matrices, titles and label lists differ in number")
    ms = [_check(m, s, t) for m, s, t in zip(matrices, src_list, tgt_labels_list)]
    annotate = all(max(m.shape) <= ANNOTATE_MAX for m in ms) if annotate is None else annotate
    width = sum(_cell_inches(len(s), 0.45 if annotate else 0.3, 2.5) + _row_label_room(t) + 0.3
                for s, t in zip(src_list, tgt_labels_list))
    rows = max((len(t) for t in tgt_labels_list), default=0)
    height = _cell_inches(rows, 0.4, 2.0) + max((_label_room(s) for s in src_list), default=0.3)
    labels = [x for group in (*src_list, *tgt_labels_list, titles) for x in group]
    with label_fonts(labels):
        fig = Figure(figsize=(width + 1.0, height + 0.5), layout="constrained")
        axes = fig.subplots(1, max(len(ms), 1), squeeze=False)[0]
        image, vmax = None, _vmax(*ms)
        for ax, m, title, src, tgt in zip(axes, ms, titles, src_list, tgt_labels_list):
            image = _heatmap(ax, m, src, tgt, annotate, vmax=vmax) or image
            ax.set_xlabel(title, fontsize=9)
        if image is not None:
            fig.colorbar(image, ax=axes.tolist(), fraction=0.03, pad=0.02)
        return _save(fig, output_paths(path_or_paths, formats))


def plot_curves(series: dict[str, tuple[Sequence[float], Sequence[float]]], xlabel: str,
                ylabel: str, path_or_paths, title: str | None = None,
                formats: Sequence[str] = ("png", "svg"), empty_note: str | None = None,
                x_from_zero: bool = False) -> list[Path]:
    """Line plot of named (xs, ys) series, e.g. train/valid loss against steps.

    With ``empty_note``, a series without points stays in the legend as "name (empty_note)", and
    a plot where no series has points says so in its middle."""
    labels = [name if len(xs) or not empty_note else f"{name} ({empty_note})"
              for name, (xs, _) in series.items()]
    with label_fonts([*labels, title or "", xlabel, ylabel]):
        fig = Figure(figsize=(6.4, 4.0))
        ax = fig.add_subplot()
        for label, (xs, ys) in zip(labels, series.values()):
            ax.plot(list(xs), list(ys), label=label, marker="." if len(xs) < 30 else None)
        has_points = any(len(xs) for xs, _ in series.values())
        if x_from_zero and has_points:
            ax.set_xlim(left=0)
        if empty_note and not has_points:
            ax.text(0.5, 0.5, f"({empty_note} in any run)", ha="center", va="center",
                    transform=ax.transAxes, color="0.4")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        if title:
            ax.set_title(title)
        if series:
            ax.legend()
        ax.grid(alpha=0.3)
        return _save(fig, output_paths(path_or_paths, formats))


def plot_records(records: Iterable[AlignmentRecord], out_dir: str | os.PathLike,
                 formats: Sequence[str] = ("png", "svg"), grid: bool = True) -> list[Path]:
    """Per sentence: a word-level heatmap ``{index:05d}.{fmt}`` and, for models with more than
    one layer or head, a layers x heads word-level grid ``{index:05d}_grid.png``."""
    out = Path(out_dir)
    written: list[Path] = []
    for rec in records:
        title = f"#{rec.index}  layer {rec.layer_used}, heads {rec.heads}"
        written += plot_alignment(rec.words, rec.src_words, rec.tgt_words,
                                  out / f"{rec.index:05d}", title=title, formats=formats)
        if grid and rec.attention.shape[0] * rec.attention.shape[1] > 1:
            written += plot_attention_grid(rec.word_attention(), rec.src_words, rec.tgt_words,
                                           out / f"{rec.index:05d}_grid.png",
                                           title=f"#{rec.index}")
    return written


# ----------------------------------------------------------------------------- comparisons


def plot_learning_curves(series: dict[str, tuple[Sequence[float], Sequence[float]]], xlabel: str,
                         ylabel: str, path_or_paths, title: str | None = None,
                         formats: Sequence[str] = ("png", "svg"),
                         empty_note: str = "no validation lines") -> list[Path]:
    """``plot_curves`` for runs that may have no points (a run stopped before its first validation,
    a bare checkpoint without metrics.jsonl); x starts at 0 (steps, training time)."""
    return plot_curves(series, xlabel, ylabel, path_or_paths, title=title, formats=formats,
                       empty_note=empty_note, x_from_zero=True)


def plot_grouped_bars(groups: Sequence[str], series: dict[str, Sequence[float | None]],
                      xlabel: str, ylabel: str, path_or_paths, title: str | None = None,
                      formats: Sequence[str] = ("png", "svg"), value_labels: bool = True
                      ) -> list[Path]:
    """One group of bars per entry of ``groups`` (e.g. source-length buckets), one bar per series
    (e.g. system) in each group. A value of None or NaN leaves its bar out (e.g. an empty bucket)."""
    names = list(series)
    width = 0.8 / max(len(names), 1)
    centers = np.arange(len(groups), dtype=np.float64)
    with label_fonts([*groups, *names, title or "", xlabel, ylabel]):
        fig = Figure(figsize=(max(6.4, 0.6 * len(groups) * max(len(names), 1) + 2), 4.0))
        ax = fig.add_subplot()
        for k, name in enumerate(names):
            values = np.array([np.nan if v is None else float(v) for v in series[name]])
            if values.shape != (len(groups),):
                raise ValueError(f"series {name!r} has {values.size} values for {len(groups)} groups")
            xs = centers - 0.4 + width * (k + 0.5)
            bars = ax.bar(xs[~np.isnan(values)], values[~np.isnan(values)], width, label=name)
            if value_labels:
                ax.bar_label(bars, fmt="%.1f", fontsize=7, padding=1)
        ax.set_xticks(centers, list(groups))
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        if title:
            ax.set_title(title)
        if names:
            ax.legend()
        ax.grid(axis="y", alpha=0.3)
        ax.set_axisbelow(True)
        if all(v is None or not v < 0 for values in series.values() for v in values):
            ax.set_ylim(bottom=0)
        return _save(fig, output_paths(path_or_paths, formats))
