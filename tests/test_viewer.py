"""The HTML alignment viewer: `translate --html` and `seq2seq view` embed the export faithfully and
safely, bad input is a named error with no output, and in headless Chromium hovering a target word
shows exactly the exported weights for every layer / head / method / level."""
from __future__ import annotations

import base64
import fcntl
import json
import math
import os
import re
import select
import shutil
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from seq2seq.alignment.viewer import SCALE, ViewerWriter, viewer_sentence
from seq2seq.cli import translate, view
from test_align_cli import checkpoint  # noqa: F401  (the tiny 2-layer, 2-head Transformer fixture)

SOURCES = ["twenty-one", "three hundred and five </script><b>x & y</b>", "", "seven thousand and twelve"]
METHODS = ["occlusion", "gradient"]
HALF_STEP = 5e-4 + 1e-6  # the viewer rounds weights to 3 decimals
TWICE = HALF_STEP + 5e-5  # attribution reaches it through the JSONL's 4 decimals


def embedded(path: Path) -> dict:
    """The viewer's JSON data, read back from the page, weights divided by its scale."""
    text = path.read_text(encoding="utf-8")
    match = re.search(r'<script type="application/json" id="viewer-data">(.*?)</script>', text, re.S)
    data = json.loads(match.group(1))
    for sentence in data["sentences"]:
        for entry in sentence["views"].values():
            for level in ("word", "subword"):
                entry[level] = (np.asarray(entry[level], dtype=float) / data["scale"]).tolist()
    return data


@pytest.fixture(scope="module")
def export(checkpoint, tmp_path_factory) -> Path:  # noqa: F811
    """translate --alignments a.jsonl (+ a.npz) --html t.html with two attribution methods."""
    out = tmp_path_factory.mktemp("viewer")
    (out / "in.txt").write_text("\n".join(SOURCES) + "\n", encoding="utf-8")
    code = translate.main(["--checkpoint", str(checkpoint), "--input", str(out / "in.txt"), "--output",
                           str(out / "hyp"), "--alignments", str(out / "a.jsonl"), "--html", str(out / "t.html"),
                           "--sample", "--temperature", "2", "--seed", "1",  # the 8-step model's search says nothing
                           "--quiet", "--attribution", *METHODS])
    assert code == 0
    return out


def records(export: Path) -> list[dict]:
    return [json.loads(line) for line in (export / "a.jsonl").read_text(encoding="utf-8").splitlines()]


def close(actual, expected, tolerance: float = HALF_STEP) -> bool:
    actual, expected = np.asarray(actual, dtype=float), np.asarray(expected, dtype=float)
    if expected.size == 0:  # no rows: JSON keeps no column count
        return actual.size == 0
    return actual.shape == expected.shape and bool(np.all(np.abs(actual - expected) <= tolerance))


def test_translate_html_embeds_the_export_with_every_layer_and_head(export):
    data = embedded(export / "t.html")
    npz = np.load(export / "a.npz")
    assert data["format"] == 1 and len(data["sentences"]) == len(SOURCES)
    for rec, sentence in zip(records(export), data["sentences"]):
        i = rec["index"]
        assert (sentence["index"], sentence["source"], sentence["target"]) == (i, rec["source"], rec["target"])
        assert sentence["levels"] == {"word": {"src": rec["src_words"], "tgt": rec["tgt_words"]},
                                      "subword": {"src": rec["src_pieces"], "tgt": rec["tgt_pieces"]}}
        att = sentence["views"]["attention"]
        assert att["layers"] == ["0", "1", "mean"] and att["heads"] == ["0", "1", "mean"]
        assert att["default"] == [rec["layer_used"], 2]  # the export's aggregate: layer -2, mean of heads
        words, raw = npz[f"s{i}_word_attention"], npz[f"s{i}_attention"]
        rows, cols = len(rec["tgt_pieces"]), len(rec["src_pieces"])
        for layer in range(2):
            for head in range(2):
                assert close(att["word"][layer][head], words[layer, head])
                assert close(att["subword"][layer][head], raw[layer, head, :rows, :cols])
        assert close(att["word"][att["default"][0]][2], npz[f"s{i}_words"])
        assert close(att["subword"][att["default"][0]][2], npz[f"s{i}_subword"])
        assert close(att["word"][2][2], words.mean(axis=(0, 1)))  # mean of layers and heads
        if not rec["source"]:
            assert list(sentence["views"]) == ["attention"] and sentence["levels"]["word"]["src"] == []
            continue
        assert list(sentence["views"]) == ["attention", *METHODS]
        for method in METHODS:
            entry = sentence["views"][method]
            assert entry["layers"] == entry["heads"] == ["-"]
            assert close(entry["word"][0][0], npz[f"s{i}_attr_{method}_words"], TWICE)
            assert close(entry["subword"][0][0], npz[f"s{i}_attr_{method}"], TWICE)
    html = (export / "t.html").read_text(encoding="utf-8")
    assert "http://" not in html and "https://" not in html  # self-contained: nothing to fetch
    assert html.lower().count("</script") == html.lower().count("<script") == 2  # the source's tag is escaped


def test_view_command_rebuilds_the_same_page_and_the_aggregate_without_npz(export, capsys):
    assert view.main([str(export / "a.jsonl"), "--output", str(export / "v.html")]) == 0
    assert "4 sentences" in capsys.readouterr().err
    from_translate, from_view = embedded(export / "t.html"), embedded(export / "v.html")
    assert from_view["sentences"] == from_translate["sentences"]
    assert view.main([str(export / "a.jsonl"), "--output", str(export / "small.html"), "--no-npz", "--quiet"]) == 0
    small = embedded(export / "small.html")
    for rec, sentence in zip(records(export), small["sentences"]):
        att = sentence["views"]["attention"]
        assert att["layers"] == att["heads"] == ["-"]
        assert att["word"] == [[np.round(np.asarray(rec["word_matrix"], dtype=float), 3).reshape(
            len(rec["tgt_words"]), len(rec["src_words"])).tolist()]]
    assert (export / "small.html").stat().st_size < (export / "v.html").stat().st_size


def test_script_tags_and_html_characters_are_escaped(tmp_path):
    nasty = '</script><script>alert("x")</script> <!-- & \u2028 </SCRIPT >'
    record = {"index": 0, "source": nasty, "target": "a <b>", "src_pieces": ["\u2581</script>", "\u2581&amp;"],
              "tgt_pieces": ["\u2581a", "\u2581<b>"], "src_words": ["</script>", "&amp;"], "tgt_words": ["a", "<b>"],
              "subword_matrix": [[0.12345, 0.8], [1.0, 0.0]], "word_matrix": [[0.12345, 0.8], [1.0, 0.0]],
              "layer_used": 0, "heads": "mean"}
    with ViewerWriter(tmp_path / "v.html", title="<title> & </script>") as writer:
        writer.add(record)
    html = (tmp_path / "v.html").read_text(encoding="utf-8")
    assert html.lower().count("</script") == html.lower().count("<script") == 2
    assert "<!--" not in html.split('id="viewer-data">')[1] and "\u2028" not in html
    assert "<title>&lt;title&gt; &amp; &lt;/script&gt;</title>" in html
    sentence = embedded(tmp_path / "v.html")["sentences"][0]
    assert sentence["source"] == nasty and sentence["levels"]["word"]["src"] == ["</script>", "&amp;"]
    assert sentence["views"]["attention"]["word"] == [[[[0.123, 0.8], [1, 0]]]]  # 3 decimals
    assert json.loads(html.split('id="viewer-data">')[1].split("</script>")[0])["sentences"][0] == json.loads(
        json.dumps(viewer_sentence(record)))  # the escapes read back as the text


@pytest.mark.parametrize("shape, layer, heads, default", [
    ((3, 4), 1, [0, 2], ["1", "0,2"]),  # a subset of heads gets its own entry
    ((3, 4), "all", "mean", ["mean", "mean"]),
    ((3, 4), -1, [3], ["2", "3"]),
    ((1, 1), -2, "mean", ["0", "0"]),  # an RNN: no means to choose
])
def test_layer_and_head_choices_start_at_the_exports_aggregate(shape, layer, heads, default):
    from seq2seq.alignment.records import AlignmentRecord
    from seq2seq.config import AlignConfig

    rng = np.random.default_rng(0)
    attention = rng.random((*shape, 4, 5)).astype(np.float32)
    attention /= attention.sum(-1, keepdims=True)
    src, tgt = ["\u2581a", "b", "\u2581c", "\u2581d"], ["\u2581x", "y", "\u2581z"]
    record = AlignmentRecord.build(0, "a b c d", "x y z", src, tgt, attention, AlignConfig(layer=layer, heads=heads))
    view = viewer_sentence(record.to_json(), record.attention)["views"]["attention"]
    layers, heads_ = view["layers"], view["heads"]
    assert [layers[view["default"][0]], heads_[view["default"][1]]] == default
    assert len(layers) == shape[0] + (shape[0] > 1) and len(heads_) >= shape[1] + (shape[1] > 1)
    li, hi = view["default"]
    assert close(np.asarray(view["word"][li][hi]) / SCALE, record.words)
    assert close(np.asarray(view["subword"][li][hi]) / SCALE, record.subword)


@pytest.mark.parametrize("content, message", [
    (None, "not found"),
    ("", "holds no records"),
    ('{"index": 0}\nnot json\n', "line 1: missing key(s) source"),
    ("GOOD\n{broken\n", "line 2: not valid JSON"),
    ("GOOD\n[1, 2]\n", "line 2: expected a JSON object"),
    ("GOOD\nSHAPE\n", "line 2: word_matrix is not 1 x 2"),
])
def test_bad_alignments_file_is_a_user_error_naming_file_and_line(tmp_path, capsys, content, message):
    good = {"index": 0, "source": "a b", "target": "c", "src_pieces": ["\u2581a", "\u2581b"], "tgt_pieces": ["\u2581c"],
            "src_words": ["a", "b"], "tgt_words": ["c"], "subword_matrix": [[0.5, 0.5]], "word_matrix": [[0.5, 0.5]]}
    path, out = tmp_path / "a.jsonl", tmp_path / "out" / "v.html"
    if content is not None:
        content = content.replace("GOOD", json.dumps(good)).replace("SHAPE", json.dumps({**good, "word_matrix": [[1]]}))
        path.write_text(content, encoding="utf-8")
    assert view.main([str(path), "--output", str(out)]) == 2
    err = capsys.readouterr().err
    assert str(path) in err and message in err, err
    assert not out.exists() and not list(tmp_path.rglob(".*.tmp"))


def test_npz_that_does_not_match_the_jsonl_is_a_user_error(export, tmp_path, capsys):
    lines = (export / "a.jsonl").read_text(encoding="utf-8").splitlines()
    rec = json.loads(lines[1])
    rec["src_pieces"], rec["src_words"] = rec["src_pieces"][:1], rec["src_words"][:1]
    rec["subword_matrix"] = [row[:1] for row in rec["subword_matrix"]]
    rec["word_matrix"] = [row[:1] for row in rec["word_matrix"]]
    (tmp_path / "a.jsonl").write_text("\n".join([lines[0], json.dumps(rec)]) + "\n", encoding="utf-8")
    out = tmp_path / "v.html"
    assert view.main([str(tmp_path / "a.jsonl"), "--npz", str(export / "a.npz"), "--output", str(out)]) == 2
    err = capsys.readouterr().err
    assert "line 2:" in err and "does not belong to this JSONL" in err and not out.exists()
    (tmp_path / "bad.npz").write_bytes(b"not a zip")
    assert view.main([str(tmp_path / "a.jsonl"), "--npz", str(tmp_path / "bad.npz"), "--output", str(out)]) == 2
    assert "bad.npz: not a readable .npz" in capsys.readouterr().err and not out.exists()


# ----------------------------------------------------------------------------- the page in a browser


def find_chromium() -> str | None:
    for name in (os.environ.get("CHROMIUM"), "chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def _high_fd(fd: int) -> int:
    """The same pipe end as a close-on-exec descriptor >= 10."""
    high = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)
    os.close(fd)
    return high


class Chromium:
    """Headless Chromium driven over the Chrome DevTools Protocol on a pipe (``--remote-debugging-pipe``:
    JSON messages ending in NUL, commands in on fd 3, replies and events out on fd 4): stdlib only,
    no websocket client, no driver download."""

    def __init__(self, binary: str, profile: Path) -> None:
        to_browser, self._write = map(_high_fd, os.pipe())
        self._read, from_browser = map(_high_fd, os.pipe())

        def on_fds_3_and_4() -> None:  # in the child; sources >= 10, so neither dup2 clobbers the other
            os.dup2(to_browser, 3)
            os.dup2(from_browser, 4)

        self.process = subprocess.Popen(
            [binary, "--headless", "--no-sandbox", "--disable-gpu", "--remote-debugging-pipe", "--no-first-run",
             "--no-default-browser-check", "--disable-extensions", "--allow-file-access-from-files",
             f"--user-data-dir={profile}", "--window-size=1200,900"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            preexec_fn=on_fds_3_and_4, close_fds=False)  # only 3 and 4 are inheritable: the rest close on exec
        os.close(to_browser)
        os.close(from_browser)
        self._buffer, self._next_id, self.session = b"", 0, None

    def call(self, method: str, timeout: float = 30.0, **params):
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params}
        if self.session and not method.startswith(("Target.", "Browser.")):
            message["sessionId"] = self.session
        os.write(self._write, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._receive(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})

    def _receive(self, deadline: float) -> dict:
        while b"\0" not in self._buffer:
            if not select.select([self._read], [], [], max(0.0, deadline - time.monotonic()))[0]:
                raise TimeoutError("Chromium did not answer")
            chunk = os.read(self._read, 1 << 16)
            if not chunk:
                raise RuntimeError("Chromium closed the DevTools pipe")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def open(self, url: str) -> None:
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        self.call("Page.navigate", url=url)
        deadline = time.monotonic() + 30
        while self.js("document.readyState") != "complete":
            assert time.monotonic() < deadline, "page did not load"
            time.sleep(0.05)

    def js(self, expression: str):
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def hover(self, selector: str) -> None:
        """A real mouse move onto the element's centre (mouseenter fires as for a person)."""
        box = self.js(f"(() => {{ const e = document.querySelector({json.dumps(selector)}); e.scrollIntoView();"
                      " const r = e.getBoundingClientRect(); return [r.x + r.width / 2, r.y + r.height / 2]; })()")
        self.call("Input.dispatchMouseEvent", type="mouseMoved", x=1, y=1)
        self.call("Input.dispatchMouseEvent", type="mouseMoved", x=box[0], y=box[1])

    def choose(self, select_id: str, label: str) -> None:
        """Pick the option with this text in a <select>, as a change event."""
        ok = self.js(f"(() => {{ const s = document.getElementById({json.dumps(select_id)});"
                     f" const o = [...s.options].find(o => o.text === {json.dumps(label)}); if (!o) return false;"
                     " s.value = o.value; s.dispatchEvent(new Event('change')); return true; })()")
        assert ok, f"no option {label!r} in #{select_id}"

    def close(self) -> None:
        try:
            self.call("Browser.close", timeout=10)
        except (RuntimeError, TimeoutError, OSError):
            pass
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        os.close(self._read)
        os.close(self._write)


@pytest.fixture
def browser(tmp_path):
    binary = find_chromium()
    if binary is None:
        pytest.skip("no Chromium found for the browser test: apt-get install chromium (.ci/run does), "
                    "or set CHROMIUM=/path/to/chrome")
    chromium = Chromium(binary, tmp_path / "profile")
    yield chromium
    chromium.close()


def source_weights(browser: Chromium) -> list[float]:
    return browser.js("[...document.querySelectorAll('#src .tok')].map(e => Number(e.dataset.weight))")


def test_hovering_a_target_word_shows_the_exported_weights_in_chromium(export, browser, tmp_path):
    npz = np.load(export / "a.npz")
    recs = records(export)
    rec = max(recs, key=lambda r: min(len(r["src_words"]), len(r["tgt_words"])))  # one with words on both sides
    assert len(rec["src_words"]) > 1 and len(rec["tgt_words"]) > 1
    i, j = rec["index"], 1
    browser.open((export / "t.html").as_uri())
    assert browser.js("document.getElementById('position').textContent") == f"1 / {len(SOURCES)}"
    browser.js("document.getElementById('next').click()")
    assert browser.js("document.getElementById('position').textContent") == f"2 / {len(SOURCES)}"
    assert "</script>" in browser.js("document.getElementById('source-text').textContent")  # shown as text
    browser.choose("sentence", f"{i}: {rec['source']}")
    target = f"#tgt .tok[data-j='{j}']"
    shown = browser.js(f"document.querySelector(\"{target}\").title")  # the word's confidence: "p = 0.123, ..."
    word = rec["confidence"]["words"][j]
    probability, entropy = float(shown.split()[2].rstrip(",")), float(shown.split()[4])
    assert abs(probability - math.exp(word["log_prob"])) < 2e-3 and abs(entropy - word["entropy"]) < 0.01

    browser.hover(target)  # the export's aggregate: layer -2 (= 0 of 2), mean of heads
    assert browser.js(f"document.querySelector(\"{target}\").classList.contains('active')")
    assert close(source_weights(browser), npz[f"s{i}_words"][j])
    tooltip = browser.js("document.querySelector('#src .tok').title")
    assert tooltip == f"weight {npz[f's{i}_words'][j][0]:.3f}" or close([float(tooltip.split()[1])],
                                                                     [npz[f"s{i}_words"][j][0]])
    browser.choose("layer", "1")
    browser.choose("head", "0")
    browser.hover(target)
    assert close(source_weights(browser), npz[f"s{i}_word_attention"][1, 0, j])
    browser.choose("level", "subwords")
    browser.hover(target)
    n_src = len(rec["src_pieces"])
    assert close(source_weights(browser), npz[f"s{i}_attention"][1, 0, j, :n_src])
    browser.choose("level", "words")
    for method in METHODS:
        browser.choose("method", method)
        assert browser.js("document.getElementById('layer').disabled")  # no layers for an attribution
        browser.hover(target)
        assert close(source_weights(browser), npz[f"s{i}_attr_{method}_words"][j], TWICE)
    browser.choose("method", "attention")  # back: the chosen layer 1 / head 0 is kept
    browser.js(f"document.querySelector(\"{target}\").click()")  # pin, then move the mouse away
    browser.call("Input.dispatchMouseEvent", type="mouseMoved", x=1, y=1)
    assert close(source_weights(browser), npz[f"s{i}_word_attention"][1, 0, j])
    cells = browser.js(f"[...document.querySelectorAll('#matrix tbody tr')[{j}].cells].slice(1).map(c => c.title)")
    assert len(cells) == len(rec["src_words"])
    png = base64.b64decode(browser.call("Page.captureScreenshot", format="png")["data"])
    (tmp_path / "viewer.png").write_bytes(png)
    assert png.startswith(b"\x89PNG") and len(png) > 5000
