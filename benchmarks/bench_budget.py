"""BLEU against training budget for both architectures (issue 26), from the repository root:

    python benchmarks/bench_budget.py --data-dir MULTI30K [--minutes 90] [--eval-minutes 5]
                                      [--budgets 5 10 20 40 90] [--archs rnn-bahdanau transformer-align]
                                      [--runs DIR] [--out FILE.json] [-- extra train flags]

1. **Train** one run per preset (``--archs``: any of ``configs/``; the recipes tuned on ``val``), back to
   back in separate processes with all cores each, or with ``--parallel`` at the same time with the
   cores split evenly between them (a long race fits one sitting; each curve is then one of fewer
   cores), each ``--minutes`` of wall-clock (``--max-minutes``, which counts the whole run), all with
   one SentencePiece model trained beforehand and, for a preset guided by eflomal's links
   (``transformer-align``), those links computed beforehand too (``runs/train.talp``, ``seq2seq wordalign``
   on the training split): no run spends its clock on them. A run validates only on a fixed
   grid of its clock (``--eval-every-minutes``, ``--eval-every 0``: greedy BLEU on the whole ``val``
   split just after every ``--eval-minutes``; those validations also pace the RNN's plateau
   schedule) and keeps a weights snapshot at each (``--keep-last``). A killed run is continued with
   ``--resume`` by running the same command again; a finished one is reused.
2. **Budgets**: for each of ``--budgets`` (minutes) the snapshot of the validation nearest to it
   (``seq2seq.jobs.compare.at_budgets``) translates the test split and ``val`` with beam 5; BLEU
   and chrF (sacreBLEU, cased).
3. **Curves**: where the validation curves of the first two architectures cross, in minutes and in
   updates (``crossings``); one figure with validation BLEU against wall-clock time and against updates
   for every architecture, the budget test scores marked; the record (``--out``: JSON + markdown) and
   the figure (``.png`` beside it).

The plateau and inverse-square-root schedules do not depend on the total budget, so one long run gives
every shorter budget as well; the linear schedule (``transformer-align``) decays to the run's budget, so its
shorter budgets are points on a longer run's curve, not what a run of that budget would reach (train one).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from common import (ROOT, add_multi30k_flags, add_run_flags, copy_tokenizer, gold_pairs, preset_command, provenance,
                    runs_dir, shared_tokenizer, write_record)
from seq2seq.io_utils import markdown_table

ARCHS = ("rnn-bahdanau", "transformer-align")
KEEP_ALL = "1000000"


def run_dir_state(run_dir: Path) -> str:
    """'done' (a summary of a run that was not interrupted), 'resume' (a last.pt) or 'new'."""
    summary = run_dir / "summary.json"
    if summary.is_file() and json.loads(summary.read_text()).get("stopped") != "interrupted":
        return "done"
    return "resume" if (run_dir / "last.pt").is_file() else "new"


def threads_per_run(args: argparse.Namespace) -> int | None:
    """--parallel: the CPU's cores split evenly between the runs (None: each run has them all)."""
    return max(1, (os.cpu_count() or 1) // len(args.archs)) if args.parallel else None


def guided_by_eflomal(preset: str) -> bool:
    """Whether ``preset`` trains with eflomal's links (``guided.links: eflomal``)."""
    from seq2seq.config import PRESETS

    return PRESETS[preset].get("guided", {}).get("links") == "eflomal"


def eflomal_train_links(args: argparse.Namespace, runs: Path) -> Path:
    """``runs/train.talp``: eflomal's links of the training split (``seq2seq wordalign``), computed once before
    the runs start, as the preset would compute them at its start but outside every run's clock."""
    links = runs / "train.talp"
    if not links.is_file():
        source, target = (args.data_dir / f"train.{lang}" for lang in (args.src, args.tgt))
        partial = links.with_suffix(".talp.partial")
        subprocess.run([sys.executable, "-m", "seq2seq", "wordalign", "--source", str(source), "--target", str(target),
                        "--output", str(partial)], check=True, cwd=ROOT)
        partial.replace(links)
    return links


def command(arch: str, args: argparse.Namespace, runs: Path, spm: Path) -> list[str] | None:
    """The training command of ``arch``'s run (continued or new as ``run_dir_state`` says), or None
    when it has finished."""
    run_dir = runs / arch
    state = run_dir_state(run_dir)
    if state == "done":
        return None
    if state == "new":
        shutil.rmtree(run_dir, ignore_errors=True)
        copy_tokenizer(spm, run_dir)
    threads = ["--threads", str(threads_per_run(args))] if args.parallel else []
    links = ["--guided-alignment", str(eflomal_train_links(args, runs))] if guided_by_eflomal(arch) else []
    return preset_command(arch, arch, args, run_dir, "--max-minutes", str(args.minutes), "--eval-every", "0",
                          "--eval-every-minutes", str(args.eval_minutes), "--keep-last", KEEP_ALL, *threads, *links,
                          *(["--resume"] if state == "resume" else []))


def train_all(args: argparse.Namespace, runs: Path, spm: Path) -> dict[str, Path]:
    """Every architecture's run, one after the other, or all at once with ``--parallel``."""
    for group in ([args.archs] if args.parallel else [[arch] for arch in args.archs]):
        commands = [c for c in (command(arch, args, runs, spm) for arch in group) if c is not None]
        processes = [subprocess.Popen(c, cwd=ROOT) for c in commands]
        failed = [c for c, p in zip(commands, processes) if p.wait() != 0]
        if failed:
            raise SystemExit(f"training failed: {' '.join(failed[0])}")
    return {arch: runs / arch for arch in args.archs}


def read_split(args: argparse.Namespace, split: str) -> tuple[list[str], list[str]]:
    return tuple((args.data_dir / f"{split}.{lang}").read_text(encoding="utf-8").splitlines()
                 for lang in (args.src, args.tgt))


def gold_files(args: argparse.Namespace, runs: Path) -> tuple[Path, Path] | None:
    """``--gold``'s sentence pairs (the first lines of ``val``, one per gold line) as ``runs/gold.{src,tgt}``."""
    if args.gold is None:
        return None
    paths = runs / "gold.src", runs / "gold.tgt"
    for path, lines in zip(paths, gold_pairs(args.data_dir, args.src, args.tgt, args.gold)):
        path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return paths


def gold_aer(snapshot: Path, args: argparse.Namespace, gold_pairs: tuple[Path, Path]) -> float:
    """The AER on ``--gold`` of the links ``seq2seq align`` reads from ``snapshot`` by default (forward)."""
    from seq2seq.jobs.align import AlignJob, evaluate

    source, target = gold_pairs
    job = AlignJob(checkpoint=str(snapshot), source=str(source), target=str(target), gold=str(args.gold),
                   device=args.device)
    return evaluate(job)["forward"].aer


def budget_scores(run_dir: Path, curve: list[dict], args: argparse.Namespace, splits: dict,
                  gold_pairs: tuple[Path, Path] | None = None) -> list[dict]:
    """Per budget the run reached: its validation line, snapshot, beam-5 scores on each split and, with
    ``--gold``, the AER of its default alignment."""
    from seq2seq import Translator
    from seq2seq.jobs.compare import at_budgets
    from seq2seq.metrics import corpus_scores
    from seq2seq.checkpoint.kept import KeptCheckpoints

    snapshots = {entry["step"]: run_dir / "checkpoints" / entry["file"] for entry in KeptCheckpoints(run_dir).entries()}
    rows = []
    for minutes, line in at_budgets(curve, args.budgets).items():
        if line is None:
            continue
        snapshot = snapshots[line["step"]]
        translator = Translator.from_checkpoint(snapshot, device=args.device)
        row = {"budget_minutes": minutes, "minutes": line["elapsed"] / 60, "step": line["step"],
               "val_greedy_bleu": line["bleu"], "checkpoint": str(snapshot.relative_to(run_dir))}
        for name, (sources, references) in splits.items():
            hyps = translator.translate(sources, beam_size=args.beam_size, need_attention=False)
            scores = corpus_scores([h.text for h in hyps], references, ("bleu", "chrf"))
            row[f"{name}_bleu"], row[f"{name}_chrf"] = scores["bleu"].score, scores["chrf"].score
            row["signature"] = scores["bleu"].signature
        if gold_pairs is not None:
            row["aer"] = gold_aer(snapshot, args, gold_pairs)
        rows.append(row)
        print(f"[{run_dir.name} @ {minutes:g} min] " + ", ".join(f"{k} {v:.2f}" for k, v in row.items()
                                                                 if k.endswith(("_bleu", "_chrf", "aer"))),
              file=sys.stderr)
    return rows


def how_trained(record: dict) -> str:
    """How the record's runs shared the CPU (the figure title and the table's head say it)."""
    if record.get("parallel"):
        return f"run at the same time with {record['threads_per_run']} thread(s) each"
    return "run one after the other with all cores"


def plot(record: dict, path: Path) -> Path:
    """Validation BLEU (greedy, every validation) against minutes and against updates, one line per
    architecture; the test BLEU (beam 5) of the budget snapshots as markers."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for k, (arch, result) in enumerate(record["archs"].items()):
        color = f"C{k}"
        curve, budgets = result["curve"], result["budgets"]
        for ax, x, bx in ((axes[0], [r["elapsed"] / 60 for r in curve], [b["minutes"] for b in budgets]),
                          (axes[1], [r["step"] for r in curve], [b["step"] for b in budgets])):
            ax.plot(x, [r["bleu"] for r in curve], "-", color=color, label=f"{arch}: val BLEU (greedy)")
            ax.plot(bx, [b["test_bleu"] for b in budgets], "o", color=color, label=f"{arch}: test BLEU (beam 5)")
    axes[0].set_xlabel("wall-clock training time (minutes)")
    axes[1].set_xlabel("updates")
    axes[0].set_ylabel("BLEU")
    for ax in axes:
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8, loc="lower right")
    machine = record["machine"]
    fig.suptitle(f"BLEU against training budget ({machine['cpu']}, {machine['cpus']} CPUs, {how_trained(record)})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def crossing_text(record: dict) -> str:
    names = list(record["archs"])
    if len(names) < 2:
        return ""
    parts = []
    for axis, unit in (("minutes", "minutes"), ("steps", "updates")):
        found = record["crossings"][axis]
        parts.append(f"by {unit}: " + ("the curves do not cross" if not found else ", then ".join(
            f"{names[1] if c['leader'] == 'b' else names[0]} goes ahead at {c['x']:.1f}" for c in found)))
    return f"Validation curves ({names[1]} against {names[0]}): " + "; ".join(parts) + "."


def table(record: dict) -> str:
    rows = [[arch, f"{b['budget_minutes']:g}", f"{b['minutes']:.1f}", b["step"], f"{b['val_greedy_bleu']:.2f}",
             f"{b['val_bleu']:.2f}", f"{b['val_chrf']:.1f}", f"{b['test_bleu']:.2f}", f"{b['test_chrf']:.1f}",
             f"{b['aer']:.3f}" if "aer" in b else ""]
            for arch, result in record["archs"].items() for b in result["budgets"]]
    m = record["machine"]
    head = (f"{record['minutes']:g}-minute runs, {how_trained(record)}, validation every "
            f"{record['eval_minutes']:g} minutes; {m['cpu']} ({m['cpu_capability']}), {m['cpus']} CPUs. "
            f"Test: `{record['test_split']}`, beam {record['beam_size']}.\n\n")
    return (head + markdown_table(["arch", "budget (min)", "at (min)", "updates", "val BLEU greedy", "val BLEU",
                                   "val chrF", "test BLEU", "test chrF", "AER (val gold)"], rows)
            + "\n\n" + crossing_text(record) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_multi30k_flags(parser)
    from seq2seq.config import PRESETS

    parser.add_argument("--archs", nargs="+", choices=list(PRESETS), default=list(ARCHS), metavar="PRESET",
                        help="presets to race, in training order; crossings compare the first two "
                             f"(default: {' '.join(ARCHS)})")
    parser.add_argument("--minutes", type=float, default=90.0, help="wall-clock budget of each run")
    parser.add_argument("--eval-minutes", type=float, default=5.0, help="validation interval on the run's clock")
    parser.add_argument("--budgets", type=float, nargs="+", default=[5, 10, 20, 40, 90],
                        help="minutes at which the nearest snapshot is tested")
    parser.add_argument("--parallel", action="store_true",
                        help="train the architectures at the same time, the CPU's cores split evenly between them "
                             "(--threads), instead of one after the other with all cores")
    parser.add_argument("--beam-size", type=int, default=5)
    parser.add_argument("--gold", type=Path, help="gold alignments (Pharaoh) of the first val pairs: each budget's "
                                                  "AER (e.g. examples/gold-alignments/multi30k-val-de-en.100.align)")
    add_run_flags(parser, "budget.json", "continued or reused")
    args = parser.parse_args(argv)
    from seq2seq.jobs.compare import crossings
    from seq2seq.jobs.compare.curves import curve_points
    from seq2seq.jobs.compare.decode import validation_curve

    runs = runs_dir(args)
    spm = shared_tokenizer(args, runs / "tokenizer")
    run_dirs = train_all(args, runs, spm)
    splits = {"test": read_split(args, args.test_split), "val": read_split(args, "val")}
    gold_pairs = gold_files(args, runs)
    archs = {}
    for arch, run_dir in run_dirs.items():
        summary = json.loads((run_dir / "summary.json").read_text())
        curve = validation_curve(run_dir / "metrics.jsonl")
        archs[arch] = {"run": str(run_dir), "parameters": summary["parameters"], "steps": summary["steps"],
                       "elapsed_s": summary["elapsed_s"], "train_tgt_tokens_per_s": summary["train_tgt_tokens_per_s"],
                       "curve": [{k: r.get(k) for k in ("step", "elapsed", "bleu", "chrf", "loss")} for r in curve],
                       "budgets": budget_scores(run_dir, curve, args, splits, gold_pairs)}
    curves = [archs[a]["curve"] for a in args.archs[:2]]
    record = {**provenance("budget"), "minutes": args.minutes, "eval_minutes": args.eval_minutes,
              "parallel": args.parallel, "threads_per_run": threads_per_run(args),
              "budgets": args.budgets, "beam_size": args.beam_size, "test_split": args.test_split,
              "gold": str(args.gold) if args.gold else None,
              "extra_flags": args.extra, "archs": archs,
              "crossings": {axis: crossings(*(curve_points(c, axis) for c in curves)) if len(curves) == 2 else []
                            for axis in ("minutes", "steps")}}
    save(record, args.out, table(record))
    return 0


def save(record: dict, path: Path, text: str) -> None:
    """``record`` as JSON at ``path``, ``text`` as its markdown and its plot (.png) beside it; ``text`` printed."""
    write_record(path, record, text)
    plot(record, path.with_suffix(".png"))
    print(text)


if __name__ == "__main__":
    sys.exit(main())
