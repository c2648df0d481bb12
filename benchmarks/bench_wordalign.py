"""A corpus word aligner against eflomal: ``seq2seq wordalign --method model`` and ``seq2seq wordalign`` (eflomal)
on one corpus, scored on hand-made gold, with their wall time and peak memory (issue 66), from the repository root:

    python benchmarks/bench_wordalign.py --data-dir MULTI30K [--minutes 50] [--sequential] [--rounds 2]
        [--gold examples/gold-alignments/multi30k-val-de-en.100.align] [--runs DIR] [--out FILE] [-- TRAIN FLAGS]

1. **Corpus**: the training split plus the ``--gold`` pairs (the first lines of ``val``, one per gold line) at its
   end, in ``runs/corpus.{SRC,TGT}``: each aligner aligns the whole corpus as a user would, and the gold pairs'
   lines of its output are scored (an aligner estimates its model on the corpus it aligns, the gold pairs
   included).
2. **eflomal**: ``seq2seq wordalign`` (grow-diag-final-and), in a process of its own.
3. **model**: ``seq2seq wordalign --method model --max-minutes M`` (``--minutes``: both directions' training in
   all, ``transformer-align`` taught by eflomal's links; ``--sequential``: one direction after the other), its
   runs in ``runs/models``; then the forward model alone on the gold pairs (``--checkpoint``: what one direction
   gives). ``--rounds N``: self-training, N rounds of that budget (each after the first taught by the round
   before's links); every round's links are scored.
4. **Scores**: precision, recall and AER of each aligner's links of the gold pairs; wall time of each command (the
   model's: eflomal's teacher, tokenizers, encoding, training, aligning) and the peak resident memory of its
   largest process and of its process tree (``measured.run_measured``).
5. **Record** (``--out``, JSON + markdown). A command whose output exists is not run again: its measurement is
   kept in ``runs/measured.json``.

Speed figures need the machine to itself: nothing else running.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from common import ROOT, add_multi30k_flags, gold_pairs, provenance, score_links, write_record
from measured import run_measured
from seq2seq.alignment.links import read_gold_alignments
from seq2seq.io_utils import display_path, markdown_table, read_lines

GOLD = ROOT / "examples" / "gold-alignments" / "multi30k-val-de-en.100.align"


def write_corpus(args: argparse.Namespace) -> tuple[Path, Path, int]:
    """``runs/corpus.{SRC,TGT}`` (``--src``, ``--tgt``: the runs' names follow them): the training split, then the
    gold pairs; returns the files and the gold's first line (0-based)."""
    paths = []
    for lang, gold in zip((args.src, args.tgt), gold_pairs(args.data_dir, args.src, args.tgt, args.gold)):
        train = read_lines(args.data_dir / f"train.{lang}")
        path = args.runs / f"corpus.{lang}"
        path.write_text("".join(line + "\n" for line in train + gold), encoding="utf-8")
        paths.append(path)
    return paths[0], paths[1], len(train)


def measured(args: argparse.Namespace, name: str, output: Path, command: list[str]) -> dict:
    """``command`` run and measured, unless ``output`` exists from an earlier run (its measurement kept in
    ``runs/measured.json``)."""
    store = args.runs / "measured.json"
    known = json.loads(store.read_text()) if store.is_file() else {}
    if name not in known or not output.is_file():
        print(f"[{name}] {' '.join(command)}", file=sys.stderr, flush=True)
        known[name] = run_measured(command, args.runs / f"{name}.log")
        store.write_text(json.dumps(known, indent=2) + "\n")
    return known[name]


def scores(links_file: Path, first: int, gold: tuple[list, list]) -> dict:
    """Precision, recall and AER of ``links_file``'s lines ``first``... (the gold pairs) against ``gold``."""
    return score_links(read_lines(links_file)[first:], gold)


def table(record: dict) -> str:
    rows = [[name, f"{r['aer']:.3f}", f"{r['precision']:.3f}", f"{r['recall']:.3f}",
             f"{r['seconds']:.0f}" if r.get("seconds") is not None else "",
             f"{r['peak_rss_mb']:.0f}" if r.get("peak_rss_mb") is not None else "",
             f"{r['peak_tree_pss_mb']:.0f}" if r.get("peak_tree_pss_mb") is not None else ""]
            for name, r in record["aligners"].items()]
    m = record["machine"]
    head = (f"Word alignment of Multi30k train + {record['gold_pairs']} gold val pairs ({record['corpus_pairs']:,} "
            f"pairs), the gold pairs scored ({record['gold']}); `--method model`: {record['minutes']:g} minutes of "
            f"training in all ({'one direction after the other' if record['sequential'] else 'both at once'}"
            f"{', each of ' + str(record['rounds']) + ' rounds' if record['rounds'] > 1 else ''}); "
            f"{m['cpu']} ({m['cpu_capability']}), {m['cpus']} CPUs.\n\n")
    return head + markdown_table(["aligner", "AER", "precision", "recall", "wall s", "peak RSS MB (largest process)",
                                  "peak PSS MB (process tree)"], rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_multi30k_flags(parser)
    parser.add_argument("--gold", type=Path, default=GOLD, help="Pharaoh gold of the first val pairs")
    parser.add_argument("--minutes", type=float, default=50.0, help="--method model's training budget, both "
                                                                   "directions in all (default: 50)")
    parser.add_argument("--sequential", action="store_true", help="train one direction after the other")
    parser.add_argument("--rounds", type=int, default=1, help="--method model's self-training rounds (default: 1)")
    parser.add_argument("--runs", type=Path, help="where the corpus, outputs and runs go (default: beside --out)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench-results" / "wordalign.json")
    parser.add_argument("extra", nargs="*", help="seq2seq train flags for --method model's runs, after --")
    args = parser.parse_args(argv)
    args.runs = args.runs or args.out.with_suffix("")
    args.runs.mkdir(parents=True, exist_ok=True)
    source, target, first = write_corpus(args)
    sources, targets = read_lines(source)[first:], read_lines(target)[first:]
    gold = read_gold_alignments(str(args.gold), sources, targets)  # (sure, possible) links of the gold pairs
    align = [sys.executable, "-m", "seq2seq", "wordalign", "--source", str(source), "--target", str(target)]
    models = args.runs / "models"
    outputs = {"eflomal": args.runs / "eflomal.talp", "model (agreement)": args.runs / "model.talp"}
    commands = {"eflomal": [*align, "--output", str(outputs["eflomal"])],
                "model (agreement)": [*align, "--method", "model", "--max-minutes", str(args.minutes),
                                      "--output-dir", str(models), "--output", str(outputs["model (agreement)"]),
                                      *(["--sequential"] if args.sequential else []), "--rounds", str(args.rounds),
                                      *(["--", *args.extra] if args.extra else [])]}
    aligners = {}
    for name, command in commands.items():
        cost = measured(args, name, outputs[name], command)
        aligners[name] = {**cost, **scores(outputs[name], first, gold)}
    last = models if args.rounds == 1 else models / f"round-{args.rounds}"
    for earlier in range(1, args.rounds):  # self-training: the rounds before the last
        rounds_links = models / f"round-{earlier}" / "links.talp"
        aligners[f"model, round {earlier} (agreement)"] = scores(rounds_links, first, gold)
    forward = last / f"{args.src}-{args.tgt}"
    if (forward / "best.pt").is_file():  # one direction: the forward model alone, on the gold pairs only
        gold_src, gold_tgt, links = (args.runs / name for name in ("gold.src", "gold.tgt", "forward.talp"))
        gold_src.write_text("".join(line + "\n" for line in sources), encoding="utf-8")
        gold_tgt.write_text("".join(line + "\n" for line in targets), encoding="utf-8")
        subprocess.run([sys.executable, "-m", "seq2seq", "wordalign", "--method", "model", "--checkpoint",
                        str(forward), "--source", str(gold_src), "--target", str(gold_tgt), "--output", str(links)],
                       check=True, cwd=ROOT)
        aligners["model (forward only)"] = scores(links, 0, gold)
    record = {**provenance("wordalign"), "gold": display_path(args.gold), "gold_pairs": len(sources),
              "corpus_pairs": first + len(sources), "minutes": args.minutes, "sequential": args.sequential,
              "rounds": args.rounds,
              "extra_flags": args.extra, "aligners": aligners}
    text = table(record)
    write_record(args.out, record, text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
