"""Scale benchmark: ``python benchmarks/bench_scale.py --pairs 2000000 --steps 200``.

Writes a synthetic parallel corpus of ``--pairs`` sentence pairs as text files (Zipf-distributed
random words; the "translation" maps every word to its own target word and swaps neighbours, so
the task has reordering), then, each in its own process so that its memory is its own:

1. prepare: load the files (above 64 MB line by line into Arrow on disk, not into RAM) and clean
   them, train SentencePiece on a sample of ``--sp-input-sentence-size``
   sentences, encode every split with ``datasets.map(num_proc=...)`` and save it as Arrow;
2. train: ``seq2seq train`` for ``--steps`` steps from that cache (tokenizer and cache are reused);
3. (``--streaming``) train: the same from the text files with ``--streaming``;
4. control: the same training on a ``--control-pairs`` corpus from the same generator, so that
   the memory the large corpus costs the training process is the difference between the two.

It records wall-clock times (preparation split into load+clean / tokenizer / encode), the peak
resident memory of each process (``ru_maxrss`` from ``os.wait4``: the largest single process,
including waited-for workers) and of its whole process tree (sum of PSS over the process and its
workers, sampled every 0.2 s: shared pages are split between the processes that map them), the
peaks of the main process's anonymous memory (``RssAnon``: what it holds) and of its file-backed
resident pages (``RssFile``: pages of the memory-mapped Arrow cache and of the libraries, page
cache that the kernel can drop and that several processes share), corpus size on disk (text,
Arrow cache) and training steps/s, as a JSON record and a markdown line.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np

from common import provenance, write_record
from measured import run_measured
from seq2seq.config import DataConfig

ROOT = Path(__file__).resolve().parents[1]
MODEL_FLAGS = ["--arch", "transformer", "--layers", "3", "--d-model", "256", "--heads", "4", "--ff-size", "1024",
               "--max-tokens", "4096", "--warmup-steps", "100"]


# ----------------------------------------------------------------------------- synthetic corpus
def _vocabulary(rng: np.random.Generator, size: int) -> np.ndarray:
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    words: set[str] = set()
    while len(words) < size:
        length = int(rng.integers(2, 10))
        words.add("".join(rng.choice(letters, length)))
    return np.array(sorted(words), dtype=object)


def _swap_neighbours(lengths: np.ndarray) -> np.ndarray:
    """Permutation of a flat array of sentences that swaps words 0<->1, 2<->3, ... in each."""
    starts = np.repeat(np.cumsum(lengths) - lengths, lengths)
    flat = np.arange(int(lengths.sum()))
    partner = (flat - starts) ^ 1
    return np.where(partner < np.repeat(lengths, lengths), starts + partner, flat)


def _sentences(words: np.ndarray, ids: np.ndarray, lengths: np.ndarray) -> list[str]:
    chunks = np.split(words[ids], np.cumsum(lengths)[:-1])
    return [" ".join(chunk) for chunk in chunks]


def write_synthetic_corpus(directory: Path, pairs: int, eval_pairs: int = 1000, vocab: int = 20000,
                           seed: int = 1, chunk: int = 100_000) -> dict[str, int]:
    """``{train,val,test}.{src,tgt}`` under ``directory``; returns line counts and bytes written."""
    rng = np.random.default_rng(seed)
    source_words, target_words = _vocabulary(rng, vocab), _vocabulary(rng, vocab)
    rng.shuffle(target_words)
    zipf = 1.0 / np.arange(3, vocab + 3) ** 1.1
    zipf /= zipf.sum()
    directory.mkdir(parents=True, exist_ok=True)
    written = 0
    for split, count in (("train", pairs), ("val", eval_pairs), ("test", eval_pairs)):
        with open(directory / f"{split}.src", "w", encoding="utf-8") as src, \
                open(directory / f"{split}.tgt", "w", encoding="utf-8") as tgt:
            for start in range(0, count, chunk):
                lengths = rng.integers(3, 21, size=min(chunk, count - start))
                ids = rng.choice(vocab, size=int(lengths.sum()), p=zipf)
                src.write("\n".join(_sentences(source_words, ids, lengths)) + "\n")
                tgt.write("\n".join(_sentences(target_words, ids[_swap_neighbours(lengths)], lengths)) + "\n")
        written += sum((directory / f"{split}.{side}").stat().st_size for side in ("src", "tgt"))
    return {"train_pairs": pairs, "eval_pairs": eval_pairs, "text_bytes": written}


def prepare_phase(flags: list[str]) -> None:
    """Child process: prepare the corpus as ``train.py flags`` would, timing each stage."""
    from seq2seq.cli import add_config_flags, build_run_config
    from seq2seq.data.corpus import corpus_fingerprint, corpus_texts, load_clean_corpus, raw_dir
    from seq2seq.data.prepare import prepare_corpus
    from seq2seq.tokenizer import load_or_train_tokenizer

    parser = argparse.ArgumentParser()
    parser.add_argument("--output-dir", required=True)
    parser.add_argument("--timings", required=True)
    add_config_flags(parser)
    args, _ = parser.parse_known_args(flags)
    data = build_run_config(args).data
    times, start = {}, time.perf_counter()
    corpus, stats = load_clean_corpus(data)
    times["load_clean_s"], start = time.perf_counter() - start, time.perf_counter()
    tokenizer = load_or_train_tokenizer(
        Path(args.output_dir) / "spm.model", lambda: corpus_texts(corpus["train"]), data.vocab_size,
        data.sp_model_type, data.sp_input_sentence_size, data_fingerprint=corpus_fingerprint(data))
    times["tokenizer_s"], start = time.perf_counter() - start, time.perf_counter()
    prepare_corpus(data, tokenizer, data.cache_dir, corpus=corpus, stats=stats)
    times["encode_save_s"] = time.perf_counter() - start
    times["scratch_bytes"] = _du(raw_dir(data)) if raw_dir(data).is_dir() else 0  # as prepare_data: removed
    shutil.rmtree(raw_dir(data), ignore_errors=True)
    times["vocab"] = tokenizer.vocab_size
    Path(args.timings).write_text(json.dumps(times), encoding="utf-8")


def _du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


# ----------------------------------------------------------------------------- the benchmark
def bench(args: argparse.Namespace) -> dict:


    work = Path(args.work_dir).resolve()
    if work.exists():
        shutil.rmtree(work)
    data_dir, cache_dir, run_dir = work / "text", work / "cache", work / "run"
    run_dir.mkdir(parents=True)
    start = time.perf_counter()
    corpus = write_synthetic_corpus(data_dir, args.pairs, seed=args.seed)
    corpus["generate_s"] = time.perf_counter() - start
    print(f"corpus: {corpus}", file=sys.stderr, flush=True)
    data_flags = ["--data-dir", str(data_dir), "--src", "src", "--tgt", "tgt", "--valid-split", "val",
                  "--test-split", "test", "--vocab-size", str(args.vocab_size), "--cache-dir", str(cache_dir),
                  "--num-proc", str(args.num_proc), "--sp-input-sentence-size", str(args.sp_input_sentence_size)]
    timings = work / "prepare.json"
    prepare = run_measured([sys.executable, str(Path(__file__).resolve()), "--phase", "prepare", "--output-dir",
                            str(run_dir), "--timings", str(timings), *data_flags], work / "prepare.log")
    prepare.update(json.loads(timings.read_text()))
    corpus["arrow_bytes"] = _du(cache_dir)
    print(f"prepare: {prepare}", file=sys.stderr, flush=True)
    train_flags = [*data_flags, *MODEL_FLAGS, "--max-steps", str(args.steps), "--eval-every", "0",
                   "--log-every", "50", "--quiet", "--no-final-test", "--device", args.device, *args.extra]
    record = {**provenance("scale"),
              "settings": {"pairs": args.pairs, "steps": args.steps, "vocab_size": args.vocab_size,
                           "num_proc": args.num_proc, "sp_input_sentence_size": args.sp_input_sentence_size,
                           "control_pairs": args.control_pairs, "train_flags": MODEL_FLAGS + args.extra},
              "corpus": corpus, "prepare": prepare, "train": {}}
    modes = [("stored", run_dir, [])] + ([("streaming", work / "run-streaming", ["--streaming"])]
                                         if args.streaming else [])
    if args.control_pairs:
        control_dir = work / "control-text"
        corpus["control_pairs"] = write_synthetic_corpus(control_dir, args.control_pairs, seed=args.seed)["train_pairs"]
        control_flags = ["--data-dir", str(control_dir), "--cache-dir", str(work / "control-cache")]  # override
        modes.append(("control", work / "run-control", control_flags))
    for mode, out, extra in modes:
        entries = set(cache_dir.iterdir())
        command = [sys.executable, "-m", "seq2seq", "train", *train_flags, *extra, "--output-dir", str(out)]
        result = run_measured(command,
                              work / f"train-{mode}.log")
        summary = json.loads((out / "summary.json").read_text())
        result.update(steps=summary["steps"], train_s=summary["train_s"],
                      steps_per_s=summary["steps"] / max(summary["train_s"], 1e-9),
                      tgt_tokens_per_s=summary["train_tgt_tokens_per_s"], parameters=summary["parameters"])
        if mode == "stored":
            result["cache_reused"] = set(cache_dir.iterdir()) == entries
        record["train"][mode] = result
        print(f"train {mode}: {result}", file=sys.stderr, flush=True)
    if not args.keep:
        shutil.rmtree(work)
    return record


def markdown(record: dict) -> str:
    c, p, t = record["corpus"], record["prepare"], record["train"]
    line = (f"| {c['train_pairs']:,} | {c['text_bytes'] / 2**20:,.0f} MB | {c['arrow_bytes'] / 2**20:,.0f} MB | "
            f"{p['seconds']:.0f} s ({p['load_clean_s']:.0f} / {p['tokenizer_s']:.0f} / {p['encode_save_s']:.0f}) | "
            f"{p['peak_rss_mb']:,.0f} / {p['peak_tree_pss_mb']:,.0f} MB | "
            + " | ".join(f"{r['peak_rss_mb']:,.0f} MB ({r.get('peak_anon_mb', 0):,.0f} anon + "
                         f"{r.get('peak_file_mb', 0):,.0f} file), {r['steps_per_s']:.2f} steps/s" for r in t.values())
            + " |")
    names = {"control": f"control ({c.get('control_pairs', 0):,} pairs)"}
    header = ("| pairs | text | Arrow cache | prepare (load+clean / tokenizer / encode+save) | prepare peak RSS "
              "(largest process / tree PSS) | "
              + " | ".join(f"train {names.get(mode, mode)}: peak RSS (anon + file-backed), speed" for mode in t) + " |")
    return header + "\n|" + "---|" * (5 + len(t)) + "\n" + line + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:2] == ["--phase", "prepare"]:
        prepare_phase(argv[2:])
        return 0
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=2_000_000)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--num-proc", type=int, default=min(4, os.cpu_count() or 1))
    parser.add_argument("--sp-input-sentence-size", type=int, default=DataConfig().sp_input_sentence_size,
                        help="sentences SentencePiece samples (train.py's default)")
    parser.add_argument("--streaming", action="store_true", help="also train from the text files with --streaming")
    parser.add_argument("--control-pairs", type=int, default=20_000,
                        help="also train on a corpus this small (0: skip) to isolate the large corpus's memory")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--work-dir", default=str(ROOT / "data" / "bench-scale"),
                        help="corpus, cache and runs (deleted afterwards unless --keep); on disk, not tmpfs")
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--out", default=str(ROOT / "bench-results"))
    parser.add_argument("extra", nargs="*", help="more train.py flags, after --")
    args = parser.parse_args(argv)
    record = bench(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = f"scale-{args.pairs}"
    write_record(out / f"{name}.json", record, markdown(record))
    print(markdown(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
