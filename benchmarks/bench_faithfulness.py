"""Faithfulness benchmark: do attention and attribution point at the source words the output needs?

    python benchmarks/bench_faithfulness.py --checkpoint RNN/best.pt TRANSFORMER/best.pt --source test.de \\
        [--sentences 100] [--max-words 4] [--methods attention grad-attention gradient ... random]

Every checkpoint (e.g. one per architecture) translates each sentence greedily, giving y. Each
method gives every source word w (``word_spans`` of the source pieces, EOS excluded) its total
importance for the output, imp(w) = the sum over w's pieces and the target rows t < T+1 (EOS row
excluded) of the method's non-negative matrix: attention weights (``--align-layer`` /
``--align-heads`` aggregate), the ``scores`` of an attribution method (see
``seq2seq.attribution``: gradient-weighted attention with the same layer / heads, |gradient
x input|, |integrated gradients|, max(occlusion, 0), max(LIME, 0), max(KernelSHAP, 0)), or a random
order (``random``, seeded). Words are ranked by imp (ties: earlier word first), and the same y is
re-scored by teacher forcing, in nats of the whole output incl. EOS, with F(x) = log p(y | x):

    deletion   drop_k = F(x) - F(x without its top-k words)          (source EOS kept)
    insertion  gain_k = F(x with only its top-k words) - F(EOS only)  (words in source order)

    AOPC_del = (1/K) sum_{k=1..K} drop_k,   AOPC_ins = (1/K) sum_{k=1..K} gain_k      (K = --max-words)

after Samek et al. 2017 (AOPC), DeYoung et al. 2020 (comprehensiveness / sufficiency) and Petsiuk
et al. 2018 (deletion / insertion). Larger is better for both: the top words are the ones the output
needs (deletion) and they suffice to restore it (insertion). Only sentences with more than K words
count, so every method is scored on the same sentences at every k. Deletion is the quantity
occlusion measures one word at a time, so occlusion is a strong reference for small K (not an
oracle: it sums per-row effects of single pieces and clips negative ones).

Writes one JSON record (command, settings, versions, machine; per checkpoint and method the AOPCs,
their standard errors, the mean curves and the seconds per sentence), a markdown table beside it
(.md) and a bar plot of the AOPCs (.png).
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import numpy as np

from seq2seq.alignment.matrices import aggregate, word_spans
from seq2seq.attribution.base import METHODS as ATTRIBUTION_METHODS
from seq2seq.attribution.attribute import attribute
from seq2seq.attribution.perturbation import DEFAULT_SAMPLES
from seq2seq.cli import run_cli
from seq2seq.config import AlignConfig, AttributionConfig
from seq2seq.decoding.scoring import teacher_force
from seq2seq.alignment.matrices import check_layer_heads
from seq2seq.decoding.translator import Translator
from seq2seq.errors import UserError
from seq2seq.io_utils import display_path, markdown_table, read_lines

METHODS = ("attention", "grad-attention", "gradient", "integrated-gradients", "occlusion", "lime", "kernel-shap",
           "random")
CURVES = ("deletion", "insertion")


def word_importance(method: str, translation, model, attribution: AttributionConfig, align: AlignConfig,
                    rng: np.random.Generator) -> np.ndarray:
    """(M,) importance of each source word (EOS excluded) for the output (EOS row excluded)."""
    spans = word_spans(translation.src_pieces[:-1])
    if method == "random":
        return rng.random(len(spans))
    if method == "attention":
        matrix = aggregate(translation.attention, align.layer, align.heads)  # (T+1, S+1)
    elif method in ATTRIBUTION_METHODS:
        matrix = attribute(model, translation.src_tokens, translation.tokens, method, attribution, align,
                           src_pieces=translation.src_pieces).scores
    else:
        raise UserError(f"--methods: unknown method {method!r}; choose from {', '.join(METHODS)}")
    per_piece = np.asarray(matrix, dtype=np.float64)[:-1, :-1].sum(axis=0)  # (S,)
    return np.array([per_piece[start:end].sum() for start, end in spans])


def curve_sources(src_ids: list[int], spans: list[tuple[int, int]], importance: np.ndarray,
                  max_words: int) -> dict[str, list[list[int]]]:
    """The perturbed sources of both curves, k = 1..max_words: without / with only the top-k words."""
    order = np.argsort(-importance, kind="stable")
    out = {curve: [] for curve in CURVES}
    for k in range(1, max_words + 1):
        top = set(order[:k].tolist())
        for curve, keep in (("deletion", lambda w: w not in top), ("insertion", lambda w: w in top)):
            out[curve].append([t for w, (a, b) in enumerate(spans) if keep(w) for t in src_ids[a:b]] + src_ids[-1:])
    return out


def model_label(translator: Translator, checkpoint: str) -> str:
    cfg = getattr(translator.model, "cfg", None)
    if cfg is None:
        return Path(checkpoint).stem
    return f"rnn-{cfg.attention}" if cfg.arch == "rnn" else cfg.arch


def run_model(args: argparse.Namespace, checkpoint: str, lines: list[str]) -> dict:
    translator = Translator.from_checkpoint(checkpoint, device=args.device)
    layer, heads = check_layer_heads(args.align_layer, args.align_heads, translator.model)
    attribution = AttributionConfig(ig_steps=args.ig_steps, samples=args.attribution_samples,
                                    seed=args.attribution_seed)
    align = AlignConfig(layer=layer, heads=heads)
    start = time.perf_counter()
    translations = translator.translate(lines, beam_size=1, need_attention=True, batch_size=args.batch_size)
    decode_seconds = time.perf_counter() - start
    used = [t for t in translations if t.tokens and len(word_spans(t.src_pieces[:-1])) > args.max_words]
    rng = np.random.default_rng(args.seed)
    values = {m: {curve: [] for curve in CURVES} for m in args.methods}  # per sentence: (K,) curve
    seconds = {m: 0.0 for m in args.methods}
    iterator = used
    if not args.quiet:
        from tqdm import tqdm

        iterator = tqdm(used, desc=f"faithfulness {display_path(checkpoint)}", unit="sent", file=sys.stderr)
    for t in iterator:
        spans = word_spans(t.src_pieces[:-1])
        sources, keys = [t.src_tokens, t.src_tokens[-1:]], []  # the original and EOS alone first
        for method in args.methods:
            tic = time.perf_counter()
            importance = word_importance(method, t, translator.model, attribution, align, rng)
            seconds[method] += time.perf_counter() - tic
            for curve, variants in curve_sources(t.src_tokens, spans, importance, args.max_words).items():
                sources.extend(variants)
                keys.append((method, curve))
        log_probs, _ = teacher_force(translator.model, sources, [t.tokens] * len(sources), batch_size=args.batch_size)
        totals = np.array([lp.astype(np.float64).sum() for lp in log_probs])
        full, empty, rest = totals[0], totals[1], totals[2:].reshape(len(keys), args.max_words)
        for (method, curve), scores in zip(keys, rest):
            values[method][curve].append(full - scores if curve == "deletion" else scores - empty)
    cfg = getattr(translator.model, "cfg", None)
    return {
        "checkpoint": display_path(checkpoint), "label": model_label(translator, checkpoint),
        "model": dataclasses.asdict(cfg) if dataclasses.is_dataclass(cfg) else None,
        "sentences_translated": len(translations), "sentences_used": len(used), "decode_seconds": decode_seconds,
        "methods": {m: {**{curve: _summary(values[m][curve]) for curve in CURVES},
                        "seconds_per_sentence": seconds[m] / len(used) if used else None} for m in args.methods},
    }


def _summary(curves: list[np.ndarray]) -> dict:
    """AOPC (mean of a sentence's curve over k) averaged over sentences, its standard error, the mean curve."""
    if not curves:
        return {"aopc": None, "stderr": None, "curve": None, "sentences": 0}
    per_sentence = np.stack(curves)  # (sentences, K)
    aopc = per_sentence.mean(axis=1)
    n = len(aopc)
    return {"aopc": float(aopc.mean()), "stderr": float(aopc.std(ddof=1) / np.sqrt(n)) if n > 1 else None,
            "curve": per_sentence.mean(axis=0).tolist(), "sentences": n}


def run(args: argparse.Namespace) -> dict:
    from common import provenance

    if not Path(args.source).is_file():
        raise UserError(f"--source {args.source}: no such file")
    lines = [line for line in read_lines(args.source) if line.strip()][: args.sentences]
    if not lines:
        raise UserError(f"--source {args.source} has no non-empty lines")
    models = [run_model(args, checkpoint, lines) for checkpoint in args.checkpoint]
    labels = [m["label"] for m in models]
    for i, m in enumerate(models):  # two checkpoints of one architecture stay apart
        if labels.count(m["label"]) > 1:
            m["label"] = f"{m['label']} #{i + 1}"
    return {
        **provenance("faithfulness"),
        "settings": {"source": display_path(args.source), "sentences_read": len(lines), "decode": "greedy",
                     "max_words": args.max_words, "methods": args.methods, "layer": args.align_layer,
                     "heads": args.align_heads, "ig_steps": args.ig_steps,
                     "attribution_samples": args.attribution_samples, "attribution_seed": args.attribution_seed,
                     "seed": args.seed},
        "models": models,
    }


def faithfulness_table(record: dict) -> str:
    def cell(summary: dict) -> str:
        if summary["aopc"] is None:
            return "–"
        return f"{summary['aopc']:.3f}" + (f" ± {summary['stderr']:.3f}" if summary["stderr"] is not None else "")

    header = ["model", "method", "deletion AOPC (nats)", "insertion AOPC (nats)", "s/sentence"]
    rows = []
    for m in record["models"]:
        for method, r in m["methods"].items():
            seconds = r["seconds_per_sentence"]
            rows.append([m["label"], method, cell(r["deletion"]), cell(r["insertion"]),
                         "–" if seconds is None else f"{seconds:.3f}"])
    k = record["settings"]["max_words"]
    notes = [f"{m['label']}: {m['sentences_used']} of {m['sentences_translated']} sentences (non-empty greedy "
             f"output, more than {k} source words)" for m in record["models"]]
    return "\n".join([markdown_table(header, rows), "", f"AOPC over the top k = 1..{k} words; ± one standard "
                      "error over sentences; larger is better.", *notes]) + "\n"


def faithfulness_plot(record: dict, path: Path) -> list[Path]:
    """Deletion and insertion AOPC per method (groups), one bar per model and curve."""
    from seq2seq.alignment.plotting import plot_grouped_bars

    methods = record["settings"]["methods"]
    series = {f"{m['label']} {curve}": [m["methods"][method][curve]["aopc"] for method in methods]
              for m in record["models"] for curve in CURVES}
    return plot_grouped_bars(methods, series, "method", "AOPC (nats, larger is better)", path,
                             title=f"Faithfulness: top 1..{record['settings']['max_words']} source words")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python benchmarks/bench_faithfulness.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True, nargs="+", metavar="CHECKPOINT",
                   help="one or more checkpoints (.pt or run directory), each benchmarked on its own, e.g. "
                        "an RNN and a Transformer")
    p.add_argument("--source", required=True, help="source sentences, one per line (empty lines skipped)")
    p.add_argument("--sentences", type=int, default=100, help="first N non-empty lines (default: 100)")
    p.add_argument("--max-words", type=int, default=4,
                   help="K: the curves delete / insert the top k = 1..K source words; sentences with more than K "
                        "words count (default: 4)")
    p.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS),
                   help="importance methods (default: all)")
    p.add_argument("--align-layer", default="-2",
                   help="attention and grad-attention layer, or 'all' (default: -2)")
    p.add_argument("--align-heads", default="mean", help="'mean' or comma-separated head indices (default: mean)")
    p.add_argument("--ig-steps", type=int, default=16, help="integrated-gradients steps (default: 16)")
    p.add_argument("--attribution-samples", type=int, default=DEFAULT_SAMPLES,
                   help=f"lime and kernel-shap samples per sentence (default: {DEFAULT_SAMPLES})")
    p.add_argument("--attribution-seed", type=int, default=0, help="lime and kernel-shap seed (default: 0)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random baseline (default: 0)")
    p.add_argument("--batch-size", type=int, default=32, help="sentences per forward pass (default: 32)")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda (default: auto)")
    p.add_argument("--out", default="bench-results/faithfulness-aopc.json",
                   help="JSON record; the .md table and .png plot are written beside it "
                        "(default: bench-results/faithfulness-aopc.json)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    args = p.parse_args(argv)
    if args.sentences < 1 or args.max_words < 1:
        raise UserError("--sentences and --max-words must be positive integers")
    if Path(args.out).suffix in (".md", ".png"):
        raise UserError(f"--out {args.out}: give the JSON path; the .md table and .png plot are written beside it")
    args.methods = list(dict.fromkeys(args.methods))
    return args


@run_cli
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    record = run(args)
    table = faithfulness_table(record)
    from common import write_record

    write_record(args.out, record, table)
    faithfulness_plot(record, Path(args.out).with_suffix(".png"))
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
