"""Benchmarks: ``python benchmarks/bench.py quality | speed | decode | profile`` (from the repository root).

quality: trains the RNN with Bahdanau attention, the RNN with Luong general attention and the
Transformer on Multi30k (German->English by default) with one shared 8k SentencePiece model, each
for the same wall-clock budget, each in its own process (so peak memory is per system), then
decodes the test split greedily and with beam 5 and writes a JSON record and a markdown table.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch

from common import ROOT, for_arch, provenance, step_flops_per_target_token, write_record
from seq2seq.io_utils import display_path, markdown_table

DEFAULT_DATA = os.environ.get("SEQ2SEQ_MULTI30K")  # Multi30k {split}.{lang} files, or --data-dir

# The systems compared: the presets (seq2seq.config.PRESETS, configs/*.yaml), whose sizes are the
# peers' (see benchmarks/peers): the same as the Joey NMT / OpenNMT-py runs.
SYSTEMS: dict[str, list[str]] = {
    "rnn-bahdanau": ["--preset", "rnn-bahdanau"],
    "rnn-luong-general": ["--preset", "rnn-luong"],
    "transformer": ["--preset", "transformer"],
}

# Training-speed batches as large as the peers' (RNN 128 sentences ~ 2,000 target tokens; Transformer
# 280 sentences ~ 4,400): --max-tokens budgets padded source and target, so a little above those.
PEER_BATCH_MAX_TOKENS = {"rnn-bahdanau": 2300, "rnn-luong-general": 2300, "transformer": 5900}

# The peers' parameter counts: their RNN has separate source / target embeddings and an untied
# 512 -> vocabulary output layer (12.0 M parameters); their Transformer ties only the target
# embeddings to the output layer (9.6 M). Our defaults share one table for all three (5.9 M / 7.6 M).
PEER_EMBEDDINGS = {"rnn-bahdanau": ["--no-tie-embeddings"], "rnn-luong-general": ["--no-tie-embeddings"],
                   "transformer": ["--no-share-source-embeddings"]}


def system_flags(name: str, peer_sizes: bool) -> list[str]:
    return SYSTEMS[name] + (PEER_EMBEDDINGS[name] if peer_sizes else [])


def train_system(name: str, args: argparse.Namespace, run_dir: Path, shared_spm: Path | None) -> dict:
    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    if shared_spm is not None:  # one shared SentencePiece model: reused, not retrained
        for suffix in (".model", ".json"):
            shutil.copy(shared_spm.with_suffix(suffix), run_dir / f"spm{suffix}")
    command = [sys.executable, "-m", "seq2seq", "train", *for_arch([
        "--data-dir", str(args.data_dir), "--src", args.src, "--tgt", args.tgt, "--vocab-size", str(args.vocab_size),
        "--max-minutes", str(args.minutes), "--eval-every", str(args.eval_every), "--output-dir", str(run_dir),
        "--quiet", "--no-final-test", "--device", args.device, *system_flags(name, args.peer_sizes), *args.extra])]
    print(f"[{name}] {' '.join(command)}", file=sys.stderr, flush=True)
    subprocess.run(command, check=True, cwd=ROOT)
    return json.loads((run_dir / "summary.json").read_text())


def decode_system(run_dir: Path, args: argparse.Namespace) -> dict:
    """Decode the test split greedy / beam 5 (fp32, default batches; then again with the run's
    lexical shortlist, its agreement with the full-vocabulary outputs recorded) and batch 1 (fp32 and
    fp16) on the first ``bs1_sentences``; on CPU all three in int8 too (with and without the shortlist),
    and on a CPU with native bf16 matrix products in bf16. A run without shortlist.npz gets one from
    the training text."""
    from seq2seq.metrics import corpus_scores
    from seq2seq.runtime import precision_warning, resolve_device
    from seq2seq.decoding.shortlist import FILE_NAME, Shortlist, build_from_text
    from seq2seq.config import DecodeConfig
    from seq2seq.decoding.translator import Translator

    sources = (args.data_dir / f"{args.test_split}.{args.src}").read_text(encoding="utf-8").splitlines()
    references = (args.data_dir / f"{args.test_split}.{args.tgt}").read_text(encoding="utf-8").splitlines()
    device = resolve_device(args.device)
    bf16 = precision_warning(device, "bf16") is None  # not emulated
    int8 = device.type == "cpu"
    precisions = ("fp32", "fp16") + (("bf16",) if bf16 else ()) + (("int8",) if int8 else ())
    translators = {precision: Translator.from_checkpoint(run_dir / "best.pt", device=args.device, precision=precision)
                   for precision in precisions}
    if not (run_dir / FILE_NAME).is_file():
        train_text = [(args.data_dir / f"train.{lang}").read_text(encoding="utf-8").splitlines()
                      for lang in (args.src, args.tgt)]
        build_from_text(translators["fp32"].tokenizer, *train_text).save(run_dir / FILE_NAME)
    shortlist = Shortlist.load(run_dir / FILE_NAME, translators["fp32"].tokenizer.sha256())
    for precision in ("fp32", "fp16") + (("int8",) if int8 else ()):  # the same models, over the shortlist
        plain = translators[precision]
        translators[f"{precision}+shortlist"] = Translator(plain.model, plain.tokenizer, plain.decode, shortlist)
    results, baseline = {}, {}
    greedy_rows, beam_rows = DecodeConfig(beam_size=1).batch, DecodeConfig(beam_size=5).batch
    runs = (("greedy", 1, greedy_rows, "fp32"), ("beam5", 5, beam_rows, "fp32"),
            ("greedy_shortlist", 1, greedy_rows, "fp32+shortlist"),
            ("beam5_shortlist", 5, beam_rows, "fp32+shortlist"),
            ("greedy_bs1", 1, 1, "fp32"), ("greedy_bs1_fp16", 1, 1, "fp16"),  # fp16 speeds up batch 1 on CPU
            ("greedy_bs1_shortlist", 1, 1, "fp32+shortlist"), ("greedy_bs1_fp16_shortlist", 1, 1, "fp16+shortlist"))
    if bf16:
        runs += (("greedy_bf16", 1, greedy_rows, "bf16"), ("beam5_bf16", 5, beam_rows, "bf16"),
                 ("greedy_bs1_bf16", 1, 1, "bf16"))
    if int8:
        runs += (("greedy_int8", 1, greedy_rows, "int8"), ("beam5_int8", 5, beam_rows, "int8"),
                 ("greedy_bs1_int8", 1, 1, "int8"),
                 ("beam5_int8_shortlist", 5, beam_rows, "int8+shortlist"),
                 ("greedy_bs1_int8_shortlist", 1, 1, "int8+shortlist"))
    for label, beam, batch, precision in runs:
        subset = sources[: args.bs1_sentences] if batch == 1 else sources
        start = time.perf_counter()
        hyps = translators[precision].translate(subset, beam_size=beam, batch_size=batch, need_attention=False)
        seconds = time.perf_counter() - start
        texts = [h.text for h in hyps]
        entry = {"sentences": len(subset), "batch_size": batch, "precision": precision, "seconds": seconds,
                 "sentences_per_s": len(subset) / seconds,
                 "tgt_tokens_per_s": sum(len(h.tokens) + 1 for h in hyps) / seconds}
        plain = label.removesuffix("_shortlist")
        for suffix in ("_fp16", "_bf16", "_int8"):
            plain = plain.removesuffix(suffix)  # its fp32 twin
        if plain != label:  # the same decoding made faster: how many outputs stayed the same
            entry[f"same_outputs_as_{plain}"] = sum(a == b for a, b in zip(texts, baseline[plain]))
        baseline.setdefault(label, texts)
        if batch == 1:  # on the first bs1_sentences only
            entry["bleu"] = corpus_scores(texts, references[: len(subset)], ("bleu",))["bleu"].score
        else:
            scores = corpus_scores(texts, references, ("bleu", "chrf"))
            entry.update({k: v.score for k, v in scores.items()})
            entry["signatures"] = {k: v.signature for k, v in scores.items()}
            entry["length_ratio"] = sum(len(t.split()) for t in texts) / sum(len(r.split()) for r in references)
            (run_dir / f"test.{label}.hyp").write_text("\n".join(texts) + "\n", encoding="utf-8")
        results[label] = entry
    return results


def quality_table(record: dict) -> str:
    header = ["system", "params", "train time", "train tgt tok/s", "peak RSS train", "BLEU greedy / beam 5",
              "chrF greedy / beam 5", "greedy sent/s", "beam 5 sent/s", "greedy bs1 sent/s"]
    rows = []
    for name, r in record["systems"].items():
        t, d = r["train"], r["decode"]
        rows.append([name, f"{t['parameters'] / 1e6:.1f} M", f"{t['elapsed_s'] / 60:.1f} min ({t['steps']} steps)",
                     f"{t['train_tgt_tokens_per_s']:,.0f}", f"{t['peak_rss_mb'] / 1024:.1f} GB",
                     f"{d['greedy']['bleu']:.2f} / {d['beam5']['bleu']:.2f}",
                     f"{d['greedy']['chrf']:.1f} / {d['beam5']['chrf']:.1f}", f"{d['greedy']['sentences_per_s']:.1f}",
                     f"{d['beam5']['sentences_per_s']:.1f}", f"{d['greedy_bs1']['sentences_per_s']:.1f}"])
    return markdown_table(header, rows) + "\n"


def quality(args: argparse.Namespace) -> dict:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    record = {**provenance("quality"), "data": display_path(args.data_dir), "pair": f"{args.src}-{args.tgt}",
              "minutes_per_system": args.minutes, "vocab_size": args.vocab_size, "systems": {}}
    shared_spm = None
    for name in args.systems:
        run_dir = out / name
        train_summary = train_system(name, args, run_dir, shared_spm)
        shared_spm = shared_spm or run_dir / "spm.model"
        record["systems"][name] = {"flags": system_flags(name, args.peer_sizes), "train": train_summary,
                                   "decode": decode_system(run_dir, args)}
        write_record(out / "quality.json", record)  # after every system: a crash keeps what was measured
    write_record(out / "quality.json", record, quality_table(record))
    print(quality_table(record))
    return record


def matmul_peak(dtype: torch.dtype, shape: tuple[int, int, int], seconds: float = 2.0,
                device: torch.device | str = "cpu") -> float:
    """GFLOP/s of (m x k) @ (k x n) in ``dtype`` on ``device`` (a CPU: torch's current thread count;
    a GPU: the clock stops after the device has finished the queued products)."""
    m, k, n = shape
    a, b = torch.randn(m, k, dtype=dtype, device=device), torch.randn(k, n, dtype=dtype, device=device)
    wait = torch.cuda.synchronize if a.is_cuda else (lambda: None)
    for _ in range(3):
        a @ b
    wait()
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(10 if a.is_cuda else 1):  # keep a GPU's queue full between clock reads
            a @ b
            count += 1
        wait()
    return 2 * m * k * n * count / (time.perf_counter() - start) / 1e9


def train_speed(name: str, args: argparse.Namespace) -> dict:
    """Steady-state training throughput of one system at the peers' sizes (batch sizes, embedding
    layout, parameter counts), in this process.

    Builds the run like train.py does, times ``args.steps`` optimizer steps after ``args.warmup``
    untimed ones, and counts the FLOPs of one step (forward + backward matmuls) with
    ``torch.utils.flop_counter``, extrapolated to the timed steps by their target tokens.
    """
    from seq2seq.cli import config_from_flags
    from seq2seq.training.corpus import prepare_run_corpus
    from seq2seq.runtime import peak_rss_mb, seed_everything
    from seq2seq.training.trainer import Trainer

    run_dir = Path(args.out) / f"speed-{name}"
    model_flags = [*system_flags(name, peer_sizes=True), "--max-tokens", str(PEER_BATCH_MAX_TOKENS[name])]
    flags = ["--data-dir", str(args.data_dir), "--src", args.src, "--tgt", args.tgt, "--vocab-size",
             str(args.vocab_size), "--precision", args.precision, "--device", args.device,
             "--output-dir", str(run_dir), *model_flags, *getattr(args, "extra", [])]
    cfg = config_from_flags(flags)
    seed_everything(cfg.train.seed)
    run_dir.mkdir(parents=True, exist_ok=True)
    corpus = prepare_run_corpus(cfg, run_dir, quiet=True)
    cfg.model.vocab_size = corpus.tokenizer.vocab_size
    trainer = Trainer(cfg, corpus, quiet=True)
    batches = (batch for epoch in itertools.count() for batch in corpus.train_batches(epoch))  # epochs on end
    for _ in range(args.warmup):
        trainer.train_step([next(batches)])
    flops_per_token = step_flops_per_target_token(trainer, next(batches))
    tokens, start = 0, time.perf_counter()
    for _ in range(args.steps):
        batch = next(batches)
        _, n = trainer.train_step([batch])
        tokens += n
    seconds = time.perf_counter() - start
    flops = flops_per_token * tokens  # FLOPs scale with the tokens of a batch: extrapolate
    return {"system": name, "flags": model_flags, "parameters": trainer.model.num_parameters(), "steps": args.steps,
            "seconds": seconds, "tgt_tokens_per_s": tokens / seconds, "steps_per_s": args.steps / seconds,
            "tgt_tokens_per_step": tokens / args.steps,
            "model_gflop_per_s_estimate": flops / seconds / 1e9, "peak_rss_mb": peak_rss_mb(),
            "precision": args.precision}


def speed(args: argparse.Namespace) -> dict:
    """Matmul peaks of the device in use (``--device``), then each system's training speed in its
    own process, then decoding speed."""
    from seq2seq.errors import UserError
    from seq2seq.runtime import precision_warning, resolve_device

    device = resolve_device(args.device)
    slow = precision_warning(device, args.precision)
    if slow:  # an emulated precision would measure the emulation, not the toolkit
        raise UserError(slow)
    native_bf16 = precision_warning(device, "bf16") is None
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    dtypes = ("float32", "bfloat16") if native_bf16 else ("float32",)  # emulated bf16: ~1 GFLOP/s, skipped
    peaks = {f"{dtype}_{label}": matmul_peak(getattr(torch, dtype), shape, args.peak_seconds, device)
             for dtype in dtypes for label, shape in
             (("square2048", (2048, 2048, 2048)), ("ffn4400x256x1024", (4400, 256, 1024)))}
    record = {**provenance("speed"), "device": str(device), "matmul_gflop_per_s": peaks, "train": {}, "decode": {}}
    for name in args.systems:
        child = out / f"speed-{name}.json"
        subprocess.run([sys.executable, str(Path(__file__).resolve()), "train-speed", name, "--json", str(child),
                        *_forwarded(args)], check=True, cwd=ROOT)
        result = json.loads(child.read_text())
        peak = peaks["bfloat16_ffn4400x256x1024" if args.precision == "bf16" else "float32_ffn4400x256x1024"]
        result["fraction_of_matmul_peak"] = result["model_gflop_per_s_estimate"] / peak
        record["train"][name] = result
        checkpoint = Path(args.checkpoints) / name / "best.pt" if args.checkpoints else None
        if checkpoint is not None and checkpoint.is_file():
            record["decode"][name] = decode_system(checkpoint.parent, args)
    table = speed_table(record)
    write_record(out / "speed.json", record, table)
    print(table)
    return record


def decode(args: argparse.Namespace) -> dict:
    """``decode_system`` for each run, ``repeats`` times in turn; the median sentences/s per row."""
    import statistics

    from seq2seq.errors import UserError

    runs = {name: Path(args.checkpoints) / name for name in args.systems}
    for name, run_dir in runs.items():
        if not (run_dir / "best.pt").is_file():
            raise UserError(f"--checkpoints {args.checkpoints}: no {name}/best.pt")
    record = {**provenance("decode"), "test_split": args.test_split, "runs": {name: [] for name in runs}}
    for _ in range(args.repeats):
        for name, run_dir in runs.items():
            record["runs"][name].append(decode_system(run_dir, args))
    record["median_sentences_per_s"] = {
        name: {label: statistics.median(r[label]["sentences_per_s"] for r in results) for label in results[0]}
        for name, results in record["runs"].items()}
    write_record(args.out, record)
    print(json.dumps(record["median_sentences_per_s"], indent=2))
    return record


# the matrix products of a decoding: what is left when everything else takes no time
MATMUL_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::mv", "aten::addmv",
              "mkldnn::_linear_pointwise")  # CPU fp32 decoding's linear layers (seq2seq.nn.packed; no FLOP count)


def profile_decoding(args: argparse.Namespace) -> dict:
    """Where the time of decoding the test split goes, and the speed that bounds.

    Decodes the sentences three times with the same translator: a short warm-up, once timed
    (wall clock), once under ``torch.profiler`` (self time and FLOPs per operator). The matrix
    products (``MATMUL_OPS``) are the part no decoder of the same model avoids: with everything
    else at zero cost, decoding would run at ``sentences / matmul seconds``
    (``bound_sentences_per_s``). Their FLOP rate is compared with the device's fp32 matmul peak,
    measured in the same process at the shape of a full batch's output layer (rows x out_dim x vocab).
    """
    from torch.profiler import ProfilerActivity, profile

    from seq2seq.errors import UserError
    from seq2seq.config import DecodeConfig
    from seq2seq.decoding.translator import Translator

    checkpoint = Path(args.checkpoint)
    checkpoint = checkpoint / "best.pt" if checkpoint.is_dir() else checkpoint
    if not checkpoint.is_file():
        raise UserError(f"--checkpoint {args.checkpoint}: no such checkpoint (a run directory or a .pt file)")
    translator = Translator.from_checkpoint(checkpoint, device=args.device, precision=args.precision,
                                            shortlist="auto" if args.shortlist else None)
    sources = (args.data_dir / f"{args.test_split}.{args.src}").read_text(encoding="utf-8").splitlines()
    sources = sources[: args.sentences] if args.sentences else sources
    batch = args.batch_size or DecodeConfig(beam_size=args.beam_size).batch

    def run() -> list:
        return translator.translate(sources, beam_size=args.beam_size, batch_size=batch, need_attention=False)

    translator.translate(sources[:batch], beam_size=args.beam_size, batch_size=batch, need_attention=False)
    start = time.perf_counter()
    hyps = run()
    seconds = time.perf_counter() - start
    with profile(activities=[ProfilerActivity.CPU], with_flops=True) as prof:
        start = time.perf_counter()
        run()
        profiled_seconds = time.perf_counter() - start
    ops = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)
    matmul = [e for e in ops if e.key in MATMUL_OPS]
    matmul_seconds = sum(e.self_cpu_time_total for e in matmul) / 1e6
    matmul_gflop = sum(e.flops for e in matmul) / 1e9
    vocab, out_dim = translator.model.generator.weight.shape
    peak_shape = (batch * args.beam_size, out_dim, vocab)  # the output layer of a full batch
    peak = matmul_peak(torch.float32, peak_shape, device=translator.device)
    record = {
        **provenance("profile"), "checkpoint": display_path(checkpoint), "beam_size": args.beam_size,
        "batch_size": batch,
        "precision": args.precision, "shortlist": bool(args.shortlist), "sentences": len(sources),
        "seconds": seconds, "sentences_per_s": len(sources) / seconds,
        "tgt_tokens_per_s": sum(len(h.tokens) + 1 for h in hyps) / seconds,
        "profiled_seconds": profiled_seconds, "matmul_seconds": matmul_seconds,
        "matmul_share": matmul_seconds / seconds, "matmul_gflop": matmul_gflop,
        "matmul_gflop_per_s": matmul_gflop / matmul_seconds if matmul_seconds else 0.0,
        "matmul_peak_gflop_per_s": peak, "matmul_peak_shape": list(peak_shape),
        "bound_sentences_per_s": len(sources) / matmul_seconds if matmul_seconds else float("inf"),
        "top_ops": [{"op": e.key, "self_seconds": e.self_cpu_time_total / 1e6, "calls": e.count,
                     "gflop": e.flops / 1e9} for e in ops[:12]],
    }
    if args.out:
        write_record(args.out, record, profile_table(record))
    print(profile_table(record))
    return record


def profile_table(record: dict) -> str:
    r = record
    lines = [f"{r['sentences']} sentences, beam {r['beam_size']}, {r['precision']}"
             f"{', shortlist' if r['shortlist'] else ''}: {r['sentences_per_s']:.1f} sent/s "
             f"({r['tgt_tokens_per_s']:,.0f} tgt tok/s), {r['seconds']:.2f} s "
             f"({r['profiled_seconds']:.2f} s under the profiler)",
             f"matrix products: {r['matmul_seconds']:.2f} s = {r['matmul_share']:.0%} of the time, "
             f"{r['matmul_gflop']:.0f} GFLOP at {r['matmul_gflop_per_s']:.0f} GFLOP/s "
             f"(the device's fp32 peak at {'x'.join(map(str, r['matmul_peak_shape']))}: "
             f"{r['matmul_peak_gflop_per_s']:.0f})",
             f"bound with everything else free: {r['bound_sentences_per_s']:.1f} sent/s "
             f"({r['bound_sentences_per_s'] / r['sentences_per_s']:.2f}x now)", ""]
    rows = [[op["op"], f"{op['self_seconds']:.2f}", f"{op['self_seconds'] / r['profiled_seconds']:.0%}",
             f"{op['calls']:,}", f"{op['gflop']:.0f}"] for op in r["top_ops"]]
    return "\n".join(lines) + "\n" + markdown_table(["operator", "self s", "share", "calls", "GFLOP"], rows) + "\n"


def _forwarded(args: argparse.Namespace) -> list[str]:
    return ["--data-dir", str(args.data_dir), "--src", args.src, "--tgt", args.tgt, "--vocab-size",
            str(args.vocab_size), "--steps", str(args.steps), "--warmup", str(args.warmup),
            "--precision", args.precision, "--device", args.device, "--out", str(args.out),
            "--train-flags", *args.extra]


def speed_table(record: dict) -> str:
    peaks = record["matmul_gflop_per_s"]
    bf16 = (f"bf16 {peaks['bfloat16_square2048']:.0f} (square), {peaks['bfloat16_ffn4400x256x1024']:.0f} "
            "(FFN-shaped)" if "bfloat16_square2048" in peaks else "bf16 not native on this device (not measured)")
    lines = [f"matmul peak GFLOP/s: fp32 {peaks['float32_square2048']:.0f} (square), "
             f"{peaks['float32_ffn4400x256x1024']:.0f} (FFN-shaped); {bf16}", ""]
    header = ["system", "precision", "params", "tgt tok/step", "train tgt tok/s", "model GFLOP/s", "of matmul peak",
              "peak RSS", "greedy sent/s", "beam 5 sent/s", "greedy bs1 sent/s", "greedy bs1 fp16 sent/s",
              "BLEU greedy / beam 5", "shortlist: greedy / beam 5 / bs1 sent/s (BLEU)",
              "int8: greedy / beam 5 / bs1 sent/s (BLEU)"]
    rows = []
    for name, t in record["train"].items():
        d = record["decode"].get(name)
        decode = (f"{d['greedy']['sentences_per_s']:.1f} | {d['beam5']['sentences_per_s']:.1f} | "
                  f"{d['greedy_bs1']['sentences_per_s']:.1f} | "
                  f"{d['greedy_bs1_fp16']['sentences_per_s']:.1f} | "
                  f"{d['greedy']['bleu']:.2f} / {d['beam5']['bleu']:.2f} | "
                  f"{d['greedy_shortlist']['sentences_per_s']:.1f} ({d['greedy_shortlist']['bleu']:.2f}) / "
                  f"{d['beam5_shortlist']['sentences_per_s']:.1f} ({d['beam5_shortlist']['bleu']:.2f}) / "
                  f"{d['greedy_bs1_shortlist']['sentences_per_s']:.1f} | {_int8_cell(d)}"
                  if d else "— | — | — | — | — | — | —")
        rows.append([name, t["precision"], f"{t['parameters'] / 1e6:.1f} M", f"{t.get('tgt_tokens_per_step', 0):,.0f}",
                     f"{t['tgt_tokens_per_s']:,.0f}", f"{t['model_gflop_per_s_estimate']:.0f}",
                     f"{t['fraction_of_matmul_peak']:.0%}", f"{t['peak_rss_mb'] / 1024:.2f} GB", decode])
    return "\n".join(lines) + "\n" + markdown_table(header, rows) + "\n"


def _int8_cell(decode: dict) -> str:
    """The int8 rows of ``decode_system`` (CPU only) as one table cell, or — where there are none."""
    if "greedy_int8" not in decode:
        return "—"
    greedy, beam, bs1 = (decode[label] for label in ("greedy_int8", "beam5_int8", "greedy_bs1_int8"))
    return (f"{greedy['sentences_per_s']:.1f} ({greedy['bleu']:.2f}) / {beam['sentences_per_s']:.1f} "
            f"({beam['bleu']:.2f}) / {bs1['sentences_per_s']:.1f}")


def _common_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data-dir", type=Path, default=DEFAULT_DATA, required=DEFAULT_DATA is None,
                   help="Multi30k directory of {split}.{lang} files (default: $SEQ2SEQ_MULTI30K)")
    p.add_argument("--src", default="de")
    p.add_argument("--tgt", default="en")
    p.add_argument("--vocab-size", type=int, default=8000)
    p.add_argument("--device", default="auto")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python benchmarks/bench.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    q = sub.add_parser("quality", help="RNN (Bahdanau, Luong) vs Transformer at equal wall-clock budget")
    _common_flags(q)
    q.add_argument("--test-split", default="test_2016_flickr")
    q.add_argument("--minutes", type=float, default=20.0, help="training budget per system (default: 20)")
    q.add_argument("--eval-every", type=int, default=400)
    q.add_argument("--systems", nargs="+", default=list(SYSTEMS), choices=list(SYSTEMS))
    q.add_argument("--bs1-sentences", type=int, default=200, help="sentences for the batch-1 greedy timing")
    q.add_argument("--peer-sizes", action="store_true",
                   help="the peers' embedding layout and parameter counts (RNN 12.4 M, Transformer 9.6 M)")
    q.add_argument("--out", default="bench-results/quality")
    q.add_argument("extra", nargs="*", help="extra train.py flags after --, applied to every system")
    s = sub.add_parser("speed", help="training tokens/s, FLOP/s vs matmul peak, decoding sentences/s")
    _common_flags(s)
    s.add_argument("--test-split", default="test_2016_flickr")
    s.add_argument("--systems", nargs="+", default=["rnn-bahdanau", "transformer"], choices=list(SYSTEMS))
    s.add_argument("--steps", type=int, default=30, help="timed training steps per system")
    s.add_argument("--warmup", type=int, default=5, help="untimed steps first")
    s.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    s.add_argument("--checkpoints", help="quality-benchmark output dir: decode its <system>/best.pt")
    s.add_argument("--bs1-sentences", type=int, default=200)
    s.add_argument("--peak-seconds", type=float, default=2.0, help="how long each matmul peak is measured")
    s.add_argument("--out", default="bench-results/speed")
    s.add_argument("extra", nargs="*", help="train flags after --, applied after the peers' sizes (e.g. smaller "
                                            "models for a smoke run)")
    d = sub.add_parser("decode", help="decoding only: sentences/s and BLEU of existing runs, repeated")
    _common_flags(d)
    d.add_argument("--test-split", default="test_2016_flickr")
    d.add_argument("--checkpoints", required=True, help="a directory of runs <system>/best.pt")
    d.add_argument("--systems", nargs="+", default=["rnn-bahdanau", "transformer"])
    d.add_argument("--repeats", type=int, default=1, help="decode every system this many times (timings are noisy)")
    d.add_argument("--bs1-sentences", type=int, default=200)
    d.add_argument("--out", default="bench-results/decode.json")
    pr = sub.add_parser("profile", help="where decoding time goes: matmul share, FLOP rate vs peak, the bound")
    _common_flags(pr)
    pr.add_argument("--test-split", default="test_2016_flickr")
    pr.add_argument("--checkpoint", required=True, help="a run directory (its best.pt) or a .pt file")
    pr.add_argument("--beam-size", type=int, default=5)
    pr.add_argument("--batch-size", type=int, help="sentences per batch (default: translate.py's)")
    pr.add_argument("--precision", default="fp32", choices=["fp32", "fp16", "bf16"])
    pr.add_argument("--shortlist", action="store_true", help="decode over the run's lexical shortlist")
    pr.add_argument("--sentences", type=int, help="the first N sentences only (default: all)")
    pr.add_argument("--out", help="write the JSON record here")
    t = sub.add_parser("train-speed", help=argparse.SUPPRESS)  # one system, in a child process
    t.add_argument("system", choices=list(SYSTEMS))
    t.add_argument("--json", required=True)
    _common_flags(t)
    t.add_argument("--steps", type=int, default=30)
    t.add_argument("--warmup", type=int, default=5)
    t.add_argument("--precision", default="fp32")
    t.add_argument("--out", default="bench-results/speed")
    t.add_argument("--train-flags", dest="extra", nargs=argparse.REMAINDER, default=[])  # last: the rest
    args = parser.parse_args(argv)
    if not (args.data_dir / f"train.{args.src}").is_file():
        print(f"error: --data-dir {args.data_dir} has no train.{args.src}; point it at Multi30k", file=sys.stderr)
        return 2
    from seq2seq.errors import UserError

    try:
        if args.command == "quality":
            quality(args)
        elif args.command == "speed":
            speed(args)
        elif args.command == "decode":
            decode(args)
        elif args.command == "profile":
            profile_decoding(args)
        else:
            Path(args.json).write_text(json.dumps(train_speed(args.system, args), indent=2), encoding="utf-8")
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
