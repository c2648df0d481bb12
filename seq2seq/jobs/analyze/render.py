"""The analysis report as markdown, from its JSON form (numbers are formatted here only)."""
from __future__ import annotations

from typing import Any

from ...io_utils import counted
from ..compare.render import fmt_parameters, md_escape, md_table
from .stats import CLASSES

DASH = "—"
GUIDE = "docs/guides/analyzing.md"
HEAD_COLUMNS = (("entropy", "entropy"), ("normalized_entropy", "norm. entropy"), ("top1_share", "top-1"),
                ("gini", "Gini"), ("eos_share", "EOS"), ("punctuation_share", "punct."),
                ("function_share", "function"), ("diagonal_distance", "diag. dist."))


def num(value: float | None, spec: str = ".3f") -> str:
    return DASH if value is None else format(value, spec)


def pct(value: float | None) -> str:
    return DASH if value is None else f"{100 * value:.1f}%"


def figure(path: str, alt: str) -> str:
    return f"![{alt}]({path})"


def summary_section(report: dict[str, Any]) -> list[str]:
    """One column per model: size, loss, the aggregate's statistics, AER, BLEU."""
    models = report["models"]
    rows = [["model", *[m["model"] for m in models]],
            ["parameters", *[fmt_parameters(m["parameters"]) for m in models]],
            ["layers x heads (cross-attention)", *[f"{m['layers']} x {m['heads']}" for m in models]],
            ["teacher-forced loss (nats / token)", *[num(m["loss"]) for m in models]]]
    rows += [[label, *[num(m["aggregate"][key]) if "share" not in key else pct(m["aggregate"][key]) for m in models]]
             for key, label in HEAD_COLUMNS]
    if any(m["aggregate_aer"] for m in models):
        rows.append(["AER ↓", *[num(m["aggregate_aer"]["aer"]) if m["aggregate_aer"] else DASH for m in models]])
    if any(m["importance"] and m["importance"]["bleu"] is not None for m in models):
        rows.append([f"BLEU (first {counted(report['settings']['bleu_sentences'], 'sentence')})",
                     *[num(m["importance"]["bleu"], ".2f") if m["importance"] else DASH for m in models]])
    s = report["settings"]
    return ["## Summary", "",
            f"Attention of the aggregate (--align-layer {s['align_layer']}, --align-heads {s['align_heads']}; "
            "the RNN's single attention), means over all target positions of the corpus.", "",
            *md_table(["", *[md_escape(m["name"]) for m in models]], rows), ""]


def concentration_section(report: dict[str, Any]) -> list[str]:
    models, s = report["models"], report["settings"]
    names = [md_escape(m["name"]) for m in models]
    class_rows = [[name, *[f"{pct(m['classes'][name]['attention_share'])} / {pct(m['classes'][name]['token_share'])}"
                           for m in models]] for name in CLASSES]
    top = max(len(m["top_words"]) for m in models)
    word_rows = [[str(rank + 1), *[
        (f"{md_escape(m['top_words'][rank]['word'])} ({m['top_words'][rank]['class']}, "
         f"{pct(m['top_words'][rank]['mass_share'])}, {m['top_words'][rank]['mass_per_occurrence']:.2f} × "
         f"{m['top_words'][rank]['occurrences']})") if rank < len(m["top_words"]) else DASH
        for m in models]] for rank in range(top)]
    function = ", ".join(md_escape(w) for w in report["function_words"]) or "(none)"
    return ["## Where attention goes", "",
            "Share of the aggregated attention mass on each class of source piece / share of the source pieces "
            "in that class (a class above its share attracts attention beyond its frequency). Classes: "
            f"`</s>`; punctuation; numbers; function words = the {s['function_words']} most frequent source "
            f"words of this corpus ({function}); other.", "",
            *md_table(["class", *names], class_rows), "",
            figure(report["plots"]["classes"], "attention share by source class"), "",
            "Source words with the most attention mass over the corpus: word (class, share of all mass, "
            "mean mass per occurrence × occurrences; mass = target positions' worth of attention).", "",
            *md_table(["rank", *names], word_rows), ""]


def heads_section(entry: dict[str, Any], settings: dict[str, Any]) -> list[str]:
    per_head, aer, imp = entry["per_head"], entry["aer"], entry["importance"]
    header = ["layer", "head", *[label for _, label in HEAD_COLUMNS]]
    header += ["AER ↓"] if aer is not None else []
    header += ["Δ loss"] if imp else []
    header += ["Δ BLEU"] if imp and imp["delta_bleu"] is not None else []
    rows = []
    for layer in range(entry["layers"]):
        for head in range(entry["heads"]):
            row = [str(layer), str(head)]
            row += [pct(per_head[key][layer][head]) if "share" in key else num(per_head[key][layer][head])
                    for key, _ in HEAD_COLUMNS]
            row += [num(aer[layer][head])] if aer is not None else []
            row += [num(imp["delta_loss"][layer][head], "+.3f")] if imp else []
            row += [num(imp["delta_bleu"][layer][head], "+.2f")] if imp and imp["delta_bleu"] is not None else []
            rows.append(row)
    lines = [f"## {md_escape(entry['name'])}: {entry['model']}", "",
             f"{counted(entry['sentences'], 'sentence')}, {counted(entry['target_rows'], 'target position')}; "
             f"`{entry['checkpoint']}`.", "", *md_table(header, rows), "",
             figure(entry["plots"]["heads"], f"layer x head statistics of {entry['name']}"), ""]
    if imp is None:
        return lines + [f"Head importance: {entry['importance_note']}.", ""]
    bleu_on = settings["bleu_sentences"]
    reference = "the references" if settings["reference"] else "the unpruned model's translations"
    pruning_rows = [[str(p["k"]), num(p["loss"]), num(p["bleu"], ".2f"),
                     ", ".join(f"{lay}.{h}" for lay, h in p["heads"][-1:]) or DASH] for p in imp["pruning"]]
    return lines + [
        "Head importance: Δ loss = teacher-forced loss with the head masked minus the loss of the full model "
        f"({num(imp['loss'])}); Δ BLEU on the first {counted(bleu_on, 'sentence')} against {reference}. "
        "Pruning masks the k least important heads (by Δ loss) together:", "",
        *md_table(["k", "loss", "BLEU", "last head pruned (layer.head)"], pruning_rows), ""]


def settings_section(report: dict[str, Any]) -> list[str]:
    s, v = report["settings"], report["versions"]
    return ["## Settings", "", "```", report["command"], "```", "",
            f"- input: `{s['input']}` ({counted(s['lines'], 'line')}, {s['sentences']:,} analysed: empty lines are "
            "skipped)",
            f"- attention from: {s['attention_from']}"
            + (f" (`{s['reference']}`)" if s["reference"] else ""),
            f"- gold alignments: `{s['gold_alignments']}`" if s["gold_alignments"] else "- gold alignments: none",
            f"- seq2seq {v['seq2seq']}, torch {v['torch']}, sacrebleu {v['sacrebleu']}, Python {v['python']}, "
            f"{v['platform']}, {v['cpus']} CPUs; {report['date']}", ""]


def render_markdown(report: dict[str, Any]) -> str:
    names = " vs ".join(md_escape(m["name"]) for m in report["models"])
    lines = [f"# Attention analysis: {names}", "",
             f"Decoder cross-attention over {counted(report['settings']['sentences'], 'sentence')}, read while "
             f"force-decoding the {report['settings']['attention_from']}. Statistics are defined in "
             f"{GUIDE}; every number is in report.json.", "",
             *summary_section(report), *concentration_section(report)]
    if "pruning" in report["plots"]:
        lines += ["## Pruning", "", *[figure(p, "pruning curve") for p in report["plots"]["pruning"]], ""]
    for entry in report["models"]:
        lines += heads_section(entry, report["settings"])
    return "\n".join(lines + settings_section(report))
