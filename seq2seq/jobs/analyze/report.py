"""Reading and checking the inputs, analysing each model, and publishing the report directory."""
from __future__ import annotations

import json
import shlex
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ...alignment.links import alignment_error_rate, extract_links, read_gold_alignments
from ...alignment.matrices import aggregate, check_layer_heads, words_from_pieces
from ...alignment.records import AlignmentRecord
from ...config import FORCED_BATCH_SIZE
from ...data.files import read_lines
from ...decoding.scoring import teacher_force
from ...errors import UserError
from ...io_utils import check_report_dir, counted, display_path
from ...runtime import LOGGER, log
from ...tokenizer import EOS_ID
from ..compare.decode import System, load_system, resolve_checkpoint, system_names
from ..compare.report import slug, staged_directory, versions
from .figures import plot_class_shares, plot_head_panels, plot_pruning
from .heads import cross_attention_layers, head_importance
from .job import AnalyzeJob
from .render import render_markdown
from .stats import RowStatistics, SourceMass, function_words, head_aer, piece_classes

RNN_NOTE = ("the RNN has a single attention (one layer, one head), so there is no other head to compare "
            "it with: head importance and pruning are skipped")


@dataclass
class Corpus:
    """The analysed text: all input lines, the references (None: the models' own translations are
    analysed) and gold links (None), and which lines are analysed (those with a source)."""

    sources: list[str]
    references: list[str] | None
    gold: tuple[list[set], list[set]] | None
    indices: list[int]
    functional: list[str]


def check_args(job: AnalyzeJob) -> None:
    for flag, value, least in (("--bleu-sentences", job.bleu_sentences, 0), ("--max-pruned", job.max_pruned, 0),
                               ("--function-words", job.function_words, 0), ("--top-words", job.top_words, 1)):
        if value is not None and value < least:
            raise UserError(f"{flag} must be an integer >= {least}, got {value}")
    if job.gold_alignments and not job.reference:
        raise UserError(f"--gold-alignments {job.gold_alignments} needs --reference: gold links refer to the "
                        "reference translations, which are then force-decoded")


def read_corpus(job: AnalyzeJob) -> Corpus:
    """--input, --reference and --gold-alignments, checked against each other (UserErrors name the
    file and line)."""
    sources = read_lines(Path(job.input), "--input")
    references = read_lines(Path(job.reference), "--reference") if job.reference else None
    if references is not None and len(references) != len(sources):
        raise UserError(f"--reference {job.reference} has {counted(len(references), 'line')} but --input "
                        f"{job.input} has {len(sources)}; give one reference line per input line")
    indices = [i for i, line in enumerate(sources) if line.strip()]
    if not indices:
        raise UserError(f"--input {job.input} has no non-empty line; nothing to analyse")
    gold = None
    if job.gold_alignments:
        if not Path(job.gold_alignments).is_file():
            raise UserError(f"--gold-alignments {job.gold_alignments}: no such file")
        gold = read_gold_alignments(job.gold_alignments, sources, references, flag="--gold-alignments")
    return Corpus(sources, references, gold, indices, function_words(sources, job.function_words))


def targets_of(system: System, corpus: Corpus, job: AnalyzeJob) -> tuple[list[list[int]], list[str]]:
    """Target ids and texts of the analysed lines: the references, or the model's own translations
    (``job.decode``: ``--beam-size``; 1 = greedy)."""
    tok, limit = system.translator.tokenizer, system.translator.max_input_tokens
    if corpus.references is not None:
        texts = [corpus.references[i] for i in corpus.indices]
        return [tok.encode(t.strip())[:limit] for t in texts], texts
    log("translate", model=system.name, sentences=len(corpus.indices), beam=job.decode.beam, quiet=job.quiet)
    hyps = system.translator.translate([corpus.sources[i] for i in corpus.indices], job.decode,
                                       need_attention=False, progress=not job.quiet)
    return [h.tokens for h in hyps], [h.text for h in hyps]


def analyze_model(system: System, corpus: Corpus, job: AnalyzeJob) -> dict[str, Any]:
    """Every statistic of one model over the corpus (JSON-able apart from numpy arrays)."""
    translator, model = system.translator, system.translator.model
    tok, limit = translator.tokenizer, translator.max_input_tokens
    own = job.align.for_model(translator.supervised_attention)  # a guided model: its supervised heads
    layer, heads = check_layer_heads(own.layer, own.heads, model)
    word_align = replace(own, layer=layer, heads=heads, include_eos=False)  # the gold's words: EOS dropped
    src_ids = [tok.encode(corpus.sources[i].strip())[:limit] + [EOS_ID] for i in corpus.indices]
    tgt_ids, tgt_texts = targets_of(system, corpus, job)
    order = sorted(range(len(src_ids)), key=lambda k: -len(src_ids[k]))  # similar lengths per batch
    sorted_src, sorted_tgt = [src_ids[k] for k in order], [tgt_ids[k] for k in order]
    log("force", model=system.name, sentences=len(order), quiet=job.quiet)
    log_probs, forced = teacher_force(model, sorted_src, sorted_tgt, need_attention=True,
                                      batch_size=job.decode.batch_size or FORCED_BATCH_SIZE)
    attention = dict(zip(order, forced))  # (L, H, T+1, S+1) per analysed line
    functional = set(corpus.functional)
    per_head = RowStatistics(model.attention_layers, model.attention_heads)
    pooled, mass = RowStatistics(1, 1), SourceMass()
    head_words, pooled_links, mismatched = [], [], 0
    for k, line in enumerate(corpus.indices):
        a = attention[k]
        src_pieces, tgt_pieces = tok.pieces(src_ids[k]), tok.pieces(tgt_ids[k] + [EOS_ID])
        classes = piece_classes(src_pieces, functional)
        per_head.add(a, classes)
        matrix = aggregate(a, layer, heads)  # (T+1, S+1)
        pooled.add(matrix[None, None], classes)
        mass.add(matrix, src_pieces, classes, functional)
        if corpus.gold is not None:
            source, target = corpus.sources[line], tgt_texts[k]
            mismatched += (len(words_from_pieces(src_pieces[:-1])) != len(source.split())
                           or len(words_from_pieces(tgt_pieces[:-1])) != len(target.split()))
            record = AlignmentRecord.build(line, source, target, src_pieces, tgt_pieces, a, word_align)
            head_words.append(record.word_attention())  # (L, H, Tw, Sw), EOS dropped
            pooled_links.append(extract_links(record.words, job.align.method, job.align.threshold))
    entry: dict[str, Any] = {
        "name": system.name, "checkpoint": display_path(system.checkpoint), "model": system.model,
        "parameters": system.parameters, "layers": model.attention_layers, "heads": model.attention_heads,
        "sentences": len(corpus.indices), "target_rows": per_head.rows,
        "loss": -float(sum(lp.sum() for lp in log_probs)) / max(sum(len(lp) for lp in log_probs), 1),
        "per_head": per_head.means(), "aggregate": {n: float(v[0, 0]) for n, v in pooled.means().items()},
        "classes": mass.classes(), "top_words": mass.top_words(job.top_words),
        "aer": None, "aggregate_aer": None, "importance": None, "importance_note": None,
        "aggregate_attention": {"layer": own.layer, "heads": own.heads},
    }
    if corpus.gold is not None:
        if mismatched:
            LOGGER.warning(f"warning: {system.name}: {mismatched} sentence pair(s) have a different number of "
                           "words after tokenization than whitespace words; gold word indices may be off there")
        sure, possible = ([g[i] for i in corpus.indices] for g in corpus.gold)
        entry["aer"] = head_aer(head_words, sure, possible, job.align.method, job.align.threshold)
        entry["aggregate_aer"] = vars(alignment_error_rate(pooled_links, sure, possible))
    if cross_attention_layers(model) is None:
        entry["importance_note"] = RNN_NOTE
        log("importance", model=system.name, skipped=RNN_NOTE, quiet=job.quiet)
        return entry
    subset = list(range(min(job.bleu_sentences, len(corpus.indices))))
    bleu_refs = ([corpus.references[corpus.indices[k]] for k in subset] if corpus.references is not None
                 else [tgt_texts[k] for k in subset])
    log("importance", model=system.name, heads=model.attention_layers * model.attention_heads,
        bleu_sentences=len(subset), quiet=job.quiet)
    entry["importance"] = head_importance(translator, sorted_src, sorted_tgt,
                                          [corpus.sources[corpus.indices[k]] for k in subset], bleu_refs, job)
    return entry


def jsonable(value: Any) -> Any:
    """numpy arrays and scalars -> lists and floats; NaN -> None (strict JSON)."""
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return jsonable(value.tolist())
    if isinstance(value, (float, np.floating)):
        return None if np.isnan(value) else float(value)
    if isinstance(value, np.integer):
        return int(value)
    return value


def model_plots(entry: dict[str, Any], root: Path) -> dict[str, str]:
    panels = {"entropy (nats)": entry["per_head"]["entropy"], "top-1 share": entry["per_head"]["top1_share"],
              "Gini": entry["per_head"]["gini"], "EOS share": entry["per_head"]["eos_share"],
              "punctuation share": entry["per_head"]["punctuation_share"],
              "diagonal distance": entry["per_head"]["diagonal_distance"]}
    if entry["aer"] is not None:
        panels["AER"] = entry["aer"]
    importance = entry["importance"]
    if importance is not None:
        panels["Δ loss (masked)"] = importance["delta_loss"]
        if importance["delta_bleu"] is not None:
            panels["Δ BLEU (masked)"] = importance["delta_bleu"]
    path = plot_head_panels(entry["name"], panels, root / "plots" / f"heads_{slug(entry['name'])}.png")
    return {"heads": path.relative_to(root).as_posix()}


def settings(job: AnalyzeJob, corpus: Corpus, device: str) -> dict[str, Any]:
    forced = "reference" if corpus.references is not None else f"translations (beam {job.decode.beam})"
    return {"input": display_path(job.input), "reference": display_path(job.reference) if job.reference else None,
            "gold_alignments": display_path(job.gold_alignments) if job.gold_alignments else None,
            "lines": len(corpus.sources), "sentences": len(corpus.indices), "attention_from": forced,
            "beam_size": job.decode.beam, "batch_size": job.decode.batch_size, "bleu_sentences": job.bleu_sentences,
            "max_pruned": job.max_pruned, "align_layer": job.align.layer_flag, "align_heads": job.align.heads_flag,
            "align_method": job.align.method, "align_threshold": job.align.threshold,
            "function_words": job.function_words, "top_words": job.top_words, "device": device}


def build_report(systems: Sequence[System], corpus: Corpus, job: AnalyzeJob, root: Path) -> dict[str, Any]:
    """Analyse every model, plot into ``root``; the JSON-able report."""
    models = [analyze_model(system, corpus, job) for system in systems]
    for entry in models:
        entry["plots"] = model_plots(entry, root)
    plots = {"classes": plot_class_shares(models, root / "plots" / "class_shares.png").relative_to(root).as_posix()}
    pruned = [m for m in models if m["importance"] is not None]
    if pruned:
        plots["pruning"] = [p.relative_to(root).as_posix() for p in plot_pruning(pruned, root / "plots")]
    return jsonable({
        "command": "seq2seq analyze " + shlex.join(job.argv),
        "date": time.strftime("%Y-%m-%d %H:%M"), "settings": settings(job, corpus, str(systems[0].translator.device)),
        "versions": versions(), "function_words": corpus.functional, "models": models, "plots": plots,
    })


def analyze(job: AnalyzeJob) -> Path:
    """Everything ``seq2seq analyze`` does, from parsed arguments; returns the report directory.
    Inputs are checked before any model runs; the directory appears only when complete."""
    check_args(job)
    corpus = read_corpus(job)
    out = Path(job.output_dir)
    check_report_dir(out, "--output-dir", "analysis")
    checkpoints = [resolve_checkpoint(run) for run in job.checkpoint]
    names = system_names(checkpoints, job.names)
    systems = [load_system(str(ckpt), name, job.device) for ckpt, name in zip(checkpoints, names)]
    for system in systems:
        own = job.align.for_model(system.translator.supervised_attention)
        check_layer_heads(own.layer, own.heads, system.translator.model)
    with staged_directory(out) as root:
        report = build_report(systems, corpus, job, root)
        (root / "report.json").write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        (root / "report.md").write_text(render_markdown(report), encoding="utf-8")
    log("report", path=out / "report.md", quiet=job.quiet)
    return out
