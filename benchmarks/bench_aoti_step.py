"""The Transformer's one-sentence decoding step compiled ahead of time (AOTInductor) against eager and against
``torch.compile`` (issue 48: a compiled step that a second start loads instead of compiling), from the
repository root:

    python benchmarks/bench_aoti_step.py [--preset transformer] [--vocab-size 8000] [--source-length 14]
        [--rows 1 5] [--steps 200] [--rounds 5] [--threads 1] [--options full|plain] [--out FILE.json]

The preset's model (its sizes, random weights: a step's time does not depend on them) encodes one source of
``--source-length`` tokens; ``static_step`` (the step ``models.compiled.CompiledStep`` compiles) runs
``--steps`` greedy steps with ``--rows`` decoder rows (1: greedy search, k: a beam of k), its own argmax fed
back, three ways, interleaved for ``--rounds`` rounds (median per step):

- **eager**: ``static_step`` itself;
- **torch.compile**: ``CompiledStep``, ``serve``'s and ``--compile``'s path (Dynamo, guards skipped for a known
  graph, ``INDUCTOR_OPTIONS``, or none with ``--options plain``; ``--backend``); its first call's compile time;
- **AOTInductor**: ``PackagedStep`` (``models.packaged``, ``--compile-cache``): ``static_step`` exported and
  compiled into a package file with the same Inductor options, then called with no Dynamo in between: the first
  call's time (export, compile, save, load), the package's size, and the first call of a second
  ``PackagedStep`` on the same directory (the model's digest, the package loaded: what a second start of the
  same model pays instead of compiling).

Records the largest logit difference from eager over the first steps, and the CPU model and flags.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

from common import add_step_flags, greedy_steps, provenance, step_model, write_record
from seq2seq.io_utils import markdown_table
from seq2seq.models import compiled as compiled_module
from seq2seq.models.compiled import INDUCTOR_OPTIONS, CompiledStep
from seq2seq.models.packaged import PackagedStep
from seq2seq.tokenizer import EOS_ID


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_step_flags(parser, "transformer", "aoti-step.json")
    parser.add_argument("--layers", type=int, help="encoder and decoder layers (default: the preset's)")
    parser.add_argument("--options", choices=("full", "plain"), default="full",
                        help="Inductor options for both compiled paths: the product's (full) or none (a quick run)")
    return parser.parse_args(argv)


def run_steps(call, memory: dict, state: dict, rows: int, steps: int) -> tuple[float, list[torch.Tensor]]:
    """``greedy_steps`` through ``call(memory, state, position, tokens)`` on a fresh copy of the caches."""
    state = {"self_kv": [(k.clone(), v.clone()) for k, v in state["self_kv"]], "step": state["step"].clone()}
    return greedy_steps(lambda t, tokens: call(memory, state, torch.tensor([t]), tokens), rows, steps)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    model = step_model(args, **({"layers": args.layers} if args.layers else {}))
    model.static_cache = True
    options = dict(INDUCTOR_OPTIONS) if args.options == "full" else {}
    saved = compiled_module.INDUCTOR_OPTIONS, compiled_module.BACKEND  # what CompiledStep compiles with
    compiled_module.INDUCTOR_OPTIONS, compiled_module.BACKEND = options, args.backend
    try:
        return measure(args, model, options)
    finally:
        compiled_module.INDUCTOR_OPTIONS, compiled_module.BACKEND = saved


def measure(args: argparse.Namespace, model: torch.nn.Module, options: dict) -> int:
    record = {**provenance("aoti-step"), "preset": args.preset, "layers": len(model.decoder),
              "vocab_size": args.vocab_size, "source_length": args.source_length, "threads": args.threads,
              "steps": args.steps, "rounds": args.rounds, "options": args.options, "backend": args.backend,
              "results": []}
    rows_out = []
    with tempfile.TemporaryDirectory() as scratch:
        for rows in args.rows:
            src = torch.randint(4, args.vocab_size, (1, args.source_length))
            src[:, -1] = EOS_ID
            with torch.no_grad():
                one = model.encode(src, torch.ones_like(src, dtype=torch.bool))
                state = model.init_state(one, args.steps + 1)  # preallocated: one sentence
                state = {"self_kv": [(k.repeat(rows, 1, 1, 1), v.repeat(rows, 1, 1, 1)) for k, v in state["self_kv"]],
                         "step": state["step"]}  # its beam of ``rows`` rows, as beam search reorders them
                many = src.repeat(rows, 1)
                memory = model.encode(many, torch.ones_like(many, dtype=torch.bool))

                def eager(memory, state, position, tokens):
                    return model.static_step(memory, state["self_kv"], position, tokens, False, None)[0]

                step = CompiledStep(model)

                def compiled(memory, state, position, tokens):
                    return step(memory, state["self_kv"], position, tokens, False, None)[0]

                began = time.perf_counter()
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    run_steps(compiled, memory, state, rows, 2)
                compile_s = time.perf_counter() - began
                if step.failure:
                    raise SystemExit(f"torch.compile failed: {step.failure}")

                directory = Path(scratch) / f"rows-{rows}"
                packaged = PackagedStep(model, directory, options, lambda: None)

                def ahead(memory, state, position, tokens):
                    return packaged(memory, state["self_kv"], position, tokens, False, None)[0]

                began = time.perf_counter()
                run_steps(ahead, memory, state, rows, 1)  # exports, compiles, saves and loads the package
                aoti_compile_s = time.perf_counter() - began
                began = time.perf_counter()
                packaged = PackagedStep(model, directory, options, lambda: None)  # as a second process would
                run_steps(ahead, memory, state, rows, 1)  # the model's digest, the package loaded, one step
                load_s = time.perf_counter() - began
                if packaged.failure or not packaged.graphs:
                    raise SystemExit(f"AOTInductor failed: {packaged.failure}")
                [package] = directory.glob("step-*.pt2")

                times: dict[str, list[float]] = {"eager": [], "compiled": [], "aoti": []}
                seen = {}
                for _ in range(args.rounds):
                    for name, call in (("eager", eager), ("compiled", compiled), ("aoti", ahead)):
                        seconds, seen[name] = run_steps(call, memory, state, rows, args.steps)
                        times[name].append(seconds)
            difference = {name: max(float((a - b).abs().max()) for a, b in zip(seen["eager"], seen[name]))
                          for name in ("compiled", "aoti")}
            ms = {name: 1000 * statistics.median(values) for name, values in times.items()}
            result = {"rows": rows, **{f"{name}_ms_per_step": round(value, 4) for name, value in ms.items()},
                      "compile_s": round(compile_s, 1), "aoti_compile_s": round(aoti_compile_s, 1),
                      "aoti_load_s": round(load_s, 3), "package_mb": round(Path(package).stat().st_size / 2 ** 20, 1),
                      "max_logit_difference": difference}
            record["results"].append(result)
            print(result, file=sys.stderr, flush=True)
            rows_out.append([rows, f"{ms['eager']:.3f}", f"{ms['compiled']:.3f}", f"{ms['aoti']:.3f}",
                             f"{compile_s:.1f}", f"{aoti_compile_s:.1f}", f"{load_s:.2f}", f"{result['package_mb']}",
                             f"{difference['compiled']:.1e} / {difference['aoti']:.1e}"])
    table = (f"`{args.preset}` decoding step at batch 1 (random weights, vocab {args.vocab_size}, a source of "
             f"{args.source_length} tokens, {args.threads} thread(s), Inductor options: {args.options}), median of "
             f"{args.rounds} interleaved rounds of {args.steps} greedy steps.\n\n"
             + markdown_table(["rows", "eager ms/step", "torch.compile ms/step", "AOTInductor ms/step",
                               "torch.compile s", "AOTInductor compile s", "package load s", "package MB",
                               "max logit difference (compile / AOT)"], rows_out))
    write_record(args.out, record, table)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
