"""The HTTP server of ``seq2seq serve`` (the optional ``serve`` extra: FastAPI + uvicorn).

    batcher.py   dynamic batching: one worker thread, concurrent requests merged into model calls
    settings.py  ServeSettings / Limits: the server's options and their defaults
    schemas.py   the API's JSON as pydantic models (the OpenAPI description), Translation -> JSON
    http.py      JSON error bodies and the request body limit (ASGI middleware)
    app.py       create_app(translator, settings): POST /translate, GET /health
    server.py    run_server: uvicorn on one socket, graceful shutdown on SIGINT / SIGTERM

Names are imported on first use: ``Batcher`` and the settings need neither FastAPI nor uvicorn.
"""
from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {"Batcher": "batcher", "BatchStats": "batcher", "QueueFull": "batcher", "BatcherClosed": "batcher",
            "Limits": "settings", "ServeSettings": "settings", "create_app": "app", "run_server": "server"}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'seq2seq.serve' has no attribute {name!r}")
    return getattr(importlib.import_module(f".{module}", __name__), name)
