"""HTTP plumbing of the server: every error as a JSON ``ErrorBody``, the API key, and the request
body limit.

The body limit is an ASGI middleware, so it acts before FastAPI reads (buffers) a body: a
Content-Length above the limit is answered 413 without reading a byte, and a body without one
(chunked) is counted as it arrives and refused as soon as it passes the limit.
"""
from __future__ import annotations

import hashlib
import hmac
import json
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException


def error_response(status: int, message: str, headers: dict[str, str] | None = None,
                   details: list[dict[str, Any]] | None = None) -> JSONResponse:
    body: dict[str, Any] = {"error": message, "status": status}
    if details is not None:
        body["details"] = details
    return JSONResponse(body, status_code=status, headers=headers)


def install_error_handlers(app: FastAPI) -> None:
    """HTTP errors (ours, 404, 405) and validation errors (400 for a body that is not JSON, 422 for JSON of
    the wrong shape) answer an ``ErrorBody``."""

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return error_response(exc.status_code, str(exc.detail), exc.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        for error in errors:
            if error.get("type") == "json_invalid":
                reason = (error.get("ctx") or {}).get("error", "JSON decode error")
                where = error["loc"][-1] if error.get("loc") else "?"
                return error_response(400, f"the request body is not valid JSON: {reason} (at character {where}); "
                                           'send an object like {"sentences": ["..."]}')
        details = [{"loc": [str(part) for part in e.get("loc", ())], "msg": e.get("msg", ""), "type": e.get("type", "")}
                   for e in jsonable_encoder(errors, exclude={"input", "ctx", "url"})]
        summary = "; ".join(f"{'.'.join(d['loc'][1:]) or 'body'}: {d['msg']}" for d in details)
        return error_response(422, f"invalid request: {summary}", details=details)


class BodyTooLarge(HTTPException):
    def __init__(self, limit: int) -> None:
        super().__init__(413, f"the request body is larger than the server's limit of {limit} bytes "
                              "(--max-body-bytes); send fewer or shorter sentences per request")


class BodyLimit:
    """ASGI middleware: HTTP request bodies of at most ``max_bytes`` (413 otherwise, see the module docstring)."""

    def __init__(self, app, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            return await self._refuse(scope, receive, send)
        received = 0
        started = False

        async def limited_receive():
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise BodyTooLarge(self.max_bytes)  # FastAPI re-raises it to the handler above: 413
            return message

        async def tracked_send(message):
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited_receive, tracked_send)
        except BodyTooLarge:
            if not started:
                await self._refuse(scope, receive, send)

    async def _refuse(self, scope, receive, send) -> None:
        exc = BodyTooLarge(self.max_bytes)
        response = error_response(413, str(exc.detail), {"Connection": "close"})
        await response(scope, receive, send)


def json_bytes(value: Any) -> bytes:
    """Compact UTF-8 JSON (responses carry nested attention lists: no indentation)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8")


#: Paths anyone may read when the server has an API key: liveness probes, the API's description, and the page
#: with what it reads before it has a key (the models and their options); the page sends the key with the rest.
OPEN_PATHS = frozenset({"/health", "/docs", "/docs/oauth2-redirect", "/openapi.json", "/", "/models"})
#: ... and every path under these: the page's static files
OPEN_PREFIXES = ("/ui/",)


def is_open(path: str) -> bool:
    """Whether ``path`` is served without the API key (``OPEN_PATHS``, ``OPEN_PREFIXES``)."""
    return path in OPEN_PATHS or path.startswith(OPEN_PREFIXES)


@dataclass
class Refused:
    """Requests the ``ApiKey`` middleware refused (shown by ``/health``)."""

    count: int = 0


class ApiKey:
    """ASGI middleware: a request to any path but the open ones (``is_open``) carries the server's key, as
    ``Authorization: Bearer KEY`` or ``X-API-Key: KEY``; without it the answer is 401 before the
    body is read, counted in ``refused``. The key sent is compared by its SHA-256 digest with
    ``hmac.compare_digest``: the time taken says nothing about how much of it was right (nor about
    its length). Keys go in headers only, never in the URL, which access logs record."""

    def __init__(self, app, key: str, refused: Refused) -> None:
        self.app, self.digest, self.refused = app, _digest(key.encode("utf-8")), refused

    def allowed(self, headers: list[tuple[bytes, bytes]]) -> bool:
        for name, value in headers:
            name = name.lower()
            if name == b"authorization" and value[:7].lower() == b"bearer ":
                value = value[7:].strip()
            elif name != b"x-api-key":
                continue
            if hmac.compare_digest(_digest(value), self.digest):
                return True
        return False

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or is_open(scope["path"]) or self.allowed(scope["headers"]):
            await self.app(scope, receive, send)
            return
        self.refused.count += 1
        response = error_response(401, "this server needs an API key: send it as 'Authorization: Bearer KEY' or "
                                       "'X-API-Key: KEY' (the key of seq2seq serve --api-key)",
                                  headers={"WWW-Authenticate": 'Bearer realm="seq2seq"'})
        await response(scope, receive, send)


def _digest(key: bytes) -> bytes:
    return hashlib.sha256(key).digest()
