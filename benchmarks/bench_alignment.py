"""Alignment quality against translation quality: AER of attention on hand-made in-domain gold, for
the presets' plain attention, guided alignment and the attention regularizers, beside the
statistical aligner eflomal, with test BLEU at equal training time (from the repository root):

    python benchmarks/bench_alignment.py [--data-dir MULTI30K] [--minutes 8] [--variants NAME ...]
        [--gold examples/gold-alignments/multi30k-val-de-en.100.align] [--parallel] [--runs DIR] [--out FILE]

1. **Gold**: ``--gold`` (Pharaoh, sure ``i-j`` / possible ``i?j``) aligns the first lines of the
   ``--gold-split`` (val) pairs, one line each (examples/gold-alignments/README.md).
2. **eflomal** (``seq2seq wordalign``, extra ``align``) on the training split plus those gold pairs,
   grow-diag-final-and: its links of the gold pairs are scored; its links of the training pairs are the
   supervision file of the guided variants (``{talp}`` in their flags; ``{talp:RULE}``: another run of eflomal
   on the same corpus, symmetrized by RULE, ``teacher_links``).
3. **Runs**: each of ``--variants`` (``VARIANTS``: a preset and extra flags) trained for ``--minutes`` on
   the training split with one shared SentencePiece model and seed, one after the other with every core,
   or with ``--parallel`` two at a time with half the cores each; a finished run is reused.
4. **Scores** of each run's ``best.pt``: test BLEU and chrF (beam 5), and AER on the gold for the
   alignment ``seq2seq align`` reads by default from that model (``default``), with every link method
   at its default share (``methods``: argmax, threshold, soft, grow; and ``grow 0``, every grown link), and
   for every decoder layer (and their mean) x (the mean of heads, and each head), argmax links: the best of
   these is tuned on the gold. With ``--adapt-steps N`` also the default links of the model adapted to the gold
   pairs (``adapted``: ``seq2seq.adapt``, as ``seq2seq align --adapt-steps N``).
5. **Record** (``--out``, JSON + markdown) after every step, and a figure (PNG beside it): test BLEU
   against default AER, eflomal's AER as a line.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from common import (ROOT, add_multi30k_flags, copy_tokenizer, gold_pairs, preset_command, provenance, score_links,
                    shared_tokenizer, write_record)
from seq2seq.io_utils import display_path, markdown_table, read_lines

#: name -> (preset, extra train flags); ``{talp}`` is eflomal's alignment of the training split, ``{runs}`` the
#: runs directory (a variant that continues another needs that one trained first). A variant runs its preset as
#: it is now: the transformer-align ones before 2026-11-27 14:20 trained with lr 1e-3 and 3,000-token batches, and
#: before 2026-11-27 20:00 with the inverse-sqrt schedule and without --guided-unaligned eos; before 2026-11-29 08:00
#: ``transformer`` trained with lr 1e-3 and 3,000-token batches and ``rnn`` with 2,000 (``rnn-1000-tokens`` is ``rnn``
#: since).
VARIANTS: dict[str, tuple[str, list[str]]] = {
    "rnn": ("rnn-bahdanau", []),
    "rnn-guided": ("rnn-bahdanau", ["--guided-alignment", "{talp}", "--guided-alignment-weight", "0.5"]),
    "rnn-entmax": ("rnn-bahdanau", ["--attention-normalizer", "entmax15"]),
    # the Transformer's recipe gains for the RNN (issue 65): the linear schedule to the budget, then guidance
    "rnn-linear": ("rnn-bahdanau", ["--schedule", "linear"]),
    "rnn-1000-tokens": ("rnn-bahdanau", ["--max-tokens", "1000"]),  # more, smaller updates in the same time
    "rnn-1000-tokens-lr-1e-3": ("rnn-bahdanau", ["--max-tokens", "1000", "--lr", "1e-3"]),  # the rate around them
    "rnn-1000-tokens-lr-3e-3": ("rnn-bahdanau", ["--max-tokens", "1000", "--lr", "3e-3"]),
    "rnn-dropout-0.2": ("rnn-bahdanau", ["--dropout", "0.2"]),  # less regularization for a short budget
    # rnn-luong (Luong's general score), never searched: its preset (lr 1e-3) against rnn-bahdanau's searched rate
    "rnn-luong": ("rnn-luong", []),
    "rnn-luong-lr-2e-3": ("rnn-luong", ["--lr", "2e-3"]),
    "rnn-guided-null": ("rnn-bahdanau", ["--guided-alignment", "{talp}", "--guided-alignment-weight", "0.2",
                                         "--guided-unaligned", "eos"]),  # a lighter weight than rnn-guided's 0.5
    "rnn-guided-linear-null": ("rnn-bahdanau", ["--guided-alignment", "{talp}", "--guided-alignment-weight", "0.5",
                                                "--schedule", "linear", "--guided-unaligned", "eos"]),
    "transformer": ("transformer", []),
    "transformer-guided-0.05": ("transformer", ["--guided-alignment", "{talp}", "--guided-alignment-weight", "0.05"]),
    "transformer-guided-0.5": ("transformer", ["--guided-alignment", "{talp}", "--guided-alignment-weight", "0.5"]),
    "transformer-align": ("transformer-align", ["--guided-alignment", "{talp}"]),  # the preset, eflomal's links shared
    "transformer-align-weight-0.5": ("transformer-align", ["--guided-alignment", "{talp}",
                                                           "--guided-alignment-weight", "0.5"]),  # the preset before
    "transformer-align-weight-1": ("transformer-align", ["--guided-alignment", "{talp}", "--guided-alignment-weight",
                                                         "1.0"]),
    "transformer-align-weight-2": ("transformer-align", ["--guided-alignment", "{talp}", "--guided-alignment-weight",
                                                         "2.0"]),
    "transformer-align-weight-3": ("transformer-align", ["--guided-alignment", "{talp}", "--guided-alignment-weight",
                                                         "3.0"]),
    "transformer-align-two-heads": ("transformer-align", ["--guided-alignment", "{talp}", "--guided-heads", "0", "1"]),
    # the preset taught by eflomal's links symmetrized otherwise ({talp:RULE}: ``teacher_links``)
    "transformer-align-teacher-forward": ("transformer-align", ["--guided-alignment", "{talp:forward}"]),
    "transformer-align-teacher-intersection": ("transformer-align", ["--guided-alignment", "{talp:intersection}"]),
    # the preset learning faster early: a higher peak rate, or smaller batches (more updates in the same time)
    "transformer-align-lr-2e-3": ("transformer-align", ["--guided-alignment", "{talp}", "--lr", "2e-3"]),
    "transformer-align-1500-tokens": ("transformer-align", ["--guided-alignment", "{talp}", "--max-tokens", "1500"]),
    "transformer-align-lr-3e-3": ("transformer-align", ["--guided-alignment", "{talp}", "--lr", "3e-3"]),
    "transformer-align-lr-2e-3-1500-tokens": ("transformer-align", ["--guided-alignment", "{talp}", "--lr", "2e-3",
                                                                     "--max-tokens", "1500"]),
    "transformer-align-lr-3e-3-1500-tokens": ("transformer-align", ["--guided-alignment", "{talp}", "--lr", "3e-3",
                                                                     "--max-tokens", "1500"]),
    "transformer-align-linear": ("transformer-align", ["--guided-alignment", "{talp}", "--schedule", "linear"]),
    "transformer-align-linear-null": ("transformer-align", ["--guided-alignment", "{talp}", "--schedule", "linear",
                                                            "--guided-unaligned", "eos"]),
    # the supervised head as a link classifier (a sigmoid per pair, binary cross-entropy: issue 66)
    "transformer-align-binary": ("transformer-align", ["--guided-alignment", "{talp}", "--guided-loss", "binary"]),
    "transformer-align-binary-0.1": ("transformer-align", ["--guided-alignment", "{talp}", "--guided-loss", "binary",
                                                           "--guided-alignment-weight", "0.1"]),  # lighter weights:
    "transformer-align-binary-0.3": ("transformer-align", ["--guided-alignment", "{talp}", "--guided-loss", "binary",
                                                           "--guided-alignment-weight", "0.3"]),  # the KL's scale
    "transformer-lr-2e-3-1500-tokens": ("transformer", ["--lr", "2e-3", "--max-tokens", "1500"]),
    "transformer-self": ("transformer", ["--guided-alignment", "self", "--guided-alignment-weight", "0.5"]),
    # a trained transformer-align run further: on its own links (self-refinement) or on eflomal's as before
    "transformer-align-then-self": ("transformer-align", ["--init-from", "{runs}/transformer-align/best.pt",
                                                          "--guided-alignment", "self", "--self-guidance-warmup", "0"]),
    "transformer-align-then-eflomal": ("transformer-align", ["--init-from", "{runs}/transformer-align/best.pt",
                                                             "--guided-alignment", "{talp}"]),
    "transformer-entropy": ("transformer", ["--attention-entropy-weight", "0.1"]),
    "transformer-entmax": ("transformer", ["--attention-normalizer", "entmax15"]),
}
DEFAULT_VARIANTS = list(VARIANTS)


def eflomal_links(args: argparse.Namespace, sources: list[str], targets: list[str]) -> Path:
    """``runs/eflomal.talp``: eflomal on train + the gold pairs (one corpus, so the gold pairs are aligned
    with the training statistics); ``runs/train.talp`` its training part (the guided supervision)."""
    home = args.runs
    whole, train = home / "eflomal.talp", home / "train.talp"
    if not whole.is_file():
        train_src = read_lines(args.data_dir / f"train.{args.src}")
        train_tgt = read_lines(args.data_dir / f"train.{args.tgt}")
        for name, lines in (("corpus.src", train_src + sources), ("corpus.tgt", train_tgt + targets)):
            (home / name).write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        subprocess.run([sys.executable, "-m", "seq2seq", "wordalign", "--source", str(home / "corpus.src"),
                        "--target", str(home / "corpus.tgt"), "--output", str(whole)], check=True, cwd=ROOT)
        lines = whole.read_text(encoding="utf-8").splitlines()
        train.write_text("".join(line + "\n" for line in lines[: len(train_src)]), encoding="utf-8")
    return whole


def teacher_links(args: argparse.Namespace, rule: str) -> Path:
    """``runs/train.RULE.talp``: the training part of eflomal's links of ``runs/corpus.*`` (``eflomal_links``)
    symmetrized by ``rule``, from a run of its own (eflomal samples: not the links of ``train.talp``'s run)."""
    home = args.runs
    whole, train = home / f"eflomal.{rule}.talp", home / f"train.{rule}.talp"
    if not train.is_file():
        subprocess.run([sys.executable, "-m", "seq2seq", "wordalign", "--source", str(home / "corpus.src"),
                        "--target", str(home / "corpus.tgt"), "--output", str(whole), "--symmetrize", rule],
                       check=True, cwd=ROOT)
        count = len(read_lines(args.data_dir / f"train.{args.src}"))
        lines = whole.read_text(encoding="utf-8").splitlines()
        train.write_text("".join(line + "\n" for line in lines[:count]), encoding="utf-8")
    return train


def train_commands(args: argparse.Namespace, spm: Path, threads: int | None) -> list[tuple[str, list[str]]]:
    talp = str(args.runs / "train.talp")
    commands = []
    for name in args.variants:
        run_dir = args.runs / name
        if (run_dir / "summary.json").is_file():
            continue  # finished: reused
        preset, flags = VARIANTS[name]
        copy_tokenizer(spm, run_dir)
        extra = [str(teacher_links(args, flag[6:-1])) if flag.startswith("{talp:") else
                 flag.replace("{talp}", talp).replace("{runs}", str(args.runs)) for flag in flags]
        extra += ["--max-minutes", str(args.minutes)]
        if threads:
            extra += ["--threads", str(threads)]
        commands.append((name, preset_command(name, preset, args, run_dir, *extra)))
    return commands


def train_all(args: argparse.Namespace, spm: Path) -> None:
    threads = max(1, (os.cpu_count() or 2) // 2) if args.parallel else None
    commands = train_commands(args, spm, threads)
    group = 2 if args.parallel else 1
    for start in range(0, len(commands), group):
        processes = [subprocess.Popen(command, cwd=ROOT) for _, command in commands[start:start + group]]
        for (name, _), process in zip(commands[start:start + group], processes):
            if process.wait() != 0:
                raise SystemExit(f"training {name} failed (exit {process.returncode})")


def attention_scores(run_dir: Path, sources: list[str], targets: list[str], gold, args) -> dict:
    """AER of the model's default alignment and of every layer x heads choice; test BLEU / chrF."""
    from seq2seq.alignment.links import alignment_error_rate
    from seq2seq.config import LINK_METHODS, AlignConfig
    from seq2seq.decoding.translator import Translator
    from seq2seq.decoding.forced_alignment import force_align
    from seq2seq.metrics import corpus_scores

    translator = Translator.from_checkpoint(run_dir / "best.pt", device="cpu")
    model = translator.model
    sure, possible = gold
    default_layer, default_heads = default_alignment(translator)
    choices = {"default": (default_layer, default_heads)}
    for layer in [*range(model.attention_layers), "all"]:
        choices[f"layer {layer}, mean"] = (layer, "mean")
        if model.attention_heads > 1 and layer != "all":
            choices.update({f"layer {layer}, head {h}": (layer, [h]) for h in range(model.attention_heads)})
    aer = {}
    for name, (layer, heads) in choices.items():
        links = force_align(translator, sources, targets, AlignConfig(layer=layer, heads=heads, method="argmax"))
        aer[name] = vars(alignment_error_rate(links, sure, possible))
    best = min((name for name in aer if name != "default"), key=lambda name: aer[name]["aer"])
    methods = {}  # the default layer and heads, every link method at its default share, and grow without one
    for name, method, share in [*((m, m, None) for m in LINK_METHODS), ("grow 0", "grow", 0.0)]:
        links = force_align(translator, sources, targets, AlignConfig(layer=default_layer, heads=default_heads,
                                                                      method=method, threshold=share))
        methods[name] = vars(alignment_error_rate(links, sure, possible))
    adapted = None
    if args.adapt_steps:  # the default links of the model adapted to the gold pairs (``seq2seq.adapt``)
        from seq2seq import adapt

        links = force_align(adapt(translator, sources, targets, args.adapt_steps), sources, targets,
                            AlignConfig(layer=default_layer, heads=default_heads))
        adapted = {"steps": args.adapt_steps, **vars(alignment_error_rate(links, sure, possible))}
    test_src = read_lines(args.data_dir / f"{args.test_split}.{args.src}")
    test_ref = read_lines(args.data_dir / f"{args.test_split}.{args.tgt}")
    outputs = [t.text for t in translator.translate(test_src, beam_size=5, need_attention=False)]
    scores = corpus_scores(outputs, test_ref, ("bleu", "chrf"))
    summary = json.loads((run_dir / "summary.json").read_text())
    return {"default": {"layer": default_layer, "heads": default_heads, **methods[AlignConfig.method]},
            "best": best, "aer": aer, "methods": methods, "adapted": adapted, "test_bleu": scores["bleu"].score,
            "test_chrf": scores["chrf"].score,
            "valid_bleu": summary["best_valid_bleu"], "steps": summary["steps"],
            "tokens_per_s": summary["train_tgt_tokens_per_s"]}


def default_alignment(translator) -> tuple:
    """The layer and heads ``seq2seq align`` reads by default from this model (a guided model's
    supervised ones, ``AlignConfig.for_model``)."""
    from seq2seq.config import AlignConfig

    chosen = AlignConfig(model_default=True).for_model(translator.supervised_attention)
    return chosen.layer, chosen.heads


def table(record: dict) -> str:
    methods = list(next(iter(record["runs"].values()))["methods"]) if record["runs"] else []
    adapt_steps = record.get("adapt_steps") or 0
    adapted = [f"AER (adapted, {adapt_steps} updates)"] if adapt_steps else []
    rows = [["eflomal (grow-diag-final-and)", "", "", f"{record['eflomal']['aer']:.3f}", *[""] * len(methods),
             *[""] * len(adapted), "", ""]]
    for name, r in record["runs"].items():
        d = r["default"]
        best = r["aer"][r["best"]]
        rows.append([name, f"{r['test_bleu']:.2f}", f"{r['valid_bleu']:.2f}", f"{d['aer']:.3f}",
                     *[f"{r['methods'][m]['aer']:.3f}" for m in methods],
                     *[f"{r['adapted']['aer']:.3f}" if r.get("adapted") else ""] * len(adapted),
                     f"{best['aer']:.3f} ({r['best']}, argmax)", r["steps"]])
    head = (f"AER on {record['gold_pairs']} hand-aligned {record['gold_split']} pairs "
            f"({display_path(record['gold'])}); runs of {record['minutes']:g} minutes each, "
            f"{'two at a time' if record['parallel'] else 'one after the other'}, {record['machine']['cpu']}\n\n")
    return head + markdown_table(["system", "test BLEU", "valid BLEU", "AER (default alignment)",
                                  *[f"AER ({m})" for m in methods], *adapted,
                                  "AER (best layer/head, tuned on the gold)",
                                  "steps"], rows) + "\n"


def figure(record: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for name, r in record["runs"].items():
        marker = "o" if name.startswith("rnn") else "s"
        ax.scatter(r["default"]["aer"], r["test_bleu"], marker=marker)
        ax.annotate(name, (r["default"]["aer"], r["test_bleu"]), fontsize=8, xytext=(4, 3),
                    textcoords="offset points")
    ax.axvline(record["eflomal"]["aer"], color="grey", linestyle="--", label="eflomal")
    ax.set_xlabel("AER on the gold (lower is better)")
    ax.set_ylabel("test BLEU (beam 5)")
    ax.set_title(f"Alignment against translation, {record['minutes']:g} minutes of training each")
    ax.legend(loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_multi30k_flags(parser)
    parser.add_argument("--gold", type=Path, default=ROOT / "examples" / "gold-alignments" /
                        "multi30k-val-de-en.100.align")
    parser.add_argument("--gold-split", default="val")
    parser.add_argument("--minutes", type=float, default=8.0, help="training time of each run (default: 8)")
    parser.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=DEFAULT_VARIANTS)
    parser.add_argument("--parallel", action="store_true", help="two runs at a time, half the cores each")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--adapt-steps", type=int, default=0,
                        help="also score each run adapted to the gold pairs by this many updates (seq2seq.adapt, "
                             "align --adapt-steps; default: 0, not)")
    parser.add_argument("--runs", type=Path, default=ROOT / "bench-results" / "alignment")
    parser.add_argument("--out", type=Path, default=ROOT / "bench-results" / "alignment.json")
    parser.add_argument("extra", nargs="*", help="after --: extra flags for every training run")
    args = parser.parse_args(argv)
    args.device, args.runs = "cpu", args.runs.resolve()
    return args


def main(argv: list[str] | None = None) -> int:
    from seq2seq.alignment.links import read_gold_alignments

    args = parse_args(argv)
    args.runs.mkdir(parents=True, exist_ok=True)
    sources, targets = gold_pairs(args.data_dir, args.src, args.tgt, args.gold, args.gold_split)
    gold = read_gold_alignments(args.gold, sources, targets)
    record = {**provenance("alignment"), "gold": display_path(args.gold), "gold_split": args.gold_split,
              "gold_pairs": len(sources), "minutes": args.minutes, "parallel": args.parallel,
              "adapt_steps": args.adapt_steps,
              "variants": {name: VARIANTS[name] for name in args.variants}, "runs": {}}
    eflomal = eflomal_links(args, sources, targets).read_text(encoding="utf-8").splitlines()[-len(sources):]
    record["eflomal"] = score_links(eflomal, gold)
    write_record(args.out, record)
    spm = shared_tokenizer(args, args.runs / "tokenizer")
    train_all(args, spm)
    for name in args.variants:
        record["runs"][name] = attention_scores(args.runs / name, sources, targets, gold, args)
        write_record(args.out, record, table(record))
    figure(record, args.out.with_suffix(".png"))
    print(table(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
