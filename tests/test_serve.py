"""seq2seq serve: the batcher alone, the FastAPI app in process (TestClient), the real command as a
subprocess (concurrent clients, a client that disconnects, SIGTERM during a request) and the load
benchmark's smoke run, all on the tiny Transformer of test_align_cli."""
from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("httpx")

import httpx  # noqa: E402
from fastapi.testclient import TestClient  # noqa: E402

from seq2seq.alignment.links import parse_pharaoh, to_pharaoh  # noqa: E402
from seq2seq.cli import serve as serve_cli  # noqa: E402
from seq2seq.config import AlignConfig  # noqa: E402
from seq2seq.decoding.forced_alignment import BackwardAligner  # noqa: E402
from seq2seq.decoding.markup import mark_translations, parse, translate_markup  # noqa: E402
from seq2seq.decoding.translator import Translator  # noqa: E402
from seq2seq.errors import UserError  # noqa: E402
from seq2seq.models import compiled  # noqa: E402
from seq2seq.serve import Batcher, BatcherClosed, Limits, QueueFull, ServeSettings, create_app  # noqa: E402
from seq2seq.serve.server import bind_socket  # noqa: E402
from test_align_cli import checkpoint, reversed_checkpoint  # noqa: E402,F401  (the tiny trained checkpoint)

ROOT = Path(__file__).resolve().parents[1]
ONE_THREAD = {**os.environ, "OMP_NUM_THREADS": "1"}  # subprocesses too: tiny tensors, cores shared with others
SOURCES = ["twenty-one", "three hundred and five", "", "seven thousand and twelve"]
GOOD = {"sentences": ["seven"]}


@pytest.fixture(scope="module")
def translator(checkpoint) -> Translator:  # noqa: F811
    return Translator.from_checkpoint(checkpoint, device="cpu")


@contextmanager
def serving(translator: Translator, **limits):
    """A TestClient over a fresh app (lifespan run: the batcher starts and is drained at the end)."""
    app = create_app(translator, ServeSettings(limits=Limits(**limits)))
    with TestClient(app) as client:
        yield client


def health(client) -> dict:
    return client.get("/health").json()


def wait_until_queued(get_health, seconds: float = 10) -> None:
    """Until a request is waiting in the server's queue (so the test's timing does not depend on load)."""
    deadline = time.monotonic() + seconds
    while get_health()["queue_requests"] == 0:
        assert time.monotonic() < deadline, "the request never reached the queue"
        time.sleep(0.01)


def assert_good_request_works(client, translator: Translator) -> None:
    response = client.post("/translate", json=GOOD)
    assert response.status_code == 200, response.text
    assert response.json()["translations"][0]["translation"] == translator.translate(GOOD["sentences"])[0].text


# ----------------------------------------------------------------------------- the batcher alone


def test_batcher_merges_jobs_by_key_up_to_the_batch_size_and_keeps_order():
    calls = []

    def run(items, key):
        calls.append((key, list(items)))
        return [f"{key}:{item}" for item in items]

    batcher = Batcher(run, max_batch=3, max_wait_s=0.3, max_queue=100)
    futures = [batcher.submit([i], key="a") for i in range(4)] + [batcher.submit(["x", "y"], key="b")]
    futures.append(batcher.submit([9], key="a", finish=lambda outputs: outputs[0].upper()))
    assert [f.result(5) for f in futures] == [["a:0"], ["a:1"], ["a:2"], ["a:3"], ["b:x", "b:y"], "A:9"]
    assert calls == [("a", [0, 1, 2]), ("a", [3, 9]), ("b", ["x", "y"])]  # oldest first; keys never mixed
    assert batcher.stats.model_calls == 3 and batcher.stats.largest_batch == 3 and batcher.stats.items == 7
    batcher.close(5)
    with pytest.raises(BatcherClosed):
        batcher.submit([1])


def test_batcher_refuses_past_the_queue_limit_drops_cancelled_jobs_and_survives_a_failing_call():
    def run(items, key):
        if "boom" in items:
            raise RuntimeError("boom")
        return items

    batcher = Batcher(run, max_batch=10, max_wait_s=0.5, max_queue=3)
    first = batcher.submit([1, 2])
    with pytest.raises(QueueFull):
        batcher.submit([3, 4])
    assert first.cancel() and batcher.queued == (0, 0)  # a cancelled job frees its place at once
    assert batcher.submit(["boom"]).exception(5).args == ("boom",)
    assert batcher.submit([5], key="other").result(5) == [5]  # the worker lives on
    assert batcher.stats.dropped_jobs == 1 and batcher.stats.failed_calls == 1
    batcher.close(5)


# ----------------------------------------------------------------------------- the app in process


def test_translations_scores_n_best_alignments_and_attention_are_the_translators(translator):
    options = {"beam_size": 3, "n_best": 2, "length_penalty": 0.5}
    with serving(translator) as client:
        response = client.post("/translate", json={"sentences": SOURCES, **options, "alignments": True,
                                                   "attention": True})
    assert response.status_code == 200 and response.headers["content-type"] == "application/json"
    results = response.json()["translations"]
    expected = translator.translate(SOURCES, **options)
    assert [r["source"] for r in results] == SOURCES
    for index, (result, best) in enumerate(zip(results, expected)):
        hypotheses = [result] + result["alternatives"]
        assert [h["translation"] for h in hypotheses] == [t.text for t in best.alternatives or [best]]
        assert [h["score"] for h in hypotheses] == pytest.approx([t.score for t in best.alternatives or [best]])
        assert [h["log_prob"] for h in hypotheses] == pytest.approx([t.log_prob for t in best.alternatives or [best]])
        if not SOURCES[index]:  # an empty input: an empty output, nothing to align
            assert result["alignment"] is None and result["attention"] is None and result["alternatives"] == []
            continue
        for hypothesis, translation in zip(hypotheses, best.alternatives):
            record = translation.alignment_record(index).to_json()  # the server's defaults: translate's
            assert hypothesis["alignment"]["pharaoh_word"] == record["pharaoh_word"]
            assert hypothesis["alignment"]["src_words"] == record["src_words"]
            assert hypothesis["alignment"]["word_matrix"] == record["word_matrix"]
            attention = hypothesis["attention"]
            assert attention["shape"] == list(translation.attention.shape)
            assert attention["tgt_pieces"] == translation.tgt_pieces
            np.testing.assert_allclose(np.array(attention["weights"]), translation.attention, atol=1e-4)


def test_a_backward_model_symmetrizes_the_alignments_as_translate_does(translator, checkpoint, tmp_path):  # noqa: F811
    backward = Translator.from_checkpoint(reversed_checkpoint(checkpoint, tmp_path / "backward.pt"), device="cpu")
    aligner = BackwardAligner(translator, backward, AlignConfig(), "intersection")
    with TestClient(create_app(translator, ServeSettings(), backward=aligner)) as client:
        results = client.post("/translate", json={"sentences": SOURCES, "beam_size": 2, "n_best": 2,
                                                  "alignments": True}).json()["translations"]
    expected = translator.translate(SOURCES, beam_size=2, n_best=2)
    chosen = [i for i, t in enumerate(expected) if t.text]
    links = [aligner.links(words) for words in aligner.backward_words([expected[i].source for i in chosen],
                                                                      [expected[i].text for i in chosen])]
    for i, back in zip(chosen, links):
        alignment = results[i]["alignment"]
        forward = parse_pharaoh(expected[i].alignment_record(i).pharaoh_word)[0]
        assert alignment["forward_pharaoh_word"] == to_pharaoh(forward)
        assert alignment["backward_pharaoh_word"] == to_pharaoh(back)
        assert alignment["pharaoh_word"] == to_pharaoh(forward & back) and alignment["symmetrize"] == "intersection"
        assert all("symmetrize" not in a["alignment"] for a in results[i]["alternatives"])  # the best one only
    assert results[2]["alignment"] is None
    lines = ["<b>twenty-one</b> and <i>three</i> hundred", "seven <u>thousand and</u> twelve"]
    with TestClient(create_app(translator, ServeSettings(), backward=aligner)) as client:
        marked = client.post("/translate", json={"sentences": lines, "markup": "html"}).json()["translations"]
    assert [r["markup"] for r in marked] == translate_markup(translator, lines, "html", backward=aligner)
    with TestClient(create_app(translator, ServeSettings(), backward=aligner)) as client:  # n-best: each its own
        listed = client.post("/translate", json={"sentences": lines, "markup": "html", "beam_size": 3,
                                                 "n_best": 2}).json()["translations"]
    parsed = [parse(line, "html") for line in lines]
    expected = mark_translations(translator.translate([text for text, _ in parsed], beam_size=3, n_best=2), parsed,
                                 AlignConfig().for_model(translator.supervised_attention), aligner)
    assert [[r["markup"]] + [a["markup"] for a in r["alternatives"]] for r in listed] == expected
    assert all(len(hypotheses) == 2 for hypotheses in expected)


def test_unset_options_are_the_servers_defaults_and_outputs_come_without_matrices(translator):
    with serving(translator) as client:
        result = client.post("/translate", json={"sentences": SOURCES[:2]}).json()["translations"]
    expected = translator.translate(SOURCES[:2])  # beam 5, as seq2seq translate
    assert [r["translation"] for r in result] == [t.text for t in expected]
    assert all("alignment" not in r and "attention" not in r and r["alternatives"] == [] for r in result)


def test_concurrent_requests_are_translated_in_fewer_model_calls_with_the_same_outputs(translator):
    sentences = ["twenty-one", "seven", "three hundred and five", "nine", "eleven", "forty", "two", "six"]
    with serving(translator, max_wait_ms=300) as client:
        with ThreadPoolExecutor(len(sentences)) as pool:
            answers = list(pool.map(lambda s: client.post("/translate", json={"sentences": [s]}).json(), sentences))
        stats = health(client)
    expected = translator.translate(sentences)
    assert [a["translations"][0]["translation"] for a in answers] == [t.text for t in expected]
    assert [a["translations"][0]["score"] for a in answers] == pytest.approx([t.score for t in expected], abs=1e-4)
    assert stats["requests_translated"] == len(sentences) and stats["sentences_translated"] == len(sentences)
    assert stats["model_calls"] < len(sentences) and stats["largest_batch"] > 1


def test_requests_with_different_options_go_in_different_batches(translator):
    bodies = [{"sentences": ["seven"], "beam_size": 1}, {"sentences": ["nine"], "beam_size": 2},
              {"sentences": ["two"], "beam_size": 1}, {"sentences": ["six"], "beam_size": 2, "alignments": True}]
    with serving(translator, max_wait_ms=500) as client:
        with ThreadPoolExecutor(len(bodies)) as pool:
            answers = list(pool.map(lambda body: client.post("/translate", json=body).json(), bodies))
        stats = health(client)
    for body, answer in zip(bodies, answers):
        expected = translator.translate(body["sentences"], beam_size=body["beam_size"])[0]
        assert answer["translations"][0]["translation"] == expected.text
    assert 3 <= stats["model_calls"] < len(bodies)  # beam 1 merged; beam 2 with and without attention apart


def test_health_and_the_openapi_description(translator, checkpoint):  # noqa: F811
    with serving(translator) as client:
        status = health(client)
        spec = client.get("/openapi.json").json()
        assert client.get("/docs").status_code == 200
    assert status["status"] == "ok" and status["model"] == [str(checkpoint)] and status["arch"] == "transformer"
    assert status["device"] == "cpu" and status["queue_sentences"] == 0
    assert status["limits"]["max_batch_sentences"] == Limits().max_batch_sentences
    schemas = spec["components"]["schemas"]
    assert schemas["TranslateRequest"]["properties"]["sentences"]["items"]["type"] == "string"
    assert {"Alignment", "Attention", "SentenceResult", "Health", "ErrorBody"} <= set(schemas)
    translate = spec["paths"]["/translate"]["post"]
    assert translate["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].endswith("TranslateResponse")
    assert {"400", "413", "422", "429", "504"} <= set(translate["responses"])


FAULTS = {  # name: (request keyword arguments, status, words of the message)
    "malformed JSON": ({"content": b'{"sentences": [', "headers": {"content-type": "application/json"}}, 400,
                       "not valid JSON"),
    "a number for a sentence": ({"json": {"sentences": ["a", 5]}}, 422, "sentences.1"),
    "a string for the list": ({"json": {"sentences": "a b"}}, 422, "valid list"),
    "a string for beam_size": ({"json": {"sentences": ["a"], "beam_size": "3"}}, 422, "beam_size"),
    "an unknown field": ({"json": {"sentences": ["a"], "beam": 3}}, 422, "beam"),
    "a JSON list": ({"json": ["a"]}, 422, "object"),
    "an empty list": ({"json": {"sentences": []}}, 422, "at least 1"),
    "a NaN length penalty": ({"content": b'{"sentences": ["a"], "length_penalty": NaN}',
                              "headers": {"content-type": "application/json"}}, 422, "finite"),
    "a lone surrogate": ({"content": b'{"sentences": ["a\\ud800"]}', "headers": {"content-type": "application/json"}},
                         422, "not valid Unicode"),
    "n_best above the beam": ({"json": {"sentences": ["a"], "beam_size": 2, "n_best": 3}}, 422, "n_best"),
    "a beam above the limit": ({"json": {"sentences": ["a"], "beam_size": 17}}, 422, "--max-beam-size"),
    "10,000 sentences": ({"json": {"sentences": ["a"] * 10_000}}, 413, "--max-request-sentences"),
    "a sentence too long": ({"json": {"sentences": ["ok", "x" * 2001]}}, 413, "sentence 1"),
    "a 10 MB body": ({"content": b"x" * 10_000_000, "headers": {"content-type": "application/json"}}, 413,
                     "--max-body-bytes"),
    "a chunked body over the limit": ({"content": iter([b'{"sentences": ["'] + [b"x" * 65536] * 20 + [b'"]}']),
                                       "headers": {"content-type": "application/json"}}, 413, "--max-body-bytes"),
    "GET /translate": (None, 405, "Method Not Allowed"),
}


@pytest.fixture(scope="module")
def client(translator):
    with serving(translator) as client:
        yield client


@pytest.mark.parametrize("fault", list(FAULTS))
def test_each_fault_is_a_json_error_and_the_server_keeps_serving(client, translator, fault):
    kwargs, status, words = FAULTS[fault]
    response = client.get("/translate") if kwargs is None else client.post("/translate", **kwargs)
    assert response.status_code == status, response.text
    body = response.json()
    assert body["status"] == status and words in body["error"], body
    assert_good_request_works(client, translator)


def test_a_full_queue_is_429_with_retry_after_and_a_slow_answer_504(translator):
    # batches of 2: one queued sentence waits --max-wait-ms (5 s) for a second, past the 1 s timeout
    with serving(translator, max_batch_sentences=2, max_wait_ms=5000, max_queue_sentences=2,
                 max_request_sentences=2, request_timeout=1.0) as client:
        with ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(client.post, "/translate", json={"sentences": ["seven"]})
            wait_until_queued(lambda: health(client))
            full = client.post("/translate", json={"sentences": ["nine", "two"]})
            late = waiting.result()
        assert full.status_code == 429 and full.headers["retry-after"] == "1"
        assert "--max-queue-sentences" in full.json()["error"]
        assert late.status_code == 504 and "--request-timeout" in late.json()["error"]
        ok = client.post("/translate", json={"sentences": ["nine", "two"]})  # a full batch goes at once
        assert ok.status_code == 200 and len(ok.json()["translations"]) == 2
        stats = health(client)
    assert stats["requests_dropped"] == 1 and stats["model_calls"] == 1  # the timed-out request never ran


async def _disconnecting_client(app, body: bytes) -> list[dict]:
    """An ASGI client that sends ``body`` and goes away 50 ms later; what the app sent it."""
    messages = [{"type": "http.request", "body": body, "more_body": False}]
    sent = []

    async def receive():
        if messages:
            return messages.pop(0)
        await asyncio.sleep(0.05)
        return {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": "/translate", "raw_path": b"/translate", "query_string": b"", "root_path": "",
             "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
             "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80)}
    await app(scope, receive, send)
    return sent


def test_a_client_that_disconnects_is_dropped_and_the_worker_goes_on(translator):
    with serving(translator, max_wait_ms=1000) as client:
        asyncio.run(_disconnecting_client(client.app, json.dumps(GOOD).encode()))
        stats = health(client)
        assert stats["requests_dropped"] == 1 and stats["model_calls"] == 0 and stats["queue_sentences"] == 0
        assert_good_request_works(client, translator)


# ----------------------------------------------------------------------------- the command


def test_the_server_answers_while_its_decoding_compiles_and_health_says_when_it_is_live(checkpoint, monkeypatch):  # noqa: F811
    """Compiled decoding is built in the background (Dynamo's "eager" backend here: tracing and
    guards, no code generation); requests are answered meanwhile, with the same translations."""
    monkeypatch.setattr(compiled, "BACKEND", "eager")
    translator = Translator.from_checkpoint(checkpoint, device="cpu")  # its own: this one gets compiled
    release, warm_up = threading.Event(), Translator.warm_up
    monkeypatch.setattr(Translator, "warm_up", lambda self, beams: release.wait(60) and warm_up(self, beams))
    job = translator.compile_in_background([1, 5], threads=1)
    with TestClient(create_app(translator, ServeSettings(), job)) as client:
        try:
            assert health(client)["compiled"] == "compiling"
            assert_good_request_works(client, translator)
        finally:
            release.set()
        assert job.wait(60) == "ready" and translator.compiled
        assert health(client)["compiled"] == "ready"
        assert_good_request_works(client, translator)
    assert {key[0] for key in translator.model.compiled_step.graphs} == {1, 5}


def test_serve_runs_the_ctranslate2_engine_where_it_can_and_says_so(checkpoint, monkeypatch, tmp_path):  # noqa: F811
    """--engine auto (serve's default) picks CTranslate2 for a Transformer (converted beside a copy of
    the checkpoint), compiles nothing, and answers what the same engine's Translator gives."""
    pytest.importorskip("ctranslate2")
    import shutil

    own = Path(shutil.copy(checkpoint, tmp_path / "best.pt"))
    started = {}
    monkeypatch.setattr("seq2seq.serve.server.run_server",
                        lambda translator, settings, host, port, quiet, compiling, backward: started.update(
                            translator=translator, compiling=compiling))
    assert serve_cli.main(["--checkpoint", str(own), "--device", "cpu", "--quiet"]) == 0
    translator = started["translator"]
    assert translator.engine.name == "ctranslate2" and started["compiling"] is None and (tmp_path / "best.ct2").is_dir()
    with TestClient(create_app(translator, ServeSettings())) as client:
        assert health(client)["engine"] == "ctranslate2" and health(client)["compiled"] == "off"
        body = client.post("/translate", json={"sentences": SOURCES, "alignments": True}).json()
    want = translator.translate(SOURCES)
    assert [t["translation"] for t in body["translations"]] == [t.text for t in want]
    assert serve_cli.main(["--checkpoint", str(own), "--device", "cpu", "--compile", "on", "--quiet"]) == 2
    assert body["translations"][0]["alignment"]["pharaoh_word"] is not None


def test_serve_from_a_read_only_run_directory_converts_into_the_user_cache_and_says_where(
        checkpoint, monkeypatch, tmp_path, caplog):  # noqa: F811
    """The CTranslate2 engine needs the checkpoint converted; a run directory that cannot be written (here
    chmod 555; root writes anyway, so for root the check is told so too) must not stop the server: the
    conversion goes to $XDG_CACHE_HOME/seq2seq/ctranslate2/, nothing is written into the run directory,
    and the log says where it went and why, before the server listens."""
    pytest.importorskip("ctranslate2")
    import shutil

    from seq2seq.decoding import ctranslate2 as engine

    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(checkpoint, run / "best.pt")
    before = sorted(p.name for p in run.iterdir())
    run.chmod(0o555)
    if os.geteuid() == 0:  # permissions do not bind root: the directory reads as unwritable all the same
        real = os.access
        monkeypatch.setattr(engine.os, "access", lambda path, mode, **kw: (
            False if Path(path) == run and mode & os.W_OK else real(path, mode, **kw)))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    started = {}
    monkeypatch.setattr("seq2seq.serve.server.run_server",
                        lambda translator, settings, host, port, quiet, compiling, backward: started.update(
                            translator=translator))
    try:
        with caplog.at_level("INFO", logger="seq2seq"):
            assert serve_cli.main(["--checkpoint", str(run), "--device", "cpu", "--engine", "ctranslate2",
                                   "--quiet"]) == 0
        assert sorted(p.name for p in run.iterdir()) == before  # no best.ct2, no temp directory
    finally:
        run.chmod(0o755)
    [converted] = (tmp_path / "cache" / "seq2seq" / "ctranslate2").iterdir()
    assert converted.name.endswith("-best.ct2") and (converted / "model.bin").is_file()
    translator = started["translator"]
    assert translator.engine.model_dir == converted
    assert f"into {converted}, in the user cache directory, as {run} cannot be written" in caplog.text
    with TestClient(create_app(translator, ServeSettings())) as client:
        assert_good_request_works(client, translator)


def test_a_server_running_ctranslate2s_search_refuses_constraints_as_a_bad_request(checkpoint, tmp_path):  # noqa: F811
    """CTranslate2 has no constrained search: a request with constraints is the client's to fix (422 saying
    which engine takes them), not a failed model call (500); one without any is translated."""
    pytest.importorskip("ctranslate2")
    import shutil

    translator = Translator.from_checkpoint(Path(shutil.copy(checkpoint, tmp_path / "best.pt")), device="cpu",
                                            engine="ctranslate2")
    with TestClient(create_app(translator, ServeSettings())) as client:
        refused = client.post("/translate", json={"sentences": ["seven", "eight"], "constraints": [["sieben"], []]})
        assert refused.status_code == 422 and "--engine seq2seq" in refused.json()["error"], refused.text
        assert client.post("/translate", json={"sentences": ["seven"], "constraints": [[]]}).status_code == 200
        assert_good_request_works(client, translator)


def test_the_serving_guide_lists_every_request_field_the_server_takes():
    """docs/guides/serving.md's table of POST /translate fields is what ``TranslateRequest`` accepts (it
    rejects any other field): it once left out constraints, ordered_constraints and markup, which the
    translating guide promised."""
    from seq2seq.serve.schemas import TranslateRequest

    guide = (ROOT / "docs" / "guides" / "serving.md").read_text(encoding="utf-8")
    table = guide.split("### `POST /translate`", 1)[1].split("The server rejects any other field", 1)[0]
    listed = re.findall(r"^\| `(\w+)` \|", table, flags=re.M)
    assert sorted(listed) == sorted(TranslateRequest.model_fields)


@pytest.mark.parametrize("flag,compiles", [("auto", True), ("on", True), ("off", False)])
def test_serve_starts_listening_with_its_compilation_under_way(checkpoint, monkeypatch, flag, compiles):  # noqa: F811
    monkeypatch.setattr(compiled, "BACKEND", "eager")
    started = {}
    monkeypatch.setattr("seq2seq.serve.server.run_server",
                        lambda translator, settings, host, port, quiet, compiling, backward: started.update(
                            compiling=compiling, status=compiling and compiling.status))
    assert serve_cli.main(["--checkpoint", str(checkpoint), "--device", "cpu", "--engine", "seq2seq", "--compile", flag,
                           "--beam-size", "3", "--compile-cache", "none", "--quiet"]) == 0
    job = started["compiling"]
    assert (job is not None) == compiles
    if compiles:
        assert started["status"] == "compiling" and job.wait(60) == "ready"  # listening came first


@pytest.mark.parametrize("flag", ["DIR", "auto"])
def test_serve_compiles_into_the_compile_cache_it_is_given(checkpoint, monkeypatch, tmp_path, flag):  # noqa: F811
    """``--compile-cache DIR`` reaches the background compile (``_compiled_parts(member, DIR)``: there a
    Transformer's step becomes AOTInductor packages, test_static_step checks them; here the parts are the
    "eager" backend's, quick); ``auto`` (the default) is ``compiled/`` beside the checkpoint."""
    import shutil

    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(checkpoint, run / "best.pt")
    monkeypatch.setattr(compiled, "BACKEND", "eager")
    real, asked, started = compiled._compiled_parts, [], {}
    monkeypatch.setattr(compiled, "_compiled_parts",
                        lambda member, packages=None, isolated=False: asked.append(packages) or real(member))
    monkeypatch.setattr("seq2seq.serve.server.run_server",
                        lambda translator, settings, host, port, quiet, compiling, backward: started.update(
                            translator=translator, compiling=compiling))
    given = ["--compile-cache", str(tmp_path / "steps")] if flag == "DIR" else []
    assert serve_cli.main(["--checkpoint", str(run), "--device", "cpu", "--engine", "seq2seq", "--compile", "on",
                           *given, "--quiet"]) == 0
    assert started["compiling"].wait(60) == "ready"
    expected = {"DIR": str(tmp_path / "steps"), "auto": str(run / "compiled")}[flag]
    assert started["translator"].compile_cache == expected
    assert asked and set(asked) == {expected}


def test_the_default_compile_cache_is_beside_the_checkpoint_where_it_can_be_made(tmp_path):
    """``--compile-cache auto``: ``compiled/`` in the checkpoint's folder (a run directory, or a .pt file's);
    none where that folder cannot be made (as in a read-only model directory, even for root); ``none``: none."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "best.pt").write_bytes(b"")
    assert serve_cli.compile_cache("auto", [str(run)]) == str(run / "compiled") and (run / "compiled").is_dir()
    assert serve_cli.compile_cache("auto", [str(run / "best.pt"), "other.pt"]) == str(run / "compiled")
    assert serve_cli.compile_cache("none", [str(run)]) is None
    assert serve_cli.compile_cache(str(tmp_path / "elsewhere"), [str(run)]) == str(tmp_path / "elsewhere")
    blocked = tmp_path / "blocked"
    blocked.mkdir()
    (blocked / "compiled").write_text("not a folder")
    assert serve_cli.compile_cache("auto", [str(blocked)]) is None


def test_serve_takes_a_backward_model_of_the_other_direction_only(checkpoint, monkeypatch, tmp_path, capsys):  # noqa: F811
    started = {}
    monkeypatch.setattr("seq2seq.serve.server.run_server",
                        lambda translator, settings, host, port, quiet, compiling, backward: started.update(
                            backward=backward))
    common = ["--checkpoint", str(checkpoint), "--device", "cpu", "--engine", "seq2seq", "--compile", "off", "--quiet"]
    assert serve_cli.main(common + ["--backward-checkpoint", str(checkpoint)]) == 2
    assert "same direction" in capsys.readouterr().err and not started
    backward = reversed_checkpoint(checkpoint, tmp_path / "backward.pt")
    assert serve_cli.main(common + ["--backward-checkpoint", str(backward), "--symmetrize", "intersection"]) == 0
    assert started["backward"].symmetrize == "intersection"


def test_a_request_with_markup_gets_its_tags_carried_across(client, translator):
    sentences = ["<b>twenty-one</b> and <i>three</i>", "seven <br/>thousand"]
    body = client.post("/translate", json={"sentences": sentences, "markup": "html"}).json()
    plain = translator.translate(["twenty-one and three", "seven thousand"])
    for sent, result, want in zip(sentences, body["translations"], plain):
        assert result["source"] == sent and result["translation"] == want.text and result.get("alignment") is None
        assert re.sub(r"<[^>]*>", "", result["markup"]).split() == want.text.split()
        assert sorted(re.findall(r"<[^>]*>", result["markup"])) == sorted(re.findall(r"<[^>]*>", sent))
    assert "markup" not in client.post("/translate", json=GOOD).json()["translations"][0]
    broken = client.post("/translate", json={"sentences": ["ok", "<b>open"], "markup": "xml"})
    assert broken.status_code == 422 and "sentence 1: <b> is never closed" in broken.json()["error"]
    assert '"markup": "html"' in broken.json()["error"]


KEY = "k3y-" + "x" * 28


def test_with_an_api_key_only_requests_that_carry_it_are_translated(translator):
    settings = ServeSettings(api_key=KEY)
    assert KEY not in repr(settings)
    with TestClient(create_app(translator, settings)) as client:
        refused = [client.post("/translate", json=GOOD),
                   client.post("/translate", json=GOOD, headers={"Authorization": "Bearer " + KEY[:-1] + "y"}),
                   client.post("/translate", json=GOOD, headers={"X-API-Key": KEY + "x"}),
                   client.post("/translate", content=b'{"sentences": [', headers={"X-API-Key": "wrong"}),
                   client.post("/translate", content=b"x" * 10_000_000)]  # refused before the body is read
        for response in refused:
            assert response.status_code == 401 and response.headers["WWW-Authenticate"].startswith("Bearer")
            assert "Authorization: Bearer KEY" in response.json()["error"] and KEY not in response.text
        for headers in ({"Authorization": "Bearer " + KEY}, {"authorization": "bearer " + KEY}, {"X-API-Key": KEY}):
            response = client.post("/translate", json=GOOD, headers=headers)
            assert response.status_code == 200, response.text
        status = health(client)  # open without the key: liveness probes
        assert client.get("/openapi.json").status_code == 200 and "401" in str(
            client.get("/openapi.json").json()["paths"]["/translate"]["post"]["responses"])
    assert status["api_key"] and status["requests_unauthorized"] == len(refused) and status["requests_translated"] == 3
    with serving(translator) as client:
        assert not health(client)["api_key"] and client.post("/translate", json=GOOD).status_code == 200


def test_the_api_key_comes_from_the_flag_or_the_environment_and_is_checked(monkeypatch, capsys, tmp_path):
    args = serve_cli.parse_args(["--checkpoint", "x"])
    monkeypatch.delenv(serve_cli.API_KEY_ENV, raising=False)
    assert serve_cli.api_key(args) is None
    monkeypatch.setenv(serve_cli.API_KEY_ENV, "")
    assert serve_cli.api_key(args) is None  # set but empty: none
    monkeypatch.setenv(serve_cli.API_KEY_ENV, KEY)
    assert serve_cli.api_key(args) == KEY
    assert serve_cli.api_key(serve_cli.parse_args(["--checkpoint", "x", "--api-key", "other"])) == "other"
    for bad, source in (("", "--api-key"), ("two words", "--api-key"), ("schlüssel", "--api-key")):
        assert serve_cli.main(["--checkpoint", str(tmp_path / "none.pt"), "--api-key", bad]) == 2
        err = capsys.readouterr().err
        assert f"{source} must be a non-empty string of visible ASCII" in err and (not bad or bad not in err)
    monkeypatch.setenv(serve_cli.API_KEY_ENV, "tab\tkey")
    assert serve_cli.main(["--checkpoint", str(tmp_path / "none.pt")]) == 2
    assert f"{serve_cli.API_KEY_ENV} must be" in capsys.readouterr().err


@pytest.mark.parametrize("host,key,warned", [("0.0.0.0", None, True), ("0.0.0.0", KEY, False),
                                             ("127.0.0.1", None, False)])
def test_listening_beyond_this_machine_without_a_key_is_warned_about_and_the_key_never_logged(
        translator, monkeypatch, caplog, host, key, warned):
    import uvicorn

    from seq2seq.serve.server import run_server

    monkeypatch.setattr(uvicorn.Server, "run", lambda self, sockets: None)
    with caplog.at_level("INFO", logger="seq2seq"):
        run_server(translator, ServeSettings(api_key=key), host, 0, quiet=True)
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert bool(warnings) == warned
    assert all("without an API key" in w and "--api-key" in w for w in warnings)
    assert KEY not in caplog.text


def test_serve_flags_are_checked_before_loading_anything(capsys, tmp_path):
    missing = str(tmp_path / "none.pt")
    for flags, words in ((["--max-wait-ms", "-1"], "--max-wait-ms must be"),
                         (["--max-request-sentences", "9", "--max-queue-sentences", "8"], "--max-queue-sentences"),
                         (["--port", "70000"], "--port must be"), (["--beam-size", "2", "--n-best", "3"], "--n-best"),
                         (["--beam-size", "20"], "--max-beam-size")):
        assert serve_cli.main(["--checkpoint", missing, *flags]) == 2
        assert words in capsys.readouterr().err


def test_serves_decoding_flags_are_decode_configs_fields_and_the_beam_limit_one_check(capsys):
    """serve's decoding flags are generated from ``DecodeConfig`` (``serve_cli.DECODE_FLAGS``, as translate's are):
    unset, the config is ``DecodeConfig()``; set, each lands on its field and the rest stay at their defaults; their
    help shows each field's ``lone_help`` (no --sample or --max-output-offset, which serve lacks; the offset's
    default written out) and translate's old --max-len-ratio is no serve flag. The beam limit is one check,
    ``Limits.allowed``, for the server's default (a UserError naming the flags) and for a request (422 from it)."""
    from seq2seq.cli.common import decode_config
    from seq2seq.config import DecodeConfig

    assert decode_config(serve_cli.parse_args(["--checkpoint", "x"])) == DecodeConfig()
    given = serve_cli.parse_args(["--checkpoint", "x", "--beam-size", "3", "--n-best", "2", "--length-penalty", "0.5",
                                  "--max-output-ratio", "2", "--max-input-tokens", "9"])
    assert decode_config(given) == DecodeConfig(beam_size=3, n_best=2, length_penalty=0.5, max_output_ratio=2.0,
                                                max_input_tokens=9)
    with pytest.raises(SystemExit):
        serve_cli.parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "beam size; 1 = greedy (default: 5)" in text and "hypotheses per sentence, at most the beam size" in text
    assert "outputs stop at this ratio x source subwords + 10 (default: 1.5)" in text
    assert "--sample" not in text and "--max-output-offset" not in text and "--top-k" not in text
    with pytest.raises(SystemExit):
        serve_cli.parse_args(["--checkpoint", "x", "--max-len-ratio", "2"])
    capsys.readouterr()
    limits = Limits(max_beam_size=4)
    assert limits.allowed(DecodeConfig(beam_size=4)) == DecodeConfig(beam_size=4)
    with pytest.raises(UserError, match="--beam-size 5 is above this server's limit of 4 \\(--max-beam-size\\)"):
        limits.allowed(DecodeConfig())  # the default beam counts too


def test_serve_without_the_extra_names_the_install_command(monkeypatch, capsys, tmp_path):
    monkeypatch.setitem(sys.modules, "uvicorn", None)  # import uvicorn -> ImportError
    assert serve_cli.main(["--checkpoint", str(tmp_path / "best.pt")]) == 2
    assert "seq2seq serve needs the serve extra: pip install 'seq2seq[serve]'" in capsys.readouterr().err


def test_the_listening_socket_sends_small_writes_at_once():
    """TCP_NODELAY (inherited by accepted connections): no 40 ms wait for a delayed ACK per response."""
    sock = bind_socket("127.0.0.1", 0)
    try:
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
    finally:
        sock.close()


def test_a_port_in_use_is_a_named_error():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(UserError, match="--port .*choose another --port"):
            bind_socket("127.0.0.1", taken.getsockname()[1])


def start_server(run: Path, *flags: str) -> tuple[subprocess.Popen, str, list[str]]:
    """``seq2seq serve`` on a free loopback port; its URL from the ``serve url=`` log line."""
    proc = subprocess.Popen([sys.executable, "-m", "seq2seq", "serve", "--checkpoint", str(run), "--device",
                             "cpu", "--port", "0", "--engine", "seq2seq", "--compile", "off", *flags], cwd=ROOT,
                            env=ONE_THREAD, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    log: list[str] = []
    for line in proc.stderr:
        log.append(line)
        if match := re.match(r"serve url=(\S+)", line):
            threading.Thread(target=lambda: log.extend(proc.stderr), daemon=True).start()
            return proc, match.group(1), log
    raise AssertionError("the server did not start: " + "".join(log))


@pytest.mark.serial
def test_the_real_server_batches_drops_a_vanished_client_and_finishes_in_flight_requests_on_sigterm(checkpoint):  # noqa: F811
    # a full batch (6) goes at once; a lone request waits 2 s for company: long enough to act on it
    proc, url, log = start_server(checkpoint, "--max-batch-sentences", "6", "--max-wait-ms", "2000", "--quiet")
    try:
        sentences = ["twenty-one", "seven", "nine", "three hundred and five", "two", "forty"]
        with ThreadPoolExecutor(len(sentences)) as pool:
            answers = list(pool.map(lambda s: httpx.post(f"{url}/translate", json={"sentences": [s]}, timeout=60),
                                    sentences))
        assert [a.status_code for a in answers] == [200] * len(sentences)
        assert httpx.get(f"{url}/health").json()["model_calls"] < len(sentences)

        host, port = url.removeprefix("http://").rsplit(":", 1)
        body = json.dumps(GOOD).encode()
        with socket.create_connection((host, int(port))) as gone:  # sends a request and hangs up while queued
            gone.sendall(b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            wait_until_queued(lambda: httpx.get(f"{url}/health").json())
        deadline = time.monotonic() + 10
        while (status := httpx.get(f"{url}/health").json())["requests_dropped"] == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert status["requests_dropped"] == 1 and status["queue_requests"] == 0

        with ThreadPoolExecutor(1) as pool:  # queued when SIGTERM arrives: still answered
            in_flight = pool.submit(httpx.post, f"{url}/translate", json={"sentences": ["eleven"]}, timeout=60)
            wait_until_queued(lambda: httpx.get(f"{url}/health").json())
            proc.send_signal(signal.SIGTERM)
            answer = in_flight.result()
        assert answer.status_code == 200 and answer.json()["translations"][0]["source"] == "eleven"
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    time.sleep(0.1)
    assert any(line.startswith("serve_stopped signal=SIGTERM") for line in log), "".join(log)


# ----------------------------------------------------------------------------- the load benchmark


def test_serve_benchmark_smoke_run_records_the_mode_and_the_reference(checkpoint, tmp_path):  # noqa: F811
    """One mode (each is a server start), eager (a compiling start costs a minute of CPU here; the
    compiled path is tested in test_static_step, its background compile above); the other modes'
    flags are checked below."""
    (tmp_path / "test.en").write_text("\n".join(SOURCES[:2] + SOURCES[3:]) + "\n", encoding="utf-8")
    out = tmp_path / "serve.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_serve.py"), "--checkpoint",
                           str(checkpoint), "--data-dir", str(tmp_path), "--src", "en", "--tgt", "de", "--test-split",
                           "test", "--requests", "4", "--clients", "2", "--warmup", "1", "--beam-size", "2",
                           "--modes", "no-batching", "--engine", "seq2seq", "--compile", "off", "--out", str(out)],
                          capture_output=True, text=True, cwd=tmp_path,
                          env=ONE_THREAD, stdin=subprocess.DEVNULL, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = json.loads(out.read_text())
    assert record["benchmark"] == "serve" and record["command"].startswith("python benchmarks/bench_serve.py")
    assert record["machine"]["cpu_capability"] and record["settings"]["clients"] == 2
    mode = record["modes"]["no-batching"]
    assert mode["requests_ok"] == 4 and mode["errors"] == {} and mode["exit_code"] == 0
    assert mode["requests_per_s"] > 0 and mode["sentences_per_s"] > 0 and mode["model_calls"] == 4
    assert set(mode["latency_ms"]) == {"p50", "p95", "p99", "mean", "max"} and mode["mean_batch"] == 1
    assert record["reference"]["sentences"] == 4 and record["reference"]["sentences_per_s"] > 0
    assert mode["startup_seconds"] > 0 and mode["first_request_ms"] > 0 and "--compile off" in mode["server_command"]
    assert mode["compiled"] == "off" and mode["compiled_seconds"] >= mode["startup_seconds"]
    assert "| no-batching | 2 | 4 |" in (tmp_path / "serve.md").read_text()


def test_serve_benchmark_modes_are_valid_serve_flags():
    import bench_serve

    for flags in bench_serve.MODES.values():
        serve_cli.limits_from_args(serve_cli.parse_args(["--checkpoint", "RUN", *(flags or [])]))
