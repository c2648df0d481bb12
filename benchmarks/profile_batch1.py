"""Where the time of one-sentence-at-a-time decoding goes (issue 70), from the repository root:

    python benchmarks/profile_batch1.py --checkpoint RUN [--checkpoint RUN2 ...] (--data-dir MULTI30K | --toy)
        [--sentences 50] [--beams 1 5] [--threads 1 2] [--engines eager packaged] [--compile-cache DIR]
        [--out FILE.json]

Each checkpoint translates its first ``--sentences`` test sentences one at a time (batch 1, length penalty 0, no
attention) with each engine (``eager``: the reference; ``compiled``: ``torch.compile``, ``--compile``;
``packaged``: the same step compiled ahead of time, ``--compile-cache``, packages in a temporary directory built
by a warm-up that is not timed, or loaded from ``--compile-cache DIR``), beam size and thread count. Every call on
the way is timed by a wrapper (a few tenths of a microsecond each), and a sentence's wall time T splits into

    T = encode + model steps + log-softmax and masks + cache reorder + search bookkeeping + outside the search

- **encode**: ``model.encode`` (the encoder and the cross-attention keys and values);
- **model steps**: ``model.decode_step`` (the decoder and output layer, and the Python that calls them:
  Dynamo's or the package's calling convention, the cache bookkeeping), or where the search's choice is packaged
  with the step (a packaged Transformer, one sentence: ``greedy_step`` / ``beam_step``, ``models.fused``) those
  calls, which then hold the log-softmax and masks, the choice and a beam's cache reorder as well;
- **log-softmax and masks**: ``OutputVocabulary.log_probs`` (the normalisation, PAD/BOS and the length bound);
- **cache reorder**: ``Generator.reorder`` (a beam's rows of the decoder state, the whole preallocated cache,
  gathered for the chosen hypotheses);
- **search bookkeeping**: the rest of the search loop (``translate_batch`` minus the four above): argmax or top-k,
  the hypotheses, finished rows, host reads;
- **outside the search**: the rest of ``Translator.translate`` (tokenization, batching, the result objects).

Per output step (``decode_step`` calls) in microseconds and as shares of the sentence's time. ``--toy`` reads
the toy quickstart's test split (``seq2seq.toy.toy_corpus``), for a model from ``seq2seq train`` without
arguments. Shares are meaningful on a busy machine; the absolute numbers only on an idle one.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

import torch

from common import ROOT, add_multi30k_flags, provenance, write_record
from seq2seq.io_utils import markdown_table

ENGINES = ("eager", "compiled", "packaged")
#: The model's step calls: the plain step, and the steps with the search's choice in them (``models.fused``).
STEPS = ("decode_step", "greedy_step", "beam_step")
PARTS = ("encode", "model steps", "log-softmax and masks", "cache reorder", "search bookkeeping", "outside the search")


class Clock:
    """Seconds spent in each wrapped call (``wrap``), and how often it was called."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}

    def wrap(self, name: str, function: Callable) -> Callable:
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start
                self.calls[name] = self.calls.get(name, 0) + 1
        return timed


@contextmanager
def clocked(translator) -> Iterator[Clock]:
    """Wrap the calls that ``PARTS`` are made of for the duration (module docstring)."""
    from seq2seq.decoding import translator as translator_module
    from seq2seq.decoding.generator import Generator
    from seq2seq.decoding.vocabulary import OutputVocabulary

    clock, model = Clock(), translator.model
    saved = translator_module.translate_batch, OutputVocabulary.log_probs, Generator.reorder
    translator_module.translate_batch = clock.wrap("search", saved[0])
    OutputVocabulary.log_probs = clock.wrap("log_probs", saved[1])
    Generator.reorder = clock.wrap("reorder", saved[2])
    model.encode = clock.wrap("encode", model.encode)
    steps = [name for name in STEPS if hasattr(model, name)]
    for name in steps:  # each a model step (``decode_step`` counts them)
        setattr(model, name, clock.wrap("decode_step", getattr(model, name)))
    try:
        yield clock
    finally:
        translator_module.translate_batch, OutputVocabulary.log_probs, Generator.reorder = saved
        for name in ["encode", *steps]:
            delattr(model, name)  # the class's methods again


def breakdown(clock: Clock, total: float) -> dict[str, float]:
    """``PARTS`` in seconds from ``clock`` and the wall time ``total``."""
    seconds = clock.seconds
    inner = sum(seconds.get(name, 0.0) for name in ("encode", "decode_step", "log_probs", "reorder"))
    return {"encode": seconds.get("encode", 0.0), "model steps": seconds.get("decode_step", 0.0),
            "log-softmax and masks": seconds.get("log_probs", 0.0), "cache reorder": seconds.get("reorder", 0.0),
            "search bookkeeping": seconds.get("search", 0.0) - inner,
            "outside the search": total - seconds.get("search", 0.0)}


def translator_for(checkpoint: Path, engine: str, packages: Path):
    from seq2seq.decoding.translator import Translator

    return Translator.from_checkpoint(checkpoint, device="cpu", compile=engine != "eager",
                                      compile_cache=str(packages) if engine == "packaged" else None)


def profile(translator, sources: list[str], beam: int) -> dict:
    """One pass over ``sources`` one sentence at a time, warmed up on the first two; the parts of its time."""
    options = {"beam_size": beam, "length_penalty": 0.0, "batch_size": 1, "need_attention": False}
    for text in sources[:2]:  # compiles (or loads) the graphs of this beam size and thread count
        translator.translate([text], **options)
    outputs = []
    with clocked(translator) as clock:
        start = time.perf_counter()
        for text in sources:
            outputs.append(translator.translate([text], **options)[0].text)
        total = time.perf_counter() - start
    steps = clock.calls.get("decode_step", 0)
    parts = breakdown(clock, total)
    return {"seconds": total, "sentences_per_s": len(sources) / total, "steps": steps,
            "us_per_step": {name: 1e6 * value / max(steps, 1) for name, value in parts.items()},
            "share": {name: value / total for name, value in parts.items()}, "outputs": outputs}


def read_sources(args: argparse.Namespace) -> list[str]:
    if args.toy:
        from seq2seq.toy import toy_corpus

        return list(toy_corpus()["test"]["src"][: args.sentences])
    lines = (args.data_dir / f"{args.test_split}.{args.src}").read_text(encoding="utf-8").splitlines()
    return lines[: args.sentences]


def run(args: argparse.Namespace) -> dict:
    sources = read_sources(args)
    results = []
    with tempfile.TemporaryDirectory() as scratch:
        for index, checkpoint in enumerate(args.checkpoint):
            for engine in args.engines:
                packages = args.compile_cache or Path(scratch) / f"packages-{index}"
                translator = translator_for(checkpoint, engine, packages)
                parameters = sum(p.numel() for p in translator.model.parameters())
                for threads in args.threads:
                    torch.set_num_threads(threads)
                    for beam in args.beams:
                        row = profile(translator, sources, beam)
                        reference = next((r for r in results if (r["model"], r["engine"], r["threads"], r["beam"])
                                          == (index, "eager", threads, beam)), None)
                        row.update(model=index, parameters=parameters, engine=engine, threads=threads, beam=beam,
                                   identical_to_eager=None if reference is None else
                                   sum(a == b for a, b in zip(row["outputs"], reference["outputs"])) / len(sources))
                        results.append(row)
                        print(f"model {index} {engine} {threads}t beam {beam}: {row['sentences_per_s']:.1f} sent/s, "
                              + ", ".join(f"{k} {v:.0f}" for k, v in row["us_per_step"].items()) + " us/step",
                              file=sys.stderr, flush=True)
    for row in results:
        del row["outputs"]
    return {**provenance("profile-batch1"), "checkpoints": [str(c) for c in args.checkpoint],
            "sentences": len(sources), "source": "toy" if args.toy else args.test_split, "results": results}


def table(record: dict) -> str:
    rows = [[r["model"], f"{r['parameters'] / 1e6:.2f} M", r["engine"], r["threads"], r["beam"],
             f"{r['sentences_per_s']:.1f}", f"{1e6 * r['seconds'] / max(r['steps'], 1):.0f}",
             *[f"{r['us_per_step'][p]:.0f} ({100 * r['share'][p]:.0f}%)" for p in PARTS],
             "-" if r["identical_to_eager"] is None else f"{100 * r['identical_to_eager']:.0f}%"]
            for r in record["results"]]
    machine = record["machine"]
    head = (f"{record['sentences']} {record['source']} sentences one at a time, length penalty 0, no attention; "
            f"{machine['cpu']} ({', '.join(machine['cpu_flags'])}), torch {machine['versions']['torch']}. "
            "Microseconds per output step (share of the time).\n\n")
    return head + markdown_table(["model", "parameters", "engine", "threads", "beam", "sentences/s", "us/step",
                                  *PARTS, "identical to eager"], rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_multi30k_flags(parser)
    parser.add_argument("--checkpoint", type=Path, action="append", required=True, help="a run or checkpoint")
    parser.add_argument("--toy", action="store_true", help="the toy quickstart's test sentences")
    parser.add_argument("--sentences", type=int, default=50)
    parser.add_argument("--beams", type=int, nargs="+", default=[1, 5])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--engines", nargs="+", choices=ENGINES, default=["eager", "packaged"])
    parser.add_argument("--compile-cache", type=Path, help="packaged: load (or build) the packages in this directory "
                        "(one package per model, so several models may share it; bench_ctranslate2.py's "
                        "--compile-cache serves), not in a fresh temporary one")
    parser.add_argument("--out", type=Path, default=ROOT / "bench-results" / "profile-batch1.json")
    args = parser.parse_args(argv)
    record = run(args)
    text = table(record)
    write_record(args.out, record, text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
