"""CTranslate2 against our own decoding, on one Transformer checkpoint (from the repository root):

    python benchmarks/bench_ctranslate2.py --checkpoint RUN --data-dir MULTI30K [--batch1-sentences 250]
        [--threads 1 2] [--precisions fp32 int8] [--modes ...] [--engines ...] [--rounds 1]

1. ``seq2seq export --format ctranslate2 RUN`` into a temp directory (int8 is CTranslate2's
   ``compute_type="int8"`` on that same fp32 export; ours is ``--precision int8``).
2. Decode ``test_2016_flickr`` with both engines back to back, mode by mode, and within a mode and precision
   at every thread count of ``--threads`` in turn, every engine at each (interleaved: ours 1, CTranslate2 1,
   ours 2, CTranslate2 2, ...: the engines compared side by side in time): greedy and beam 5 in
   wide batches (the same batch size for both: ``DecodeConfig.batch``), and greedy and beam 5 one
   sentence at a time on the first ``--batch1-sentences`` sentences; fp32 and int8; one sentence at
   a time also ours compiled (``Translator(compile=True)``, fp32), and ours packaged (the same step compiled
   ahead of time, ``compile_cache``: AOTInductor packages built in the warm-up, or loaded there from
   ``--compile-cache DIR`` when an earlier run built them); and CTranslate2 as our engine
   (``Translator(engine="ctranslate2")``: our tokenization, batching and records around its search;
   the conversion, cached beside the checkpoint, in its warm-up). Both searches rank by
   log-probability (length penalty 0: CTranslate2 divides by length^alpha, we use GNMT's
   ((5 + |Y|) / 6)^alpha, so only 0 is the same objective) and bound outputs the same way.
   With ``--rounds N`` every engine of a mode is measured N times, round by round (each round the whole interleaved
   sequence again), and each keeps its fastest round (``round_seconds`` lists them all; ``identical`` the lowest
   share of its rounds): on a machine shared with others one pass can be 2x off either way.
3. Record sentences/s, target subwords/s (output subwords + EOS), ms per target subword, BLEU and
   chrF (sacreBLEU) of each, the share of outputs identical to ours in fp32 in the same mode, and the
   warm-up (the first 8 sentences; for the compiled engine its compilation); ``--out`` (JSON + md).
   ``--modes`` measures only some of the four modes, ``--engines`` only some engines (ours in fp32,
   the reference of the others, always), ``--precisions`` only fp32 or int8. The table's head names the CPU
   model and its instruction-set flags (``common.cpu_model_and_flags``), and a summary gives, per mode, each
   engine's best thread count against CTranslate2's best (issue 70: "best of 1 and 2 threads").
4. The memory-bandwidth floor of one decoding step: the decoder's and output layer's fp32 bytes
   over the read bandwidth measured here for a buffer of that size (cache-resident when it fits)
   and for one of 256 MB (main memory).

Every (engine, precision, mode) decodes in a process of its own (this script with ``--worker``):
CTranslate2's and PyTorch's thread pools in one process slow each other down by 2x at batch 1
(their idle threads spin), which made an earlier record of this benchmark (2026-11-26, 08:01) wrong.
Both engines use the same thread count in a row (torch threads; CTranslate2 intra_threads, one translator;
default ``--threads 1 N``, N every core). "ctranslate2
MKL_NUM_THREADS=1" is CTranslate2 in a process with that variable set: its matrix products (Intel MKL) on one
thread, its other operations still on intra_threads (on a 2-core Intel Xeon VM MKL's two-thread products made
CTranslate2 several times slower: bench-results/ctranslate2-2026-11-27-intel-mkl.md).
"""
from __future__ import annotations

import argparse
import json
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


ENGINES = ("ours", "ours compiled", "ours packaged", "ctranslate2", "ctranslate2 MKL_NUM_THREADS=1",
           "ours --engine ctranslate2")
SINGLE_MKL = " MKL_NUM_THREADS=1"  # the engine in a process whose MKL runs one thread (see the module docstring)
COMPILED = ("ours compiled", "ours packaged")  # one sentence at a time, in fp32 only


def engine(name: str, precision: str, checkpoint: Path, ct2_dir: Path, packages: str | None):
    """A function(sentences, beam, batch) -> outputs for one engine and precision ("ours packaged": compiled
    ahead of time into packages in ``packages``, else a fresh directory beside the export, built during the
    warm-up)."""
    if name.startswith("ours"):
        from seq2seq.decoding.translator import Translator

        if name == "ours packaged":
            packages = packages or str(ct2_dir.parent / f"packages-{os.getpid()}")
        translator = Translator.from_checkpoint(checkpoint, device="cpu", precision=precision,
                                                compile=name in COMPILED,
                                                compile_cache=packages if name == "ours packaged" else None,
                                                engine="ctranslate2" if name.endswith("ctranslate2") else "seq2seq")
        return lambda sentences, beam, batch: [t.text for t in translator.translate(
            sentences, beam_size=beam, length_penalty=0.0, batch_size=batch, need_attention=False)]
    from seq2seq.decoding.ctranslate2 import CTranslate2Translator  # "ctranslate2" with or without SINGLE_MKL

    translator = CTranslate2Translator(ct2_dir, compute_type={"fp32": "float32", "int8": "int8"}[precision],
                                       intra_threads=torch.get_num_threads(),  # the job's (``worker``)
                                       fastest_threads=False)  # bare: the threads given
    return lambda sentences, beam, batch: translator.translate(sentences, beam_size=beam, length_penalty=0.0,
                                                               batch_size=batch)


def worker(args: argparse.Namespace) -> int:
    """Decode one (engine, precision, mode, thread count) in this process; print outputs and timings as JSON."""
    job = json.loads(args.worker)
    torch.set_num_threads(job["threads"])
    sources = json.loads(Path(job["sources"]).read_text(encoding="utf-8"))
    decode = engine(job["engine"], job["precision"], args.checkpoint, Path(job["ct2_dir"]), args.compile_cache)
    start = time.perf_counter()
    decode(sources[:8], job["beam"], job["batch"])  # warm-up: allocations, thread pools, compilation
    warmup = time.perf_counter() - start
    start = time.perf_counter()
    outputs = decode(sources, job["beam"], job["batch"])
    print(json.dumps({"outputs": outputs, "seconds": time.perf_counter() - start, "warmup_seconds": warmup}))
    return 0


def decode_in_process(args: argparse.Namespace, job: dict) -> dict:
    """``worker`` in a fresh process (module docstring: why)."""
    command = [sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(job), "--checkpoint",
               str(args.checkpoint.resolve()), "--data-dir", str(args.data_dir.resolve())]
    if args.compile_cache:
        command += ["--compile-cache", str(Path(args.compile_cache).resolve())]
    environment = {**os.environ, "MKL_NUM_THREADS": "1"} if job["engine"].endswith(SINGLE_MKL) else None
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=environment)
    if done.returncode:
        raise SystemExit(f"{job['engine']} {job['precision']} beam {job['beam']} batch {job['batch']} "
                         f"{job['threads']} threads failed "
                         f"(exit {done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def decoder_bytes(model: torch.nn.Module) -> int:
    """fp32 bytes one decoding step reads: the decoder's and the output layer's weights."""
    weights = {id(p): p for p in [*model.decoder.parameters(), *model.dec_norm.parameters(), model.generator.weight]}
    return sum(p.numel() * 4 for p in weights.values())


def read_bandwidth(nbytes: int, repeats: int = 20) -> float:
    """Bytes per second of summing a float32 buffer of ``nbytes`` (best of ``repeats``)."""
    buffer = torch.ones(max(1, nbytes // 4))
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        buffer.sum()
        best = min(best, time.perf_counter() - start)
    return buffer.numel() * 4 / best


def floor(model: torch.nn.Module) -> dict:
    nbytes = decoder_bytes(model)
    fitting, dram = read_bandwidth(nbytes), read_bandwidth(256 << 20, 5)
    return {"decoder_bytes": nbytes, "read_gb_per_s_decoder_sized": fitting / 1e9, "read_gb_per_s_256mb": dram / 1e9,
            "floor_ms_per_step_decoder_sized": 1e3 * nbytes / fitting, "floor_ms_per_step_256mb": 1e3 * nbytes / dram}


def run(args: argparse.Namespace) -> dict:
    from seq2seq.config import DecodeConfig
    from seq2seq.decoding.translator import Translator

    torch.set_num_threads(max(args.threads))
    sources = (args.data_dir / f"{args.test_split}.{args.src}").read_text(encoding="utf-8").splitlines()
    references = (args.data_dir / f"{args.test_split}.{args.tgt}").read_text(encoding="utf-8").splitlines()
    if args.sentences:
        sources, references = sources[: args.sentences], references[: args.sentences]
    reference = Translator.from_checkpoint(args.checkpoint, device="cpu")  # its tokenizer and weights
    tokenizer = reference.tokenizer
    results, signature = [], ""
    with tempfile.TemporaryDirectory() as tmp:
        ct2_dir = Path(tmp) / "ct2"
        export(args.checkpoint, ct2_dir)
        for mode in args.modes:
            beam, batch = MODES[mode]
            count = args.batch1_sentences if batch == 1 else len(sources)
            source_file = Path(tmp) / f"sources-{count}.json"
            source_file.write_text(json.dumps(sources[:count]), encoding="utf-8")
            batch = batch or DecodeConfig(beam_size=beam).batch
            reference_outputs, fastest = None, {}
            for _ in range(args.rounds):  # every job once per round: the engines side by side in time
                for precision, name, threads in jobs(args, batch):  # ours in fp32 first: the reference
                    job = {"engine": name, "precision": precision, "beam": beam, "batch": batch, "threads": threads,
                           "sources": str(source_file), "ct2_dir": str(ct2_dir)}
                    row = measure(args, job, mode, count, (references[:count], tokenizer))
                    signature = row.pop("bleu_signature")
                    reference_outputs = reference_outputs or row["outputs"]
                    same = sum(a == b for a, b in zip(row.pop("outputs"), reference_outputs))
                    row["identical_to_ours_fp32"] = same / count
                    print(f"{mode:16} {name:13} {precision} {threads}t: {row['sentences_per_s']:8.1f} sent/s "
                          f"{row['ms_per_subword']:6.2f} ms/subword BLEU {row['bleu']:.2f} "
                          f"identical {row['identical_to_ours_fp32']:.3f} warm-up {row['warmup_seconds']:.1f} s",
                          file=sys.stderr, flush=True)
                    best = fastest.get((precision, name, threads))
                    row["round_seconds"] = (best["round_seconds"] if best else []) + [row["seconds"]]
                    if best is not None and best["seconds"] <= row["seconds"]:  # the fastest round's row stays
                        row = {**best, "round_seconds": row["round_seconds"],
                               "identical_to_ours_fp32": min(best["identical_to_ours_fp32"],
                                                             row["identical_to_ours_fp32"])}
                    fastest[(precision, name, threads)] = row
            results.extend(fastest.values())
    return {**provenance("ctranslate2"), "checkpoint": str(args.checkpoint), "test_split": args.test_split,
            "threads": args.threads, "ctranslate2": _version("ctranslate2"), "results": results,
            "bandwidth_floor": floor(reference.model), "bleu_signature": signature}


def jobs(args: argparse.Namespace, batch: int) -> list[tuple[str, str, int]]:
    """(precision, engine, threads) of one mode in the order they run: precision by precision, thread count by
    thread count, every engine at each (ours first); the compiled engines only one sentence at a time and in fp32."""
    return [(precision, name, threads) for precision in args.precisions for threads in args.threads
            for name in args.engines if name not in COMPILED or (batch == 1 and precision == "fp32")]


def measure(args: argparse.Namespace, job: dict, mode: str, count: int, truth: tuple) -> dict:
    """Decode ``job`` in its own process; its row of the record (``outputs`` included), scored against
    ``truth`` (the references, and the tokenizer that counts target subwords)."""
    from seq2seq.metrics import corpus_scores

    references, tokenizer = truth
    done = decode_in_process(args, job)
    outputs, seconds = done["outputs"], done["seconds"]
    scores = corpus_scores(outputs, references, ("bleu", "chrf"))
    subwords = sum(len(tokenizer.encode(o)) + 1 for o in outputs)
    return {"mode": mode, "engine": job["engine"], "precision": job["precision"], "beam": job["beam"],
            "batch": job["batch"], "threads": job["threads"], "sentences": count, "seconds": seconds,
            "sentences_per_s": count / seconds, "target_subwords_per_s": subwords / seconds,
            "ms_per_subword": 1e3 * seconds / subwords, "warmup_seconds": done["warmup_seconds"],
            "bleu": scores["bleu"].score, "chrf": scores["chrf"].score, "outputs": outputs,
            "bleu_signature": scores["bleu"].signature}


def _version(package: str) -> str:
    from importlib.metadata import version

    return version(package)


def table(record: dict) -> str:
    rows = []
    by_key = {(r["mode"], r["engine"], r["precision"], r.get("threads", record["threads"])): r
              for r in record["results"]}
    for r in record["results"]:
        threads = r.get("threads", record["threads"])
        ours = by_key[(r["mode"], "ours", r["precision"], threads)]
        speedup = r["sentences_per_s"] / ours["sentences_per_s"]
        rows.append([r["mode"], r["precision"], r["engine"], threads, r["sentences"], f"{r['sentences_per_s']:.1f}",
                     f"{r['target_subwords_per_s']:.0f}", f"{r['ms_per_subword']:.2f}", f"{speedup:.2f}x",
                     f"{r['bleu']:.2f}", f"{r['chrf']:.1f}", f"{100 * r['identical_to_ours_fp32']:.1f}%",
                     f"{r['warmup_seconds']:.1f}"])
    machine = record["machine"]
    head = (f"{record['test_split']}, {machine['cpu']} ({machine['cpu_capability']}; "
            f"{', '.join(machine.get('cpu_flags', []))}), threads {record['threads']}, "
            f"CTranslate2 {record['ctranslate2']}, torch {machine['versions']['torch']}; "
            "length penalty 0 for both; every engine in a process of its own.\n\n")
    bound = record["bandwidth_floor"]
    foot = (f"\n\nMemory-bandwidth floor of one decoding step (fp32 decoder + output layer, "
            f"{bound['decoder_bytes'] / 1e6:.1f} MB): {bound['floor_ms_per_step_decoder_sized']:.3f} ms at the "
            f"{bound['read_gb_per_s_decoder_sized']:.0f} GB/s read here for a buffer that size, "
            f"{bound['floor_ms_per_step_256mb']:.3f} ms at the {bound['read_gb_per_s_256mb']:.0f} GB/s of a 256 MB "
            "one. "
            "Warm-up: the first 8 sentences (compiled: the compilation).\n")
    return head + markdown_table(["mode", "precision", "engine", "threads", "sentences", "sentences/s", "subwords/s",
                                  "ms/subword", "vs ours", "BLEU", "chrF", "identical to ours fp32", "warm-up s"],
                                 rows) + best_of_threads(record) + foot


def best_of_threads(record: dict) -> str:
    """Per mode and precision, each engine at its best thread count against CTranslate2 at its own best."""
    best: dict[tuple, dict] = {}
    for r in record["results"]:
        key = (r["mode"], r["precision"], r["engine"])
        if key not in best or r["sentences_per_s"] > best[key]["sentences_per_s"]:
            best[key] = r
    rows = []
    for (mode, precision, name), r in best.items():
        ct2 = best.get((mode, precision, "ctranslate2"))
        rows.append([mode, precision, name, r.get("threads", record["threads"]), f"{r['sentences_per_s']:.1f}",
                     "-" if ct2 is None else f"{r['sentences_per_s'] / ct2['sentences_per_s']:.2f}x"])
    return ("\n\nEach engine at its best thread count:\n\n"
            + markdown_table(["mode", "precision", "engine", "threads", "sentences/s", "vs CTranslate2"], rows))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_multi30k_flags(parser)
    parser.add_argument("--checkpoint", type=Path, required=True, help="a Transformer checkpoint or run directory")
    parser.add_argument("--sentences", type=int, default=0, help="decode the first N test sentences (0 = all)")
    parser.add_argument("--batch1-sentences", type=int, default=250, help="sentences decoded one at a time")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 0],
                        help="thread counts, each engine measured at each (0 = every core; default 1 and every core)")
    parser.add_argument("--precisions", nargs="+", choices=("fp32", "int8"), default=["fp32", "int8"])
    parser.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES), metavar="MODE",
                        help=f"the modes to measure (default: all of {', '.join(map(repr, MODES))})")
    parser.add_argument("--engines", nargs="+", choices=ENGINES, default=list(ENGINES), metavar="ENGINE",
                        help=f"the engines to measure (default: all of {', '.join(map(repr, ENGINES))}; "
                             "'ours' is always measured: the reference)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="measure every engine this many times, interleaved round by round; each keeps its fastest "
                             "round (a noisy machine: several rounds)")
    parser.add_argument("--compile-cache", help="ours packaged: keep the packages in this directory (a second run "
                                                "loads them: its warm-up is a second start), not in a fresh one")
    parser.add_argument("--out", type=Path, default=ROOT / "bench-results" / "ctranslate2.json")
    parser.add_argument("--worker", help=argparse.SUPPRESS)  # one engine, precision and mode (``worker``)
    args = parser.parse_args(argv)
    args.threads = list(dict.fromkeys(t or os.cpu_count() for t in args.threads))  # 0: every core; once each
    args.precisions = [p for p in ("fp32", "int8") if p in args.precisions]  # fp32 first: ours fp32 the reference
    args.engines = [name for name in ENGINES if name == "ours" or name in args.engines]  # ours first
    if args.worker:
        return worker(args)
    record = run(args)
    text = table(record)
    write_record(args.out, record, text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
