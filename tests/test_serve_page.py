"""seq2seq serve's page and the endpoints behind it, in process (TestClient), on the tiny Transformer and RNN
of tests/data/pre-tiers served side by side: every model answers what its Translator gives, /alignments carries
the viewer's data of exactly its attention, /attribution what the attribution code computes, both keep the
limits, errors and API key of /translate, and the page is static files under a strict Content-Security-Policy
whose renderer is the static viewer's. The command's new flags are checked without a server. The page itself
in a browser: tests/test_serve_browser.py."""
from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from importlib import resources
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("httpx")

from fastapi.testclient import TestClient  # noqa: E402

from seq2seq.alignment.viewer import SCALE  # noqa: E402
from seq2seq.attribution.attribute import attribute_translation  # noqa: E402
from seq2seq.attribution.base import METHODS  # noqa: E402
from seq2seq.attribution.explain import Explainer  # noqa: E402
from seq2seq.cli import serve as serve_cli  # noqa: E402
from seq2seq.config import AttributionConfig  # noqa: E402
from seq2seq.decoding.translator import Translator  # noqa: E402
from seq2seq.serve import Limits, ServedModel, ServeSettings, create_app  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CHECKPOINTS = {"transformer": ROOT / "tests/data/pre-tiers/transformer.pt", "rnn": ROOT / "tests/data/pre-tiers/rnn.pt"}
SOURCES = ["three hundred and five", "twenty-one", ""]
KEY = "page-" + "x" * 27


@pytest.fixture(scope="module")
def translators() -> dict[str, Translator]:
    return {name: Translator.from_checkpoint(path, device="cpu") for name, path in CHECKPOINTS.items()}


@contextmanager
def serving(translators, methods=METHODS, **options):
    """Both models side by side (the Transformer first); ``options``: ServeSettings fields, limits as a dict."""
    limits = Limits(**options.pop("limits", {}))
    explain = Explainer(AttributionConfig(methods=list(methods))) if methods else None
    models = [ServedModel(name, translator) for name, translator in translators.items()]
    with TestClient(create_app(models, ServeSettings(limits=limits, explain=explain, **options))) as client:
        yield client


@pytest.fixture(scope="module")
def client(translators):
    with serving(translators) as client:
        yield client


def test_each_model_translates_by_name_and_the_first_when_none_is_named(client, translators):
    for name, translator in translators.items():
        body = client.post("/translate", json={"sentences": SOURCES, "model": name}).json()
        assert [t["translation"] for t in body["translations"]] == [t.text for t in translator.translate(SOURCES)]
    unnamed = client.post("/translate", json={"sentences": SOURCES}).json()
    assert [t["translation"] for t in unnamed["translations"]] == [
        t.text for t in translators["transformer"].translate(SOURCES)]
    assert len({t.translate(SOURCES[:1])[0].text for t in translators.values()}) == 2  # two models, two answers
    wrong = client.post("/translate", json={"sentences": ["five"], "model": "gpt"})
    assert wrong.status_code == 422 and wrong.json()["error"] == (
        "unknown model 'gpt': this server serves transformer, rnn (GET /models)")
    health = client.get("/health").json()
    assert [m["name"] for m in health["models"]] == ["transformer", "rnn"] and health["arch"] == "transformer"
    assert health["models"][1]["arch"] == "rnn (bahdanau)" and health["models"][1]["model"] == [str(CHECKPOINTS["rnn"])]


def test_models_lists_both_with_their_attribution_methods_and_costs(client):
    body = client.get("/models").json()
    transformer, rnn = body["models"]
    assert (transformer["name"], transformer["layers"], transformer["heads"]) == ("transformer", 2, 2)
    assert (rnn["name"], rnn["layers"], rnn["heads"], rnn["arch"]) == ("rnn", 1, 1, "rnn (bahdanau)")
    assert transformer["languages"] == ["src", "tgt"]
    methods = {m["method"]: m for m in transformer["attribution"]}
    assert list(methods) == list(METHODS)
    assert methods["integrated-gradients"] == {"method": "integrated-gradients", "slow": True, "contrast": True,
                                               "cost": "16 forward and backward passes (--ig-steps)"}
    assert not methods["gradient"]["slow"] and not methods["grad-attention"]["contrast"]
    assert body["decode"] == {"beam_size": 5, "n_best": 1, "length_penalty": 1.0}
    assert body["api_key"] is False and body["markup"] is None and body["limits"]["max_sentence_chars"] == 2000


def test_alignments_carry_each_models_attention_for_every_layer_and_head(client, translators):
    for name, translator in translators.items():
        body = client.post("/alignments", json={"sentences": SOURCES, "model": name}).json()
        assert body["model"] == name and body["scale"] == SCALE
        assert set(body["timings"]) == {"queue_ms", "model_ms", "total_ms"}
        assert 0 < body["timings"]["model_ms"] <= body["timings"]["total_ms"]
        expected = translator.translate(SOURCES, need_attention=True, confidence=True)
        for result, best in zip(body["sentences"], expected):
            assert (result["source"], result["translation"]) == (best.source, best.text)
            assert result["score"] == pytest.approx(best.score) and result["alternatives"] == []
            if not best.source:
                assert result["view"] is None
                continue
            view = result["view"]
            record = best.alignment_record(0)
            assert view["levels"]["subword"] == {"src": record.src_pieces, "tgt": record.tgt_pieces}
            attention = view["views"]["attention"]
            layers, heads = best.attention.shape[:2]
            assert len(attention["layers"]) == layers + (layers > 1) and len(attention["heads"]) == heads + (heads > 1)
            rows, cols = len(record.tgt_pieces), len(record.src_pieces)
            for layer in range(layers):
                for head in range(heads):  # the raw array, cut to the labels, in thousandths
                    np.testing.assert_allclose(np.array(attention["subword"][layer][head]) / SCALE,
                                               best.attention[layer, head, :rows, :cols], atol=5e-4 + 1e-6)
            li, hi = attention["default"]
            np.testing.assert_allclose(np.array(attention["word"][li][hi]) / SCALE, record.words, atol=5e-4 + 1e-6)
            assert sorted(f"{i}-{j}" for i, j in view["links"]["word"]) == sorted(record.pharaoh_word.split())
            words = best.confidence()["words"][: len(record.tgt_words)]
            assert view["confidence"]["word"]["log_prob"] == pytest.approx([w["log_prob"] for w in words], abs=1e-4)


def test_alignments_give_the_n_best_list_and_the_markup(client, translators):
    body = client.post("/alignments", json={"sentences": ["<b>three</b> hundred and <i>five</i>"], "model": "rnn",
                                            "beam_size": 3, "n_best": 3, "markup": "html"}).json()
    [result] = body["sentences"]
    expected = translators["rnn"].translate(["three hundred and five"], beam_size=3, n_best=3)[0]
    assert [result["translation"]] + [a["translation"] for a in result["alternatives"]] == [
        t.text for t in expected.alternatives]
    assert result["source"] == "<b>three</b> hundred and <i>five</i>" and result["view"]["source"] == expected.source
    for hypothesis in [result, *result["alternatives"]]:
        assert re.sub(r"<[^>]*>", "", hypothesis["markup"]).split() == hypothesis["translation"].split()
        assert sorted(re.findall(r"<[^>]*>", hypothesis["markup"])) == ["</b>", "</i>", "<b>", "<i>"]


def test_attribution_is_what_the_attribution_code_computes_for_the_translation(client, translators):
    translator = translators["transformer"]
    best = translator.translate(SOURCES[:1])[0]
    for method in ("occlusion", "gradient"):
        body = client.post("/attribution", json={"source": best.source, "target": best.text, "method": method}).json()
        assert (body["model"], body["method"], body["contrast"]) == ("transformer", method, None)
        expected = attribute_translation(translator, best, method).record_for(best, 0)
        view = body["view"]
        assert view["levels"]["word"] == {"src": expected.src_words, "tgt": expected.tgt_words}
        assert view["layers"] == view["heads"] == ["-"] and body["timings"]["model_ms"] > 0
        np.testing.assert_allclose(np.array(view["word"][0][0]) / SCALE, expected.words, atol=5e-4 + 1e-4)
    rnn = translators["rnn"].translate(SOURCES[:1])[0]
    versus = client.post("/attribution", json={"source": rnn.source, "target": rnn.text, "method": "occlusion",
                                               "model": "rnn", "contrast": "vier hundert"}).json()
    expected = attribute_translation(translators["rnn"], rnn, "occlusion", contrast="vier hundert").record_for(rnn, 0)
    assert versus["contrast"] == "vier hundert" and 'why this rather than "vier hundert"' in versus["view"]["note"]
    np.testing.assert_allclose(np.array(versus["view"]["word"][0][0]) / SCALE, expected.words, atol=6e-4)


@pytest.mark.parametrize("body, words", [
    ({"method": "saliency"}, "'saliency' is not offered for model 'transformer'; this server offers gradient, "
                             "integrated-gradients, occlusion"),
    ({"method": "grad-attention", "contrast": "vier"}, "'grad-attention' has no contrastive form"),
    ({"method": "occlusion", "target": " "}, "nothing to explain"),
    ({"method": "occlusion", "model": "gpt"}, "unknown model 'gpt'"),
    ({"method": "occlusion", "source": "x" * 2001}, "source has 2001 characters"),
    ({"method": "occlusion", "contrast": "x" * 2001}, "contrast has 2001 characters"),
    ({"method": "occlusion", "extra": 1}, "extra"),
    ({"method": 5}, "method"),
])
def test_attribution_refusals_are_json_errors_naming_the_fix(client, body, words):
    response = client.post("/attribution", json={"source": "three hundred", "target": "drei hundert", **body})
    expected = 413 if "characters" in words else 422
    assert response.status_code == expected and words in response.json()["error"], response.text
    good = {"source": "five", "target": "fünf", "method": "occlusion"}
    assert client.post("/attribution", json=good).status_code == 200  # the server goes on


def test_a_server_without_attribution_or_some_methods_says_so(translators):
    with serving(translators, methods=["occlusion"]) as client:
        assert [m["method"] for m in client.get("/models").json()["models"][1]["attribution"]] == ["occlusion"]
        refused = client.post("/attribution", json={"source": "five", "target": "fünf", "method": "lime"})
        assert refused.status_code == 422 and "this server offers occlusion (GET /models)" in refused.json()["error"]
    with serving(translators, methods=[]) as client:
        assert client.get("/models").json()["models"][0]["attribution"] == []
        refused = client.post("/attribution", json={"source": "five", "target": "fünf", "method": "occlusion"})
        assert refused.status_code == 422 and "offers no attribution" in refused.json()["error"]


FAULTS = {  # name: (path, request keyword arguments, status, words of the message): /translate's limits
    "too many sentences": ("/alignments", {"json": {"sentences": ["a"] * 129}}, 413, "--max-request-sentences"),
    "a sentence too long": ("/alignments", {"json": {"sentences": ["ok", "x" * 2001]}}, 413, "sentence 1 has 2001"),
    "a beam above the limit": ("/alignments", {"json": {"sentences": ["a"], "beam_size": 17}}, 422, "--max-beam-size"),
    "n_best above the beam": ("/alignments", {"json": {"sentences": ["a"], "beam_size": 2, "n_best": 3}}, 422,
                              "n_best"),
    "an empty list": ("/alignments", {"json": {"sentences": []}}, 422, "at least 1"),
    "an unknown model": ("/alignments", {"json": {"sentences": ["a"], "model": "x"}}, 422, "unknown model 'x'"),
    "broken xml": ("/alignments", {"json": {"sentences": ["<b>a"], "markup": "xml"}}, 422, "never closed"),
    "a lone surrogate": ("/alignments", {"content": b'{"sentences": ["a\\ud800"]}',
                                         "headers": {"content-type": "application/json"}}, 422, "not valid Unicode"),
    "malformed JSON": ("/attribution", {"content": b'{"source": ', "headers": {"content-type": "application/json"}},
                       400, "not valid JSON"),
    "a 10 MB body": ("/attribution", {"content": b"x" * 10_000_000, "headers": {"content-type": "application/json"}},
                     413, "--max-body-bytes"),
}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_the_page_endpoints_keep_the_limits_and_errors_of_translate(client, fault):
    path, kwargs, status, words = FAULTS[fault]
    response = client.post(path, **kwargs)
    assert response.status_code == status, response.text
    assert response.json()["status"] == status and words in response.json()["error"], response.json()


def test_the_page_endpoints_share_the_queue_and_its_timeout(translators):
    # batches of 2: a lone queued sentence waits 5 s for company, past the 1 s timeout, and fills the queue
    limits = {"max_batch_sentences": 2, "max_wait_ms": 5000, "max_queue_sentences": 1, "max_request_sentences": 1,
              "request_timeout": 1.0}
    with serving(translators, limits=limits) as client:
        with ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(client.post, "/alignments", json={"sentences": ["seven"]})
            while client.get("/health").json()["queue_requests"] == 0:
                pass
            full = client.post("/attribution", json={"source": "five", "target": "fünf", "method": "occlusion"})
            late = waiting.result()
    assert full.status_code == 429 and full.headers["retry-after"] == "1"
    assert late.status_code == 504 and "--request-timeout" in late.json()["error"]


def test_with_an_api_key_the_page_loads_and_its_endpoints_need_the_key_in_a_header(translators):
    with serving(translators, api_key=KEY) as client:
        for path in ("/", "/ui/page.js", "/ui/viewer.js", "/ui/page.css", "/models"):
            assert client.get(path).status_code == 200, path  # the page asks for the key; it has none yet
        assert client.get("/models").json()["api_key"] is True
        bodies = {"/alignments": {"sentences": ["five"]},
                  "/attribution": {"source": "five", "target": "fünf", "method": "occlusion"}}
        for path, body in bodies.items():
            for refused in (client.post(path, json=body), client.post(f"{path}?api_key={KEY}", json=body),
                            client.post(f"{path}?key={KEY}", json=body, headers={"X-API-Key": "wrong"})):
                assert refused.status_code == 401 and KEY not in refused.text
            assert client.post(path, json=body, headers={"X-API-Key": KEY}).status_code == 200
            assert client.post(path, json=body, headers={"Authorization": f"Bearer {KEY}"}).status_code == 200
        assert client.post("/ui/../translate", json={"sentences": ["five"]}).status_code in (401, 404, 405)


def test_the_page_is_static_files_under_a_strict_content_security_policy(client):
    page = client.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    policy = page.headers["content-security-policy"]
    for rule in ("default-src 'none'", "script-src 'self'", "style-src 'self'", "connect-src 'self'",
                 "frame-ancestors 'none'", "form-action 'none'", "base-uri 'none'"):
        assert rule in policy
    assert "unsafe" not in policy and page.headers["x-content-type-options"] == "nosniff"
    html = page.text
    scripts = re.findall(r"<script\b[^>]*>", html)
    assert scripts == ['<script src="/ui/viewer.js" defer>', '<script src="/ui/page.js" defer>']  # nothing inline
    assert "<style" not in html and " style=" not in html and not re.search(r"\son[a-z]+\s*=", html)  # no handlers
    for name, kind in (("viewer.js", "text/javascript"), ("page.js", "text/javascript"), ("viewer.css", "text/css"),
                       ("page.css", "text/css"), ("icon.svg", "image/svg+xml")):
        asset = client.get(f"/ui/{name}")
        assert asset.status_code == 200 and asset.headers["content-type"].startswith(kind)
        assert asset.headers["content-security-policy"] == policy
        if name != "icon.svg":  # the page asks this server only: no URL of another
            assert not re.search(r"https?://", asset.text), name
    for text in (client.get("/ui/page.js").text, client.get("/ui/viewer.js").text):
        assert "innerHTML" not in text and "insertAdjacentHTML" not in text and "eval(" not in text
        assert "document.write" not in text and "localStorage" not in text
    # one renderer: the page's is the file the static viewer inlines
    renderer = resources.files("seq2seq.alignment").joinpath("viewer.js").read_text(encoding="utf-8")
    assert client.get("/ui/viewer.js").text == renderer
    assert client.get("/ui/nothing.js").status_code == 404 and client.get("/ui/index.html").status_code == 404


def test_the_api_description_documents_the_page_endpoints(client):
    spec = client.get("/openapi.json").json()
    paths = spec["paths"]
    assert {"/alignments", "/attribution", "/models"} <= set(paths) and "/" not in paths
    for path in ("/alignments", "/attribution"):
        responses = paths[path]["post"]["responses"]
        assert {"200", "400", "401", "413", "422", "429", "504"} <= set(responses)
    schemas = spec["components"]["schemas"]
    assert set(schemas["AttributionRequest"]["properties"]) == {"source", "target", "method", "model", "contrast"}
    assert set(schemas["AlignmentsRequest"]["properties"]) == {"sentences", "model", "beam_size", "n_best",
                                                               "length_penalty", "markup"}


def test_no_ui_serves_no_page_and_keeps_the_api(translators):
    with serving(translators, ui=False) as client:
        assert client.get("/").status_code == 404 and client.get("/ui/page.js").status_code == 404
        assert client.post("/alignments", json={"sentences": ["five"]}).status_code == 200


# ----------------------------------------------------------------------------- the command's flags


def started_with(monkeypatch, argv: list[str]) -> dict:
    started = {}
    monkeypatch.setattr("seq2seq.serve.server.run_server",
                        lambda translator, settings, host, port, quiet, compiling, backward: started.update(
                            translator=translator, settings=settings))
    assert serve_cli.main(argv + ["--device", "cpu", "--engine", "seq2seq", "--compile", "off", "--quiet"]) == 0
    return started


def test_serve_takes_models_side_by_side_by_name(monkeypatch):
    t, r = map(str, CHECKPOINTS.values())
    started = started_with(monkeypatch, ["--model", f"transformer={t}", "--model", f"rnn={r}", "--no-ui",
                                         "--markup", "html", "--attribution", "occlusion", "gradient"])
    models, settings = started["translator"], started["settings"]
    assert [(m.name, m.translator.checkpoints, m.arch) for m in models] == [
        ("transformer", [t], "transformer"), ("rnn", [r], "rnn (bahdanau)")]
    assert models[1].align.layer == -2 and not settings.ui and settings.markup == "html"
    assert [m["method"] for m in settings.explain.methods(models[0].translator.model)] == ["occlusion", "gradient"]
    started = started_with(monkeypatch, ["--checkpoint", t, "--model", f"rnn={r},{r}", "--attribution", "none"])
    models = started["translator"]
    assert [m.name for m in models] == ["default", "rnn"] and models[1].arch.startswith("ensemble: ")
    assert started["settings"].explain is None and started["settings"].ui
    alone = started_with(monkeypatch, ["--checkpoint", t])["translator"]
    assert isinstance(alone, Translator)  # one model: served as ever


@pytest.mark.parametrize("flags, words", [
    ([], "give the model to serve"),
    (["--model", "rnn"], "--model rnn: give NAME=CHECKPOINT"),
    (["--model", "=x.pt"], "give NAME=CHECKPOINT"),
    (["--model", "rnn="], "give NAME=CHECKPOINT"),
    (["--model", "a b=TRANSFORMER"], "model name 'a b'"),
    (["--model", "m=TRANSFORMER", "--model", "m=RNN"], "model name(s) m given twice"),
    (["--checkpoint", "TRANSFORMER", "--attribution", "none", "gradient"], "--attribution none"),
    (["--checkpoint", "TRANSFORMER", "--attribution-samples", "3"], "--attribution-samples must be >= 4"),
    (["--checkpoint", "TRANSFORMER", "--ig-steps", "0"], "--ig-steps must be >= 1"),
    (["--model", "t=TRANSFORMER", "--model", "r=RNN", "--align-heads", "1"], "(model r)"),
])
def test_bad_model_and_attribution_flags_are_named_errors(flags, words, capsys):
    argv = [f.replace("TRANSFORMER", str(CHECKPOINTS["transformer"])).replace("RNN", str(CHECKPOINTS["rnn"]))
            for f in flags]
    assert serve_cli.main(argv + ["--device", "cpu", "--engine", "seq2seq", "--compile", "off"]) == 2
    assert words in capsys.readouterr().err


def test_the_page_files_are_package_data():
    """A wheel ships the page and the renderer only if pyproject.toml's package-data names them."""
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    data = text.split("[tool.setuptools.package-data]", 1)[1].split("\n[", 1)[0]
    declared = {line.split("=", 1)[0].strip().strip('"'): json.loads(line.split("=", 1)[1].split("#")[0])
                for line in data.strip().splitlines() if "=" in line}
    alignment, serve = declared.get("seq2seq.alignment", []), declared.get("seq2seq.serve", [])
    fix = ('pyproject.toml, [tool.setuptools.package-data]: "seq2seq.alignment" = ["viewer.html", "viewer.js", '
           '"viewer.css"] and "seq2seq.serve" = ["static/*"]')
    assert {"viewer.html", "viewer.js", "viewer.css"} <= set(alignment), fix
    assert "static/*" in serve, fix
