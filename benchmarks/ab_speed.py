"""Did a change make decoding or training slower? Two source trees measured interleaved (from the
repository root):

    git worktree add /tmp/before HEAD~1
    python benchmarks/ab_speed.py --tree before=/tmp/before --tree after=. --rounds 5

Each round runs every tree once, in a fresh process with that tree first on ``PYTHONPATH`` (its
``seq2seq`` is the one imported, or the process stops at once), one torch thread, in alternating
order, so that the machine's drift hits both alike. A process decodes the toy test sentences with
the two checkpoints of ``tests/data/pre-tiers`` (a Transformer and an RNN) through
``Translator.translate``: greedy and beam 5 in wide batches, beam 5 one sentence at a time, and
sampling; then trains the toy Transformer for ``--train-steps`` steps (target tokens/s from its
summary). The record holds every round and the median per tree; ``--out`` (JSON + md).
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import provenance, run_in_tree, write_record  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

CHILD = """
import tempfile, time
from seq2seq.config import RunConfig
from seq2seq.decoding.translator import Translator
from seq2seq.toy import toy_corpus
from seq2seq.training.run import train

sources = list(toy_corpus(n_train=10, n_valid=10, n_test=args["sentences"], seed=5)["test"]["src"])
modes = {"greedy": ({"beam_size": 1}, False), "beam 5": ({"beam_size": 5}, False),
         "beam 5, batch 1": ({"beam_size": 5}, True), "sampling": ({"sample": True, "seed": 1}, False)}
result = {}
for arch, checkpoint in args["checkpoints"].items():
    translator = Translator.from_checkpoint(checkpoint, device="cpu")
    for name, (options, one_by_one) in modes.items():
        translator.translate(sources[:8], need_attention=False, **options)  # warm-up
        start = time.perf_counter()
        if one_by_one:
            for sentence in sources[: args["batch1"]]:
                translator.translate([sentence], need_attention=False, **options)
            count = args["batch1"]
        else:
            translator.translate(sources, need_attention=False, **options)
            count = len(sources)
        result[f"{arch} {name} sentences/s"] = count / (time.perf_counter() - start)
with tempfile.TemporaryDirectory() as tmp:
    if not args["train_steps"]:
        print(json.dumps(result))
        sys.exit(0)
    # the layout before the config sections (train.eval_every, not eval.every): the trees compared may predate
    # them, and today's reads it too (seq2seq.config.layout)
    config = RunConfig.from_dict({"model": {"arch": "transformer", "d_model": 64, "heads": 4, "ff_size": 128,
                                            "layers": 2},
                                  "data": {"toy_size": 1000, "vocab_size": 120, "cache_dir": tmp + "/cache"},
                                  "train": {"max_steps": args["train_steps"], "eval_every": 0, "log_every": 50,
                                            "threads": 1, "device": "cpu", "seed": 1}})
    config.output_dir = tmp + "/run"
    train(config, quiet=True, final_test=False)
    summary = json.loads(open(tmp + "/run/summary.json").read())
    result["train target tokens/s"] = summary["train_tgt_tokens_per_s"]
print(json.dumps(result))
"""


def measure(tree: Path, args: argparse.Namespace) -> dict:
    return run_in_tree(tree, CHILD, {"sentences": args.sentences, "batch1": args.batch1_sentences,
                                     "train_steps": args.train_steps})


def table(record: dict) -> str:
    names = list(record["trees"])
    lines = [f"| measure | {' | '.join(names)} | {names[-1]} / {names[0]} |", "|---" * (len(names) + 2) + "|"]
    for key in record["median"][names[0]]:
        values = [record["median"][n][key] for n in names]
        lines.append(f"| {key} | {' | '.join(f'{v:.1f}' for v in values)} | {values[-1] / values[0]:.3f} |")
    return (f"Medians of {record['rounds']} interleaved rounds, one thread each "
            f"(benchmarks/ab_speed.py).\n\n" + "\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tree", action="append", required=True, metavar="NAME=PATH",
                        help="a source tree to measure (twice or more; the last is compared with the first)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--sentences", type=int, default=400, help="toy test sentences decoded in wide batches")
    parser.add_argument("--batch1-sentences", type=int, default=60, help="sentences decoded one at a time")
    parser.add_argument("--train-steps", type=int, default=150, help="0: decoding only")
    parser.add_argument("--out", type=Path, default=ROOT / "bench-results" / "ab-speed.json")
    args = parser.parse_args(argv)
    trees = dict(tree.split("=", 1) for tree in args.tree)
    rounds: dict[str, list[dict]] = {name: [] for name in trees}
    for k in range(args.rounds):
        order = list(trees) if k % 2 == 0 else list(reversed(trees))
        for name in order:
            rounds[name].append(measure(Path(trees[name]), args))
            print(f"round {k + 1} {name}: " + ", ".join(f"{key} {v:.1f}" for key, v in rounds[name][-1].items()),
                  file=sys.stderr, flush=True)
    median = {name: {key: statistics.median(r[key] for r in runs) for key in runs[0]} for name, runs in rounds.items()}
    record = {**provenance("ab-speed"), "trees": {name: str(path) for name, path in trees.items()},
              "rounds": args.rounds, "settings": {"sentences": args.sentences, "batch1": args.batch1_sentences,
                                                  "train_steps": args.train_steps},
              "per_round": rounds, "median": median}
    text = table(record)
    write_record(args.out, record, text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
