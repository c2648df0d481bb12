"""The FastAPI application of ``seq2seq serve``: ``POST /translate``, ``GET /health`` and the OpenAPI
description (``/openapi.json``, browsable at ``/docs``).

    app = create_app(Translator.from_checkpoint("RUN"), ServeSettings())
    uvicorn.run(app)          # or seq2seq.serve.run_server, which also shuts down gracefully

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

import torch
from fastapi import FastAPI, HTTPException, Request, Response

from ..io_utils import counted
from ..version import __version__
from ..decoding.forced_alignment import BackwardAligner
from ..decoding.markup import mark_translations, parse
from ..decoding.translator import Translation, Translator
from ..errors import UserError
from ..models.compiled import BackgroundCompile
from ..runtime import LOGGER
from .batcher import Batcher, BatcherClosed, QueueFull
from .http import ApiKey, BodyLimit, Refused, install_error_handlers, json_bytes
from .schemas import DecodeOptions, ErrorBody, Health, TranslateRequest, TranslateResponse, sentence_json
from .settings import Limits, ServeSettings

ERRORS = {code: {"model": ErrorBody, "description": text} for code, text in (
    (400, "the body is not valid JSON"), (401, "the server has an API key and the request did not carry it"),
    (413, "too many sentences, a sentence too long or a body too large"),
    (422, "a field of the wrong type, an empty list or bad decoding options"),
    (429, "the queue is full: retry after Retry-After seconds"), (500, "the model call failed"),
    (503, "the server is shutting down"), (504, "no answer within --request-timeout"))}


def create_app(translator: Translator, settings: ServeSettings | None = None,
               compiling: BackgroundCompile | None = None, backward: BackwardAligner | None = None) -> FastAPI:
    """The app serving ``translator``; its batcher (``app.state.batcher``) runs the model in one
    worker thread, started with the app (or by the first request) and drained when the app stops.
    ``compiling``: the translator's compiled decoding under way, reported by ``/health``; ``backward``:
    a target->source model whose links symmetrize each best hypothesis's alignment (``symmetrize``)."""
    settings = settings or ServeSettings()
    limits = settings.limits
    run = partial(translate_batch, translator, settings, torch.get_num_threads())
    batcher = Batcher(run, limits.max_batch_sentences,
                      limits.max_wait_ms / 1000, limits.max_queue_sentences)
    arch = describe_arch(translator.model)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        batcher.start()
        yield
        await asyncio.to_thread(batcher.close)  # uvicorn has let the requests in flight finish

    app = FastAPI(title="seq2seq translation API", version=__version__, lifespan=lifespan,
                  description="Neural machine translation with a seq2seq checkpoint; concurrent requests are "
                              "translated together (dynamic batching). See docs/guides/serving.md.")
    app.state.batcher, app.state.settings = batcher, settings
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
        if body.prefixes is not None and len(body.prefixes) != len(body.sentences):
            raise HTTPException(422, f"{counted(len(body.prefixes), 'prefix', 'prefixes')} for "
                                     f"{counted(len(body.sentences), 'sentence')}; give one per sentence (\"\" = none)")
        if body.constraints is not None and len(body.constraints) != len(body.sentences):
            raise HTTPException(422, f"{counted(len(body.constraints), 'constraint list')} for "
                                     f"{counted(len(body.sentences), 'sentence')}; give one list of phrases per "
                                     "sentence ([] = none)")
        if body.constraints and any(body.constraints) and translator.engine is not None:
            raise HTTPException(422, f"constraints: this server's search is {translator.engine.name}'s, which has "
                                     "no constrained search; start the server with --engine seq2seq to take them")
        prefixes = body.prefixes or [""] * len(body.sentences)
        constraints = [tuple(c) for c in body.constraints] if body.constraints else [()] * len(body.sentences)
        parsed = parse_markup(body)
        sentences = body.sentences if parsed is None else [text for text, _ in parsed]
        finish = partial(response_bytes, settings=settings, alignments=body.alignments, attention=body.attention,
                         confidence=body.confidence, markup=parsed, sources=body.sentences, backward=backward)
        try:
            future = batcher.submit(list(zip(sentences, prefixes, constraints)), decode_options(body, settings),
                                    finish)
        except QueueFull as exc:
            raise HTTPException(429, f"the server is busy: {exc} (--max-queue-sentences); retry after "
                                     "Retry-After seconds", headers={"Retry-After": "1"}) from None
        except BatcherClosed:
            raise HTTPException(503, "the server is shutting down; send the request to another instance") from None
        content = await wait_for(future, request, limits.request_timeout)
        return Response(content, media_type="application/json", status_code=200 if content else 499)

    @app.get("/health", response_model=Health)
    async def health() -> Health:
        """The model, where it runs, the queue, and how requests were batched so far."""
        jobs, sentences = batcher.queued
        stats = batcher.stats
        return Health(status="stopping" if batcher.closing else "ok", model=translator.checkpoints, arch=arch,
                      compiled=compiling.status if compiling else "off",
                      engine=translator.engine.name if translator.engine is not None else "seq2seq",
                      device=str(translator.device), precision=settings.precision, queue_requests=jobs,
                      queue_sentences=sentences, in_flight_sentences=batcher.in_flight,
                      model_calls=stats.model_calls, sentences_translated=stats.items,
                      requests_translated=stats.jobs, requests_dropped=stats.dropped_jobs,
                      largest_batch=stats.largest_batch, requests_unauthorized=refused.count,
                      api_key=settings.api_key is not None, limits=asdict(limits))

    return app


def decode_options(body: TranslateRequest, settings: ServeSettings) -> DecodeOptions:
    """The request's options over the server's defaults (``settings.decode``), checked where the
    ``DecodeConfig`` is built, as for ``seq2seq translate`` (422)."""
    asked = {"beam_size": body.beam_size, "n_best": body.n_best, "length_penalty": body.length_penalty}
    try:
        decode = settings.limits.allowed(dataclasses.replace(
            settings.decode, ordered_constraints=body.ordered_constraints,
            **{name: value for name, value in asked.items() if value is not None}))
    except UserError as exc:
        raise HTTPException(422, str(exc).replace("--n-best", "n_best").replace("--beam-size", "beam_size")) from None
    return DecodeOptions(decode, need_attention=body.alignments or body.attention or body.markup is not None,
                         need_confidence=body.confidence)


def parse_markup(body: TranslateRequest) -> list[tuple[str, list]] | None:
    """Each sentence's plain text and elements (``decoding.markup.parse``) with ``markup``; 422
    naming the sentence for markup the xml mode cannot read."""
    if body.markup is None:
        return None
    try:
        return [parse(sentence, body.markup, f"sentence {i}") for i, sentence in enumerate(body.sentences)]
    except UserError as exc:
        raise HTTPException(422, str(exc).replace("--markup html", '"markup": "html"')) from None


def check_sentences(sentences: list[str], limits: Limits) -> None:
    """413 for too many sentences or a sentence too long, naming the limit and its flag; 422 for a
    string that is not text (a lone surrogate escape, which JSON allows and the tokenizer cannot take)."""
    if len(sentences) > limits.max_request_sentences:
        raise HTTPException(413, f"{len(sentences)} sentences in one request; this server takes at most "
                                 f"{limits.max_request_sentences} (--max-request-sentences): split the request")
    for index, sentence in enumerate(sentences):
        if len(sentence) > limits.max_sentence_chars:
            raise HTTPException(413, f"sentence {index} has {len(sentence)} characters; this server takes at most "
                                     f"{limits.max_sentence_chars} (--max-sentence-chars): split it")
        try:
            sentence.encode("utf-8")
        except UnicodeEncodeError:
            raise HTTPException(422, f"sentence {index} is not valid Unicode text (a lone surrogate such as "
                                     "\\ud800); send UTF-8 text") from None


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


async def wait_for(future, request: Request, timeout: float) -> bytes:
    """The job's answer; 504 after ``timeout`` seconds; b"" when the client went away first. Either
    way the job is cancelled, so the worker drops it if it has not started it."""
    result = asyncio.wrap_future(future)
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        done, _ = await asyncio.wait({result, gone}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not result.done():
            result.cancel()
    if result in done:
        try:
            return result.result()
        except Exception as exc:
            LOGGER.error(f"serve error=translation_failed exception={type(exc).__name__}: {exc}")
            raise HTTPException(500, f"translation failed: {type(exc).__name__}: {exc}") from None
    if gone in done:
        return b""
    raise HTTPException(504, f"no translation within {timeout:g} s (--request-timeout): the server is overloaded; "
                             "retry later or send fewer sentences")


async def _disconnected(request: Request) -> None:
    """Returns when the client has disconnected (the body has been read: the next ASGI message is that)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def describe_arch(model) -> str:
    """'transformer', 'rnn (bahdanau)', or 'ensemble: rnn (bahdanau) + transformer'."""
    members = getattr(model, "members", None)
    if members is not None:
        return "ensemble: " + " + ".join(describe_arch(member) for member in members)
    cfg = getattr(model, "cfg", None)
    if cfg is None:
        return type(model).__name__
    return f"rnn ({cfg.attention})" if cfg.arch == "rnn" else cfg.arch
