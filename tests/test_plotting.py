"""Plots are written (PNG and SVG), non-empty, with umlauts and CJK labels handled."""
import warnings

import matplotlib
import numpy as np
import pytest

from seq2seq.alignment import plotting
from seq2seq.alignment.records import AlignmentRecord
from seq2seq.alignment.plotting import (
    has_cjk, output_paths, plot_alignment, plot_attention_grid, plot_curves, plot_records, plot_side_by_side,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
SRC = ["Zwei", "Männer", "überqueren", "die", "Straße", "</s>"]
TGT = ["Two", "men", "cross", "the", "street"]


def matrix(rows, cols, seed=0):
    m = np.random.default_rng(seed).random((rows, cols))
    return m / m.sum(-1, keepdims=True)  # (T, S)


def assert_written(paths, suffixes):
    assert [p.suffix for p in paths] == suffixes
    for path in paths:
        data = path.read_bytes()
        assert len(data) > 0
        if path.suffix == ".png":
            assert data.startswith(PNG_MAGIC)
        else:
            assert b"<svg" in data[:2000]
    assert not list(paths[0].parent.glob(".*.tmp"))  # no temp files left


@pytest.fixture
def figures(monkeypatch):
    """Every matplotlib Figure the plotting functions save, in order (they are still written)."""
    saved = []
    save = plotting._save

    def recording(fig, paths):
        saved.append(fig)
        return save(fig, paths)

    monkeypatch.setattr(plotting, "_save", recording)
    return saved


def labels(ticks):
    return [tick.get_text() for tick in ticks]


def assert_heatmap(ax, m, src, tgt, x_labels=True, y_labels=True, annotated=False):
    """``ax`` shows the (T, S) matrix ``m`` as drawn: one row per target word from the top down, one
    column per source word from the left, the source words along the top and the target words down
    the left. A transposed, flipped or relabelled heatmap fails here."""
    [image] = ax.images
    assert image.get_array().shape == (len(tgt), len(src)) == m.shape  # rows: target, columns: source
    np.testing.assert_array_equal(image.get_array(), m)
    # cell (j, i) at x = i, y = j with row 0 at the top: imshow's upper origin, y axis running down
    assert image.origin == "upper"
    assert tuple(image.get_extent()) == (-0.5, len(src) - 0.5, len(tgt) - 0.5, -0.5)
    assert ax.get_ylim() == (len(tgt) - 0.5, -0.5) and ax.get_xlim() == (-0.5, len(src) - 0.5)
    assert list(ax.get_xticks()) == list(range(len(src))) and list(ax.get_yticks()) == list(range(len(tgt)))
    assert labels(ax.get_xticklabels()) == (list(src) if x_labels else [""] * len(src))
    assert labels(ax.get_yticklabels()) == (list(tgt) if y_labels else [""] * len(tgt))
    assert ax.xaxis.get_ticks_position() == "top"  # source words along the top
    written = {(text.get_position(), text.get_text()) for text in ax.texts}
    cells = {((i, j), f"{m[j, i]:.2f}") for j in range(m.shape[0]) for i in range(m.shape[1])}
    assert written == (cells if annotated else set())


def test_output_paths(tmp_path):
    assert output_paths(tmp_path / "a") == [tmp_path / "a.png", tmp_path / "a.svg"]
    assert output_paths(tmp_path / "a.svg") == [tmp_path / "a.svg"]
    assert output_paths([tmp_path / "a.png", tmp_path / "b"], formats=("pdf",)) == [
        tmp_path / "a.png", tmp_path / "b.pdf"]


def test_plot_alignment_umlauts_png_svg(tmp_path, figures):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # umlauts must not trigger missing-glyph warnings
        paths = plot_alignment(matrix(5, 6), SRC, TGT, tmp_path / "sent", title="Grüße")
    assert_written(paths, [".png", ".svg"])
    [fig] = figures
    ax, colorbar = fig.axes  # the heatmap and its colour bar
    assert_heatmap(ax, matrix(5, 6), SRC, TGT, annotated=True)  # <= 12 words a side: weights written
    assert ax.get_xlabel() == "Grüße"
    assert colorbar.get_ylim() == (0.0, 1.0)  # the colour scale runs from 0 to 1


def test_plot_alignment_large_and_empty(tmp_path, figures):
    src = [f"w{i}" for i in range(30)]
    tgt = [f"v{i}" for i in range(25)]
    assert_written(plot_alignment(matrix(25, 30), src, tgt, tmp_path / "big.png"), [".png"])
    assert_heatmap(figures[0].axes[0], matrix(25, 30), src, tgt)  # too large to annotate
    empty = plot_alignment(np.zeros((0, 6)), SRC, [], tmp_path / "empty.png")
    assert_written(empty, [".png"])
    [ax] = figures[1].axes  # no image, no colour bar: the source labels stay
    assert len(ax.images) == 0 and labels(ax.get_xticklabels()) == SRC and labels(ax.get_yticklabels()) == []
    assert [text.get_text() for text in ax.texts] == ["(empty)"]
    with pytest.raises(ValueError, match="does not match"):
        plot_alignment(matrix(5, 5), SRC, TGT, tmp_path / "bad.png")


def test_grid_side_by_side_curves(tmp_path, figures):
    attn = np.stack([np.stack([matrix(5, 6, seed=l * 4 + h) for h in range(4)]) for l in range(2)])
    assert_written(plot_attention_grid(attn, SRC, TGT, tmp_path / "grid"), [".png"])
    *grid, colorbar = figures[0].axes  # layers x heads, row by row, then the shared colour bar
    assert len(grid) == 8
    for k, ax in enumerate(grid):
        layer, head = divmod(k, 4)
        # labels on the outer axes only: source words on the top row, target words in the left column
        assert_heatmap(ax, attn[layer, head], SRC, TGT, x_labels=layer == 0, y_labels=head == 0)
        assert ax.get_xlabel() == f"layer {layer} head {head}"
    other_tgt = ["Two", "guys", "cross", "a", "road", "now"]
    paths = plot_side_by_side([matrix(5, 6), matrix(6, 6, seed=1)], ["RNN", "Transformer"],
                              SRC, [TGT, other_tgt], tmp_path / "compare")
    assert_written(paths, [".png", ".svg"])
    rnn, transformer, colorbar = figures[1].axes
    assert_heatmap(rnn, matrix(5, 6), SRC, TGT, annotated=True)
    assert_heatmap(transformer, matrix(6, 6, seed=1), SRC, other_tgt, annotated=True)
    assert (rnn.get_xlabel(), transformer.get_xlabel()) == ("RNN", "Transformer")
    curves = {"train": ([1, 2, 3], [3.0, 2.0, 1.5]), "valid": ([1, 2, 3], [3.2, 2.5, 2.2])}
    assert_written(plot_curves(curves, "epoch", "loss", tmp_path / "loss.png"), [".png"])
    [ax] = figures[2].axes
    assert [line.get_label() for line in ax.lines] == ["train", "valid"]
    for line, (xs, ys) in zip(ax.lines, curves.values()):
        np.testing.assert_array_equal(line.get_xydata(), np.column_stack([xs, ys]))
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("epoch", "loss")


def test_side_by_side_row_labels_stay_out_of_the_panel_beside_them(tmp_path, figures):
    """The attribution plot (``translate --plot-dir --attribution``: attention | each method) labels every
    panel's rows; long target words must not reach into the panel on their left (as they did with a fixed
    1.2 in per panel and no layout), nor the rotated source words into the next panel's labels."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    src = ["Internationalisierungsbemühungen", "der", "Bundesregierung", "wurden", "verstärkt", "."]
    tgt = ["the", "internationalization", "efforts", "of", "the", "federal", "government", "intensified", "."]
    titles = ["attention (layer -2, heads mean)", "gradient_x_input", "integrated_gradients"]
    plot_side_by_side([matrix(len(tgt), len(src), seed=k) for k in range(3)], titles, src, [tgt] * 3,
                      tmp_path / "00000_attribution.png")
    fig = figures[0]
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    *panels, colorbar = fig.axes
    assert len(panels) == 3
    boxes = [ax.get_window_extent(renderer) for ax in fig.axes]
    for left, right in zip(panels, panels[1:]):
        box = left.get_window_extent(renderer)
        for label in right.get_yticklabels():
            extent = label.get_window_extent(renderer)
            assert extent.x0 >= box.x1, (label.get_text(), extent.x0, box.x1)
    for k, ax in enumerate(panels):  # no label of a panel over another panel or the colour bar
        for label in [*ax.get_yticklabels(), *ax.get_xticklabels(), ax.xaxis.label]:
            extent = label.get_window_extent(renderer)
            others = [b for j, b in enumerate(boxes) if j != k]
            assert not any(extent.overlaps(b) for b in others), label.get_text()


def test_plot_records(tmp_path, figures):
    rng = np.random.default_rng(5)
    attn = rng.random((2, 2, 4, 4)).astype(np.float32)
    attn /= attn.sum(-1, keepdims=True)
    rec = AlignmentRecord.build(3, "Ein Hunde läuft", "A dog", ["▁Ein", "▁Hund", "e"],
                                ["▁A", "▁do", "g"], attn)
    rnn = AlignmentRecord.build(4, "x", "y", ["▁x"], ["▁y"], attn[:1, :1, :2, :2])
    paths = plot_records([rec, rnn], tmp_path / "plots")
    names = sorted(p.name for p in paths)
    assert names == ["00003.png", "00003.svg", "00003_grid.png", "00004.png", "00004.svg"]
    assert all(p.stat().st_size > 0 for p in paths)
    # what is drawn: each record's word matrix (EOS dropped) under its words, then its layers x heads grid
    assert rec.src_words == ["Ein", "Hunde"] and rec.tgt_words == ["A", "dog"]  # words of the pieces
    assert_heatmap(figures[0].axes[0], rec.words, rec.src_words, rec.tgt_words, annotated=True)
    grid = figures[1].axes[:-1]
    for k, ax in enumerate(grid):
        layer, head = divmod(k, 2)
        assert_heatmap(ax, rec.word_attention()[layer, head], rec.src_words, rec.tgt_words,
                       x_labels=layer == 0, y_labels=head == 0)
    assert len(grid) == 4 and len(figures) == 3  # the one-head record gets no grid
    assert_heatmap(figures[2].axes[0], rnn.words, ["x"], ["y"], annotated=True)


def test_cjk_without_font_warns_once(tmp_path, monkeypatch):
    monkeypatch.setattr(plotting, "cjk_font", lambda: None)
    monkeypatch.setattr(plotting, "_cjk_warned", False)
    assert has_cjk("你好") and has_cjk("こんにちは") and not has_cjk("Grüße")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = plot_alignment(matrix(2, 3), ["你好", "世界", "</s>"], ["hello", "world"],
                               tmp_path / "zh.png")
        second = plot_alignment(matrix(2, 3), ["再见", "世界", "</s>"], ["bye", "world"],
                                tmp_path / "zh2.png")
    messages = [str(w.message) for w in caught]
    assert len(messages) == 1 and "fonts-noto-cjk" in messages[0], messages
    assert_written(first, [".png"])
    assert_written(second, [".png"])


def test_cjk_font_family_used_when_available(monkeypatch):
    monkeypatch.setattr(plotting, "cjk_font", lambda: "Fake CJK Sans")
    with plotting.label_fonts(["你好"]):
        assert list(matplotlib.rcParams["font.family"]) == ["Fake CJK Sans", "DejaVu Sans"]
    with plotting.label_fonts(["Grüße"]):
        assert "Fake CJK Sans" not in matplotlib.rcParams["font.family"]
