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


def test_output_paths(tmp_path):
    assert output_paths(tmp_path / "a") == [tmp_path / "a.png", tmp_path / "a.svg"]
    assert output_paths(tmp_path / "a.svg") == [tmp_path / "a.svg"]
    assert output_paths([tmp_path / "a.png", tmp_path / "b"], formats=("pdf",)) == [
        tmp_path / "a.png", tmp_path / "b.pdf"]


def test_plot_alignment_umlauts_png_svg(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # umlauts must not trigger missing-glyph warnings
        paths = plot_alignment(matrix(5, 6), SRC, TGT, tmp_path / "sent", title="Grüße")
    assert_written(paths, [".png", ".svg"])


def test_plot_alignment_large_and_empty(tmp_path):
    src = [f"w{i}" for i in range(30)]
    tgt = [f"v{i}" for i in range(25)]
    assert_written(plot_alignment(matrix(25, 30), src, tgt, tmp_path / "big.png"), [".png"])
    empty = plot_alignment(np.zeros((0, 6)), SRC, [], tmp_path / "empty.png")
    assert_written(empty, [".png"])
    with pytest.raises(ValueError, match="does not match"):
        plot_alignment(matrix(5, 5), SRC, TGT, tmp_path / "bad.png")


def test_grid_side_by_side_curves(tmp_path):
    attn = np.stack([np.stack([matrix(5, 6, seed=l * 4 + h) for h in range(4)]) for l in range(2)])
    assert_written(plot_attention_grid(attn, SRC, TGT, tmp_path / "grid"), [".png"])
    other_tgt = ["Two", "guys", "cross", "a", "road", "now"]
    paths = plot_side_by_side([matrix(5, 6), matrix(6, 6, seed=1)], ["RNN", "Transformer"],
                              SRC, [TGT, other_tgt], tmp_path / "compare")
    assert_written(paths, [".png", ".svg"])
    curves = {"train": ([1, 2, 3], [3.0, 2.0, 1.5]), "valid": ([1, 2, 3], [3.2, 2.5, 2.2])}
    assert_written(plot_curves(curves, "epoch", "loss", tmp_path / "loss.png"), [".png"])


def test_plot_records(tmp_path):
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
