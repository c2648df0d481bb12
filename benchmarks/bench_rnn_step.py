"""The RNN's decoding step at batch 1, eager against compiled (issue 48, part 3), from the repository root:

    python benchmarks/bench_rnn_step.py [--preset rnn-bahdanau] [--vocab-size 8000] [--source-length 14]
        [--rows 1 5] [--steps 200] [--rounds 5] [--threads 1] [--backend inductor] [--out FILE.json]

Whether ``torch.compile`` pays for the RNN's one-sentence step the way it pays for the Transformer's
(``models/compiled.py``): the preset's model (its sizes, random weights: the time of a step does not depend
on them) encodes one source of ``--source-length`` tokens, and ``step_eager`` (what ``CompiledRNNStep``
compiles) runs ``--steps`` times with ``--rows`` decoder rows (1: greedy search; k: a beam of k), feeding
its own argmax back, once eagerly and once through ``torch.compile`` (with Dynamo's guards checked, and
skipped as ``CompiledStep`` skips them for a known graph) with the options the Transformer's compiled step
uses (``models.compiled.INDUCTOR_OPTIONS``: frozen weights, autotuned linear layers), the source length a
dynamic dimension; the two interleaved for ``--rounds`` rounds, the median per step reported with the
compile time and the largest difference between the two paths' logits over the first steps. Records the
CPU model and flags (``provenance``).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings

import torch

from common import add_step_flags, greedy_steps, provenance, step_model, write_record
from seq2seq.io_utils import markdown_table
from seq2seq.models.compiled import INDUCTOR_OPTIONS
from seq2seq.tokenizer import EOS_ID


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_step_flags(parser, "rnn-bahdanau", "rnn-step.json")
    return parser.parse_args(argv)


def run_steps(step, memory: dict, state: dict, rows: int, steps: int) -> tuple[float, list[torch.Tensor]]:
    """``greedy_steps`` through ``step`` (``step_eager`` or a compiled one), the state carried along."""
    carried = {"state": state}

    def advance(t: int, tokens: torch.Tensor) -> torch.Tensor:
        logits, carried["state"], _ = step(memory, carried["state"], tokens, False, None)
        return logits

    return greedy_steps(advance, rows, steps)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    model = step_model(args)
    record = {**provenance("rnn-step"), "preset": args.preset, "backend": args.backend, "vocab_size": args.vocab_size,
              "source_length": args.source_length, "threads": args.threads, "steps": args.steps,
              "rounds": args.rounds, "results": []}
    rows_out = []
    for rows in args.rows:
        src = torch.randint(4, args.vocab_size, (rows, args.source_length))
        src[:, -1] = EOS_ID
        mask = torch.ones_like(src, dtype=torch.bool)
        with torch.inference_mode():
            memory = model.encode(src, mask)
            state = model.init_state(memory)
            compiled = torch.compile(model.step_eager, dynamic=False, backend=args.backend)
            for value in memory.values():
                if isinstance(value, torch.Tensor) and value.dim() >= 2 and value.size(1) == args.source_length:
                    torch._dynamo.mark_dynamic(value, 1)
            began = time.perf_counter()
            with torch._inductor.config.patch(INDUCTOR_OPTIONS), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                run_steps(compiled, memory, dict(state), rows, 3)
            compile_s = time.perf_counter() - began
            times: dict[str, list[float]] = {"eager": [], "compiled": [], "unguarded": []}
            for _ in range(args.rounds):
                seconds, eager_logits = run_steps(model.step_eager, memory, dict(state), rows, args.steps)
                times["eager"].append(seconds)
                seconds, compiled_logits = run_steps(compiled, memory, dict(state), rows, args.steps)
                times["compiled"].append(seconds)
                with torch.compiler.set_stance(skip_guard_eval_unsafe=True):  # as CompiledStep calls a known graph
                    seconds, _ = run_steps(compiled, memory, dict(state), rows, args.steps)
                times["unguarded"].append(seconds)
            difference = max(float((a - b).abs().max()) for a, b in zip(eager_logits, compiled_logits))
        ms = {name: 1000 * statistics.median(values) for name, values in times.items()}
        result = {"rows": rows, **{f"{name}_ms_per_step": round(value, 4) for name, value in ms.items()},
                  "speedup": round(ms["eager"] / ms["compiled"], 2),
                  "speedup_unguarded": round(ms["eager"] / ms["unguarded"], 2), "compile_s": round(compile_s, 1),
                  "max_logit_difference": difference}
        record["results"].append(result)
        print(result, file=sys.stderr, flush=True)
        rows_out.append([rows, f"{ms['eager']:.3f}", f"{ms['compiled']:.3f}", f"{ms['unguarded']:.3f}",
                         f"{result['speedup']:.2f}x / {result['speedup_unguarded']:.2f}x", f"{compile_s:.1f}",
                         f"{difference:.1e}"])
    table = (f"`{args.preset}` decoding step at batch 1 (random weights, vocab {args.vocab_size}, a source of "
             f"{args.source_length} tokens, {args.threads} thread(s)), median of {args.rounds} interleaved rounds "
             f"of {args.steps} steps.\n\n"
             + markdown_table(["rows", "eager ms/step", "compiled ms/step", "compiled, guards skipped",
                               "speed-up (guarded / skipped)", "compile s", "max logit difference"], rows_out))
    write_record(args.out, record, table)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
