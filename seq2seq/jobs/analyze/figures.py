"""The analysis report's figures: layer x head heatmaps of each statistic, attention share by
source class, and BLEU / loss against the number of pruned heads. Written straight into the
report's staging directory (published as a whole, so no per-file temp names are needed)."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Sequence

import numpy as np
from matplotlib.figure import Figure

from .stats import CLASSES

DIVERGING = "coolwarm"  # changes (Δ): centred on 0
SEQUENTIAL = "Blues"


def plot_head_panels(name: str, panels: dict[str, np.ndarray], path: Path, columns: int = 3) -> Path:
    """One figure: a layers x heads heatmap per statistic (panel), values written in the cells;
    rows are decoder layers (0 = bottom), columns heads. Δ panels use a scale centred on 0."""
    from ...alignment.plotting import label_fonts

    first = np.asarray(next(iter(panels.values())), dtype=np.float64)
    layers, heads = first.shape
    cols = min(columns, len(panels))
    rows = math.ceil(len(panels) / cols)
    cell_w, cell_h = max(2.4, 0.55 * heads + 1.2), max(1.6, 0.45 * layers + 1.0)
    with label_fonts([name, *panels]):
        fig = Figure(figsize=(cell_w * cols + 0.5, cell_h * rows + 0.9))
        axes = fig.subplots(rows, cols, squeeze=False)
        for ax, (title, values) in zip(axes.ravel(), panels.items()):
            m = np.asarray(values, dtype=np.float64)
            if title.startswith("Δ"):
                bound = float(np.nanmax(np.abs(m))) if np.isfinite(m).any() else 1.0
                image = ax.imshow(m, cmap=DIVERGING, vmin=-bound or -1.0, vmax=bound or 1.0, aspect="auto")
            else:
                image = ax.imshow(m, cmap=SEQUENTIAL, aspect="auto")
            span = (np.nanmin(m), np.nanmax(m)) if np.isfinite(m).any() else (0.0, 1.0)
            for (layer, head), value in np.ndenumerate(m):
                dark = not title.startswith("Δ") and value > span[0] + 0.6 * (span[1] - span[0])
                ax.text(head, layer, "—" if np.isnan(value) else f"{value:.2f}", ha="center", va="center",
                        fontsize=7, color="white" if dark else "black")
            ax.set_title(title, fontsize=9)
            ax.set_xticks(range(heads), [str(h) for h in range(heads)], fontsize=7)
            ax.set_yticks(range(layers), [str(lay) for lay in range(layers)], fontsize=7)
            ax.set_xlabel("head", fontsize=8)
            ax.set_ylabel("layer", fontsize=8)
            fig.colorbar(image, ax=ax, fraction=0.05, pad=0.03)
        for ax in axes.ravel()[len(panels):]:
            ax.set_visible(False)
        fig.suptitle(name, fontsize=10)
        height = fig.get_figheight()  # fixed gaps in inches: a layout engine would draw the figure twice
        fig.subplots_adjust(left=0.08, right=0.95, bottom=0.6 / height, top=1 - 0.75 / height,
                            wspace=1.1 / (cell_w - 1.1), hspace=0.9 / (cell_h - 0.9))
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, format="png", dpi=110)
    return path


def plot_class_shares(models: Sequence[dict[str, Any]], path: Path) -> Path:
    """Attention share of each source class (aggregated attention), one bar per model, with the
    classes' share of source pieces as the first series for reference."""
    from ...alignment.plotting import plot_grouped_bars

    series = {"source pieces": [100 * models[0]["classes"][c]["token_share"] for c in CLASSES]}
    for entry in models:
        series[entry["name"]] = [100 * entry["classes"][c]["attention_share"] for c in CLASSES]
    return plot_grouped_bars(list(CLASSES), series, "source piece class", "share (%)", path,
                             title="Attention mass by source class", formats=("png",))[0]


def plot_pruning(models: Sequence[dict[str, Any]], plots: Path) -> list[Path]:
    """Loss (and BLEU, when computed) against the number of pruned heads, one line per model."""
    from ...alignment.plotting import plot_curves

    def series(key: str) -> dict[str, tuple[list[float], list[float]]]:
        return {m["name"]: ([p["k"] for p in m["importance"]["pruning"]], [p[key] for p in m["importance"]["pruning"]])
                for m in models if all(p[key] is not None for p in m["importance"]["pruning"])}

    paths = plot_curves(series("loss"), "cross-attention heads pruned (least important first)",
                        "teacher-forced loss", plots / "pruning_loss.png", title="Loss after pruning heads",
                        formats=("png",))
    bleu = series("bleu")
    if bleu:
        paths += plot_curves(bleu, "cross-attention heads pruned (least important first)", "BLEU",
                             plots / "pruning_bleu.png", title="BLEU after pruning heads", formats=("png",))
    return paths
