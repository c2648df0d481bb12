"""seq2seq serve's page in headless Chromium: the real command serving the tiny Transformer and RNN of
tests/data/pre-tiers side by side, with an API key and --markup html. A sentence typed and Enter pressed is
translated by both; each pane shows what the model computes (the translation, the heatmap of every layer and
head, the source words shaded for a hovered target word, an attribution), checked against the models loaded
here; the page logs no console error, requests nothing but this server, and sends the key in a header only.
A source holding a script tag is shown as text and runs nothing. Skipped without Chromium (.ci/run installs it).

``SEQ2SEQ_SCREENSHOT=docs/images/serve-page.png`` keeps the first test's screenshot there (the serving guide's)."""
from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("fastapi")

from seq2seq.attribution.attribute import attribute_translation  # noqa: E402
from seq2seq.decoding.translator import Translator  # noqa: E402
from test_viewer import Chromium, find_chromium  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
MODELS = {"transformer": ROOT / "tests/data/pre-tiers/transformer.pt", "rnn": ROOT / "tests/data/pre-tiers/rnn.pt"}
KEY = "page-key-" + "k" * 24
SENTENCE = "three hundred and five"
HALF_STEP = 5e-4 + 1e-6  # the page's weights have 3 decimals
RAW = HALF_STEP + 5e-5  # ... read back from the raw attention, rounded to 4 decimals on the way


class PageBrowser(Chromium):
    """Chromium that keeps every DevTools event (console, exceptions, network requests, dialogs)."""

    def __init__(self, binary: str, profile: Path) -> None:
        super().__init__(binary, profile)
        self.events: list[dict] = []

    def _receive(self, deadline: float) -> dict:
        message = super()._receive(deadline)
        if "method" in message:
            self.events.append(message)
        return message

    def open(self, url: str) -> None:
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        for domain in ("Runtime", "Log", "Network", "Page"):
            self.call(f"{domain}.enable")
        self.call("Page.navigate", url=url)
        self.wait("document.body && document.body.dataset.ready === 'true'", "the page did not start")

    def wait(self, condition: str, what: str, seconds: float = 60) -> None:
        deadline = time.monotonic() + seconds
        while not self.js(condition):
            if time.monotonic() > deadline:
                shown = self.js("(document.getElementById('error') || {}).textContent")
                raise AssertionError(f"{what}; the page says: {shown!r}; {self.problems()}")
            time.sleep(0.05)

    def type_into(self, selector: str, text: str, enter: bool = False) -> None:
        """Focus the element, type ``text`` as a person would (an IME-free insert), optionally press Enter."""
        self.js(f"document.querySelector({json.dumps(selector)}).focus()")
        self.js(f"document.querySelector({json.dumps(selector)}).value = ''")
        self.call("Input.insertText", text=text)
        if enter:
            for kind in ("keyDown", "keyUp"):
                self.call("Input.dispatchKeyEvent", type=kind, key="Enter", code="Enter", windowsVirtualKeyCode=13,
                          nativeVirtualKeyCode=13, **({"text": "\r"} if kind == "keyDown" else {}))

    def problems(self) -> list[str]:
        """Console errors and warnings, uncaught exceptions, Content-Security-Policy reports, dialogs."""
        out = []
        for event in self.events:
            method, params = event["method"], event.get("params", {})
            if method == "Runtime.exceptionThrown":
                out.append(f"exception: {params['exceptionDetails']}")
            elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "warning", "assert"):
                out.append(f"console.{params['type']}: {params.get('args')}")
            elif method == "Log.entryAdded" and params["entry"]["level"] in ("error", "warning"):
                entry = params["entry"]
                out.append(f"log {entry['level']}: {entry.get('text')} {entry.get('url')}")
            elif method == "Page.javascriptDialogOpening":
                out.append(f"dialog: {params.get('message')}")
        return out

    def requests(self) -> list[dict]:
        return [event["params"]["request"] for event in self.events if event["method"] == "Network.requestWillBeSent"]


@pytest.fixture(scope="module")
def server():
    """``seq2seq serve --model transformer=... --model rnn=... --markup html`` with an API key (from the
    environment, as a person would keep it out of the process list) on a free port; its URL."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "SEQ2SEQ_API_KEY": KEY}
    proc = subprocess.Popen([sys.executable, "-m", "seq2seq", "serve", "--device", "cpu", "--port", "0",
                             "--engine", "seq2seq", "--compile", "off", "--markup", "html", "--quiet",
                             *(arg for name, path in MODELS.items() for arg in ("--model", f"{name}={path}"))],
                            cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    log: list[str] = []
    try:
        for line in proc.stderr:
            log.append(line)
            if match := re.match(r"serve url=(\S+)", line):
                threading.Thread(target=lambda: log.extend(proc.stderr), daemon=True).start()
                yield match.group(1)
                break
        else:
            raise AssertionError("the server did not start: " + "".join(log))
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture(scope="module")
def translators() -> dict[str, Translator]:
    return {name: Translator.from_checkpoint(path, device="cpu") for name, path in MODELS.items()}


@pytest.fixture
def page(server, tmp_path):
    binary = find_chromium()
    if binary is None:
        pytest.skip("no Chromium found for the browser test: apt-get install chromium (.ci/run does), "
                    "or set CHROMIUM=/path/to/chrome")
    browser = PageBrowser(binary, tmp_path / "profile")
    try:
        browser.open(server + "/")
        yield browser
    finally:
        browser.close()


def pane(name: str, selector: str = "") -> str:
    return f"[data-model='{name}'] {selector}".strip()


def source_weights(browser: PageBrowser, name: str) -> list[float]:
    return browser.js(f"[...document.querySelectorAll(\"{pane(name, '[data-part=src] .tok')}\")]"
                      ".map(e => Number(e.dataset.weight))")


def texts(browser: PageBrowser, selector: str) -> list[str]:
    return browser.js(f"[...document.querySelectorAll({json.dumps(selector)})].map(e => e.textContent)")


def choose(browser: PageBrowser, selector: str, label: str) -> None:
    """Pick the option of this text in a <select>, as a change event."""
    ok = browser.js(f"(() => {{ const s = document.querySelector({json.dumps(selector)});"
                    f" const o = [...s.options].find(o => o.text === {json.dumps(label)}); if (!o) return false;"
                    " s.value = o.value; s.dispatchEvent(new Event('change')); return true; })()")
    assert ok, f"no option {label!r} in {selector}"


def close(actual, expected, tolerance: float = HALF_STEP) -> bool:
    actual, expected = np.asarray(actual, dtype=float), np.asarray(expected, dtype=float)
    return actual.shape == expected.shape and bool(np.all(np.abs(actual - expected) <= tolerance))


def translate_on_page(browser: PageBrowser, text: str) -> None:
    """Type the key where the page asks for it, then ``text`` and Enter; wait for both panes' answers."""
    if browser.js("!document.getElementById('key-row').hidden && !document.getElementById('key').value"):
        browser.type_into("#key", KEY)
    answered = int(browser.js("document.body.dataset.answered || '0'"))
    browser.type_into("#input", text, enter=True)
    browser.wait(f"Number(document.body.dataset.answered || 0) > {answered}", "no translation appeared")
    assert browser.js("document.querySelectorAll('.pane').length") == 2


def test_the_page_translates_with_both_models_and_shows_where_each_looks_in_chromium(page, server, translators):
    translate_on_page(page, SENTENCE)
    assert page.js("document.getElementById('status').textContent").startswith("1 sentence translated")
    for name, translator in translators.items():
        best = translator.translate([SENTENCE], need_attention=True)[0]  # the server's default: beam 5
        record = best.alignment_record(0)  # the server's default reading: translate's
        assert page.js(f"document.querySelector(\"{pane(name, '[data-part=targetText]')}\").textContent"
                       ).startswith(best.text)
        rows = page.js(f"[...document.querySelectorAll(\"{pane(name, '[data-part=matrix] tbody tr')}\")]"
                       ".map(r => r.cells.length - 1)")
        assert rows == [len(record.src_words)] * len(record.tgt_words)  # target x source cells
        assert page.js(f"document.querySelector(\"{pane(name, '[data-part=tgt] .tok')}\").title").startswith("p = ")
        j = 1
        target = pane(name, f"[data-part=tgt] .tok[data-j='{j}']")
        page.hover(target)  # the default view: layer -2 (the first of two; the RNN's one), mean of heads
        assert page.js(f"document.querySelector(\"{target}\").classList.contains('active')")
        assert close(source_weights(page, name), record.words[j])
        shaded = page.js(f"[...document.querySelectorAll(\"{pane(name, '[data-part=src] .tok')}\")]"
                         ".map(e => e.style.backgroundColor)")
        assert all(s.startswith("rgba(33, 102, 172") for s in shaded)
        choose(page, pane(name, "[data-part=level]"), "subwords")
        if name == "transformer":  # another layer and head, read from the raw attention array
            choose(page, pane(name, "[data-part=layer]"), "1")
            choose(page, pane(name, "[data-part=head]"), "0")
            page.hover(target)
            assert close(source_weights(page, name), best.attention[1, 0, j, :len(best.src_pieces) - 1], RAW)
            choose(page, pane(name, "[data-part=head]"), "mean of heads")
            page.hover(target)
            assert close(source_weights(page, name), best.attention[1, :, j, :len(best.src_pieces) - 1].mean(0), RAW)
        else:  # one layer, one head: nothing to choose
            assert page.js(f"document.querySelector(\"{pane(name, '[data-part=head]')}\").disabled")
            page.hover(target)
            assert close(source_weights(page, name), best.attention[0, 0, j, :len(best.src_pieces) - 1], RAW)
        choose(page, pane(name, "[data-part=level]"), "words")

    # attribution: a fast method runs when chosen, a slow one waits for its button
    occlusion = attribute_translation(translators["transformer"], translators["transformer"].translate([SENTENCE])[0],
                                      "occlusion").record_for(translators["transformer"].translate([SENTENCE])[0], 0)
    choose(page, pane("transformer", ".attr-method"), "occlusion (1 forward pass per source subword)")
    page.wait(f"document.querySelector(\"{pane('transformer', '.attr-status')}\").textContent.startsWith('occlusion:')",
              "occlusion did not come")
    assert page.js(f"document.querySelector(\"{pane('transformer', '[data-part=method]')}\").selectedOptions[0].text"
                   ) == "occlusion"
    page.hover(pane("transformer", "[data-part=tgt] .tok[data-j='1']"))
    assert close(source_weights(page, "transformer"), occlusion.words[1], HALF_STEP + 5e-5)
    choose(page, pane("rnn", ".attr-method"), "lime (200 forward passes (--attribution-samples); slow)")
    assert "press explain" in page.js(f"document.querySelector(\"{pane('rnn', '.attr-status')}\").textContent")
    assert not any("/attribution" in r["url"] and "lime" in (r.get("postData") or "") for r in page.requests())
    page.js(f"document.querySelector(\"{pane('rnn', '.explain-button')}\").click()")
    page.wait(f"document.querySelector(\"{pane('rnn', '.attr-status')}\").textContent.startsWith('lime:')",
              "lime did not come")
    page.hover(pane("rnn", "[data-part=tgt] .tok[data-j='0']"))
    assert abs(sum(source_weights(page, "rnn")) - 1) < 0.01 or sum(source_weights(page, "rnn")) == 0

    pinned = pane("rnn", "[data-part=tgt] .tok[data-j='2']")
    page.js(f"document.querySelector({json.dumps(pinned)}).click()")  # pinned: stays shaded when the mouse leaves
    choose(page, pane("transformer", "[data-part=method]"), "attention")  # the layer 1, mean of heads chosen above
    choose(page, pane("transformer", "[data-part=level]"), "words")
    page.hover(pane("transformer", "[data-part=tgt] .tok[data-j='1']"))
    assert page.js(f"document.querySelector(\"{pane('transformer', '[data-part=layer]')}\").selectedOptions[0].text"
                   ) == "1"
    png = base64.b64decode(page.call("Page.captureScreenshot", format="png")["data"])
    assert png.startswith(b"\x89PNG") and len(png) > 5000
    if os.environ.get("SEQ2SEQ_SCREENSHOT"):
        Path(os.environ["SEQ2SEQ_SCREENSHOT"]).write_bytes(png)

    assert page.problems() == []
    requests = page.requests()
    origin = server.rstrip("/")
    assert requests and all(r["url"].startswith(origin + "/") for r in requests), [r["url"] for r in requests]
    assert all(KEY not in r["url"] for r in requests)
    posts = [r for r in requests if r["method"] == "POST"]
    assert {r["url"].removeprefix(origin) for r in posts} == {"/alignments", "/attribution"}
    assert all(r["headers"].get("X-API-Key") == KEY for r in posts)


def test_a_source_with_a_script_tag_is_shown_as_text_and_runs_nothing(page):
    nasty = "<script>alert(1)</script>"
    choose(page, "#markup", "plain text")
    translate_on_page(page, nasty + "\n<img src=x onerror=\"window.pwned=1\"> five")
    assert page.js(f"document.querySelector(\"{pane('rnn', '[data-part=sourceText]')}\").textContent") == nasty
    tokens = page.js(f"[...document.querySelectorAll(\"{pane('rnn', '[data-part=src] .tok')}\")]"
                     ".map(e => [e.firstChild.textContent, e.children.length])")
    assert "<" in "".join(word for word, _ in tokens)  # the toy vocabulary's <unk>: text too
    assert all(children == 1 for _, children in tokens)  # the weight's span, nothing parsed from the text
    choose(page, "#sentence", "<img src=x onerror=\"window.pwned=1\"> five")
    page.wait(f"document.querySelector(\"{pane('rnn', '[data-part=sourceText]')}\").textContent.startsWith('<img')",
              "the second sentence is not shown")
    choose(page, "#markup", "HTML tags")  # the tags carried across, shown as text
    translate_on_page(page, nasty + " five")
    assert texts(page, pane("transformer", ".markup-source .tag")) == ["<script>", "</script>"]
    assert sorted(texts(page, pane("transformer", ".markup-target .tag"))) == ["</script>", "<script>"]
    assert page.js("document.scripts.length") == 2 and page.js("document.images.length") == 0
    assert page.js("window.pwned === undefined")
    assert page.problems() == []
