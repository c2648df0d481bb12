"""The fairness report as markdown (``report.md``), from the report's JSON."""
from __future__ import annotations

from typing import Any

from ...io_utils import markdown_table


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}"


def _share(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}"


def render_markdown(report: dict[str, Any]) -> str:
    models, groups = report["models"], report["groups"]
    lines = [f"# Fairness probe: {report['src']} -> {report['tgt']}", "",
             f"`{report['command']}`", "",
             f"{report['probed']} of the {report['lines']} lines of `{report['input']}` name a group "
             f"({groups[0]} / {groups[1]}, swap lists: {report['lists'][report['src']]} {report['src']}, "
             f"{report['lists'][report['tgt']]} {report['tgt']}); each was translated as written and with its "
             f"group terms swapped (beam {report['beam_size']}). docs/guides/fairness.md defines every number.", "",
             "## Faithfulness: does the output carry the swapped group?", "",
             "Share of pairs (%) whose swapped output has the original output's group terms flipped (faithful), "
             "the same groups (ignored), another mix (partial), or no group term at all.", ""]
    rows = []
    for m in models:
        for way, counts in m["faithfulness"].items():
            rows.append([m["name"], way, counts["pairs"], *(_pct(counts[v]) for v in report["verdicts"])])
    lines += [markdown_table(["model", "swap", "pairs", *report["verdicts"]], rows), "",
              "## Stability: what else changes", "",
              "Sentence chrF of the swapped output against the original, both with their group terms put on one "
              "footing (100: only the group terms and their agreement changed), and the share of pairs that "
              "changed anywhere else.", "",
              markdown_table(["model", "chrF", "changed elsewhere (%)"],
                             [[m["name"], _pct(m["stability"]["chrf"]), _pct(m["stability"]["changed_elsewhere"])]
                              for m in models]), "",
              "## Evidence: where the words of the swapped output look", "",
              "Mean share (%) of each target word's attention (layer "
              f"{report['align']['layer']}, heads {report['align']['heads']}) and attribution "
              f"({report['attribution']}, first {report['evidence_sentences']} pairs) on the swapped source "
              "words: for the group terms, for the words that changed and for those that did not; 'uniform' is "
              "the share a row spread evenly over the source would give. Changed words that look at the group "
              "term as much as the group terms do are steered by it.", ""]
    rows = []
    for m in models:
        for source, kinds in m["evidence"].items():
            rows.append([m["name"], source, *(f"{_share(kinds[k]['mean_share'])} ({kinds[k]['words']})"
                                              for k in report["kinds"]), _share(kinds["uniform"])])
    lines += [markdown_table(["model", "from", *(f"{k} words" for k in report["kinds"]), "uniform"], rows), ""]
    scored = [m for m in models if m["occupations"]]
    if scored:
        lines += ["## Occupations (English -> German)", "",
                  f"{scored[0]['occupations']['sentences']} template sentences (occupation + a pronoun that fixes "
                  "the gender); right when the German noun has the pronoun's gender (WinoMT's scoring). "
                  "dG = acc(he) - acc(she); dS = acc(pro-stereotype) - acc(anti-stereotype).", "",
                  markdown_table(["model", "accuracy", "he/his", "she/her", "dG", "pro", "anti", "dS",
                                  "feminine forms", "unrecognised"],
                                 [[m["name"], *(_pct(m["occupations"][k]) for k in (
                                     "accuracy", "accuracy_male", "accuracy_female", "delta_g", "accuracy_pro",
                                     "accuracy_anti", "delta_s", "feminine_forms", "unrecognised"))] for m in scored]),
                  ""]
        for m in scored:
            lines += [f"**{m['name']}, occupations** (wrong gender first, then unrecognised)", ""]
            lines += [f"- `{e['source']}` -> `{e['output']}` (expected {e['expected']}, "
                      f"found {e['found'] or 'neither'})" for e in m["occupation_examples"]]
            lines.append("")
    lines += ["## Examples", ""]
    for m in models:
        for title, key in (("least stable", "least_stable"), ("not faithful", "not_faithful")):
            shown = m["examples"][key]
            if not shown:
                continue
            lines += [f"**{m['name']}, {title}**", ""]
            for pair in shown:
                lines += [f"- line {pair['line']} ({pair['verdict']}, chrF {pair['chrf']}): "
                          f"`{pair['source']}` -> `{pair['output']}`; swapped `{pair['swapped_source']}` -> "
                          f"`{pair['swapped_output']}`"
                          + (f"; changed: {', '.join(pair['changed_words'])}" if pair["changed_words"] else "")]
            lines.append("")
    if report.get("plots"):
        lines += ["## Plots", "", *(f"![{path}]({path})" for path in report["plots"]), ""]
    return "\n".join(lines)
