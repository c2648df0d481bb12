"""Building the report directory: decode, score, plot, render, then publish atomically."""
from __future__ import annotations

import dataclasses
import json
import os
import platform
import re
import shlex
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Sequence

import torch

from ...alignment.links import read_gold_alignments
from ...config import DecodeConfig
from ...errors import UserError
from ...io_utils import atomic_directory, check_report_dir, display_path
from ...metrics import corpus_scores
from ...runtime import log
from ...version import __version__
from .curves import budget_summary
from .decode import (
    Decoded,
    System,
    decode_system,
    input_files,
    load_system,
    read_test_set,
    resolve_checkpoint,
    system_names,
)
from .job import CompareJob
from .figures import plot_learning, plot_length_buckets, plot_sentence
from .render import render_markdown
from .stats import (
    bucket_bleu,
    check_sentence_ids,
    forced_attentions,
    gold_aer,
    length_buckets,
    pick_sentences,
    sentence_chrf,
    significance,
)


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
        "name": system.name, "checkpoint": display_path(system.checkpoint), "model": system.model,
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
                       chrf: dict[str, list[float]], decode: DecodeConfig, root: Path) -> list[dict[str, Any]]:
    """Per chosen sentence: each system's translation and chrF, and two side-by-side figures."""
    names = [s.name for s in systems]
    chosen = [sources[i] for i in ids]
    own = {s.name: s.translator.translate(chosen, decode, need_attention=True) for s in systems}
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


def decode_all(systems: Sequence[System], sources: list[str], job: CompareJob) -> dict[str, Decoded]:
    decoded = {}
    for system in systems:
        log("decode", system=system.name, sentences=len(sources), beam=job.decode.beam, quiet=job.quiet)
        decoded[system.name] = decode_system(system, sources, job.decode, job.quiet)
    return decoded


def report_settings(job: CompareJob, sentences: int, device: torch.device) -> dict[str, Any]:
    return {"source": display_path(job.source_path), "reference": display_path(job.reference_path),
            "sentences": sentences,
            "beam_size": job.decode.beam, "batch_size": job.decode.batch_size, "device": str(device),
            "length_buckets": list(job.length_buckets),
            "sentence_choice": "--sentence-ids" if job.sentence_ids is not None else "largest chrF spread",
            "gold": str(job.gold) if job.gold else None}


def summary_plots(report: dict[str, Any], systems: Sequence[System], root: Path) -> dict[str, list[str]]:
    names = [s.name for s in systems]
    curves = plot_learning(systems, root / "plots")
    return {"bleu_by_length": relative(plot_length_buckets(report["length_buckets"], names, root / "plots"), root),
            "valid_bleu_vs_steps": relative(curves["steps"], root),
            "valid_bleu_vs_time": relative(curves["time"], root)}


def build_report(systems: Sequence[System], sources: list[str], references: list[str],
                 job: CompareJob, gold: tuple[list, list] | None, root: Path) -> dict[str, Any]:
    """Decode, score, test, plot; files land in ``root``, numbers in the returned JSON-able dict."""
    names = [s.name for s in systems]
    decoded = decode_all(systems, sources, job)
    hypotheses = [decoded[n].beam for n in names]
    hyp_files = write_hypotheses(names, decoded, root)
    log("significance", bootstrap=job.bootstrap, ar_trials=job.ar_trials, quiet=job.quiet)
    report: dict[str, Any] = {
        "command": "seq2seq compare " + shlex.join(job.argv),
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "settings": report_settings(job, len(sources), systems[0].translator.device),
        "versions": versions(),
        "systems": [system_entry(s, decoded[s.name], references, hyp_files[s.name]) for s in systems],
        "quality": significance(names, hypotheses, references, job.bootstrap, job.ar_trials),
        "length_buckets": bucket_bleu(length_buckets(sources, job.length_buckets), names, hypotheses, references),
        "budgets": budget_summary(names, [s.curve for s in systems], job.budgets),
    }
    report["plots"] = summary_plots(report, systems, root)
    chrf = {n: sentence_chrf(decoded[n].beam, references) for n in names}
    ids = job.sentence_ids if job.sentence_ids is not None else pick_sentences(chrf, sources, job.sentences)
    log("alignments", sentences=len(ids), gold=bool(gold), quiet=job.quiet)
    report["examples"] = alignment_examples(systems, ids, sources, references, chrf, job.decode, root)
    report["aer"] = {s.name: gold_aer(s.translator, sources, references, *gold) for s in systems} if gold else None
    return report


def versions() -> dict[str, Any]:
    import sacrebleu

    return {"seq2seq": __version__, "python": platform.python_version(), "torch": torch.__version__,
            "sacrebleu": sacrebleu.__version__, "platform": platform.platform(), "cpus": os.cpu_count()}




@contextmanager
def staged_directory(out: Path) -> Iterator[Path]:
    """``io_utils.atomic_directory`` for a report: ``out`` may be new, empty or an earlier report
    (``check_report_dir``), and is replaced only when the new report is complete."""
    check_report_dir(out, "--output", "comparison")
    out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_directory(out, force=True, flag="--output") as tmp:
        yield tmp


def check_args(job: CompareJob) -> None:
    for flag, value in (("--sentences", job.sentences), ("--bootstrap", job.bootstrap),
                        ("--ar-trials", job.ar_trials)):
        if value is not None and value < 1:
            raise UserError(f"{flag} must be a positive integer, got {value}")
    if any(m <= 0 for m in job.budgets):
        raise UserError(f"--budgets must be positive minutes, got {' '.join(f'{m:g}' for m in job.budgets)}")
    bounds = job.length_buckets
    if any(b < 1 for b in bounds) or list(bounds) != sorted(set(bounds)):
        raise UserError(f"--length-buckets must be increasing positive word counts, got {' '.join(map(str, bounds))}")


def compare(job: CompareJob) -> Path:
    """Everything ``main`` does, from parsed arguments; returns the report directory."""
    check_args(job)
    source_path, reference_path = input_files(job)
    sources, references = read_test_set(source_path, reference_path)
    sentence_ids = check_sentence_ids(job.sentence_ids, sources) if job.sentence_ids is not None else None
    job = dataclasses.replace(job, source_path=source_path, reference_path=reference_path, sentence_ids=sentence_ids)
    gold = read_gold_alignments(job.gold, sources, references) if job.gold else None
    out = Path(job.output)
    check_report_dir(out, "--output", "comparison")
    checkpoints = [resolve_checkpoint(run) for run in job.runs]
    names = system_names(checkpoints, job.names)
    systems = [load_system(str(ckpt), name, job.device) for ckpt, name in zip(checkpoints, names)]
    with staged_directory(out) as root:
        report = build_report(systems, sources, references, job, gold, root)
        (root / "report.json").write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        (root / "report.md").write_text(render_markdown(report), encoding="utf-8")
    log("report", path=out / "report.md", quiet=job.quiet)
    return out
