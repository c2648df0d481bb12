"""``seq2seq fairness``: the probe run over models, and its report directory (markdown, JSON, plots)."""
from __future__ import annotations

import json
import shlex
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ...alignment.matrices import check_layer_heads
from ...config import AlignConfig, DecodeConfig
from ...errors import UserError
from ...io_utils import check_report_dir, display_path, read_lines
from ...runtime import log
from ..compare.decode import System, load_system, resolve_checkpoint, system_names
from ..compare.report import staged_directory, versions
from . import occupations as occupation_probe
from .probe import KINDS, VERDICTS, Pair, add_evidence, measure, summary
from .render import render_markdown
from .swaps import Swapped, Swapper, swapper_for


@dataclass
class FairnessJob:
    """What ``seq2seq fairness`` takes: the models, the input sentences, the languages and lists, and what to
    measure. ``argv`` is the command line the report records."""

    checkpoint: list[str]  # run directories (their best.pt) or .pt files; one report column each
    input: str  # source sentences, one per line: those with group terms are probed
    output_dir: str  # the report directory (new, or an earlier report to replace)
    names: list[str] | None = None
    src: str | None = None  # the languages (None: the checkpoint's)
    tgt: str | None = None
    swap_list_src: str | None = None  # the user's swap lists (None: the shipped list of the language)
    swap_list_tgt: str | None = None
    occupations: bool | None = None  # the English -> German occupation probe (None: when the models are en -> de)
    attribution: str = "gradient"  # the attribution method of the evidence ("none": attention only)
    evidence_sentences: int = 100  # attribution of the first N pairs (attention: all)
    max_sentences: int = 0  # probe at most N sentences with group terms (0 = all)
    examples: int = 5  # pairs shown per model in the report
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    align: AlignConfig = field(default_factory=AlignConfig)
    device: str = "auto"
    quiet: bool = False
    argv: list[str] = field(default_factory=list)


def languages(systems: list[System], job: FairnessJob) -> tuple[str, str]:
    """(source, target) language: the flags, else the models' (which must agree)."""
    found = {system.translator.languages for system in systems} - {None}
    if len(found) > 1 and not (job.src and job.tgt):
        raise UserError(f"the checkpoints translate different language pairs ({', '.join(sorted(map(str, found)))}); "
                        "probe one pair at a time, or give --src and --tgt")
    src, tgt = next(iter(found), (None, None))
    src, tgt = job.src or src, job.tgt or tgt
    if not src or not tgt:
        raise UserError("the checkpoint does not say its languages; give --src and --tgt (e.g. --src de --tgt en)")
    return src, tgt


def check_args(job: FairnessJob) -> None:
    from ...attribution.base import METHODS

    if job.attribution != "none" and job.attribution not in METHODS:
        raise UserError(f"--attribution {job.attribution!r}: choose one of {', '.join(METHODS)} or none")
    for flag, value, least in (("--evidence-sentences", job.evidence_sentences, 0),
                               ("--max-sentences", job.max_sentences, 0), ("--examples", job.examples, 0)):
        if value < least:
            raise UserError(f"{flag} must be an integer >= {least}, got {value}")


def swapped_inputs(job: FairnessJob, swapper: Swapper) -> tuple[list[tuple[int, Swapped]], int]:
    """(line, swap) of the input lines with group terms (at most ``max_sentences``), and the lines read."""
    lines = read_lines(job.input, "--input")
    chosen = []
    for number, line in enumerate(lines, 1):
        swapped = swapper.swap(line.strip())
        if swapped.terms:
            chosen.append((number, swapped))
            if job.max_sentences and len(chosen) == job.max_sentences:
                break
    if not chosen:
        raise UserError(f"--input {job.input}: no line holds a word of the {swapper.swap_list.language} swap list "
                        f"({job.swap_list_src or 'shipped'}); give sentences that mention the groups")
    return chosen, len(lines)


def probe_model(system: System, inputs: list[tuple[int, Swapped]], job: FairnessJob, target: Swapper,
                groups: tuple[str, str]) -> dict[str, Any]:
    """The probe of one model (``target``: the swapper of its output language): pairs, their summary, the
    occupation probe."""
    translator = system.translator
    align = job.align.for_model(translator.supervised_attention)  # a guided model: its supervised heads
    started = time.perf_counter()
    texts = [swapped.source for _, swapped in inputs] + [swapped.text for _, swapped in inputs]
    log("translate", model=system.name, sentences=len(texts), quiet=job.quiet)
    translations = translator.translate(texts, job.decode, need_attention=True, progress=not job.quiet)
    n = len(inputs)
    pairs: list[Pair] = []
    for k, (line, swapped) in enumerate(inputs):
        pair = measure(line, swapped, (translations[k].text, translations[n + k].text), target, groups)
        record = translations[n + k].alignment_record(0, align.layer, align.heads, include_eos=True)
        add_evidence(pair, "attention", record.words, record.src_words[:-1], record.tgt_words[:-1])
        if job.attribution != "none" and k < job.evidence_sentences and translations[n + k].tokens:
            from ...attribution.attribute import attribute_translation

            attributed = attribute_translation(translator, translations[n + k], job.attribution, align=job.align)
            record = attributed.record_for(translations[n + k], 0, include_eos=True)
            add_evidence(pair, job.attribution, record.words, record.src_words[:-1], record.tgt_words[:-1])
        pairs.append(pair)
    entry: dict[str, Any] = {"name": system.name, "checkpoint": display_path(system.checkpoint), "model": system.model,
                             "align": {"layer": align.layer, "heads": align.heads}, **summary(pairs, groups),
                             "occupations": None}
    if job.occupations:
        sentences = occupation_probe.probe_sentences()
        log("occupations", model=system.name, sentences=len(sentences), quiet=job.quiet)
        outputs = translator.translate([s.text for s in sentences], job.decode, need_attention=False)
        entry["occupations"] = occupation_probe.score(sentences, [t.text for t in outputs])
        shown = [{"source": s.text, "output": t.text, "expected": s.gender, "found": s.occupation.gender_of(t.text)}
                 for s, t in zip(sentences, outputs)]  # the wrong gender first, then the unrecognised
        shown.sort(key=lambda e: (e["found"] is None, e["found"] == e["expected"]))
        entry["occupation_examples"] = shown[: 2 * job.examples]
    entry["seconds"] = time.perf_counter() - started
    entry["pairs_detail"] = [pair.as_json() for pair in pairs]
    entry["examples"] = examples(pairs, job.examples)
    return entry


def examples(pairs: list[Pair], count: int) -> dict[str, list[dict]]:
    """The least stable pairs and the swaps the output ignored (``count`` each)."""
    unstable = sorted((p for p in pairs if p.chrf < 100.0), key=lambda p: p.chrf)[:count]
    ignored = [p for p in pairs if p.verdict in ("ignored", "partial")][:count]
    return {"least_stable": [p.as_json() for p in unstable], "not_faithful": [p.as_json() for p in ignored]}


def fairness(job: FairnessJob) -> Path:
    """Everything ``seq2seq fairness`` does; returns the report directory. Inputs are checked before any
    model runs; the directory appears only when complete."""
    check_args(job)
    out = Path(job.output_dir)
    check_report_dir(out, "--output-dir", "fairness")
    checkpoints = [resolve_checkpoint(run) for run in job.checkpoint]
    names = system_names(checkpoints, job.names)
    systems = [load_system(str(ckpt), name, job.device) for ckpt, name in zip(checkpoints, names)]
    src, tgt = languages(systems, job)
    source, target = swapper_for(src, job.swap_list_src, "--src"), swapper_for(tgt, job.swap_list_tgt, "--tgt")
    if job.occupations and (src, tgt) != ("en", "de"):
        raise UserError(f"--occupations probes English -> German; the models translate {src} -> {tgt}")
    job = replace(job, occupations=(src, tgt) == ("en", "de") if job.occupations is None else job.occupations)
    for system in systems:
        own = job.align.for_model(system.translator.supervised_attention)
        check_layer_heads(own.layer, own.heads, system.translator.model)
    inputs, lines = swapped_inputs(job, source)
    groups = source.swap_list.groups
    models = [probe_model(system, inputs, job, target, groups) for system in systems]
    report = {"command": "seq2seq fairness " + shlex.join(job.argv), "versions": versions(),
              "input": display_path(job.input), "lines": lines, "probed": len(inputs), "src": src, "tgt": tgt,
              "groups": list(groups),
              "lists": {src: job.swap_list_src or "shipped", tgt: job.swap_list_tgt or "shipped"},
              "attribution": job.attribution, "evidence_sentences": job.evidence_sentences,
              "align": {"layer": job.align.layer, "heads": job.align.heads}, "beam_size": job.decode.beam_size,
              "verdicts": list(VERDICTS), "kinds": list(KINDS), "models": models}
    with staged_directory(out) as root:
        report["plots"] = [p.relative_to(root).as_posix() for p in figures(report, root / "plots")]
        (root / "report.json").write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        (root / "report.md").write_text(render_markdown(report), encoding="utf-8")
    log("report", path=out / "report.md", quiet=job.quiet)
    return out


def figures(report: dict, plots: Path) -> list[Path]:
    """Faithfulness by swap direction, evidence by kind of target word, occupation accuracy by gender."""
    from ...alignment.plotting import plot_grouped_bars

    plots.mkdir(parents=True, exist_ok=True)
    models = report["models"]
    directions = [d for d in models[0]["faithfulness"] if d != "all"]
    paths = plot_grouped_bars(directions, {m["name"]: [m["faithfulness"].get(d, {}).get("faithful") for d in directions]
                                           for m in models}, "swap", "faithful pairs (%)", plots / "faithfulness.png",
                              title="Outputs that carry the swapped group", formats=("png",))
    for source in sorted({s for m in models for s in m["evidence"]}):
        series = {m["name"]: [m["evidence"].get(source, {}).get(kind, {}).get("mean_share") for kind in KINDS]
                  for m in models}
        paths += plot_grouped_bars(list(KINDS), {k: [None if v is None else 100 * v for v in vals]
                                                 for k, vals in series.items()},
                                   "target words", "share on the swapped source word (%)",
                                   plots / f"evidence_{source}.png", title=f"Where the words look ({source})",
                                   formats=("png",))
    scored = [m for m in models if m["occupations"]]
    if scored:
        keys = ("accuracy_male", "accuracy_female", "accuracy_pro", "accuracy_anti")
        paths += plot_grouped_bars(["he/his", "she/her", "pro-stereotype", "anti-stereotype"],
                                   {m["name"]: [m["occupations"][k] for k in keys] for m in scored},
                                   "sentences", "occupation noun of the pronoun's gender (%)",
                                   plots / "occupations.png", title="Occupations (English -> German)", formats=("png",))
    return paths
