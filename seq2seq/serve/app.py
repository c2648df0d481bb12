"""The FastAPI application of ``seq2seq serve``: ``POST /translate``, ``GET /health``, the endpoints
behind the page (``GET /models``, ``POST /alignments``, ``POST /attribution``: ``explore``), the page at
``/`` (``page``) and the OpenAPI description (``/openapi.json``, browsable at ``/docs``).

    app = create_app(Translator.from_checkpoint("RUN"), ServeSettings())
    uvicorn.run(app)          # or seq2seq.serve.run_server, which also shuts down gracefully
    app = create_app([ServedModel("transformer", t), ServedModel("rnn", r)])   # side by side

A request is checked (limits, options), queued on the ``Batcher`` and awaited; the event loop only
validates and waits. The worker thread translates, builds the alignments and serializes the JSON
answer, so a large answer costs the loop nothing. A request whose client disconnects is cancelled:
dropped if still queued, its result discarded if already being translated. The API is described in
docs/guides/serving.md.
"""
from __future__ import annotations

import asyncio
import dataclasses
from contextlib import asynccontextmanager
from dataclasses import asdict
from functools import partial
from typing import Sequence

import torch
from fastapi import FastAPI, HTTPException, Request, Response

from ..io_utils import counted
from ..version import __version__
from ..decoding.forced_alignment import BackwardAligner
from ..decoding.markup import mark_translations
from ..decoding.translator import Translation, Translator
from ..models.compiled import BackgroundCompile
from .batcher import Batcher
from .checks import check_sentences, checked_decode, parse_markup
from .explore import ExplainOptions, explain_batch, install_explore
from .http import ApiKey, BodyLimit, Refused, install_error_handlers, json_bytes
from .models import ServedModel, ServedModels, describe_arch, served_models
from .page import install_page
from .schemas import DecodeOptions, ErrorBody, Health, TranslateRequest, TranslateResponse, sentence_json
from .settings import ServeSettings
from .waiting import submit, wait_for

__all__ = ["create_app", "describe_arch", "check_sentences", "lone_sentence_threads", "translate_batch",
           "response_bytes"]

ERRORS = {code: {"model": ErrorBody, "description": text} for code, text in (
    (400, "the body is not valid JSON"), (401, "the server has an API key and the request did not carry it"),
    (413, "too many sentences, a sentence too long or a body too large"),
    (422, "a field of the wrong type, an empty list, bad decoding options or an unknown model"),
    (429, "the queue is full: retry after Retry-After seconds"), (500, "the model call failed"),
    (503, "the server is shutting down"), (504, "no answer within --request-timeout"))}


def create_app(translator: Translator | Sequence[ServedModel], settings: ServeSettings | None = None,
               compiling: BackgroundCompile | None = None, backward: BackwardAligner | None = None) -> FastAPI:
    """The app serving ``translator`` (the model named ``default``), or several ``ServedModel``s side by side;
    its batcher (``app.state.batcher``) runs every model in one worker thread, started with the app (or by the
    first request) and drained when the app stops. ``compiling``: the translator's compiled decoding under way,
    reported by ``/health``; ``backward``: a target->source model whose links symmetrize each best hypothesis's
    alignment (``symmetrize``); ``ServedModel``s carry their own."""
    settings = settings or ServeSettings()
    limits = settings.limits
    models = served_models(translator, settings.align, compiling, backward)
    batcher = Batcher(partial(run_batch, models, settings, torch.get_num_threads()), limits.max_batch_sentences,
                      limits.max_wait_ms / 1000, limits.max_queue_sentences)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        batcher.start()
        yield
        await asyncio.to_thread(batcher.close)  # uvicorn has let the requests in flight finish

    app = FastAPI(title="seq2seq translation API", version=__version__, lifespan=lifespan,
                  description="Neural machine translation with a seq2seq checkpoint; concurrent requests are "
                              "translated together (dynamic batching). See docs/guides/serving.md.")
    app.state.batcher, app.state.settings, app.state.models = batcher, settings, models
    refused = Refused()
    app.add_middleware(BodyLimit, max_bytes=limits.max_body_bytes)
    if settings.api_key is not None:  # outermost: a request without the key is refused before anything else
        app.add_middleware(ApiKey, key=settings.api_key, refused=refused)
    install_error_handlers(app)

    @app.post("/translate", response_model=TranslateResponse, responses=ERRORS)
    async def translate(body: TranslateRequest, request: Request) -> Response:
        """Translate ``sentences``; per sentence the best translation, its score and the rest of the
        n-best list, with word alignments and attention when asked for."""
        check_sentences(body.sentences, limits)
        served = models.get(body.model)
        if body.prefixes is not None and len(body.prefixes) != len(body.sentences):
            raise HTTPException(422, f"{counted(len(body.prefixes), 'prefix', 'prefixes')} for "
                                     f"{counted(len(body.sentences), 'sentence')}; give one per sentence (\"\" = none)")
        if body.constraints is not None and len(body.constraints) != len(body.sentences):
            raise HTTPException(422, f"{counted(len(body.constraints), 'constraint list')} for "
                                     f"{counted(len(body.sentences), 'sentence')}; give one list of phrases per "
                                     "sentence ([] = none)")
        engine = served.translator.engine
        if body.constraints and any(body.constraints) and engine is not None:
            raise HTTPException(422, f"constraints: this server's search is {engine.name}'s, which has "
                                     "no constrained search; start the server with --engine seq2seq to take them")
        prefixes = body.prefixes or [""] * len(body.sentences)
        constraints = [tuple(c) for c in body.constraints] if body.constraints else [()] * len(body.sentences)
        parsed = parse_markup(body)
        sentences = body.sentences if parsed is None else [text for text, _ in parsed]
        own = settings if served.align is settings.align else dataclasses.replace(settings, align=served.align)
        finish = partial(response_bytes, settings=own, alignments=body.alignments, attention=body.attention,
                         confidence=body.confidence, markup=parsed, sources=body.sentences, backward=served.backward)
        options = DecodeOptions(checked_decode(body, settings),
                                need_attention=body.alignments or body.attention or body.markup is not None,
                                need_confidence=body.confidence, model=served.name)
        future = submit(batcher, list(zip(sentences, prefixes, constraints)), options, finish)
        content = await wait_for(future, request, limits.request_timeout)
        return Response(content, media_type="application/json", status_code=200 if content else 499)

    @app.get("/health", response_model=Health)
    async def health() -> Health:
        """The model(s), where they run, the queue, and how requests were batched so far."""
        jobs, sentences = batcher.queued
        stats = batcher.stats
        first = models.first
        return Health(status="stopping" if batcher.closing else "ok", model=first.translator.checkpoints,
                      arch=first.arch, compiled=compiled_status(first), engine=engine_name(first),
                      device=str(first.translator.device), precision=settings.precision, queue_requests=jobs,
                      queue_sentences=sentences, in_flight_sentences=batcher.in_flight,
                      model_calls=stats.model_calls, sentences_translated=stats.items,
                      requests_translated=stats.jobs, requests_dropped=stats.dropped_jobs,
                      largest_batch=stats.largest_batch, requests_unauthorized=refused.count,
                      api_key=settings.api_key is not None, limits=asdict(limits),
                      models=[{"name": m.name, "arch": m.arch, "model": m.translator.checkpoints,
                               "engine": engine_name(m), "compiled": compiled_status(m)} for m in models])

    install_explore(app, models, settings)
    if settings.ui:
        install_page(app)
    return app


def engine_name(model: ServedModel) -> str:
    """Who runs the model's search: 'seq2seq' (ours) or the other engine's name."""
    return model.translator.engine.name if model.translator.engine is not None else "seq2seq"


def compiled_status(model: ServedModel) -> str:
    """The model's compiled decoding: 'off', 'compiling', 'ready' or 'failed' (``/health``)."""
    return model.compiling.status if model.compiling else "off"


def run_batch(models: ServedModels, settings: ServeSettings, threads: int, items: list,
              key: DecodeOptions | ExplainOptions) -> list:
    """The worker's one model call of a batch: translations (``translate_batch``) or attributions
    (``explore.explain_batch``), with the model the batch's key names."""
    model = models.get(key.model)
    if isinstance(key, ExplainOptions):
        return explain_batch(model, settings, threads, items, key)
    return translate_batch(model.translator, settings, threads, items, key)


def lone_sentence_threads(translator: Translator) -> int | None:
    """torch threads for a batch of one sentence in the worker: 1 on CPU (``translate_batch``), None:
    as many as for the others. (A compiled model compiles per thread count: ``seq2seq serve`` warms
    it up on this one.)"""
    return 1 if translator.device.type == "cpu" else None


def translate_batch(translator: Translator, settings: ServeSettings, threads: int,
                    items: list[tuple[str, str, tuple]], options: DecodeOptions) -> list[Translation]:
    """The one model call of a batch of (sentence, target prefix, constraint phrases) items (in the worker
    thread), on ``threads`` torch threads, or on one for a lone sentence on CPU.

    A lone sentence's decoding steps are hundreds of small operations, each an OpenMP parallel region,
    and the OpenMP team of a thread other than the main one is woken up for each (the main thread's
    spins between regions): on 2 cores one sentence at beam 5 took 61 ms in the worker on 2 threads,
    22 ms on 1 (21.5 ms in the main thread on 2). Wider batches keep every thread (64 sentences:
    0.40 s on 2, 0.47 s on 1; docs/guides/serving.md)."""
    sentences, prefixes, constraints = ([item[i] for item in items] for i in range(3))
    wanted = (lone_sentence_threads(translator) if len(sentences) == 1 else None) or threads
    if torch.get_num_threads() != wanted:
        torch.set_num_threads(wanted)
    return translator.translate(sentences, options.decode, prefix=prefixes if any(prefixes) else None,
                                constraints=[list(c) for c in constraints] if any(constraints) else None,
                                need_attention=options.need_attention, confidence=options.need_confidence)


def response_bytes(translations: list[Translation], settings: ServeSettings, alignments: bool,
                   attention: bool, confidence: bool = False, markup: list[tuple[str, list]] | None = None,
                   sources: list[str] | None = None, backward: BackwardAligner | None = None) -> bytes:
    """One request's ``TranslateResponse`` as JSON (in the worker thread); with ``markup`` (each
    sentence's plain text and elements) the tags carried across, and ``sources`` as sent; with
    ``backward`` the best hypotheses' alignments symmetrized (``symmetrize``)."""
    results = []
    # every hypothesis with the tags, by its own links (symmetrized with a backward model's where there is one)
    marked = None if markup is None else mark_translations(translations, markup, settings.align, backward)
    for i, t in enumerate(translations):
        result = sentence_json(t, i, settings, alignments, attention, confidence, None if marked is None else marked[i])
        if markup is not None and sources is not None:
            result["source"] = sources[i]
        results.append(result)
    if alignments and backward is not None:
        symmetrize(results, translations, backward)
    return json_bytes({"translations": results})


def symmetrize(results: list[dict], translations: list[Translation], backward: BackwardAligner) -> None:
    """Each result's alignment (the best hypothesis's) with its word links symmetrized with the backward
    model's, the forward and backward links beside them, in one forced pass of the backward model."""
    chosen = [i for i, (r, t) in enumerate(zip(results, translations))
              if r.get("alignment") and t.source.strip() and t.text.strip()]
    sources, targets = [translations[i].source for i in chosen], [translations[i].text for i in chosen]
    fields = backward.symmetrized_fields(sources, targets, [results[i]["alignment"]["pharaoh_word"] for i in chosen],
                                         [results[i]["alignment"]["word_matrix"] for i in chosen])
    for i, own in zip(chosen, fields):
        results[i]["alignment"].update(own)
