"""Run the app under uvicorn, with a graceful shutdown.

On SIGINT or SIGTERM uvicorn stops accepting connections and waits for the requests in flight
(queued or being translated) to be answered, at most ``--request-timeout`` + 10 s; then the app's
shutdown drains the batcher and the process exits normally (``run_server`` returns). The socket is
bound here, before uvicorn starts, so an address in use is a named error and ``--port 0`` (any
free port) can be logged with the port it got.
"""
from __future__ import annotations

import ipaddress
import signal
import socket
import threading
from typing import Sequence

from ..decoding.forced_alignment import BackwardAligner
from ..decoding.translator import Translator
from ..errors import UserError
from ..models.compiled import BackgroundCompile
from ..runtime import log
from .app import create_app
from .models import ServedModel
from .settings import ServeSettings


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host``:``port`` (0: a free port); UserError naming the flags if impossible."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    except socket.gaierror as exc:
        raise UserError(f"--host {host}: not an address of this machine ({exc.strerror})") from None
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # accepted connections inherit it (Linux): without, a response written as headers then body waits
    # for the client's delayed ACK of the headers, 40 ms per request on keep-alive connections
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise UserError(f"--host {host} --port {port}: cannot listen there ({exc.strerror}); choose another --port "
                        "(0 = any free port) or stop the process using it") from None
    sock.listen(2048)
    return sock


def run_server(translator: Translator | Sequence[ServedModel], settings: ServeSettings, host: str = "127.0.0.1",
               port: int = 8000, quiet: bool = False, compiling: BackgroundCompile | None = None,
               backward: BackwardAligner | None = None) -> None:
    """Serve ``translator`` (or several ``ServedModel``s side by side) over HTTP until SIGINT / SIGTERM, then
    finish the requests in flight and return. ``compiling``: its compiled decoding under way
    (``Translator.compile_in_background``); ``backward``: a target->source model that symmetrizes the
    alignments (``create_app``)."""
    import uvicorn

    app = create_app(translator, settings, compiling, backward)  # first: a bad model name binds no socket
    sock = bind_socket(host, port)
    address, port = sock.getsockname()[:2]
    if settings.api_key is None and not ipaddress.ip_address(address.split("%")[0]).is_loopback:
        log("warning", message=f"listening on {address} without an API key: anyone who can reach port {port} can use "
                               "the model; set --api-key (or the environment variable SEQ2SEQ_API_KEY)")
    config = uvicorn.Config(app, host=host, port=port, log_level="warning" if quiet else "info", access_log=not quiet,
                            timeout_graceful_shutdown=int(settings.limits.request_timeout) + 10, lifespan="on")
    server = uvicorn.Server(config)
    url = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
    models = app.state.models
    first = models.first
    engine = {"engine": "seq2seq"} if first.translator.engine is None else {  # and the converted model it reads
        "engine": first.translator.engine.name, "engine_model": first.translator.engine.model_dir}
    several = {"models": ",".join(f"{m.name}:{m.arch.replace(' ', '')}" for m in models)} if len(models) > 1 else {}
    log("serve", url=url, arch=first.arch.replace(" ", ""), device=first.translator.device,
        max_batch_sentences=settings.limits.max_batch_sentences, max_wait_ms=settings.limits.max_wait_ms,
        **engine, compiled=first.compiling.status if first.compiling else "off", **several,
        page=f"{url}/" if settings.ui else "off")
    signals: list[int] = []
    previous = {}
    if threading.current_thread() is threading.main_thread():
        # uvicorn re-raises the signal that stopped it once it is done; with these handlers that is a
        # no-op, so a graceful stop returns here (exit 0) instead of dying by the signal.
        previous = {sig: signal.signal(sig, lambda number, frame: signals.append(number))
                    for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        server.run(sockets=[sock])
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        sock.close()
    stats = app.state.batcher.stats
    log("serve_stopped", signal=signal.Signals(signals[0]).name if signals else "none", model_calls=stats.model_calls,
        sentences=stats.items, requests=stats.jobs)
