"""Did a change alter what decoding outputs? Two source trees decode the same inputs in every mode, and
the outputs and scores are compared (from the repository root):

    git worktree add /tmp/before HEAD~1
    python benchmarks/ab_outputs.py --tree before=/tmp/before --tree after=.

Each tree runs in a fresh process with that tree first on ``PYTHONPATH`` (its ``seq2seq`` is the one
imported, or the process stops at once), one torch thread, on copies of the two checkpoints of
``tests/data/pre-tiers`` (a Transformer and an RNN): greedy, beam 5, a 3-best list with another length
penalty, sampling with a seed, terminology constraints, target prefixes, for each model; an ensemble of
both (greedy, beam, sampling); and the Transformer through CTranslate2 (when installed). Every output
of every n-best list, with its score to 5 decimals, must be the same; the record lists the modes that
differ and their first differences. Exit status 1 when any does.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import provenance, run_in_tree, write_record  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

CHILD = """
import shutil, tempfile
from seq2seq.decoding.translator import Translator
from seq2seq.toy import toy_corpus

work = Path(tempfile.mkdtemp())  # CTranslate2 caches its conversion beside a checkpoint: copies
checkpoints = {name: shutil.copy(path, work / f"{name}.pt") for name, path in args["checkpoints"].items()}
sources = list(toy_corpus(n_train=10, n_valid=10, n_test=args["sentences"], seed=5)["test"]["src"])
words = ["zwei", "hundert", "und", "tausend"]
modes = {
    "greedy": dict(beam_size=1), "beam 5": dict(beam_size=5), "3-best": dict(beam_size=4, n_best=3, length_penalty=0.6),
    "sampling": dict(sample=True, seed=7, n_best=2, temperature=1.3),
    "constraints": dict(beam_size=3, constraints=[[words[i % 4]] for i in range(len(sources))]),
    "prefix": dict(beam_size=3, prefix=["ein " if i % 2 else "" for i in range(len(sources))]),
}

def outputs(translator, options, digits=5):
    found = translator.translate(sources, need_attention=False, **options)
    return [[t.text, round(t.score, digits)] for result in found for t in result.alternatives]

result = {}
for name, path in checkpoints.items():
    translator = Translator.from_checkpoint(path, device="cpu")
    for mode, options in modes.items():
        result[f"{name} {mode}"] = outputs(translator, options)
ensemble = Translator.from_checkpoint([checkpoints["rnn"], checkpoints["transformer"]], device="cpu")
for mode in ("greedy", "beam 5", "sampling"):
    result[f"ensemble {mode}"] = outputs(ensemble, modes[mode])
try:
    import ctranslate2  # noqa: F401
except ImportError:
    ctranslate2 = None
if ctranslate2 is not None:
    engine = Translator.from_checkpoint(checkpoints["transformer"], device="cpu", engine="ctranslate2")
    for mode in ("greedy", "beam 5", "3-best"):
        result[f"ctranslate2 {mode}"] = outputs(engine, modes[mode], digits=4)
print(json.dumps(result, ensure_ascii=False))
"""


def decode(tree: Path, sentences: int) -> dict[str, list]:
    return run_in_tree(tree, CHILD, {"sentences": sentences})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tree", action="append", required=True, metavar="NAME=PATH",
                        help="a source tree (twice: the second is compared with the first)")
    parser.add_argument("--sentences", type=int, default=60, help="toy test sentences decoded in every mode")
    parser.add_argument("--out", type=Path, default=ROOT / "bench-results" / "ab-outputs.json")
    args = parser.parse_args(argv)
    trees = dict(tree.split("=", 1) for tree in args.tree)
    if len(trees) != 2:
        parser.error("give exactly two --tree NAME=PATH")
    (first, first_path), (second, second_path) = trees.items()
    before, after = decode(Path(first_path), args.sentences), decode(Path(second_path), args.sentences)
    modes = {}
    for mode in before.keys() | after.keys():
        a, b = before.get(mode), after.get(mode)
        differ = [[x, y] for x, y in zip(a or [], b or []) if x != y]
        modes[mode] = {"outputs": len(a or []), "same": a == b, "first_differences": differ[:3]}
    record = {**provenance("ab-outputs"), "trees": trees, "sentences": args.sentences,
              "modes": dict(sorted(modes.items()))}
    lines = [f"| mode | outputs | {first} = {second} |", "|---|---|---|"]
    lines += [f"| {mode} | {m['outputs']} | {'yes' if m['same'] else '**no**'} |"
              for mode, m in record["modes"].items()]
    text = "Every output and score of every mode, two trees (benchmarks/ab_outputs.py).\n\n" + "\n".join(lines) + "\n"
    write_record(args.out, record, text)
    print(text)
    return 0 if all(m["same"] for m in modes.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
