"""Load test of ``seq2seq serve`` on loopback (from the repository root):

    python benchmarks/bench_serve.py --checkpoint RUN --data-dir MULTI30K [--requests 1000] [--clients 32]

1. For each of --modes: ``batching`` (dynamic batching: --max-batch-sentences, --max-wait-ms) and
   ``no-batching`` (--max-batch-sentences 1 --max-wait-ms 0: one model call per request), start
   ``python -m seq2seq serve`` (``--compile``: auto, on or off) on a free loopback port and wait for
   its URL: the start-up seconds, then one request of one sentence alone: the first request's latency
   (with ``--compile``, answered uncompiled while the server compiles in the background), then wait
   until ``/health`` says the compiled decoding is live (or failed, or off): the seconds from the
   start to that.
2. --clients concurrent clients (asyncio + httpx, one keep-alive connection each) send --requests
   requests of --sentences-per-request sentences from the source side of the Multi30k test split
   (cycled if there are fewer), until all are sent or --seconds have passed; after a short warm-up.
   Measured: requests/s, sentences/s, latency percentiles (p50 / p95 / p99, client side), the
   server's model calls and mean batch (from ``/health``). Then SIGTERM: the server must exit 0.
3. Reference: ``Translator.translate`` on the same sentences in one call, in this process, after the
   servers have stopped: what the model does with no HTTP and ideal batches.
4. Record: --out (JSON + markdown table).

Clients and server share the machine's cores (the clients' CPU time is not free); compare modes
within one record only.
"""
from __future__ import annotations

import argparse
import asyncio
import itertools
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np

from common import ROOT, add_multi30k_flags, provenance, write_record
from seq2seq.io_utils import markdown_table

MODES = {"batching": None, "no-batching": ["--max-batch-sentences", "1", "--max-wait-ms", "0"]}


def start_server(args: argparse.Namespace, mode: str) -> tuple[subprocess.Popen, str, list[str], float]:
    """The server process, its URL (read from its ``serve url=...`` log line), the command and the
    seconds it took to start."""
    flags = MODES[mode] or ["--max-batch-sentences", str(args.max_batch_sentences), "--max-wait-ms",
                            str(args.max_wait_ms)]
    command = [sys.executable, "-m", "seq2seq", "serve", "--checkpoint", *map(str, args.checkpoint), "--host",
               "127.0.0.1", "--port", "0", "--device", args.device, "--beam-size", str(args.beam_size), "--quiet",
               "--max-queue-sentences", str(max(1024, args.clients * args.sentences_per_request)),
               "--max-request-sentences", str(max(128, args.sentences_per_request)), "--compile", args.compile,
               "--engine", args.engine, "--compile-cache", args.compile_cache, *flags]
    print(f"[{mode}] {' '.join(command)}", file=sys.stderr, flush=True)
    started = time.perf_counter()
    proc = subprocess.Popen(command, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    found: dict[str, str] = {}
    ready = threading.Event()

    def relay() -> None:  # the server's log to ours; its first "serve url=..." line says where it listens
        for line in proc.stderr:
            sys.stderr.write(line)
            if not ready.is_set() and (match := re.search(r"^serve url=(\S+)", line)):
                found["url"], found["seconds"] = match.group(1), time.perf_counter() - started
                ready.set()
        ready.set()

    threading.Thread(target=relay, daemon=True).start()
    if not ready.wait(args.startup_timeout) or "url" not in found:
        proc.kill()
        raise SystemExit(f"[{mode}] the server did not start within {args.startup_timeout} s (exit {proc.poll()})")
    return proc, found["url"], command, found["seconds"]


async def load(url: str, requests: list[list[str]], args: argparse.Namespace) -> dict:
    """Send ``requests`` from --clients concurrent clients; latencies and counts."""
    import httpx

    latencies: list[float] = []
    errors: Counter = Counter()
    order = itertools.count()
    deadline = time.perf_counter() + args.seconds

    async def client() -> None:
        async with httpx.AsyncClient(base_url=url, timeout=args.timeout) as http:
            while (i := next(order)) < len(requests) and time.perf_counter() < deadline:
                start = time.perf_counter()
                try:
                    response = await http.post("/translate", json={"sentences": requests[i]})
                    status = response.status_code
                except httpx.HTTPError as exc:
                    status = type(exc).__name__
                if status == 200:
                    latencies.append(time.perf_counter() - start)
                else:
                    errors[str(status)] += 1

    start = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(args.clients)))
    return {"seconds": time.perf_counter() - start, "latencies": latencies, "errors": dict(errors)}


def wait_for_compiled(url: str, started: float, timeout: float) -> tuple[str, float]:
    """The server's compiled-decoding status once it is no longer "compiling" and the seconds since
    ``started`` (the process start) at that moment."""
    import httpx

    deadline = time.perf_counter() + timeout
    while (status := httpx.get(url + "/health", timeout=60).json()["compiled"]) == "compiling":
        if time.perf_counter() > deadline:
            raise SystemExit(f"the server's decoding did not compile within {timeout} s (--startup-timeout)")
        time.sleep(0.2)
    return status, time.perf_counter() - started


def run_mode(mode: str, requests: list[list[str]], args: argparse.Namespace) -> dict:
    """Steps 1-2 for one mode."""
    import httpx

    started = time.perf_counter()
    proc, url, command, startup = start_server(args, mode)
    try:
        health = httpx.get(url + "/health", timeout=60).json()
        start = time.perf_counter()
        httpx.post(url + "/translate", json={"sentences": requests[0][:1]}, timeout=args.timeout).raise_for_status()
        first_ms = 1000 * (time.perf_counter() - start)
        compiled, compiled_seconds = wait_for_compiled(url, started, args.startup_timeout)
        asyncio.run(load(url, requests[: args.warmup], args))
        before = httpx.get(url + "/health", timeout=60).json()
        result = asyncio.run(load(url, requests, args))
        after = httpx.get(url + "/health", timeout=60).json()
    finally:
        proc.send_signal(signal.SIGTERM)
        exit_code = proc.wait(timeout=args.timeout + 30)
    ok = len(result["latencies"])
    sentences = ok * args.sentences_per_request
    calls = after["model_calls"] - before["model_calls"]
    translated = after["sentences_translated"] - before["sentences_translated"]
    milliseconds = np.array(result["latencies"]) * 1000
    percentiles = {f"p{q}": float(np.percentile(milliseconds, q)) for q in (50, 95, 99)} if ok else {}
    print(f"[{mode}] {ok} requests in {result['seconds']:.1f} s, errors {result['errors']}, exit {exit_code}",
          file=sys.stderr, flush=True)
    return {"server_command": " ".join(command[1:]), "arch": health["arch"], "device": health["device"],
            "startup_seconds": startup, "first_request_ms": first_ms, "compiled": compiled,
            "compiled_seconds": compiled_seconds,
            "requests_ok": ok, "errors": result["errors"], "seconds": result["seconds"],
            "requests_per_s": ok / result["seconds"], "sentences_per_s": sentences / result["seconds"],
            "latency_ms": {**percentiles, "mean": float(milliseconds.mean()) if ok else None,
                           "max": float(milliseconds.max()) if ok else None},
            "model_calls": calls, "mean_batch": translated / calls if calls else None,
            "largest_batch": after["largest_batch"], "exit_code": exit_code}


def reference(sentences: list[str], args: argparse.Namespace) -> dict:
    """Step 3: one ``Translator.translate`` call on the sentences the clients sent."""
    from seq2seq.decoding.translator import Translator

    paths = args.checkpoint if len(args.checkpoint) > 1 else args.checkpoint[0]
    translator = Translator.from_checkpoint(paths, device=args.device)
    translator.translate(sentences[: args.warmup], beam_size=args.beam_size, need_attention=False)
    start = time.perf_counter()
    translator.translate(sentences, beam_size=args.beam_size, need_attention=False)
    seconds = time.perf_counter() - start
    return {"sentences": len(sentences), "seconds": seconds, "sentences_per_s": len(sentences) / seconds}


def serve_table(record: dict) -> str:
    s = record["settings"]
    rows = [[mode, s["clients"], r["requests_ok"], f"{r['requests_per_s']:.1f}", f"{r['sentences_per_s']:.1f}",
             *(f"{r['latency_ms'].get(q, float('nan')):.0f}" for q in ("p50", "p95", "p99")), r["model_calls"],
             f"{r['mean_batch']:.1f}" if r["mean_batch"] else "-", f"{r['startup_seconds']:.1f}",
             f"{r['first_request_ms']:.0f}", f"{r['compiled']} {r['compiled_seconds']:.1f} s"]
            for mode, r in record["modes"].items()]
    ref = record["reference"]
    head = [f"`seq2seq serve` on loopback, {s['clients']} concurrent clients, {s['sentences_per_request']} "
            f"sentence(s) per request, beam {s['beam_size']}, batching: --max-batch-sentences "
            f"{s['max_batch_sentences']} --max-wait-ms {s['max_wait_ms']}, --engine {s.get('engine', 'seq2seq')}, "
            f"--compile {s['compile']}; "
            f"{record['machine']['cpu']}.", ""]
    foot = ["", f"Reference, `Translator.translate` on the same {ref['sentences']} sentences in one call: "
                f"{ref['sentences_per_s']:.1f} sentences/s."]
    return "\n".join(head) + markdown_table(
        ["mode", "clients", "requests", "requests/s", "sentences/s", "p50 ms", "p95 ms", "p99 ms", "model calls",
         "mean batch", "start-up s", "first request ms", "compiled after"], rows) + "\n".join(["", *foot]) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", required=True, nargs="+", type=Path, help="checkpoint(s) or run directory")
    add_multi30k_flags(parser)
    parser.add_argument("--requests", type=int, default=1000, help="requests per mode (default: 1000)")
    parser.add_argument("--seconds", type=float, default=120, help="and at most this long per mode (default: 120)")
    parser.add_argument("--clients", type=int, default=32, help="concurrent clients (default: 32)")
    parser.add_argument("--sentences-per-request", type=int, default=1)
    parser.add_argument("--beam-size", type=int, default=5)
    parser.add_argument("--max-batch-sentences", type=int, default=64, help="batching mode's (default: 64)")
    parser.add_argument("--max-wait-ms", type=float, default=10, help="batching mode's (default: 10)")
    parser.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES))
    parser.add_argument("--warmup", type=int, default=8, help="requests sent before measuring (default: 8)")
    parser.add_argument("--timeout", type=float, default=120, help="client timeout per request, seconds")
    parser.add_argument("--startup-timeout", type=float, default=300)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--engine", choices=["seq2seq", "ctranslate2", "auto"], default="auto",
                        help="the server's --engine (default: auto, as the server's)")
    parser.add_argument("--compile", choices=["auto", "on", "off"], default="auto",
                        help="the server's --compile (compiled decoding of lone requests; default: auto)")
    parser.add_argument("--compile-cache", default="none",
                        help="the server's --compile-cache (default: none, every start compiles: a cold start; "
                             "auto or DIR: what a later start of the same model loads)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench-results" / "serve.json")
    args = parser.parse_args(argv)
    source = args.data_dir / f"{args.test_split}.{args.src}"
    lines = [line for line in source.read_text(encoding="utf-8").splitlines() if line.strip()]
    k = args.sentences_per_request
    pool = itertools.cycle(lines)
    requests = [[next(pool) for _ in range(k)] for _ in range(args.requests)]
    record = {**provenance("serve"), "checkpoint": [str(c) for c in args.checkpoint], "source": str(source),
              "settings": {"requests": args.requests, "seconds_limit": args.seconds, "clients": args.clients,
                           "sentences_per_request": k, "beam_size": args.beam_size,
                           "max_batch_sentences": args.max_batch_sentences, "max_wait_ms": args.max_wait_ms,
                           "warmup": args.warmup, "device": args.device, "compile": args.compile,
                           "engine": args.engine},
              "modes": {mode: run_mode(mode, requests, args) for mode in args.modes}}
    sent = max(1, max(r["requests_ok"] for r in record["modes"].values()))
    record["reference"] = reference([s for request in requests[:sent] for s in request], args)
    table = serve_table(record)
    write_record(args.out, record, table)
    print(table)
    return 0 if all(r["exit_code"] == 0 for r in record["modes"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
