"""The page of ``seq2seq serve`` at ``/`` (``--no-ui``: none): type a sentence, see each served model's
translation, its attention and attributions (docs/guides/serving.md, "The page").

The page is static files and nothing else: ``static/index.html``, ``page.js`` and ``page.css`` here, and the
alignment renderer of the static viewer, ``viewer.js`` and ``viewer.css`` of ``seq2seq.alignment``
(``renderer_assets``): one renderer draws every alignment page. Everything it shows comes from the JSON
endpoints (``explore``), fetched from this server, and goes into the page as text (``textContent``), never
as HTML. Every file is served with a Content-Security-Policy that allows scripts, styles, images and requests
from this server only: no inline script or style, no other origin, no framing, no forms posting elsewhere. The
files are read once, when the app is built.
"""
from __future__ import annotations

from importlib import resources

from fastapi import FastAPI, HTTPException
from fastapi.responses import Response

from ..alignment.viewer import renderer_assets

#: scripts, styles, images and requests from this server only; nothing inline, no plugins, no framing
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
       "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer",
           "X-Frame-Options": "DENY", "Cache-Control": "no-cache"}
MEDIA_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
               ".css": "text/css; charset=utf-8", ".svg": "image/svg+xml"}
#: the page's own files, in ``seq2seq/serve/static/``
OWN = ("index.html", "page.js", "page.css", "icon.svg")


def page_files() -> dict[str, bytes]:
    """Every file of the page by name (the renderer's from ``seq2seq.alignment``)."""
    folder = resources.files(__package__).joinpath("static")
    files = {name: folder.joinpath(name).read_bytes() for name in OWN}
    files.update({name: text.encode("utf-8") for name, text in renderer_assets().items()})
    return files


def install_page(app: FastAPI) -> None:
    """Serve the page at ``/`` and its files at ``/ui/NAME`` (outside the API description)."""
    files = page_files()

    def served(name: str) -> Response:
        suffix = name[name.rfind("."):]
        return Response(files[name], media_type=MEDIA_TYPES[suffix], headers=HEADERS)

    @app.get("/", include_in_schema=False)
    async def index() -> Response:
        return served("index.html")

    @app.get("/ui/{name}", include_in_schema=False)
    async def asset(name: str) -> Response:
        if name not in files or name == "index.html":
            raise HTTPException(404, f"no file {name!r} on this page; it has {', '.join(sorted(files))}")
        return served(name)
