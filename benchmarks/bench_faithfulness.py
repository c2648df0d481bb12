"""Faithfulness benchmark: do attention / attribution point at the source tokens the output needs?

    python benchmarks/bench_faithfulness.py --checkpoint RUN/best.pt --source test.de \\
        [--sentences 100] [--top-k 1 2 3] [--methods attention gradient occlusion random]

Deletion test (after Jain & Wallace 2019, DeYoung et al. 2020 "comprehensiveness"): translate each
sentence greedily, giving y. Each method scores every source position s (source EOS excluded) by
its total importance for the output, imp(s) = sum over target rows t < T+1 (EOS row excluded) of
the method's non-negative matrix: attention weights (``--align-layer``/``--align-heads`` aggregate), |gradient
x input|, |integrated gradients| or max(occlusion, 0) (see ``seq2seq.analysis.attribution``); ``random``
draws a random order (seeded). The k highest-scoring tokens are deleted (source EOS kept) and the
same y is re-scored by teacher forcing:

    drop_k = log p(y | x) - log p(y | x without its top-k tokens)     (nats, whole output incl. EOS)

The table reports the mean drop over sentences with more than k source tokens (and its standard
error). A larger drop means the method found tokens the output depends on. Occlusion measures
single deletions directly, so it is a strong reference at k = 1 (not an exact oracle: it sums
per-row effects, clips negative ones and leaves out the EOS row); at k > 1 interactions matter.
Writes a JSON record (command, settings, versions, machine, numbers) and prints a markdown table.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import numpy as np

from seq2seq.analysis.alignment import aggregate
from seq2seq.analysis.attribution import METHODS as ATTRIBUTION_METHODS, attribute
from seq2seq.decoding.scoring import teacher_force
from seq2seq.cli import run_cli
from seq2seq.errors import UserError
from seq2seq.io_utils import display_path, markdown_table
from seq2seq.decoding.stream import check_layer_heads
from seq2seq.decoding.translator import Translator, read_lines

METHODS = ("attention", "gradient", "occlusion", "integrated-gradients", "random")


def token_importance(method: str, translation, model, layer, heads, steps: int,
                     rng: np.random.Generator) -> np.ndarray:
    """(S,) importance of each source token (EOS excluded) for the output (EOS row excluded)."""
    n_src = len(translation.src_tokens) - 1
    if method == "random":
        return rng.random(n_src)
    if method == "attention":
        matrix = aggregate(translation.attention, layer, heads)  # (T+1, S+1)
    elif method in ATTRIBUTION_METHODS:
        matrix = attribute(model, translation.src_tokens, translation.tokens, method, steps).scores
    else:
        raise UserError(f"--methods: unknown method {method!r}; choose from {', '.join(METHODS)}")
    return np.asarray(matrix, dtype=np.float64)[:-1, :-1].sum(axis=0)


def top_k_removed(src_ids: list[int], importance: np.ndarray, k: int) -> list[int]:
    """``src_ids`` without its k most important tokens (ties: earlier position first); EOS kept."""
    drop = set(np.argsort(-importance, kind="stable")[:k].tolist())
    return [token for s, token in enumerate(src_ids[:-1]) if s not in drop] + src_ids[-1:]


def run(args: argparse.Namespace) -> dict:
    if not Path(args.source).is_file():
        raise UserError(f"--source {args.source}: no such file")
    translator = Translator.from_checkpoint(args.checkpoint, device=args.device)
    layer, heads = check_layer_heads(args.align_layer, args.align_heads, translator.model)
    lines = [line for line in read_lines(args.source) if line.strip()][: args.sentences]
    if not lines:
        raise UserError(f"--source {args.source} has no non-empty lines")
    start = time.perf_counter()
    translations = translator.translate(lines, beam_size=1, need_attention=True, batch_size=args.batch_size)
    decode_seconds = time.perf_counter() - start
    rng = np.random.default_rng(args.seed)
    drops = {m: {k: [] for k in args.top_k} for m in args.methods}
    seconds = {m: 0.0 for m in args.methods}
    used = [t for t in translations if t.tokens and len(t.src_tokens) > 1]
    iterator = used
    if not args.quiet:
        from tqdm import tqdm

        iterator = tqdm(used, desc="faithfulness", unit="sent", file=sys.stderr)
    for t in iterator:
        variants, keys = [], []
        for method in args.methods:
            tic = time.perf_counter()
            importance = token_importance(method, t, translator.model, layer, heads, args.ig_steps, rng)
            seconds[method] += time.perf_counter() - tic
            for k in args.top_k:
                if len(t.src_tokens) - 1 > k:
                    variants.append(top_k_removed(t.src_tokens, importance, k))
                    keys.append((method, k))
        log_probs, _ = teacher_force(translator.model, [t.src_tokens, *variants],
                                     [t.tokens] * (1 + len(variants)), batch_size=args.batch_size)
        original = float(log_probs[0].sum())
        for (method, k), lp in zip(keys, log_probs[1:]):
            drops[method][k].append(original - float(lp.sum()))
    return _record(args, translator, lines, used, drops, seconds, decode_seconds)


def _record(args, translator, lines, used, drops, seconds, decode_seconds) -> dict:

    from common import provenance

    cfg = getattr(translator.model, "cfg", None)
    results = {m: {str(k): _summary(values) for k, values in by_k.items()} for m, by_k in drops.items()}
    return {
        **provenance("faithfulness"), "checkpoint": display_path(args.checkpoint),
        "model": dataclasses.asdict(cfg) if dataclasses.is_dataclass(cfg) else None,
        "settings": {"source": display_path(args.source), "sentences_read": len(lines), "sentences_used": len(used),
                     "decode": "greedy", "top_k": args.top_k, "methods": args.methods, "layer": args.align_layer,
                     "heads": args.align_heads, "ig_steps": args.ig_steps, "seed": args.seed},
        "decode_seconds": decode_seconds,
        "attribution_seconds_per_sentence": {m: s / max(len(used), 1) for m, s in seconds.items()},
        "results": results,
    }


def _summary(values: list[float]) -> dict:
    n = len(values)
    arr = np.asarray(values, dtype=np.float64)
    return {"mean_drop": float(arr.mean()) if n else None,
            "stderr": float(arr.std(ddof=1) / np.sqrt(n)) if n > 1 else None, "sentences": n}


def faithfulness_table(record: dict) -> str:
    ks = [str(k) for k in record["settings"]["top_k"]]
    header = ["method", *(f"drop k={k} (nats)" for k in ks), "s/sentence"]
    table = []
    for method, by_k in record["results"].items():
        cells = []
        for k in ks:
            s = by_k[k]
            cells.append("–" if s["mean_drop"] is None else
                         f"{s['mean_drop']:.3f}" + (f" ± {s['stderr']:.3f}" if s["stderr"] is not None else ""))
        per_sentence = record["attribution_seconds_per_sentence"][method]
        table.append([method, *cells, f"{per_sentence:.3f}"])
    n = {k: record["results"][record["settings"]["methods"][0]][k]["sentences"] for k in ks}
    rows = [markdown_table(header, table), ""]
    rows.append("sentences per k: " + ", ".join(f"k={k}: {v}" for k, v in n.items()) +
                f" (of {record['settings']['sentences_used']} with a non-empty greedy output)")
    return "\n".join(rows) + "\n"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python benchmarks/bench_faithfulness.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True, help="checkpoint (.pt or run directory)")
    p.add_argument("--source", required=True, help="source sentences, one per line (empty lines skipped)")
    p.add_argument("--sentences", type=int, default=100, help="first N non-empty lines (default: 100)")
    p.add_argument("--top-k", type=int, nargs="+", default=[1, 2, 3], help="tokens removed (default: 1 2 3)")
    p.add_argument("--methods", nargs="+", choices=METHODS, default=["attention", "gradient", "occlusion", "random"],
                   help="importance methods (default: attention gradient occlusion random)")
    p.add_argument("--align-layer", default="-2", help="attention layer or 'all' (default: -2)")
    p.add_argument("--align-heads", default="mean", help="'mean' or comma-separated head indices (default: mean)")
    p.add_argument("--ig-steps", type=int, default=16, help="integrated-gradients steps (default: 16)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random baseline (default: 0)")
    p.add_argument("--batch-size", type=int, default=32, help="sentences per forward pass (default: 32)")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda (default: auto)")
    p.add_argument("--out", default="bench-results/faithfulness.json",
                   help="JSON record (a .md table is written beside it) (default: bench-results/faithfulness.json)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    args = p.parse_args(argv)
    if args.sentences < 1 or any(k < 1 for k in args.top_k):
        raise UserError("--sentences and every --top-k must be positive integers")
    if Path(args.out).suffix == ".md":
        raise UserError(f"--out {args.out}: give the JSON path; the .md table is written beside it")
    args.top_k = sorted(set(args.top_k))
    args.methods = list(dict.fromkeys(args.methods))
    return args


@run_cli
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    record = run(args)
    table = faithfulness_table(record)
    from common import write_record

    write_record(args.out, record, table)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
