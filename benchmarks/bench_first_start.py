"""How soon ``seq2seq translate`` answers, one sentence at a time (issue 70): the first start of ``--compile`` (an
empty package cache), the second (the packages on disk) and eager decoding, from the repository root:

    python benchmarks/bench_first_start.py --checkpoint RUN [--checkpoint RUN2 ...] (--data-dir MULTI30K | --toy)
        [--sentences 100] [--beam-size 1] [--modes eager "compile, first start" ...] [--out FILE]

Each run is the command a user types, in a process of its own, fed ``--sentences`` source lines on a pipe
(``--batch-size 1``: lone sentences, the compiled step's case; the command writes a chunk of 16 lines at a time):
the seconds from its start to its first output line (start-up, model load, the first chunk) and to its last, and
whether its outputs equal eager decoding's. Modes, in order: ``eager``; ``compile, first start`` (a fresh
``--compile-cache``: the step and encoder compile into packages at the first sentence); ``compile, second start``
(the same cache: the packages load). Speed figures need the machine to itself.
"""
from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, provenance, write_record
from seq2seq.io_utils import markdown_table, read_lines

MODES = ("eager", "compile, first start", "compile, second start")


def sources(args: argparse.Namespace) -> list[str]:
    """The first ``--sentences`` lines of Multi30k's test split, or of the toy task's test split (``--toy``)."""
    if args.toy:
        from seq2seq.toy import toy_corpus

        return list(toy_corpus()["test"]["src"])[: args.sentences]
    return read_lines(args.data_dir / f"{args.test_split}.{args.src}")[: args.sentences]


def timed_run(command: list[str], lines: list[str]) -> dict:
    """``command`` fed ``lines`` on its standard input: seconds to its first and last output line, its outputs."""
    start = time.perf_counter()
    process = subprocess.Popen(command, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    process.stdin.write("".join(line + "\n" for line in lines))
    process.stdin.close()
    outputs, first = [], None
    for line in process.stdout:
        first = first if first is not None else time.perf_counter() - start
        outputs.append(line.rstrip("\n"))
    stderr = process.stderr.read()
    if process.wait() != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{stderr[-3000:]}")
    return {"first_line_s": first, "last_line_s": time.perf_counter() - start, "outputs": outputs}


def measure(checkpoint: str, args: argparse.Namespace, lines: list[str]) -> dict:
    """Every mode of ``MODES`` on ``checkpoint``, in order (the second start reuses the first's packages)."""
    cache = Path(tempfile.mkdtemp(prefix="seq2seq-first-start-"))
    base = [sys.executable, "-m", "seq2seq", "translate", "--checkpoint", checkpoint, "--batch-size", "1",
            "--beam-size", str(args.beam_size), "--device", "cpu", "--quiet"]
    try:
        results = {}
        for mode in args.modes:
            flags = [] if mode == "eager" else ["--compile", "--compile-cache", str(cache)]
            results[mode] = timed_run(base + flags, lines)
            print(f"[{Path(checkpoint).name} / {mode}] first line {results[mode]['first_line_s']:.1f} s, last "
                  f"{results[mode]['last_line_s']:.1f} s", file=sys.stderr, flush=True)
        eager = results["eager"]["outputs"] if "eager" in results else None
        for mode, result in results.items():
            outputs = result.pop("outputs")
            if mode != "eager":
                result["same_as_eager"] = None if eager is None else outputs == eager
        return results
    finally:
        shutil.rmtree(cache, ignore_errors=True)


def table(record: dict) -> str:
    rows = [[name, mode, f"{r['first_line_s']:.1f}", f"{r['last_line_s']:.1f}",
             {None: "", True: "yes", False: "NO"}[r.get("same_as_eager")]]
            for name, modes in record["checkpoints"].items() for mode, r in modes.items()]
    m = record["machine"]
    return (f"`seq2seq translate --batch-size 1 --beam-size {record['beam_size']}` (torch's threads: every core) fed "
            f"{record['sentences']} sentences on a pipe, each run in a process of its own; {m['cpu']} "
            f"({', '.join(m.get('cpu_flags', [])) or m['cpu_capability']}), {m['cpus']} CPUs.\n\n"
            + markdown_table(["checkpoint", "mode", "first line s", "last line s", "outputs as eager"], rows) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", action="append", required=True, help="a run or .pt (repeat for several)")
    parser.add_argument("--data-dir", type=Path)
    parser.add_argument("--src", default="de")
    parser.add_argument("--test-split", default="test_2016_flickr")
    parser.add_argument("--toy", action="store_true", help="the toy task's test sentences (the quickstart model)")
    parser.add_argument("--sentences", type=int, default=100)
    parser.add_argument("--beam-size", type=int, default=1)
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES), help="in this order (default: all)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench-results" / "first-start.json")
    args = parser.parse_args(argv)
    if not args.toy and args.data_dir is None:
        parser.error("give --data-dir (Multi30k) or --toy")
    lines = sources(args)
    record = {**provenance("first_start"), "sentences": len(lines), "beam_size": args.beam_size,
              "checkpoints": {Path(c).parent.name if c.endswith(".pt") else Path(c).name: measure(c, args, lines)
                              for c in args.checkpoint}}
    text = table(record)
    write_record(args.out, record, text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
