"""The README's results tables, written from the records they cite (issue 65), from the repository root:

    python benchmarks/readme_results.py            # rewrite README.md's results section from the records
    python benchmarks/readme_results.py --check    # exit 1 with a unified diff when README.md differs from them

The tables are data (``TABLES``; the machinery is ``readme_tables.py``): rows, each a label, the record it comes
from (a JSON file under ``bench-results/``) and its cells, small functions of the loaded record with a format. The
section between ``START`` and ``END`` in README.md is written from them, atomically; every row links its record,
and every sentence about who leads is generated from the rows or records it names, with their dates. A row whose
record, or a field it reads, is missing is an error naming the row, the record and the key. Adding a record to the
README is one line in ``RACE`` or ``PEERS`` and a run of this script.
"""
from __future__ import annotations

import argparse
import difflib
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from common import ROOT
from readme_tables import (END, START, Cell, Loaded, MissingField, RecordError, Row, Table, at, both, dig,
                           link, load_record, load_row, markdown, read, render_section)

__all__ = ["Cell", "RecordError", "Row", "Table", "at"]  # the machinery's names tests and callers use from here


def render(root: Path = ROOT, tables: tuple[Table, ...] | None = None) -> str:
    """The README's results section, both markers included, from the records under ``root`` (``TABLES``)."""
    return render_section(root, tables or TABLES)


# --- the race: presets by training budget -------------------------------------------------------------------

RACE_HEADER = ("system", "minutes", "cores", "updates", "test BLEU", "test chrF", "val BLEU greedy",
               "AER (val gold)", "CPU")


def budget_field(record: dict, arch: str, minutes: float, key: str) -> Any:
    """Field ``key`` of ``bench_budget.py``'s row of ``arch`` at ``minutes`` (``archs[arch].budgets[i]``)."""
    entry = next((entry for entry in dig(record, "archs", arch, "budgets") if entry.get("budget_minutes") == minutes),
                 {})
    if key not in entry:
        raise MissingField(f"archs.{arch}.budgets[budget_minutes={minutes:g}]" + (f".{key}" if entry else ""))
    return entry[key]


def budget_cores(record: dict) -> int:
    """Cores of one run of a ``bench_budget.py`` record: split between the runs with ``--parallel``."""
    return dig(record, "threads_per_run") if dig(record, "parallel") else dig(record, "machine", "torch_threads")


def alignment_cores(record: dict) -> int:
    """Cores of one run of a ``bench_alignment.py`` record: half of them with ``--parallel`` (two at a time)."""
    if dig(record, "parallel"):
        return max(1, dig(record, "machine", "cpus") // 2)
    return dig(record, "machine", "torch_threads")


CPU = Cell(both(at("machine", "cpu"), at("machine", "cpu_capability")), "{} {}")


def budget_row(record: str, arch: str, minutes: float) -> Row:
    """A race row from a ``bench_budget.py`` record: preset ``arch`` at ``minutes`` of its run."""
    def field(key: str) -> Callable[[dict], Any]:
        return lambda record: budget_field(record, arch, minutes, key)

    return Row(f"`{arch}`", record, (
        Cell(field("budget_minutes"), "{:g}"), Cell(budget_cores), Cell(field("step"), "{:,}"),
        Cell(field("test_bleu"), "{:.2f}"), Cell(field("test_chrf"), "{:.1f}"),
        Cell(field("val_greedy_bleu"), "{:.2f}"), Cell(field("aer"), "{:.3f}", optional=True), CPU))


def alignment_row(record: str, run: str, preset: str, note: str = "") -> Row:
    """A race row from a ``bench_alignment.py`` record: its run ``run``, which trained ``preset`` (and ``note``:
    how, after the preset's name)."""
    return Row(f"`{preset}`{note and ', ' + note}", record, (
        Cell(at("minutes"), "{:g}"), Cell(alignment_cores), Cell(at("runs", run, "steps"), "{:,}"),
        Cell(at("runs", run, "test_bleu"), "{:.2f}"), Cell(at("runs", run, "test_chrf"), "{:.1f}"),
        Cell(at("runs", run, "valid_bleu"), "{:.2f}"), Cell(at("runs", run, "default", "aer"), "{:.3f}"), CPU))


def race_leaders(root: Path, loaded: list[Loaded]) -> str:
    """Who leads by test BLEU (as the table writes it) among the rows of one race record (``bench_budget.py``: the
    runs trained side by side) at one budget, per such group, dated and linked."""
    groups: dict[tuple[str, float], list[Loaded]] = {}
    for item in (item for item in loaded if item.record.get("benchmark") == "budget"):
        groups.setdefault((item.row.record, item.values["minutes"]), []).append(item)
    verdicts = []
    for (name, minutes), items in groups.items():
        if len(items) > 1:
            first, second = sorted(items, key=lambda item: round(item.values["test BLEU"], 2), reverse=True)[:2]
            margin = round(first.values["test BLEU"], 2) - round(second.values["test BLEU"], 2)
            cores = f"{first.values['cores']} core{'s' if first.values['cores'] != 1 else ''} each"
            verdicts.append(f"{first.row.label} at {minutes:g} minutes ({cores}) by {margin:.2f} "
                            f"({read('The race, who leads', name, first.record, at('date'))[:10]}, {link(root, name)})")
    return f"Who leads by test BLEU: {'; '.join(verdicts)}." if verdicts else ""


RACE = Table(
    "The race",
    "the presets of both architectures as of each record's date, `rnn-bahdanau` and `transformer-align` (since "
    "2026-11-29 `rnn-bahdanau` trains with 1,000-token batches on a CPU, the AVX-512 rows with 2,000), by minutes "
    "of training on Multi30k de->en, side by side on one core each of a 2-core CPU (the rows with 2 cores: one "
    "preset alone on both, as a user of that machine trains it); test `test_2016_flickr` at beam 5, val BLEU "
    "greedy, AER of the default alignment on 100 hand-aligned `val` pairs (`transformer-align`'s supervised head; "
    "none where a record kept only a reading of all heads). The 25-minute rows are 25-minute runs, "
    "their best checkpoint (`transformer-align`'s schedule decays to 25 minutes; each 1-core run ran beside another"
    " run of its record); the `budget-90` rows test the 90-minute runs' snapshots at that minute (the schedule "
    "decays to 90 minutes). An AVX2-only EPYC makes about 60% of an AVX-512 EPYC's Transformer updates; a lead "
    "under a point is within what a second seed moves (docs/benchmarks.md).",
    RACE_HEADER,
    (
        alignment_row("alignment-2026-11-29-avx2-presets.json", "rnn-1000-tokens", "rnn-bahdanau"),
        alignment_row("alignment-2026-11-29-avx2-binary.json", "transformer-align", "transformer-align"),
        alignment_row("alignment-2026-11-29-avx2-rnn-two-cores.json", "rnn", "rnn-bahdanau"),
        budget_row("budget-90-2026-11-29-avx2.json", "rnn-bahdanau", 90),
        budget_row("budget-90-2026-11-29-avx2.json", "transformer-align", 90),
        budget_row("budget-90-2026-11-29-avx2-transformer-two-cores.json", "transformer-align", 90),
        budget_row("budget-90-2026-11-28.json", "rnn-bahdanau", 90),
        budget_row("budget-90-2026-11-28.json", "transformer-align", 90),
    ),
    race_leaders,
)


# --- against the peers: 12 minutes each, same session -------------------------------------------------------

PEERS_HEADER = ("system", "BLEU greedy / beam 5", "greedy sent/s", "beam 5 sent/s", "batch 1 sent/s")
BLEU_PAIR = "{:.2f} / {:.2f}"
SPEED = "{:,.1f}"


def ours_decode_row(label: str, record: str, system: str, precision: str = "") -> Row:
    """A peers row from a ``bench.py decode`` record: ``system``'s BLEU (first repeat; repeats decode alike) and
    median sentences/s, in fp32 or with ``precision`` (``int8``: the ``*_int8`` rows)."""
    suffix = f"_{precision}" if precision else ""
    return Row(label, record, (
        Cell(both(at("runs", system, 0, f"greedy{suffix}", "bleu"), at("runs", system, 0, f"beam5{suffix}", "bleu")),
             BLEU_PAIR),
        *(Cell(at("median_sentences_per_s", system, f"{mode}{suffix}"), SPEED)
          for mode in ("greedy", "beam5", "greedy_bs1"))))


def onmt_row(label: str, record: str) -> Row:
    """A peers row from an OpenNMT-py record (``benchmarks/peers/onmt``): its decodes' BLEU and sentences/s."""
    return Row(label, record, (
        Cell(both(at("decode", "greedy", "bleu"), at("decode", "beam5", "bleu")), BLEU_PAIR),
        *(Cell(at("decode", mode, "sents_per_s"), SPEED) for mode in ("greedy", "beam5", "greedy_bs1"))))


#: Training speed at the peers' sizes: (architecture, our ``bench.py speed`` system, OpenNMT-py's record).
TRAINING_SPEED = (("RNN", "rnn-bahdanau", "peers/onmt_rnn-2026-11-25.json"),
                  ("Transformer", "transformer", "peers/onmt_transformer-2026-11-25.json"))
OUR_TRAINING_RUNS = ("speed-2026-11-25-training-run1.json", "speed-2026-11-25-training-run2.json")


def peers_training(root: Path, loaded: list[Loaded]) -> str:
    """Who trains faster, ours (``OUR_TRAINING_RUNS``: short runs at the peers' sizes) or OpenNMT-py (its full
    runs), in target tokens/s per architecture, dated and linked."""
    owner = f"{PEERS.title}, training speed"
    ours = {name: load_record(root, name, owner) for name in OUR_TRAINING_RUNS}
    parts, peers = [], {}
    for arch, system, name in TRAINING_SPEED:
        peers[name] = load_record(root, name, owner)
        speeds = sorted(read(owner, ours_name, record, at("train", system, "tgt_tokens_per_s"))
                        for ours_name, record in ours.items())
        peer = read(owner, name, peers[name], at("train", "tgt_tok_per_s"))
        parts.append(f"{arch} {speeds[0]:,.0f}-{speeds[-1]:,.0f}, {speeds[0] / peer:.2f}-{speeds[-1] / peer:.2f}x "
                     f"OpenNMT-py's {peer:,.0f}")
    records = {**ours, **peers}
    dates = sorted({read(owner, name, record, at("date"))[:10] for name, record in records.items()})
    return (f"Training at the peers' sizes, target tokens/s ({', '.join(dates)}; ours in two short runs): "
            f"{'; '.join(parts)} ({', '.join(link(root, name) for name in records)}).")


PEERS = Table(
    "Against the peers",
    "Multi30k de->en, 12 minutes of training each at the peers' model sizes (OpenNMT-py 3.5.1: its 12-minute "
    "update counts), `test_2016_flickr`; ours and OpenNMT-py in one session on 2026-11-25 (AVX2-only AMD EPYC, "
    "2 cores, torch 2.13). Joey NMT 2.3.0 and all other results, dated: [docs/benchmarks.md](docs/benchmarks.md); "
    "why it is fast: [docs/performance.md](docs/performance.md).",
    PEERS_HEADER,
    (
        ours_decode_row("ours, RNN (fp32)", "decode-2026-11-25-int8-rnn.json", "rnn-bahdanau"),
        ours_decode_row("ours, RNN, `--precision int8`", "decode-2026-11-25-int8-rnn.json", "rnn-bahdanau", "int8"),
        onmt_row("OpenNMT-py 3.5.1, RNN", "peers/onmt_rnn-2026-11-25.json"),
        ours_decode_row("ours, Transformer (fp32)", "decode-2026-11-25-int8-transformer.json", "transformer"),
        ours_decode_row("ours, Transformer, `--precision int8`", "decode-2026-11-25-int8-transformer.json",
                        "transformer", "int8"),
        onmt_row("OpenNMT-py 3.5.1, Transformer", "peers/onmt_transformer-2026-11-25.json"),
    ),
    peers_training,
)

TABLES = (RACE, PEERS)


# --- the README ---------------------------------------------------------------------------------------------

def split_readme(text: str) -> tuple[str, str, str]:
    """README text before the results section, the section (both markers included), and after it."""
    start, end = text.find(START), text.find(END)
    if start < 0 or end < start:
        raise RecordError(f"README.md has no results section between {START!r} and {END!r}")
    end += len(END)
    return text[:start], text[start:end], text[end:]


def rewritten(root: Path = ROOT) -> tuple[str, str]:
    """README.md under ``root`` as it is and as the records give it."""
    text = (root / "README.md").read_text(encoding="utf-8")
    before, _, after = split_readme(text)
    return text, before + render(root) + after


def stale_rows(root: Path, current: str) -> list[str]:
    """The rows (named as errors name them) whose line in the ``current`` README differs from their record."""
    section = split_readme(current)[1].splitlines()
    return [table.owner(row) for table in TABLES for row in table.rows
            if markdown(root, table, [load_row(root, table, row)]).splitlines()[-1] not in section]


def check(root: Path = ROOT) -> str:
    """What differs between README.md and its records ('' when nothing): the stale rows and a unified diff."""
    current, expected = rewritten(root)
    if current == expected:
        return ""
    rows = stale_rows(root, current) or ["its results section"]
    diff = difflib.unified_diff(current.splitlines(keepends=True), expected.splitlines(keepends=True),
                                "README.md", "README.md (from the records)")
    return ("".join(f"README.md: {row} differs from its record\n" for row in rows) + "".join(diff)
            + "run `python benchmarks/readme_results.py` to rewrite it\n")


def write(root: Path = ROOT) -> bool:
    """Rewrite README.md's results section from the records, atomically; whether it changed."""
    from seq2seq.io_utils import atomic_output

    current, expected = rewritten(root)
    if current != expected:
        with atomic_output(root / "README.md") as handle:
            handle.write(expected)
    return current != expected


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only compare: exit 1 with a diff when stale")
    parser.add_argument("--root", type=Path, default=ROOT, help="the repository (README.md, bench-results/)")
    args = parser.parse_args(argv)
    try:
        if args.check:
            report = check(args.root)
            sys.stdout.write(report)
            return 1 if report else 0
        print(f"README.md: {'rewritten' if write(args.root) else 'already up to date'}")
    except RecordError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
