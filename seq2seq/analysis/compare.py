"""Compare trained systems on one test set and write a self-contained report directory.

    seq2seq compare RUN_A RUN_B --source test.de --reference test.en --output report

``report/report.md`` (with ``report.json`` holding every number, ``plots/*.png|svg`` and
``hypotheses/*.txt``) has four parts:

1. quality and cost, one row per system: BLEU, chrF and TER of beam-search output with 95%
   confidence intervals and p-values against the FIRST system from paired bootstrap resampling and
   paired approximate randomization (both sacrebleu's own ``significance.PairedTest``, not
   re-implemented here); parameters; training time, throughput and peak memory (``summary.json``);
   decoding speed greedy and beam (timed here);
2. BLEU by source-length bucket (source words = whitespace-separated tokens);
3. learning curves: validation BLEU against steps and against wall-clock time (``metrics.jsonl``);
4. word-level attention heatmaps of a few sentences, systems side by side: once for each system's
   own translation, once force-decoding the reference (same rows and columns for every system);
   with ``--gold``, the alignment error rate of each system's argmax alignments of the reference.

A RUN is a run directory (its ``best.pt``, with ``summary.json`` / ``metrics.jsonl`` beside it) or
a ``.pt`` file (the files beside it are used when present; missing figures show as "—").
The report directory is built under a temporary name and renamed into place at the end.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import shlex
import shutil
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np
import torch

from .. import __version__
from .alignment import AlignmentRecord, alignment_error_rate, argmax_alignment, read_gold_alignments
from ..training.checkpoint import load_checkpoint
from ..data.files import read_lines
from ..errors import UserError
from .evaluation import corpus_scores
from ..io_utils import markdown_table
from ..runtime import log
from ..tokenizer import EOS_ID
from ..decoding.scoring import teacher_force
from ..decoding.translator import Translator

METRICS = ("BLEU", "chrF", "TER")  # display names, in sacrebleu's order below
LOWER_IS_BETTER = {"TER"}
DEFAULT_BUCKETS = (10, 15, 20, 30)  # upper bounds: 1-10, 11-15, 16-20, 21-30, 31+
ALPHA = 0.05
DASH = "—"


# ----------------------------------------------------------------------------- systems


@dataclass
class System:
    """One system to compare: its translator and what its run directory says about training."""

    name: str
    checkpoint: Path
    model: str  # short description, e.g. "transformer (3 layers, d 256, 4 heads)"
    parameters: int
    translator: Translator
    training: dict[str, Any]  # from summary.json; empty if there is none
    curve: list[dict[str, Any]]  # the validation lines of metrics.jsonl, by step


def resolve_checkpoint(arg: str) -> Path:
    """A run directory means its best.pt; a file is taken as is."""
    path = Path(arg)
    if path.is_dir():
        if not (path / "best.pt").is_file():
            raise UserError(f"{path}: run directory without best.pt; pass a .pt file instead "
                            f"(e.g. {path / 'last.pt'}) or a finished run")
        return path / "best.pt"
    if not path.is_file():
        raise UserError(f"{arg}: no such checkpoint or run directory; pass RUN_DIR or RUN_DIR/best.pt")
    return path


def default_name(checkpoint: Path) -> str:
    """``run`` for run/best.pt, ``run/step5`` for run/step5.pt."""
    if checkpoint.name == "best.pt":
        return checkpoint.parent.name or "best"
    return f"{checkpoint.parent.name}/{checkpoint.stem}" if checkpoint.parent.name else checkpoint.stem


def system_names(checkpoints: Sequence[Path], names: Sequence[str] | None) -> list[str]:
    """``--names`` if given (one per system, unique), else names from the paths made unique."""
    if names:
        if len(names) != len(checkpoints):
            raise UserError(f"--names gives {len(names)} names for {len(checkpoints)} systems; "
                            "give one name per RUN_OR_CKPT, in the same order")
        if len(set(names)) != len(names):
            raise UserError(f"--names must be distinct, got {' '.join(names)}")
        return list(names)
    result: list[str] = []
    for checkpoint in checkpoints:
        name = default_name(checkpoint)
        result.append(name if name not in result else f"{name}#{len(result) + 1}")
    return result


def describe_model(model_cfg: dict[str, Any]) -> str:
    if model_cfg.get("arch") == "rnn":
        return (f"rnn ({model_cfg.get('attention')}, {model_cfg.get('rnn_cell')} "
                f"{model_cfg.get('hidden_size')}/{model_cfg.get('decoder_hidden_size')})")
    return (f"transformer ({model_cfg.get('layers')} layers, d {model_cfg.get('d_model')}, "
            f"{model_cfg.get('heads')} heads)")


def read_json_file(path: Path) -> dict[str, Any]:
    """A JSON object from ``path``, or {} if the file is absent or unreadable (with a warning)."""
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        log("warning", message=f"ignoring {path}: {exc}")
        return {}
    return data if isinstance(data, dict) else {}


def validation_curve(metrics_path: Path) -> list[dict[str, Any]]:
    """The ``"kind": "valid"`` lines of metrics.jsonl sorted by step; a step logged twice (a run
    killed between logging and checkpointing, then resumed) keeps its last line; broken lines
    (a run killed mid-write) are skipped."""
    if not metrics_path.is_file():
        return []
    by_step: dict[int, dict[str, Any]] = {}
    for line in metrics_path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("kind") == "valid" and {"step", "bleu"} <= record.keys():
            by_step[int(record["step"])] = record
    return [by_step[step] for step in sorted(by_step)]


def load_system(arg: str, name: str, device: str) -> System:
    checkpoint = resolve_checkpoint(arg)
    config = load_checkpoint(checkpoint)["config"]
    translator = Translator.from_checkpoint(checkpoint, device=device)
    return System(
        name=name, checkpoint=checkpoint, model=describe_model(config.get("model", {})),
        parameters=translator.model.num_parameters(), translator=translator,
        training=read_json_file(checkpoint.parent / "summary.json"),
        curve=validation_curve(checkpoint.parent / "metrics.jsonl"),
    )


# ----------------------------------------------------------------------------- test set


def input_files(args: argparse.Namespace) -> tuple[Path, Path]:
    """--source/--reference, or the --data-dir shortcut DIR/SPLIT.SRC and DIR/SPLIT.TGT."""
    explicit = args.source is not None or args.reference is not None
    if explicit and args.data_dir is not None:
        raise UserError("give either --source and --reference or --data-dir (with --src, --tgt), not both")
    if args.data_dir is not None:
        if not (args.src and args.tgt):
            raise UserError("--data-dir needs --src and --tgt (language suffixes, e.g. --src de --tgt en)")
        return (Path(args.data_dir) / f"{args.split}.{args.src}",
                Path(args.data_dir) / f"{args.split}.{args.tgt}")
    if args.source is None or args.reference is None:
        raise UserError("give --source and --reference (parallel text files), or --data-dir DIR "
                        "--src de --tgt en [--split test_2016_flickr]")
    return Path(args.source), Path(args.reference)


def read_test_set(source: Path, reference: Path) -> tuple[list[str], list[str]]:
    sources = read_lines(source, "--source")
    references = read_lines(reference, "--reference")
    if len(sources) != len(references):
        raise UserError(f"--source {source} has {len(sources)} lines but --reference {reference} has "
                        f"{len(references)}; they must be parallel, one reference line per source line")
    if not sources:
        raise UserError(f"--source {source} is empty; nothing to compare on")
    return sources, references


# ----------------------------------------------------------------------------- decoding


@dataclass
class Decoded:
    """One system's translations of the test set, greedy and beam, with their wall-clock times."""

    greedy: list[str]
    beam: list[str]
    greedy_seconds: float
    beam_seconds: float


def timed_translate(translator: Translator, sources: list[str], beam_size: int, batch_size: int | None,
                    quiet: bool) -> tuple[list[str], float]:
    start = time.perf_counter()
    hyps = translator.translate(sources, beam_size=beam_size, batch_size=batch_size,
                                need_attention=False, progress=not quiet)
    return [h.text for h in hyps], time.perf_counter() - start


def decode_system(system: System, sources: list[str], beam_size: int, batch_size: int | None,
                  quiet: bool) -> Decoded:
    """Greedy and beam translations, each timed after an untimed warm-up on a few sentences
    (first calls pay for lazy initialisation); beam size 1 reuses the greedy run."""
    system.translator.translate(sources[:4], beam_size=beam_size, need_attention=False)
    greedy, greedy_s = timed_translate(system.translator, sources, 1, batch_size, quiet)
    if beam_size == 1:
        return Decoded(greedy, greedy, greedy_s, greedy_s)
    beam, beam_s = timed_translate(system.translator, sources, beam_size, batch_size, quiet)
    return Decoded(greedy, beam, greedy_s, beam_s)


# ----------------------------------------------------------------------------- significance


def sacrebleu_metrics() -> dict[str, Any]:
    from sacrebleu.metrics import BLEU, CHRF, TER

    return {"BLEU": BLEU(), "chrF": CHRF(), "TER": TER()}


def run_paired_test(names: Sequence[str], hypotheses: Sequence[list[str]], references: list[str],
                    test_type: str, samples: int) -> tuple[dict[str, str], dict[str, list]]:
    """sacrebleu's PairedTest; results keyed by our metric names (BLEU, chrF, TER)."""
    from sacrebleu.significance import PairedTest

    test = PairedTest(list(zip(names, hypotheses)), sacrebleu_metrics(), [references],
                      test_type=test_type, n_samples=samples)
    signatures, results = test()
    keys = [key for key in results if key != "System"]  # sacrebleu's names: BLEU, chrF2, TER
    return ({ours: str(signatures[key]) for ours, key in zip(METRICS, keys)},
            {ours: results[key] for ours, key in zip(METRICS, keys)})


def significance(names: Sequence[str], hypotheses: Sequence[list[str]], references: list[str],
                 bootstrap: int, ar_trials: int) -> dict[str, Any]:
    """Per system and metric: score, bootstrap mean and 95% CI half-width, p-values against the
    first system (paired bootstrap ``p_bs``, approximate randomization ``p_ar``).

    A score exactly equal to the baseline's (always so for identical outputs) gets p = 1 and
    ``equal_to_baseline``: with no observed difference there is nothing to reject, but sacrebleu
    (2.6) counts only resampled differences strictly greater than the observed one, so when every
    resample ties it reports p = 1/(n+1), i.e. "significant"."""
    bs_signatures, bs = run_paired_test(names, hypotheses, references, "bs", bootstrap)
    ar_signatures, ar = {}, {}
    if len(names) > 1:
        ar_signatures, ar = run_paired_test(names, hypotheses, references, "ar", ar_trials)
    systems = []
    for k, name in enumerate(names):
        scores = {}
        for metric in METRICS:
            result = bs[metric][k]
            equal = k > 0 and result.score == bs[metric][0].score
            scores[metric] = {
                "score": float(result.score), "mean": float(result.mean), "ci": float(result.ci),
                "p_bs": None if k == 0 else (1.0 if equal else float(result.p_value)),
                "p_ar": None if k == 0 else (1.0 if equal else float(ar[metric][k].p_value)),
                "equal_to_baseline": equal,
            }
        identical = k > 0 and hypotheses[k] == hypotheses[0]
        systems.append({"name": name, "identical_to_baseline": identical, "scores": scores})
    return {"baseline": names[0], "bootstrap": bootstrap, "ar_trials": ar_trials,
            "seed": os.environ.get("SACREBLEU_SEED", "12345"),
            "signatures": {"bs": bs_signatures, "ar": ar_signatures}, "systems": systems}


# ----------------------------------------------------------------------------- length buckets


@dataclass
class Bucket:
    label: str
    low: int  # source words, inclusive
    high: int | None  # inclusive; None = no upper bound
    ids: list[int] = field(default_factory=list)


def length_buckets(sources: Sequence[str], bounds: Sequence[int]) -> list[Bucket]:
    """Sentences grouped by source word count: bounds (10, 15) give 1-10, 11-15, 16+.
    Empty source lines belong to no bucket."""
    lows = [1] + [b + 1 for b in bounds]
    highs: list[int | None] = list(bounds) + [None]
    buckets = [Bucket(f"{lo}-{hi}" if hi is not None else f"{lo}+", lo, hi) for lo, hi in zip(lows, highs)]
    for i, source in enumerate(sources):
        words = len(source.split())
        for bucket in buckets:
            if words >= bucket.low and (bucket.high is None or words <= bucket.high):
                bucket.ids.append(i)
                break
    return buckets


def bucket_bleu(buckets: list[Bucket], names: Sequence[str], hypotheses: Sequence[list[str]],
                references: list[str]) -> list[dict[str, Any]]:
    """Corpus BLEU of every system on every bucket (None for an empty bucket)."""
    rows = []
    for bucket in buckets:
        bleu: dict[str, float | None] = {}
        for name, hyps in zip(names, hypotheses):
            if not bucket.ids:
                bleu[name] = None
                continue
            subset = [hyps[i] for i in bucket.ids], [references[i] for i in bucket.ids]
            bleu[name] = corpus_scores(*subset, ("bleu",))["bleu"].score
        rows.append({"label": bucket.label, "low": bucket.low, "high": bucket.high,
                     "sentences": len(bucket.ids), "bleu": bleu})
    return rows


# ----------------------------------------------------------------------------- alignments


def forced_attentions(translator: Translator, sources: Sequence[str], targets: Sequence[str],
                      batch_size: int = 32, first_index: int = 0) -> list[AlignmentRecord]:
    """Teacher-force each ``target`` on its ``source`` (``scoring.teacher_force``) and return the
    model's attention as alignment records (word matrices over source words x target words,
    default layer/heads). Both sides are cut to the translator's ``max_input_tokens`` subwords."""
    tok, limit = translator.tokenizer, translator.max_input_tokens
    src_ids = [tok.encode(s.strip())[:limit] + [EOS_ID] for s in sources]
    tgt_ids = [tok.encode(t.strip())[:limit] for t in targets]
    _, attention = teacher_force(translator.model, src_ids, tgt_ids, need_attention=True, batch_size=batch_size)
    return [AlignmentRecord.build(first_index + k, sources[k], targets[k], tok.pieces(src_ids[k]),
                                  tok.pieces(tgt_ids[k] + [EOS_ID]), attention[k])  # (L, H, T+1, S)
            for k in range(len(sources))]


def forced_attention(translator: Translator, source: str, target: str) -> AlignmentRecord:
    """One sentence pair of ``forced_attentions``."""
    return forced_attentions(translator, [source], [target])[0]


def gold_aer(translator: Translator, sources: list[str], references: list[str], sure: list,
             possible: list) -> dict[str, Any]:
    """AER of argmax word alignments from attention while force-decoding the references."""
    records = forced_attentions(translator, sources, references)
    scores = alignment_error_rate([argmax_alignment(r.words) for r in records], sure, possible)
    return vars(scores)


# ----------------------------------------------------------------------------- sentence choice


def sentence_chrf(hypotheses: list[str], references: list[str]) -> list[float]:
    from sacrebleu.metrics import CHRF

    metric = CHRF()
    return [metric.sentence_score(h, [r]).score for h, r in zip(hypotheses, references)]


def pick_sentences(chrf: dict[str, list[float]], sources: list[str], count: int) -> list[int]:
    """The ``count`` non-empty sentences where the systems' sentence chrF differ most
    (ties: the earlier line)."""
    spread = np.ptp(np.array(list(chrf.values())), axis=0)  # (sentences,)
    order = sorted((i for i, s in enumerate(sources) if s.strip()), key=lambda i: (-spread[i], i))
    return order[:count]


def check_sentence_ids(ids: Sequence[int], sources: list[str]) -> list[int]:
    """Distinct ids, in order, of non-empty source lines."""
    bad = [i for i in ids if not 0 <= i < len(sources)]
    if bad:
        raise UserError(f"--sentence-ids {' '.join(map(str, bad))}: the test set has {len(sources)} "
                        f"sentences; ids are 0-based line numbers, 0..{len(sources) - 1}")
    empty = [i for i in ids if not sources[i].strip()]
    if empty:
        raise UserError(f"--sentence-ids {' '.join(map(str, empty))}: empty source line(s), nothing to "
                        "plot; choose other sentences")
    return list(dict.fromkeys(ids))


# ----------------------------------------------------------------------------- plots


def plot_length_buckets(rows: list[dict[str, Any]], names: Sequence[str], plots: Path) -> list[Path]:
    from .plotting import plot_grouped_bars

    groups = [f"{row['label']}\n(n={row['sentences']})" for row in rows]
    series = {name: [row["bleu"][name] for row in rows] for name in names}
    return plot_grouped_bars(groups, series, "source words", "BLEU", plots / "bleu_by_length",
                             title="BLEU by source length")


def plot_learning(systems: Sequence[System], plots: Path) -> dict[str, list[Path]]:
    """Validation BLEU against steps and against wall-clock minutes, one line per system."""
    from .plotting import plot_learning_curves

    by_step = {s.name: ([r["step"] for r in s.curve], [r["bleu"] for r in s.curve]) for s in systems}
    longest = max((r.get("elapsed", 0.0) for s in systems for r in s.curve), default=0.0)
    divisor, unit = (1, "s") if longest < 120 else (60, "min") if longest < 3 * 3600 else (3600, "h")
    by_time = {s.name: ([r.get("elapsed", math.nan) / divisor for r in s.curve], [r["bleu"] for r in s.curve])
               for s in systems}
    return {
        "steps": plot_learning_curves(by_step, "training step", "validation BLEU",
                                      plots / "valid_bleu_vs_steps", title="Validation BLEU by step"),
        "time": plot_learning_curves(by_time, f"wall-clock training time ({unit})", "validation BLEU",
                                     plots / "valid_bleu_vs_time", title="Validation BLEU by time"),
    }


def plot_sentence(index: int, names: Sequence[str], records: Sequence[AlignmentRecord], kind: str,
                  plots: Path) -> list[Path]:
    """One figure: the systems' word-level heatmaps of sentence ``index`` side by side."""
    from .plotting import plot_side_by_side

    return plot_side_by_side([r.words for r in records], list(names), [r.src_words for r in records],
                             [r.tgt_words for r in records], plots / f"align_{index:05d}_{kind}")


# ----------------------------------------------------------------------------- the report


def relative(paths: Sequence[Path], root: Path) -> list[str]:
    return [p.relative_to(root).as_posix() for p in paths]


def slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._") or "system"


def write_hypotheses(names: Sequence[str], decoded: dict[str, Decoded], root: Path) -> dict[str, str]:
    paths = {}
    for name in names:
        path = root / "hypotheses" / f"{slug(name)}.txt"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(line + "\n" for line in decoded[name].beam), encoding="utf-8")
        paths[name] = path.relative_to(root).as_posix()
    return paths


def system_entry(system: System, decoded: Decoded, references: list[str], hypotheses_file: str) -> dict[str, Any]:
    """What report.json says about one system besides its scores."""
    t, n = system.training, len(references)
    greedy_bleu = corpus_scores(decoded.greedy, references, ("bleu",))["bleu"].score
    return {
        "name": system.name, "checkpoint": str(system.checkpoint), "model": system.model,
        "parameters": system.parameters, "hypotheses": hypotheses_file,
        "training": {key: t.get(key) for key in ("steps", "elapsed_s", "train_s", "train_tgt_tokens_per_s",
                                                  "peak_rss_mb", "best_valid_bleu", "best_step")},
        "decoding": {
            "greedy": {"seconds": decoded.greedy_seconds, "sentences_per_s": n / decoded.greedy_seconds,
                       "bleu": greedy_bleu},
            "beam": {"seconds": decoded.beam_seconds, "sentences_per_s": n / decoded.beam_seconds},
        },
        "validation_curve": [{k: r.get(k) for k in ("step", "elapsed", "bleu", "loss")} for r in system.curve],
    }


def alignment_examples(systems: Sequence[System], ids: list[int], sources: list[str], references: list[str],
                       chrf: dict[str, list[float]], beam_size: int, root: Path) -> list[dict[str, Any]]:
    """Per chosen sentence: each system's translation and chrF, and two side-by-side figures."""
    names = [s.name for s in systems]
    chosen = [sources[i] for i in ids]
    own = {s.name: s.translator.translate(chosen, beam_size=beam_size, need_attention=True) for s in systems}
    forced = {s.name: forced_attentions(s.translator, chosen, [references[i] for i in ids]) for s in systems}
    examples = []
    for k, index in enumerate(ids):
        hyp_records = [own[n][k].alignment_record(index) for n in names]
        ref_records = [forced[n][k] for n in names]
        examples.append({
            "id": index, "source": sources[index], "reference": references[index],
            "translations": {n: {"text": own[n][k].text, "chrf": chrf[n][index]} for n in names},
            "plots": {"translation": relative(plot_sentence(index, names, hyp_records, "hyp", root / "plots"), root),
                      "reference": relative(plot_sentence(index, names, ref_records, "ref", root / "plots"), root)},
        })
    return examples


def decode_all(systems: Sequence[System], sources: list[str], args: argparse.Namespace) -> dict[str, Decoded]:
    decoded = {}
    for system in systems:
        log("decode", system=system.name, sentences=len(sources), beam=args.beam_size, quiet=args.quiet)
        decoded[system.name] = decode_system(system, sources, args.beam_size, args.batch_size, args.quiet)
    return decoded


def report_settings(args: argparse.Namespace, sentences: int, device: torch.device) -> dict[str, Any]:
    return {"source": str(args.source_path), "reference": str(args.reference_path), "sentences": sentences,
            "beam_size": args.beam_size, "batch_size": args.batch_size, "device": str(device),
            "length_buckets": list(args.length_buckets),
            "sentence_choice": "--sentence-ids" if args.sentence_ids is not None else "largest chrF spread",
            "gold": str(args.gold) if args.gold else None}


def summary_plots(report: dict[str, Any], systems: Sequence[System], root: Path) -> dict[str, list[str]]:
    names = [s.name for s in systems]
    curves = plot_learning(systems, root / "plots")
    return {"bleu_by_length": relative(plot_length_buckets(report["length_buckets"], names, root / "plots"), root),
            "valid_bleu_vs_steps": relative(curves["steps"], root),
            "valid_bleu_vs_time": relative(curves["time"], root)}


def build_report(systems: Sequence[System], sources: list[str], references: list[str],
                 args: argparse.Namespace, gold: tuple[list, list] | None, root: Path) -> dict[str, Any]:
    """Decode, score, test, plot; files land in ``root``, numbers in the returned JSON-able dict."""
    names = [s.name for s in systems]
    decoded = decode_all(systems, sources, args)
    hypotheses = [decoded[n].beam for n in names]
    hyp_files = write_hypotheses(names, decoded, root)
    log("significance", bootstrap=args.bootstrap, ar_trials=args.ar_trials, quiet=args.quiet)
    report: dict[str, Any] = {
        "command": "seq2seq compare " + shlex.join(getattr(args, "argv", [])),
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "settings": report_settings(args, len(sources), systems[0].translator.device),
        "versions": versions(),
        "systems": [system_entry(s, decoded[s.name], references, hyp_files[s.name]) for s in systems],
        "quality": significance(names, hypotheses, references, args.bootstrap, args.ar_trials),
        "length_buckets": bucket_bleu(length_buckets(sources, args.length_buckets), names, hypotheses, references),
    }
    report["plots"] = summary_plots(report, systems, root)
    chrf = {n: sentence_chrf(decoded[n].beam, references) for n in names}
    ids = args.sentence_ids if args.sentence_ids is not None else pick_sentences(chrf, sources, args.sentences)
    log("alignments", sentences=len(ids), gold=bool(gold), quiet=args.quiet)
    report["examples"] = alignment_examples(systems, ids, sources, references, chrf, args.beam_size, root)
    report["aer"] = {s.name: gold_aer(s.translator, sources, references, *gold) for s in systems} if gold else None
    return report


def versions() -> dict[str, Any]:
    import sacrebleu

    return {"seq2seq": __version__, "python": platform.python_version(), "torch": torch.__version__,
            "sacrebleu": sacrebleu.__version__, "platform": platform.platform(), "cpus": os.cpu_count()}


# ----------------------------------------------------------------------------- markdown


def md_escape(text: str) -> str:
    return re.sub(r"([\\`*_\[\]<>|#])", r"\\\1", text)


def md_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """``io_utils.markdown_table`` as lines, for building the report line by line."""
    return markdown_table(header, rows).split("\n")


def fmt_number(value: float | None, spec: str = ".1f") -> str:
    return DASH if value is None else format(value, spec)


def fmt_parameters(n: int) -> str:
    return f"{n / 1e6:.1f} M" if n >= 1e6 else f"{n:,}"


def fmt_duration(seconds: float | None, steps: int | None) -> str:
    if seconds is None:
        return DASH
    text = f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.0f} s"
    return text + (f" ({steps:,} steps)" if steps is not None else "")


def fmt_memory(mb: float | None) -> str:
    if mb is None:
        return DASH
    return f"{mb / 1024:.1f} GB" if mb >= 1024 else f"{mb:.0f} MB"


def fmt_p(p: float | None) -> str:
    if p is None:
        return DASH
    return f"{p:.2g}" + ("*" if p < ALPHA else "")


def fmt_p_pair(score: dict[str, Any], is_baseline: bool, identical: bool) -> str:
    if is_baseline:
        return "baseline"
    note = " (identical)" if identical else " (equal)" if score["equal_to_baseline"] else ""
    return f"{fmt_p(score['p_bs'])} / {fmt_p(score['p_ar'])}{note}"


def quality_table(report: dict[str, Any]) -> list[str]:
    beam = report["settings"]["beam_size"]
    header = ["system", "model", "parameters"]
    for metric in METRICS:
        header += [metric + (" ↓" if metric in LOWER_IS_BETTER else ""), f"p {metric} (BS / AR)"]
    header += ["training time", "train tgt tok/s", "greedy sent/s", f"beam {beam} sent/s", "peak RSS (train)"]
    rows = []
    for k, (entry, q) in enumerate(zip(report["systems"], report["quality"]["systems"])):
        t, d = entry["training"], entry["decoding"]
        row = [md_escape(entry["name"]), entry["model"], fmt_parameters(entry["parameters"])]
        for metric in METRICS:
            s = q["scores"][metric]
            row += [f"{s['score']:.2f} ± {s['ci']:.2f}", fmt_p_pair(s, k == 0, q["identical_to_baseline"])]
        row += [fmt_duration(t["elapsed_s"], t["steps"]), fmt_number(t["train_tgt_tokens_per_s"], ",.0f"),
                fmt_number(d["greedy"]["sentences_per_s"], ",.1f"), fmt_number(d["beam"]["sentences_per_s"], ",.1f"),
                fmt_memory(t["peak_rss_mb"])]
        rows.append(row)
    return md_table(header, rows)


def figure(paths: Sequence[str], alt: str) -> str:
    png = next((p for p in paths if p.endswith(".png")), paths[0])
    svg = next((p for p in paths if p.endswith(".svg")), None)
    return f"![{alt}]({png})" + (f"  \n[SVG]({svg})" if svg else "")


def quality_section(report: dict[str, Any]) -> list[str]:
    q, s = report["quality"], report["settings"]
    lines = ["## Quality and cost", "", *quality_table(report), "",
             f"BLEU, chrF and TER (↓ lower is better) of beam-{s['beam_size']} translations of "
             f"{s['sentences']:,} sentences. ± is the half-width of sacrebleu's 95% bootstrap confidence "
             f"interval ({q['bootstrap']:,} resamples). p-values compare each system with the first "
             f"({md_escape(q['baseline'])}): paired bootstrap resampling (BS, {q['bootstrap']:,} resamples) / "
             f"paired approximate randomization (AR, {q['ar_trials']:,} trials), both computed by "
             f"`sacrebleu.significance.PairedTest` (seed {q['seed']}); * = p < {ALPHA}."]
    if any(m["equal_to_baseline"] for x in q["systems"] for m in x["scores"].values()):
        lines.append("\"identical\" (the output equals the baseline's line for line) and \"equal\" (the same "
                     "score): no difference to test, so p = 1; sacrebleu's tests count only resampled "
                     "differences strictly above the observed one and would report 1/(n+1) when all tie.")
    lines += ["",
              "Training time, training throughput (target tokens per second of training steps) and peak "
              "resident memory come from each run's `summary.json` (— if there is none). Decoding speed is "
              f"measured here: the whole test set, batch size {s['batch_size'] or '320 / beam size'}, "
              f"device {s['device']}.",
              "", "Signatures:", "", "```"]
    for kind, signatures in q["signatures"].items():
        lines += [f"{kind} {metric}: {sig}" for metric, sig in signatures.items()]
    return lines + ["```", ""]


def best_system(scores: dict[str, float | None]) -> str:
    """The name with the highest score, "tie" if several share it, — without scores or rivals."""
    known = {n: v for n, v in scores.items() if v is not None}
    if len(known) < 2:
        return DASH
    top = max(known.values())
    winners = [n for n, v in known.items() if v == top]
    return md_escape(winners[0]) if len(winners) == 1 else "tie"


def buckets_section(report: dict[str, Any]) -> list[str]:
    names = [e["name"] for e in report["systems"]]
    rows = []
    for row in report["length_buckets"]:
        scores = row["bleu"]
        rows.append([row["label"], str(row["sentences"]), *(fmt_number(scores[n], ".2f") for n in names),
                     best_system(scores)])
    bounds = report["settings"]["length_buckets"]
    return ["## BLEU by source length", "",
            f"Sentences grouped by the number of whitespace-separated words of the source (bucket upper bounds "
            f"{', '.join(map(str, bounds))}; empty source lines are left out); corpus BLEU of the beam "
            "translations within each bucket.", "",
            *md_table(["source words", "sentences", *map(md_escape, names), "best"], rows), "",
            figure(report["plots"]["bleu_by_length"], "BLEU by source length"), ""]


def curves_section(report: dict[str, Any]) -> list[str]:
    missing = [e["name"] for e in report["systems"] if not e["validation_curve"]]
    lines = ["## Learning curves", "",
             "Validation BLEU (greedy or the run's evaluation beam, on the run's validation sentences) from "
             "each run's `metrics.jsonl`, against training steps and against wall-clock training time (all "
             "sessions of a resumed run, validation included).", ""]
    if missing:
        lines += [f"No validation lines for: {', '.join(map(md_escape, missing))}.", ""]
    return lines + [figure(report["plots"]["valid_bleu_vs_steps"], "validation BLEU by step"), "",
                    figure(report["plots"]["valid_bleu_vs_time"], "validation BLEU by time"), ""]


def examples_section(report: dict[str, Any]) -> list[str]:
    lines = ["## Attention alignments", "",
             f"Sentences chosen by {report['settings']['sentence_choice']} (ids are 0-based line numbers). "
             "Word-level attention (penultimate decoder layer averaged over heads; the RNN's single "
             "attention), source words across the top. First figure: each system's own translation; "
             "second: the reference force-decoded, so every system has the same rows and columns.", ""]
    for ex in report["examples"]:
        lines += [f"### Sentence {ex['id']}", "", f"- source: {md_escape(ex['source'])}",
                  f"- reference: {md_escape(ex['reference'])}"]
        lines += [f"- {md_escape(name)} (chrF {t['chrf']:.1f}): {md_escape(t['text']) or '(empty)'}"
                  for name, t in ex["translations"].items()]
        lines += ["", figure(ex["plots"]["translation"], f"attention, sentence {ex['id']}, own translations"), "",
                  figure(ex["plots"]["reference"], f"attention, sentence {ex['id']}, reference forced"), ""]
    return lines


def aer_section(report: dict[str, Any]) -> list[str]:
    if not report["aer"]:
        return []
    rows = [[md_escape(name), f"{a['aer']:.3f}", f"{a['precision']:.3f}", f"{a['recall']:.3f}",
             str(a["sentences"])] for name, a in report["aer"].items()]
    return ["## Alignment error rate", "",
            f"Against `{report['settings']['gold']}`: one argmax link per reference word from the "
            "attention while force-decoding the reference (layer and heads as above; lower AER is better).", "",
            *md_table(["system", "AER ↓", "precision", "recall", "sentences"], rows), ""]


def settings_section(report: dict[str, Any]) -> list[str]:
    s, v = report["settings"], report["versions"]
    return ["## Settings", "", "```", report["command"], "```", "",
            f"- test set: `{s['source']}` -> `{s['reference']}` ({s['sentences']:,} sentences)",
            *[f"- {md_escape(e['name'])}: `{e['checkpoint']}`, hypotheses in [{e['hypotheses']}]({e['hypotheses']})"
              for e in report["systems"]],
            f"- seq2seq {v['seq2seq']}, torch {v['torch']}, sacrebleu {v['sacrebleu']}, Python {v['python']}, "
            f"{v['platform']}, {v['cpus']} CPUs; {report['date']}", ""]


def render_markdown(report: dict[str, Any]) -> str:
    names = [md_escape(e["name"]) for e in report["systems"]]
    lines = [f"# Comparison: {' vs '.join(names)}", "",
             *quality_section(report), *buckets_section(report), *curves_section(report),
             *examples_section(report), *aer_section(report), *settings_section(report)]
    return "\n".join(lines)


# ----------------------------------------------------------------------------- output directory


def check_out_dir(out: Path) -> None:
    """--output may be new, empty, or an earlier report (replaced); anything else is refused."""
    if out.exists() and not out.is_dir():
        raise UserError(f"--output {out} is a file; give a directory for the report")
    if out.is_dir() and any(out.iterdir()) and not (out / "report.json").is_file():
        raise UserError(f"--output {out} exists and is not a comparison report (no report.json); "
                        "choose a new directory or empty it")


@contextmanager
def staged_directory(out: Path) -> Iterator[Path]:
    """A temp directory beside ``out`` that replaces ``out`` when the block succeeds and is
    removed when it fails, so ``out`` is never half-written."""
    check_out_dir(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    tmp.mkdir()
    try:
        yield tmp
        if out.exists():
            old = out.with_name(f".{out.name}.{uuid.uuid4().hex[:8]}.old")
            out.rename(old)
            tmp.rename(out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


# ----------------------------------------------------------------------------- CLI


def check_args(args: argparse.Namespace) -> None:
    for flag, value in (("--beam-size", args.beam_size), ("--batch-size", args.batch_size),
                        ("--sentences", args.sentences), ("--bootstrap", args.bootstrap),
                        ("--ar-trials", args.ar_trials)):
        if value is not None and value < 1:
            raise UserError(f"{flag} must be a positive integer, got {value}")
    bounds = args.length_buckets
    if any(b < 1 for b in bounds) or list(bounds) != sorted(set(bounds)):
        raise UserError(f"--length-buckets must be increasing positive word counts, got {' '.join(map(str, bounds))}")


def compare(args: argparse.Namespace) -> Path:
    """Everything ``main`` does, from parsed arguments; returns the report directory."""
    check_args(args)
    args.source_path, args.reference_path = input_files(args)
    sources, references = read_test_set(args.source_path, args.reference_path)
    if args.sentence_ids is not None:
        args.sentence_ids = check_sentence_ids(args.sentence_ids, sources)
    gold = read_gold_alignments(args.gold, sources, references) if args.gold else None
    out = Path(args.output)
    check_out_dir(out)
    checkpoints = [resolve_checkpoint(run) for run in args.runs]
    names = system_names(checkpoints, args.names)
    systems = [load_system(str(ckpt), name, args.device) for ckpt, name in zip(checkpoints, names)]
    with staged_directory(out) as root:
        report = build_report(systems, sources, references, args, gold, root)
        (root / "report.json").write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        (root / "report.md").write_text(render_markdown(report), encoding="utf-8")
    log("report", path=out / "report.md", quiet=args.quiet)
    return out
