"""CTranslate2 against our own decoding, on one Transformer checkpoint (from the repository root):

    python benchmarks/bench_ctranslate2.py --checkpoint RUN --data-dir MULTI30K [--batch1-sentences 250]

1. ``seq2seq export --format ctranslate2 RUN`` into a temp directory (int8 is CTranslate2's
   ``compute_type="int8"`` on that same fp32 export; ours is ``--precision int8``).
2. Decode ``test_2016_flickr`` with both engines back to back, mode by mode: greedy and beam 5 in
   wide batches (the same batch size for both: ``default_batch_size``), and greedy and beam 5 one
   sentence at a time on the first ``--batch1-sentences`` sentences; fp32 and int8. Both searches
   rank by log-probability (length penalty 0: CTranslate2 divides by length^alpha, we use GNMT's
   ((5 + |Y|) / 6)^alpha, so only 0 is the same objective) and bound outputs the same way.
3. Record sentences/s, target subwords/s (output subwords + EOS), BLEU and chrF (sacreBLEU) of each,
   and the share of outputs identical to ours in fp32 in the same mode; ``--out`` (JSON + markdown).
Both engines use every core (torch threads; CTranslate2 intra_threads, one translator).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from common import ROOT, add_multi30k_flags, provenance, write_record
from seq2seq.io_utils import markdown_table

MODES = {  # name: (beam size, batch size or None for the default wide batch)
    "greedy": (1, None),
    "beam 5": (5, None),
    "greedy, batch 1": (1, 1),
    "beam 5, batch 1": (5, 1),
}


def export(checkpoint: Path, out: Path) -> None:
    subprocess.run([sys.executable, "-m", "seq2seq", "export", "--format", "ctranslate2", str(checkpoint), str(out)],
                   check=True, cwd=ROOT)


def engines(checkpoint: Path, ct2_dir: Path, threads: int) -> dict:
    """name -> a function(sentences, beam, batch) -> outputs, for both engines and precisions."""
    from seq2seq.decoding.translator import Translator
    from seq2seq.export.ctranslate2 import CTranslate2Translator

    def ours(precision):
        translator = Translator.from_checkpoint(checkpoint, device="cpu", precision=precision)
        return lambda sentences, beam, batch: [t.text for t in translator.translate(
            sentences, beam_size=beam, length_penalty=0.0, batch_size=batch, need_attention=False)]

    def ctranslate2(compute_type):
        translator = CTranslate2Translator(ct2_dir, compute_type=compute_type, intra_threads=threads)
        return lambda sentences, beam, batch: translator.translate(sentences, beam_size=beam, length_penalty=0.0,
                                                                   batch_size=batch)

    return {("ours", "fp32"): ours("fp32"), ("ctranslate2", "fp32"): ctranslate2("float32"),
            ("ours", "int8"): ours("int8"), ("ctranslate2", "int8"): ctranslate2("int8")}


def run(args: argparse.Namespace) -> dict:
    from seq2seq.metrics import corpus_scores
    from seq2seq.decoding.translator import Translator, default_batch_size

    threads = args.threads or os.cpu_count()
    torch.set_num_threads(threads)
    sources = (args.data_dir / f"{args.test_split}.{args.src}").read_text(encoding="utf-8").splitlines()
    references = (args.data_dir / f"{args.test_split}.{args.tgt}").read_text(encoding="utf-8").splitlines()
    if args.sentences:
        sources, references = sources[: args.sentences], references[: args.sentences]
    tokenizer = Translator.from_checkpoint(args.checkpoint, device="cpu").tokenizer
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        ct2_dir = Path(tmp) / "ct2"
        export(args.checkpoint, ct2_dir)
        decoders = engines(args.checkpoint, ct2_dir, threads)
        for mode, (beam, batch) in MODES.items():
            count = args.batch1_sentences if batch == 1 else len(sources)
            batch = batch or default_batch_size(beam)
            reference_outputs = None
            for precision in ("fp32", "int8"):
                for engine in ("ours", "ctranslate2"):  # back to back, ours first
                    decode = decoders[(engine, precision)]
                    decode(sources[:8], beam, batch)  # warm-up: first-call allocations, thread pools
                    start = time.perf_counter()
                    outputs = decode(sources[:count], beam, batch)
                    seconds = time.perf_counter() - start
                    if engine == "ours" and precision == "fp32":
                        reference_outputs = outputs
                    scores = corpus_scores(outputs, references[:count], ("bleu", "chrf"))
                    subwords = sum(len(tokenizer.encode(o)) + 1 for o in outputs)
                    row = {"mode": mode, "engine": engine, "precision": precision, "beam": beam, "batch": batch,
                           "sentences": count, "seconds": seconds, "sentences_per_s": count / seconds,
                           "target_subwords_per_s": subwords / seconds, "bleu": scores["bleu"].score,
                           "chrf": scores["chrf"].score,
                           "identical_to_ours_fp32": sum(a == b for a, b in zip(outputs, reference_outputs)) / count}
                    results.append(row)
                    print(f"{mode:16} {engine:11} {precision}: {row['sentences_per_s']:8.1f} sent/s "
                          f"{row['target_subwords_per_s']:8.0f} subwords/s BLEU {row['bleu']:.2f} "
                          f"identical {row['identical_to_ours_fp32']:.3f}", file=sys.stderr, flush=True)
    return {**provenance("ctranslate2"), "checkpoint": str(args.checkpoint), "test_split": args.test_split,
            "threads": threads, "ctranslate2": _version("ctranslate2"), "results": results,
            "bleu_signature": scores["bleu"].signature}


def _version(package: str) -> str:
    from importlib.metadata import version

    return version(package)


def table(record: dict) -> str:
    rows = []
    by_key = {(r["mode"], r["engine"], r["precision"]): r for r in record["results"]}
    for r in record["results"]:
        ours = by_key[(r["mode"], "ours", r["precision"])]
        speedup = r["sentences_per_s"] / ours["sentences_per_s"]
        rows.append([r["mode"], r["precision"], r["engine"], r["sentences"], f"{r['sentences_per_s']:.1f}",
                     f"{r['target_subwords_per_s']:.0f}", f"{speedup:.2f}x", f"{r['bleu']:.2f}", f"{r['chrf']:.1f}",
                     f"{100 * r['identical_to_ours_fp32']:.1f}%"])
    machine = record["machine"]
    head = (f"{record['test_split']}, {machine['cpu']} ({machine['cpu_capability']}), {record['threads']} threads, "
            f"CTranslate2 {record['ctranslate2']}, torch {machine['versions']['torch']}; "
            "length penalty 0 for both.\n\n")
    return head + markdown_table(["mode", "precision", "engine", "sentences", "sentences/s", "subwords/s",
                                  "vs ours", "BLEU", "chrF", "identical to ours fp32"], rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_multi30k_flags(parser)
    parser.add_argument("--checkpoint", type=Path, required=True, help="a Transformer checkpoint or run directory")
    parser.add_argument("--sentences", type=int, default=0, help="decode the first N test sentences (0 = all)")
    parser.add_argument("--batch1-sentences", type=int, default=250, help="sentences decoded one at a time")
    parser.add_argument("--threads", type=int, default=0, help="threads for both engines (0 = every core)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench-results" / "ctranslate2.json")
    args = parser.parse_args(argv)
    record = run(args)
    text = table(record)
    write_record(args.out, record, text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
