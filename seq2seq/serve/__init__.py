"""The HTTP server of ``seq2seq serve`` (the optional ``serve`` extra: FastAPI + uvicorn).

    batcher.py   dynamic batching: one worker thread, concurrent requests merged into model calls
    settings.py  ServeSettings / Limits: the server's options and their defaults
    models.py    ServedModel(s): the models served side by side, found by name
    schemas.py   the API's JSON as pydantic models (the OpenAPI description), Translation -> JSON
    http.py      JSON error bodies, the API key and the request body limit (ASGI middleware)
    checks.py    the limits and options every endpoint checks before it queues work
    waiting.py   a request's work queued on the batcher and awaited (429, 503, 504)
    app.py       create_app(translator or models, settings): POST /translate, GET /health
    explore.py   the endpoints behind the page: GET /models, POST /alignments, POST /attribution
    page.py      the page at / (static/: index.html, page.js, page.css) with the alignment renderer
    server.py    run_server: uvicorn on one socket, graceful shutdown on SIGINT / SIGTERM

Names are imported on first use: ``Batcher`` and the settings need neither FastAPI nor uvicorn.
"""
from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {"Batcher": "batcher", "BatchStats": "batcher", "QueueFull": "batcher", "BatcherClosed": "batcher",
            "Limits": "settings", "ServeSettings": "settings", "create_app": "app", "run_server": "server",
            "ServedModel": "models"}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'seq2seq.serve' has no attribute {name!r}")
    return getattr(importlib.import_module(f".{module}", __name__), name)
