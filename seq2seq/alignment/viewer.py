"""Interactive alignment viewer: one self-contained HTML file (inline CSS/JS, no network) over an
alignments export (``seq2seq view``) or straight from ``seq2seq translate --html``.

For each sentence the page shows the source and target words; hovering or clicking a target word
shades its source words by weight (background alpha = weight, the number under each word and in its
tooltip), with a heatmap of the whole matrix below. Selectors switch between attention and every
attribution method the export holds, between decoder layers / heads (each one, and their means) and
between word and subword level; prev / next and a list navigate the sentences.

Where the matrices come from (the JS only looks them up, it computes nothing):

* attention, per layer and head: from the raw ``(L, H, T+1, S+1)`` array (the record's
  ``attention`` in ``translate --html``; ``s{index}_attention`` of the NPZ beside the JSONL in
  ``view``), averaged with the same formula as ``alignment.aggregate``, merged to words with
  ``alignment.merge_to_words`` and cut to the record's labels (so the export's EOS policy holds).
  Without the raw array only the export's aggregate (``subword_matrix`` / ``word_matrix``) is shown.
* attribution: the record's ``attribution[method]`` ``subword_matrix`` / ``word_matrix``.

The page is ``viewer.html`` with the renderer inlined: ``viewer.js`` (the ``AlignmentView`` class) and
``viewer.css``, the renderer ``seq2seq serve``'s page loads too (``renderer_assets``), so both pages draw
alignments with the same code. A sentence may also carry ``links`` (hard links per level, ``[[source i,
target j], ...]``, outlined on hover and dotted in the heatmap of the attention view; serve's page sends
them) and a view its own ``levels`` (labels of its own, for an attribution of a re-tokenized target).

Embedded data (``<script type="application/json" id="viewer-data">``; ``<``, ``>``, ``&``, U+2028
and U+2029 are written as ``\\uXXXX`` escapes, so no sentence can close the tag)::

    {"format": 1, "scale": 1000, "title": str, "sentences": [
      {"index", "source", "target",
       "levels": {"word": {"src": [str], "tgt": [str]}, "subword": {"src": [...], "tgt": [...]}},
       "views": {"attention" | method: {"note": str, "layers": [label], "heads": [label],
                 "default": [layer_pos, head_pos],
                 "word": grid, "subword": grid}}}]}   # grid[layer_pos][head_pos] = (T, S) rows

Weights are embedded as ints, round(weight * scale) (3 decimals), to keep the file small; it still
grows with (layers + 1) x (heads + 1) x sentence length squared, so for a large export view a slice
of it (``head -n 200 align.jsonl > part.jsonl; seq2seq view part.jsonl --npz align.npz``) or only
the aggregate (``--no-npz``).
"""
from __future__ import annotations

import html
import json
import os
from contextlib import ExitStack
from importlib import resources
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from ..errors import UserError
from ..io_utils import atomic_output, counted
from .matrices import EOS, merge_to_words
from .matrices import strip_eos

FORMAT = 1
SCALE = 1000  # weights are embedded as round(weight * SCALE): 3 decimals
REQUIRED = ("index", "source", "target", "src_pieces", "tgt_pieces", "src_words", "tgt_words",
            "subword_matrix", "word_matrix")
_ESCAPES = (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("\u2028", "\\u2028"), ("\u2029", "\\u2029"))
_DATA_MARK, _TITLE_MARK, _STYLE_MARK, _RENDERER_MARK = "@@DATA@@", "@@TITLE@@", "@@STYLE@@", "@@RENDERER@@"


def embed_json(obj: Any) -> str:
    """Compact JSON that is safe inside ``<script>``: ``<``, ``>``, ``&`` only occur in strings,
    where their ``\\uXXXX`` escapes parse back to the same text."""
    text = json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    for char, escape in _ESCAPES:  # str.replace: much faster than str.translate on long texts
        text = text.replace(char, escape)
    return text


def _weights(matrix: Any) -> list:
    """Nested lists of weights in thousandths (weight = value / SCALE): 3 decimals, as ints, which
    take half the characters of the floats and half the time to write."""
    m = np.asarray(matrix, dtype=np.float64)
    if not np.isfinite(m).all():
        raise UserError("weights hold NaN or infinity: the export is damaged; re-run seq2seq translate")
    return np.rint(m * SCALE).astype(np.int64).tolist()


def _with_eos(pieces: list[str], n: int, side: str) -> list[str]:
    """``pieces`` plus the EOS label the raw array has (``n`` = its rows or columns)."""
    own = strip_eos(pieces)
    if n - len(own) not in (0, 1):
        raise UserError(f"raw attention has {counted(n, side + ' position')} for {counted(len(own), side + ' piece')}: "
                        "the NPZ does not belong to this JSONL (pass the pair translate wrote, or --no-npz)")
    return own + [EOS] * (n - len(own))


def attention_view(record: dict, attention: np.ndarray) -> dict:
    """Every layer and head of the raw ``(L, H, T, S)`` attention (and their means), both levels."""
    raw = np.asarray(attention, dtype=np.float32)
    if raw.ndim != 4:
        raise UserError(f"raw attention must be (layers, heads, tgt, src), got shape {raw.shape}")
    n_layers, n_heads = raw.shape[:2]
    layers = [([i], str(i)) for i in range(n_layers)] + ([(list(range(n_layers)), "mean")] if n_layers > 1 else [])
    heads = [([h], str(h)) for h in range(n_heads)] + ([(list(range(n_heads)), "mean")] if n_heads > 1 else [])
    chosen = record.get("heads", "mean")
    if (isinstance(chosen, list) and 1 < len(chosen) < n_heads  # the export averaged a subset of heads
            and all(isinstance(h, int) and 0 <= h < n_heads for h in chosen)):
        heads.append(([int(h) for h in chosen], ",".join(map(str, chosen))))
    grid = np.stack([np.stack([raw[ls][:, hs].mean(axis=(0, 1)) for hs, _ in heads]) for ls, _ in layers])
    src = _with_eos(record["src_pieces"], raw.shape[3], "source")
    tgt = _with_eos(record["tgt_pieces"], raw.shape[2], "target")
    words = merge_to_words(grid, src, tgt)  # (layers, heads, Tw, Sw) incl. EOS
    n_tgt, n_src = len(record["tgt_pieces"]), len(record["src_pieces"])
    n_tgt_words, n_src_words = len(record["tgt_words"]), len(record["src_words"])
    layer_labels, head_labels = [label for _, label in layers], [label for _, label in heads]
    used = record.get("layer_used", "all")
    chosen_label = ",".join(map(str, chosen)) if isinstance(chosen, list) else "mean"
    default = [_position(layer_labels, "mean" if used == "all" else str(used)),
               _position(head_labels, chosen_label)]
    return {"note": f"attention; the export's aggregate is layer {layer_labels[default[0]]}, "
                    f"heads {head_labels[default[1]]}",
            "layers": layer_labels, "heads": head_labels, "default": default,
            "word": _weights(words[..., :n_tgt_words, :n_src_words]),
            "subword": _weights(grid[..., :n_tgt, :n_src])}


def _position(labels: list[str], label: str) -> int:
    return labels.index(label) if label in labels else len(labels) - 1


def single_view(note: str, entry: dict) -> dict:
    """One matrix per level (the export's aggregate attention, or an attribution method)."""
    return {"note": note, "layers": ["-"], "heads": ["-"], "default": [0, 0],
            "word": [[_weights(entry["word_matrix"])]], "subword": [[_weights(entry["subword_matrix"])]]}


def attribution_view(method: str, entry: dict) -> dict:
    """One attribution method's view: an export's ``attribution[method]`` entry (``Attribution.to_json``)."""
    steps = f", {counted(entry['steps'], 'step')}" if entry.get("steps") else ""
    versus = f", why this rather than \"{entry['contrast']}\"" if entry.get("contrast") else ""
    return single_view(f"attribution: {method}{steps}{versus} (row-normalized importances)", entry)


def viewer_sentence(record: dict, attention: np.ndarray | None = None) -> dict:
    """The viewer's data for one export record (``AlignmentRecord.to_json()`` or a JSONL line),
    with per-layer / per-head attention when the raw ``(L, H, T+1, S+1)`` array is given."""
    missing = [key for key in REQUIRED if key not in record]
    if missing:
        raise UserError(f"missing key(s) {', '.join(missing)}: not a record of seq2seq translate --alignments")
    if not isinstance(record["index"], int) or isinstance(record["index"], bool):
        raise UserError(f"index must be an integer sentence number, got {record['index']!r}")
    _check_shapes(record, "")
    if attention is not None:
        views = {"attention": attention_view(record, attention)}
    else:
        heads = record.get("heads", "mean")
        views = {"attention": single_view(
            f"attention, the export's aggregate (layer {record.get('layer_used', '?')}, heads "
            f"{heads if isinstance(heads, str) else ','.join(map(str, heads))}); per-layer and per-head "
            "attention needs the .npz beside the JSONL", record)}
    for method, entry in (record.get("attribution") or {}).items():
        _check_shapes(entry, f"attribution {method!r}: ", record)
        views[method] = attribution_view(method, entry)
    sentence = {"index": int(record["index"]), "source": str(record["source"]), "target": str(record["target"]),
                "levels": {"word": {"src": list(record["src_words"]), "tgt": list(record["tgt_words"])},
                           "subword": {"src": list(record["src_pieces"]), "tgt": list(record["tgt_pieces"])}},
                "views": views}
    if record.get("confidence"):
        sentence["confidence"] = confidence_levels(record)
    return sentence


def confidence_levels(record: dict) -> dict:
    """The target labels' log-probabilities and entropies per level, from the record's ``confidence``
    (``Translation.confidence``: per piece and per word, EOS last; labels without EOS drop it)."""
    out = {}
    for level, key, labels in (("word", "words", "tgt_words"), ("subword", "tokens", "tgt_pieces")):
        entries = record["confidence"][key][: len(record[labels])]
        out[level] = {"log_prob": [round(float(e["log_prob"]), 4) for e in entries],
                      "entropy": [round(float(e["entropy"]), 4) for e in entries]}
    return out


def _check_shapes(entry: dict, what: str, labels: dict | None = None) -> None:
    """Matrices must be (target labels) x (source labels) of the record."""
    labels = labels or entry
    for key, src, tgt in (("word_matrix", "src_words", "tgt_words"), ("subword_matrix", "src_pieces", "tgt_pieces")):
        matrix = entry.get(key)
        rows, cols = len(labels[tgt]), len(labels[src])
        if (not isinstance(matrix, list) or len(matrix) != rows
                or any(not isinstance(row, list) or len(row) != cols for row in matrix)):
            raise UserError(f"{what}{key} is not {rows} x {cols} ({tgt} x {src})")


def renderer_assets() -> dict[str, str]:
    """The renderer every alignment page shares, by file name: ``viewer.js`` (the ``AlignmentView`` class:
    tokens shaded on hover, the heatmap, the layer / head / level / method selectors) and ``viewer.css``
    (its styles). The static viewer inlines both; ``seq2seq serve`` serves them to its page."""
    folder = resources.files(__package__)
    assets = {name: folder.joinpath(name).read_text(encoding="utf-8") for name in ("viewer.js", "viewer.css")}
    for name, text in assets.items():  # inlined in <script> / <style>: nothing may close the element
        if any(mark in text.lower() for mark in ("</script", "</style", "<!--", "@@")):
            raise RuntimeError(f"{name} holds '</script', '</style', '<!--' or '@@': it cannot be inlined")
    return assets


def _template(title: str) -> tuple[str, str]:
    text = resources.files(__package__).joinpath("viewer.html").read_text(encoding="utf-8")
    before, after = text.split(_DATA_MARK)  # split first: a title may hold any text
    assets = renderer_assets()
    before = before.replace(_STYLE_MARK, assets["viewer.css"].rstrip("\n"))
    after = after.replace(_RENDERER_MARK, assets["viewer.js"].rstrip("\n"))
    return before.replace(_TITLE_MARK, html.escape(title)), after


class ViewerWriter:
    """Stream sentences into the viewer HTML; the file appears (atomically) only when the ``with``
    block exits without an exception, so a bad record leaves no half-written page."""

    def __init__(self, path: str | os.PathLike, title: str = "seq2seq alignments") -> None:
        if str(path) in ("", "-"):
            raise UserError("the viewer is an HTML file: give a file name, not '-' (stdout)")
        self.path, self.title = Path(path), title
        self.sentences = 0
        self._stack: ExitStack | None = None
        self._out = None
        self._suffix = ""

    def __enter__(self) -> ViewerWriter:
        self._stack = ExitStack()
        self._out = self._stack.enter_context(atomic_output(self.path))
        prefix, self._suffix = _template(self.title)
        self._out.write(f'{prefix}{{"format":{FORMAT},"scale":{SCALE},"title":{embed_json(self.title)},"sentences":[')
        return self

    def add(self, record: dict, attention: np.ndarray | None = None) -> None:
        """Append one export record (and its raw attention, for the layer / head selectors)."""
        self._out.write(("," if self.sentences else "") + embed_json(viewer_sentence(record, attention)) + "\n")
        self.sentences += 1

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc_type is None:
            self._out.write("]}" + self._suffix)
        return self._stack.__exit__(exc_type, exc, tb)


def read_export(path: str | os.PathLike) -> Iterator[tuple[int, dict]]:
    """(line number, record) of an alignments JSONL; a missing file or a bad line is a UserError
    naming the file and line. Blank lines are skipped."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"alignments file {path} not found: pass the JSONL written by "
                        "seq2seq translate --alignments FILE")
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise UserError(f"{path}, line {number}: not valid JSON ({exc.msg}, column {exc.colno}): "
                                "pass the JSONL written by seq2seq translate --alignments") from None
            if not isinstance(record, dict):
                raise UserError(f"{path}, line {number}: expected a JSON object (one record per line)")
            yield number, record


def _open_npz(path: Path):
    try:
        return np.load(path, allow_pickle=False)
    except Exception as exc:  # zipfile.BadZipFile, OSError, ValueError: a damaged or foreign file
        raise UserError(f"{path}: not a readable .npz ({exc}); pass the file translate wrote, or --no-npz") from None


def write_viewer(jsonl: str | os.PathLike, output: str | os.PathLike, npz: str | os.PathLike | None = None,
                 title: str | None = None) -> int:
    """Write the viewer of an alignments export; per-layer / per-head attention comes from ``npz``
    (the ``.npz`` translate wrote beside the JSONL) when given. Returns the number of sentences."""
    jsonl = Path(jsonl)
    if Path(output).resolve() == jsonl.resolve():
        raise UserError(f"--output {output} would overwrite the alignments file; choose another name")
    with ExitStack() as stack:
        arrays = stack.enter_context(_open_npz(Path(npz))) if npz is not None else None
        writer = stack.enter_context(ViewerWriter(output, title or f"seq2seq alignments: {jsonl.name}"))
        for number, record in read_export(jsonl):
            key = f"s{record.get('index')}_attention"
            try:
                writer.add(record, arrays[key] if arrays is not None and key in arrays.files else None)
            except UserError as exc:
                raise UserError(f"{jsonl}, line {number}: {exc}") from None
        if writer.sentences == 0:
            raise UserError(f"{jsonl} holds no records: translate with --alignments FILE first")
    return writer.sentences
