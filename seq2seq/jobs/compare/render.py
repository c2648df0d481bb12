"""The report as markdown, from its JSON form (numbers formatted here only)."""
from __future__ import annotations

import re
from typing import Any, Sequence

from ...io_utils import counted, markdown_table
from .constants import ALPHA, DASH, LOWER_IS_BETTER, METRICS


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
    return text + (f" ({counted(steps, 'step')})" if steps is not None else "")


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
             f"{counted(s['sentences'], 'sentence')}. ± is the half-width of sacrebleu's 95% bootstrap confidence "
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
                    figure(report["plots"]["valid_bleu_vs_time"], "validation BLEU by time"), "",
                    *budgets_section(report)]


def fmt_crossings(found: list[dict[str, Any]], system: str, baseline: str, unit: str) -> str:
    """'X goes ahead at 23.4 minutes' clauses in order, or that the curves do not cross."""
    if not found:
        return f"the curves do not cross (in {unit})"
    spec = ".1f" if unit == "minutes" else ",.0f"
    return ", then ".join(f"{system if c['leader'] == 'b' else baseline} goes ahead at {c['x']:{spec}} {unit}"
                          for c in found)


def budgets_section(report: dict[str, Any]) -> list[str]:
    """Validation BLEU at each training budget, and where the curves cross the baseline's."""
    budgets = report.get("budgets")
    if not budgets or not any(cell for row in budgets["systems"].values() for cell in row.values()):
        return []
    keys = [f"{m:g}" for m in budgets["minutes"]]
    rows = [[md_escape(name), *[DASH if row[k] is None else
                                f"{row[k]['bleu']:.2f} ({row[k]['elapsed'] / 60:.1f} min, "
                                f"{counted(row[k]['step'], 'step')})" for k in keys]]
            for name, row in budgets["systems"].items()]
    lines = ["### Training budgets", "",
             "Validation BLEU of each run at the validation nearest to each budget (its clock in minutes and "
             f"its updates in brackets; {DASH}: the run stopped short of it).", "",
             *md_table(["system", *[f"{k} min" for k in keys]], rows), ""]
    for crossed in budgets["crossings"]:
        system, baseline = md_escape(crossed["system"]), md_escape(crossed["baseline"])
        lines.append(f"- {system} vs {baseline}: by wall-clock time, "
                     f"{fmt_crossings(crossed['minutes'], system, baseline, 'minutes')}; by updates, "
                     f"{fmt_crossings(crossed['steps'], system, baseline, 'updates')}.")
    return lines + [""]


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
    rows = [[md_escape(name), f"{a['aer']:.3f}", fmt_number(a["precision"], ".3f"), fmt_number(a["recall"], ".3f"),
             str(a["sentences"])] for name, a in report["aer"].items()]
    return ["## Alignment error rate", "",
            f"Against `{report['settings']['gold']}`: one argmax link per reference word from the "
            "attention while force-decoding the reference (layer and heads as above; lower AER is better).", "",
            *md_table(["system", "AER ↓", "precision", "recall", "sentences"], rows), ""]


def settings_section(report: dict[str, Any]) -> list[str]:
    s, v = report["settings"], report["versions"]
    return ["## Settings", "", "```", report["command"], "```", "",
            f"- test set: `{s['source']}` -> `{s['reference']}` ({counted(s['sentences'], 'sentence')})",
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
