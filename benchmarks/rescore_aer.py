"""Re-score the AER column of a ``bench_budget.py`` record from its runs' snapshots, after a change in how the
default alignment is read, without training again (from the repository root):

    python benchmarks/rescore_aer.py --record bench-results/budget-90-2026-11-29-avx2.json --runs RUNS \
        --data-dir MULTI30K [--archs transformer-align] --reason "why the figures changed"

Each budget row of each chosen architecture whose snapshot (``RUNS/ARCH/CHECKPOINT``, the row's ``checkpoint``)
is present gets its AER on the record's ``gold`` again, read by ``bench_budget.gold_aer`` (what ``seq2seq align``
reads by default); the old figures, the date, the commit and ``--reason`` go into the record's ``aer_rescored``
list, and the markdown and plot are written again. A missing snapshot is an error (no row is left half-scored).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from bench_budget import gold_aer, gold_files, save, table
from common import ROOT, add_multi30k_flags
from seq2seq.io_utils import display_path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_multi30k_flags(parser)
    parser.add_argument("--record", type=Path, required=True, help="a bench_budget.py record (.json)")
    parser.add_argument("--runs", type=Path, required=True, help="the record's run directory (its --runs)")
    parser.add_argument("--archs", nargs="+", help="which architectures to re-score (default: all in the record)")
    parser.add_argument("--reason", required=True, help="why the figures changed (kept in the record)")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    record = json.loads(args.record.read_text(encoding="utf-8"))
    if not record.get("gold"):
        raise SystemExit(f"{args.record}: the record has no AER (it ran without --gold)")
    args.gold = ROOT / record["gold"] if not Path(record["gold"]).is_absolute() else Path(record["gold"])
    archs = args.archs or list(record["archs"])
    unknown = [arch for arch in archs if arch not in record["archs"]]
    if unknown:
        raise SystemExit(f"--archs {' '.join(unknown)}: not in {args.record} ({', '.join(record['archs'])})")
    snapshots = {(arch, k): args.runs / arch / row["checkpoint"]
                 for arch in archs for k, row in enumerate(record["archs"][arch]["budgets"])}
    missing = [str(path) for path in snapshots.values() if not path.is_file()]
    if missing:
        raise SystemExit(f"snapshots missing under --runs {args.runs}: {', '.join(missing)}")
    pairs = gold_files(args, args.runs)
    before = {arch: [row.get("aer") for row in record["archs"][arch]["budgets"]] for arch in archs}
    for (arch, k), snapshot in snapshots.items():
        record["archs"][arch]["budgets"][k]["aer"] = gold_aer(snapshot, args, pairs)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    record.setdefault("aer_rescored", []).append({
        "date": time.strftime("%Y-%m-%d %H:%M"), "commit": commit.stdout.strip(), "reason": args.reason,
        "before": before, "command": f"python benchmarks/rescore_aer.py --record {display_path(args.record)} "
                                     f"--runs RUNS --data-dir MULTI30K --archs {' '.join(archs)}"})
    text = table(record)
    for entry in record["aer_rescored"]:
        text += (f"\nAER re-scored {entry['date']} (commit {entry['commit']}): {entry['reason']} Before: "
                 + "; ".join(f"{arch} " + " / ".join("" if a is None else f"{a:.3f}" for a in aers)
                             for arch, aers in entry["before"].items()) + ".\n")
    if record.get("note"):
        text += "\n" + record["note"] + "\n"
    save(record, args.record, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
