"""The fairness mitigation measured: counterfactual data augmentation (``seq2seq augment``) against the plain
corpus, for both architectures and several seeds, at equal training time; the probe (``seq2seq fairness``) and
test BLEU of every run side by side (from the repository root):

    python benchmarks/bench_fairness.py [--data-dir MULTI30K] [--src en --tgt de] [--minutes 12]
        [--presets transformer rnn-bahdanau] [--seeds 1 2] [--parallel] [--runs DIR] [--out FILE]

1. **Corpora**: the training split as it is (``base``) and with gender-swapped copies of its pairs that name
   a group on both sides (``cda``, ``seq2seq augment``, the shipped swap lists); each run trains its
   SentencePiece model on its own corpus, as a user of either would.
2. **Runs**: each preset x corpus x seed trained for ``--minutes`` with one thread, one after the other, or
   with ``--parallel`` two at a time (the base and cda runs of one preset and seed together, so that they share
   the machine alike); a finished run (``summary.json``) is reused.
3. **Scores**: test BLEU and chrF (beam 5) of each run's ``best.pt``; the probe on the ``--probe-split``
   sentences of the source language that name a group (at most ``--probe-sentences``): faithfulness by swap
   direction, stability, evidence, and for English -> German the occupation probe.
4. **Record** (``--out``, JSON + markdown): per run, and the mean over seeds per preset and corpus.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from common import ROOT, add_multi30k_flags, preset_command, provenance, write_record
from seq2seq.io_utils import display_path, markdown_table, read_lines

CORPORA = ("base", "cda")
#: the probe's numbers in the record's tables: (label, path in a model's probe entry)
COLUMNS = (("faithful %", ("faithfulness", "all", "faithful")),
           ("faithful m->f %", ("faithfulness", "male -> female", "faithful")),
           ("faithful f->m %", ("faithfulness", "female -> male", "faithful")),
           ("stability chrF", ("stability", "chrf")),
           ("changed elsewhere %", ("stability", "changed_elsewhere")),
           ("occupations acc", ("occupations", "accuracy")),
           ("acc he", ("occupations", "accuracy_male")),
           ("acc she", ("occupations", "accuracy_female")),
           ("dG", ("occupations", "delta_g")),
           ("dS", ("occupations", "delta_s")))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_multi30k_flags(p)
    p.set_defaults(src="en", tgt="de")
    p.add_argument("--minutes", type=float, default=12.0, help="training budget of each run")
    p.add_argument("--presets", nargs="+", default=["transformer", "rnn-bahdanau"])
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    p.add_argument("--parallel", action="store_true", help="two runs at a time, one thread each")
    p.add_argument("--probe-split", default="val")
    p.add_argument("--probe-sentences", type=int, default=400)
    p.add_argument("--evidence-sentences", type=int, default=100)
    p.add_argument("--beam-size", type=int, default=5)
    p.add_argument("--cda-dir", type=Path, help="the augmented corpus (default: RUNS/corpus-cda; made if missing)")
    p.add_argument("--runs", type=Path, help="where the runs go (reused if finished; default: beside --out)")
    p.add_argument("--out", type=Path, default=ROOT / "bench-results" / "fairness.json")
    p.add_argument("--device", default="cpu")
    p.add_argument("extra", nargs="*", help="extra train flags after --, applied to every run")
    return p.parse_args(argv)


def train_command(args, preset: str, corpus: Path, seed: int, run_dir: Path) -> list[str]:
    run_args = argparse.Namespace(**{**vars(args), "data_dir": corpus, "seed": seed})
    return preset_command(run_dir.name, preset, run_args, run_dir, "--max-minutes", str(args.minutes),
                          "--threads", "1", "--cache-dir", str(run_dir.parent / "cache"))


def train_all(args, runs: Path, corpora: dict[str, Path]) -> list[dict]:
    """Every preset x corpus x seed, trained unless finished; returns their descriptions."""
    planned = []
    for preset in args.presets:
        for seed in args.seeds:
            group = []
            for corpus in CORPORA:
                run_dir = runs / f"{preset}-{corpus}-s{seed}"
                planned.append({"preset": preset, "corpus": corpus, "seed": seed, "run": run_dir})
                if not (run_dir / "summary.json").is_file():
                    group.append(train_command(args, preset, corpora[corpus], seed, run_dir))
            env = {**os.environ, "OMP_NUM_THREADS": "1"}
            if args.parallel:
                for process in [subprocess.Popen(command, cwd=ROOT, env=env) for command in group]:
                    if process.wait():
                        raise SystemExit(f"a run failed: exit {process.returncode}")
            else:
                for command in group:
                    subprocess.run(command, check=True, cwd=ROOT, env=env)
    return planned


def test_scores(run: Path, args) -> dict:
    from seq2seq import Translator
    from seq2seq.metrics import corpus_scores

    sources = read_lines(args.data_dir / f"{args.test_split}.{args.src}")
    references = read_lines(args.data_dir / f"{args.test_split}.{args.tgt}")
    translator = Translator.from_checkpoint(run / "best.pt", beam_size=args.beam_size, device=args.device)
    outputs = [t.text for t in translator.translate(sources, need_attention=False)]
    scores = corpus_scores(outputs, references)
    return {"bleu": scores["bleu"].score, "chrf": scores["chrf"].score}


def probe(planned: list[dict], runs: Path, args) -> dict:
    """The fairness report over every run (``seq2seq fairness``, in this process)."""
    from seq2seq.config import DecodeConfig
    from seq2seq.jobs.fairness import FairnessJob, fairness

    out = runs / "probe"
    names = [item["run"].name for item in planned]
    argv = ["--checkpoint", *(str(item["run"]) for item in planned), "--names", *names, "--input",
            str(args.data_dir / f"{args.probe_split}.{args.src}"), "--src", args.src, "--tgt", args.tgt,
            "--evidence-sentences", str(args.evidence_sentences), "--max-sentences", str(args.probe_sentences),
            "--beam-size", str(args.beam_size), "--output-dir", str(out)]  # the command the report records
    fairness(FairnessJob([str(item["run"]) for item in planned], str(args.data_dir / f"{args.probe_split}.{args.src}"),
                         str(out), names=names, src=args.src, tgt=args.tgt, evidence_sentences=args.evidence_sentences,
                         max_sentences=args.probe_sentences, decode=DecodeConfig(beam_size=args.beam_size),
                         device=args.device, quiet=True, argv=argv))
    report = json.loads((out / "report.json").read_text(encoding="utf-8"))
    return {model["name"]: model for model in report["models"]} | {"_report": report}


def portable(record: dict, places: dict[str, str]) -> dict:
    """``record`` with the machine's paths written as placeholders (MULTI30K, RUNS, CDA, OUT)."""
    text = json.dumps(record)
    for path, name in sorted(places.items(), key=lambda item: -len(item[0])):
        text = text.replace(path, name)
    return json.loads(text)


def pick(entry: dict, path: tuple[str, ...]):
    for key in path:
        entry = entry.get(key) if isinstance(entry, dict) else None
    return entry


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    runs = args.runs or args.out.with_suffix("")
    runs.mkdir(parents=True, exist_ok=True)
    cda = args.cda_dir or runs / "corpus-cda"
    if not (cda / "augment.json").is_file():
        from seq2seq.jobs.fairness import AugmentJob, augment

        augment(AugmentJob(str(args.data_dir), args.src, args.tgt, str(cda)))
    planned = train_all(args, runs, {"base": args.data_dir, "cda": cda})
    probed = probe(planned, runs, args)
    rows = []
    for item in planned:
        summary = json.loads((item["run"] / "summary.json").read_text(encoding="utf-8"))
        entry = probed[item["run"].name]
        rows.append({"preset": item["preset"], "corpus": item["corpus"], "seed": item["seed"],
                     "run": item["run"].name, "updates": summary["steps"],
                     "valid_bleu": summary.get("best_valid_bleu"), "test": test_scores(item["run"], args),
                     "probe": {label: pick(entry, path) for label, path in COLUMNS},
                     "evidence": entry["evidence"]})
        print(f"{item['run'].name}: {rows[-1]['test']} {rows[-1]['probe']}", file=sys.stderr, flush=True)
    means = []
    for preset in args.presets:
        for corpus in CORPORA:
            chosen = [r for r in rows if r["preset"] == preset and r["corpus"] == corpus]
            mean = {"preset": preset, "corpus": corpus, "seeds": len(chosen),
                    "updates": statistics.mean(r["updates"] for r in chosen),
                    "test_bleu": statistics.mean(r["test"]["bleu"] for r in chosen)}
            for label, _ in COLUMNS:
                values = [r["probe"][label] for r in chosen if r["probe"][label] is not None]
                mean[label] = statistics.mean(values) if values else None
            means.append(mean)
    report = probed["_report"]
    record = {**provenance("fairness"), "data": "MULTI30K", "src": args.src, "tgt": args.tgt,
              "minutes": args.minutes, "seeds": args.seeds, "probe_split": args.probe_split,
              "probed_sentences": report["probed"], "beam_size": args.beam_size, "runs": rows, "means": means,
              "cda": json.loads((cda / "augment.json").read_text(encoding="utf-8")) | {"data_dir": "MULTI30K"}}
    record = portable(record, {str(args.data_dir): "MULTI30K", str(runs): "RUNS", str(cda): "CDA",
                                str(args.out): "OUT"})
    labels = [label for label, _ in COLUMNS]

    def cell(value) -> str:
        return "n/a" if value is None else f"{value:.1f}" if isinstance(value, float) else str(value)

    table = "\n".join([
        f"# Fairness: counterfactual data augmentation, {args.src} -> {args.tgt}, {args.minutes:g} minutes per run", "",
        f"`{record['command']}` on {record['machine']['cpu']}; {report['probed']} {args.probe_split} sentences "
        f"probed, beam {args.beam_size}; cda adds {record['cda']['added']} swapped pairs to {record['cda']['pairs']}.",
        "", "Mean over seeds:", "",
        markdown_table(["preset", "corpus", "seeds", "updates", "test BLEU", *labels],
                       [[m["preset"], m["corpus"], m["seeds"], cell(float(m["updates"])), cell(m["test_bleu"]),
                         *(cell(m[label]) for label in labels)] for m in means]), "",
        "Per run:", "",
        markdown_table(["run", "updates", "test BLEU", "chrF", *labels],
                       [[r["run"], r["updates"], cell(r["test"]["bleu"]), cell(r["test"]["chrf"]),
                         *(cell(r["probe"][label]) for label in labels)] for r in rows]), ""])
    write_record(args.out, record, table)
    print(f"wrote {display_path(args.out)}", file=sys.stderr)


if __name__ == "__main__":
    main()
