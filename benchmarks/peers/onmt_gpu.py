"""OpenNMT-py 3.5.1 on one CUDA GPU: Multi30k German->English, the CPU peer's Transformer with GPU-sized
batches, a wall-clock training budget, then BLEU of every checkpoint (time to BLEU) and tokens/s.

    python3 benchmarks/peers/onmt_gpu.py --data-dir DIR --work WORKDIR --out FILE.json [--minutes 2]
        [--device cuda|cpu] [--precision fp16|fp32] [--batch-tokens 12000] [--max-steps 0]
        [--eval-every-seconds S] [--decode-sentences 0] [--final-sentences 0] [--decode-minutes 5]
        [--peak-lr 2e-3] [--warmup 200] [--num-workers N] [--cudnn-attention] [--keep-logs]

Needs OpenNMT-py 3.5.1 importable (it pins torch<2.3, so it is installed with --no-deps) besides torch,
sentencepiece, sacrebleu, pyyaml, numpy and tensorboard. The wheels it needs and nothing more, for the
lent GPU machine (run once here, from the project root; they land in ``.whl/``, the data in ``.gpu/``):

    bash ../shared/gpu/prepare.sh OpenNMT-py==3.5.1 configargparse==1.9.0 pyonmttok==1.38.1

(pyonmttok, 17 MB: onmt.inputters imports it at module level and its Vocab holds the vocabularies;
configargparse parses every option; ctranslate2, flask, waitress, rapidfuzz, pyahocorasick,
fasttext-wheel, spacy and six are not needed: see "the runner" below). On the GPU machine, from the
project root, with ``.whl`` and ``.gpu`` sent along, one command of about ``--minutes`` + 2-3 minutes:

    bash .gpu/on-device.sh python3 benchmarks/peers/onmt_gpu.py --data-dir .gpu/multi30k \\
        --work /tmp/onmt-gpu --out $OUT/onmt_gpu.json --minutes 4 --decode-minutes 2.5 --keep-logs

(``$OUT`` then holds onmt_gpu.json, onmt_gpu.md, onmt_gpu.train.log, onmt_gpu.decode.log and the
wrapper's setup.log; checkpoints stay in ``--work``.)

What it does, each stage rewriting the JSON record at ``--out`` (and its markdown table beside it):

1. data (``stages.data_prep_s``, not training time): the joint SentencePiece unigram model of 8,000
   pieces on train.de + train.en exactly as ``common/prep_data.py`` trains it (character coverage 1.0,
   all sentences, unshuffled, 2 threads), train and test encoded into pieces, the OpenNMT vocabulary
   (piece<TAB>count); reused from ``--work`` when already there.
2. training: ``onmt/transformer.yaml.in``'s model (3+3 layers, d_model 256, 4 heads, FF 1024, pre-norm,
   tied decoder embeddings, q/k/v and FFN biases, dropout 0.1, label smoothing 0.1, Adam 0.9/0.98, noam,
   clip 1, glorot init, seed 42; 9.6 M parameters) with GPU-sized batches: ``batch_type tokens`` of
   ``--batch-tokens`` (OpenNMT-py counts sentences x the longest source or target in the batch, padding
   included; batches come from the length-sorted corpus, so real target tokens are ~0.9 of it: 12,000
   is ~750 sentences, ~10,800 target tokens, ~39 updates an epoch), ``gpu_ranks [0]``, ``model_dtype
   fp16`` for ``--precision fp16`` (the default on CUDA: OpenNMT-py 3.5.1 then trains with
   torch.cuda.amp autocast fp16 and a GradScaler on fp32 weights, no apex, and rounds batches to
   multiples of 8 sentences), ``vocab_size_multiple 8`` on CUDA (8,001 -> 8,008 entries),
   ``num_workers`` 2 on CUDA (the toolkit's default: spawned loader processes run ahead, so the
   per-epoch refill of the bucket does not stall the GPU; 0 when /dev/shm has under 1 GB free), 0 on CPU.
   Learning rate: noam with ``warmup_steps`` = ``--warmup`` (200) and the factor that makes its peak
   ``--peak-lr`` (2e-3): lr = factor * 256^-0.5 * min(step^-0.5, step * warmup^-1.5). The CPU peer peaks
   at 1.98e-3 after 30 updates of ~4,100 target tokens (a 12-minute CPU budget of ~290 updates); a GPU
   run makes thousands of updates of ~2.6x the tokens, so warm-up is stretched to 200 (our Transformer
   preset's warm-up) and the peak kept at 2e-3 (our preset's 1e-3 at 3,000 tokens, scaled by the square
   root of the batch ratio), which pre-norm keeps stable.
3. budget: OpenNMT-py has no time limit, so training runs in a subprocess (this file as a runner, see
   below) that saves a checkpoint every ``--eval-every-seconds`` of training-loop time (default
   budget / 8: 8 checkpoints, the last when the budget is over) and stops itself after that last one;
   the parent sends SIGTERM, then SIGKILL, to its process group if it overruns (``--grace-seconds``),
   and on its own SIGTERM stops the runners and writes the record ("interrupted"). Each checkpoint's
   minute is recorded since the training loop started (``minute``: OpenNMT-py's "Start training loop",
   after imports, CUDA start-up and model building, but before the data loader's first batch), since
   the first update finished (``minute_since_first_update``), since the process was launched
   (``minute_since_launch``) and without the time spent saving earlier checkpoints
   (``minute_excl_saves``); ``stages`` has the start-up, loop and saving seconds.
4. throughput: OpenNMT-py's report lines (every ``--report-every`` updates): the median of the
   intervals' target tokens/s after the first 15 % of them (and the pooled rate over the same window);
   peak GPU memory from torch (allocated / reserved, training process) and from ``nvidia-smi`` polled
   every second (whole device, includes the CUDA context), with the mean GPU utilisation.
5. time to BLEU: every checkpoint decoded on the same device in one process (greedy = beam 1, batches
   of ``--decode-batch`` sentences, Wu length penalty 1.0, max length 1.5 x source + 5, fp32, as the
   CPU peer), SentencePiece-decoded, sacrebleu BLEU against the raw reference. The final checkpoint
   first: greedy and beam 5 on the whole test set (``--final-sentences``: fewer, for CPU rehearsals);
   then the curve on ``--decode-sentences`` sentences (0: all; else a fixed random sample);
   ``time_to_bleu`` gives the first checkpoint at which the curve reached 38, 39, 40 (null: never).
   ``--decode-minutes`` bounds the stage; points left out are "skipped".

Exit status 0 when every stage completed, 1 otherwise (``status``: completed, partial, failed or
interrupted; ``errors`` with the last lines of the failing process's log).

The runner. ``python3 onmt_gpu.py --_runner train|translate ...`` runs OpenNMT-py in-process with patches
applied to the running process only (never to installed files: on the GPU machine the package lives in
``/tmp/carried/site-packages``): ``torch.load(weights_only=False)`` by default (torch>=2.6 cannot
unpickle the options in OpenNMT-py's checkpoints otherwise); empty modules stand for the four transforms
whose third-party packages are not carried (``clean``: fasttext, ``fuzzymatch``: rapidfuzz,
``inlinetags``: pyahocorasick, ``terminology``: spacy; ``onmt.transforms`` imports every transform
module at start-up and none of them is used here); checkpoint saving and stopping by wall clock
(``ModelSaverBase.save`` wrapped; ``save_checkpoint_steps`` is 1 so the wrapper sees every update);
events (loop start, checkpoints, memory) appended to a JSON-lines file. Unless ``--cudnn-attention``,
cuDNN's scaled-dot-product attention is excluded (``torch.backends.cuda.sdp_kernel``, which OpenNMT-py
enters around every attention call, left with the memory-efficient and math kernels it asks for): torch
2.11 prefers cuDNN attention for masked half-precision inputs and builds a plan for every new shape
(``../shared/gpu/README.md``), which the torch versions OpenNMT-py 3.5 supports (<2.3) never did.
OpenNMT-py's decoder self-attention passes an explicit mask *and* ``is_causal=True`` on CUDA, which the
memory-efficient kernel accepts and the math kernel refuses, so on CUDA the runner first tries that call
(``train.sdpa_preflight``) and leaves cuDNN enabled if it fails; a training run that fails before its
first checkpoint with that error, or with a data-loader worker out of shared memory, is run once more
without cuDNN excluded / without workers (``train.attempts``). The patches are applied again at import
in the spawned data-loader processes (environment variable ``ONMT_GPU_RUNNER``). Warnings about
torch.cuda.amp's deprecation are silenced.

How long on a GPU: the wrapper's set-up ~20-40 s (21 MB of wheels), data ~15-30 s (SentencePiece; 1 s
when reused), training start-up ~15-30 s, ``--minutes`` of training (+ one update and the last save),
decoding ~3-5 s per checkpoint (model load + 1,000 sentences greedy) and ~10 s for beam 5: about
``--minutes`` + 2-3 minutes in all. On the 2-core CPU keep it tiny: ``--device cpu --minutes 0.3
--max-steps 30 --batch-tokens 2000 --decode-sentences 30 --final-sentences 50 --eval-every-seconds 8``
takes about a minute (several when the CPU is shared: untrained models decode to the length limit).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import re
import shlex
import signal
import statistics
import subprocess
import sys
import threading
import time
import traceback
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUNNER_ENV = "ONMT_GPU_RUNNER"  # set in the runner's environment: patch at import (also in spawned workers)
EVENTS_ENV = "ONMT_GPU_EVENTS"
SCHEDULE_ENV = "ONMT_GPU_SCHEDULE"
UNUSED_TRANSFORMS = ("clean", "fuzzymatch", "inlinetags", "terminology")
THRESHOLDS = (38.0, 39.0, 40.0)
WARM_FRAC = 0.15
SPLITS = ("train", "val", "test_2016_flickr")
TS_RE = re.compile(r"\[(\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}),(\d{3}) ")
STEP_RE = re.compile(r"Step\s+(\d+)(?:/\s*\d+)?; acc:\s+([\d.]+); ppl:\s+([\d.]+); xent:\s+([\d.]+); "
                     r"lr:\s+([\d.e-]+); sents:\s+(\d+); bsz:\s+(\d+)/\s*(\d+)/\s*(\d+); "
                     r"\s*([\d.]+)/\s*([\d.]+) tok/s;\s+(\d+) sec;")

# ---------------------------------------------------------------------------------------------
# The runner: OpenNMT-py in this process, patched in memory
# ---------------------------------------------------------------------------------------------


def _patch_imports() -> None:
    """What any process that imports onmt needs here: no torch.load(weights_only=True) and no
    imports of the transforms whose packages are not installed."""
    import types
    import warnings

    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", message=".*torch.cuda.amp.*")
    for name in UNUSED_TRANSFORMS:
        full = f"onmt.transforms.{name}"
        sys.modules.setdefault(full, types.ModuleType(full))
    import torch

    if not getattr(torch.load, "_onmt_gpu", False):
        original = torch.load

        def load(*args, **kwargs):
            kwargs.setdefault("weights_only", False)
            return original(*args, **kwargs)

        load._onmt_gpu = True
        torch.load = load


def _patch_attention(allow_cudnn: bool):
    """Without cuDNN attention (unless allowed); returns a function that undoes it, or None."""
    import contextlib

    import torch

    if allow_cudnn or not hasattr(torch.backends.cuda, "enable_cudnn_sdp"):
        return None
    from torch.nn.attention import SDPBackend, sdpa_kernel

    original, was_enabled = torch.backends.cuda.sdp_kernel, torch.backends.cuda.cudnn_sdp_enabled()
    torch.backends.cuda.enable_cudnn_sdp(False)

    @contextlib.contextmanager
    def sdp_kernel(enable_flash=True, enable_math=True, enable_mem_efficient=True, enable_cudnn=True):
        backends = [b for b, on in ((SDPBackend.FLASH_ATTENTION, enable_flash),
                                    (SDPBackend.EFFICIENT_ATTENTION, enable_mem_efficient),
                                    (SDPBackend.MATH, enable_math)) if on]
        with sdpa_kernel(backends):
            yield {}

    torch.backends.cuda.sdp_kernel = sdp_kernel

    def undo():
        torch.backends.cuda.sdp_kernel = original
        torch.backends.cuda.enable_cudnn_sdp(was_enabled)

    return undo


def _sdpa_preflight(dtype_name: str) -> str | None:
    """OpenNMT-py's training call of the decoder self-attention on CUDA (explicit mask *and*
    is_causal=True, flash off): only the memory-efficient kernel (or cuDNN) accepts both, the math
    kernel raises. None when it runs, else the error."""
    import torch
    import torch.nn.functional as F

    dtype = torch.float16 if dtype_name == "fp16" else torch.float32
    try:
        q = torch.randn(8, 4, 21, 64, device="cuda", dtype=dtype, requires_grad=True)
        keep = torch.ones(8, 1, 21, 21, dtype=torch.bool, device="cuda").tril()
        with torch.backends.cuda.sdp_kernel(enable_flash=False, enable_math=True, enable_mem_efficient=True):
            out = F.scaled_dot_product_attention(q, q, q, keep, 0.1, is_causal=True)
            out.float().sum().backward()
        torch.cuda.synchronize()
        return None
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"[:500]


def _event(**fields) -> None:
    path = os.environ.get(EVENTS_ENV)
    if not path:
        return
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(fields) + "\n")
        handle.flush()


def _cuda_memory() -> dict:
    import torch

    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return {}
    return {"max_allocated_mb": round(torch.cuda.max_memory_allocated() / 2**20, 1),
            "max_reserved_mb": round(torch.cuda.max_memory_reserved() / 2**20, 1)}


def _versions_in_process() -> dict:
    import torch

    import onmt

    out = {"onmt": getattr(onmt, "__version__", None), "torch": torch.__version__, "cuda": torch.version.cuda,
           "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
           "python": platform.python_version()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        props = torch.cuda.get_device_properties(0)
        out.update(gpu=props.name, gpu_capability=f"{props.major}.{props.minor}",
                   gpu_memory_mb=round(props.total_memory / 2**20))
    out["tf32_matmul"] = torch.backends.cuda.matmul.allow_tf32
    out["cudnn_sdp_enabled"] = (torch.backends.cuda.cudnn_sdp_enabled()
                                if hasattr(torch.backends.cuda, "cudnn_sdp_enabled") else None)
    return out


class _BudgetReached(Exception):
    pass


class _Terminated(BaseException):
    pass


def _patch_training() -> None:
    """Checkpoints by wall clock, stop at the budget, events."""
    import torch

    import onmt.models.model_saver as model_saver
    import onmt.trainer

    schedule = json.loads(os.environ[SCHEDULE_ENV])
    budget_s, every_s = float(schedule["budget_s"]), float(schedule["every_s"])
    state = {"t0": None, "next": every_s, "first": None, "save_total": 0.0, "train_steps": 0, "cuda": False}

    original_train = onmt.trainer.Trainer.train
    original_save = model_saver.ModelSaverBase.save

    def train(self, train_iter, train_steps, save_checkpoint_steps=5000, valid_iter=None, valid_steps=10000):
        state["t0"] = time.time()
        state["train_steps"] = train_steps
        state["cuda"] = next(self.model.parameters()).is_cuda
        if state["cuda"]:
            torch.cuda.reset_peak_memory_stats()
        _event(kind="loop_start", t=state["t0"], pid=os.getpid(),
               params=sum(p.numel() for p in self.model.parameters()),
               amp=bool(getattr(self.optim, "amp", False)), fp16_mode=getattr(self.optim, "_fp16", None),
               versions=_versions_in_process(), budget_s=budget_s, every_s=every_s)
        try:
            return original_train(self, train_iter, train_steps, save_checkpoint_steps, valid_iter, valid_steps)
        except _BudgetReached:
            _event(kind="budget_stop", t=time.time())
            return None

    def save(self, step, moving_average=None):
        now = time.time()
        if state["t0"] is None:  # not from the training loop
            return original_save(self, step, moving_average)
        elapsed = now - state["t0"]
        if state["first"] is None:
            state["first"] = now
            _event(kind="first_step", t=now, step=step, **_cuda_memory())
        over = elapsed >= budget_s
        final = state["train_steps"] > 0 and step >= state["train_steps"]
        if not (over or final or elapsed >= state["next"]) or step == self.last_saved_step:
            return None
        if state["cuda"]:
            torch.cuda.synchronize()
        reached = time.time()
        original_save(self, step, moving_average)
        done = time.time()
        while state["next"] <= elapsed:
            state["next"] += every_s
        _event(kind="checkpoint", step=step, t=reached, save_s=round(done - reached, 3),
               saves_before_s=round(state["save_total"], 3), path=f"{self.base_path}_step_{step}.pt",
               final=bool(over or final), **_cuda_memory())
        state["save_total"] += done - reached
        if over:
            raise _BudgetReached()
        return None

    onmt.trainer.Trainer.train = train
    model_saver.ModelSaverBase.save = save


def _runner_train(argv: list[str], allow_cudnn: bool) -> int:
    _patch_imports()
    undo = _patch_attention(allow_cudnn)
    schedule = json.loads(os.environ[SCHEDULE_ENV])
    if schedule.get("device") == "cuda":
        problem = _sdpa_preflight(schedule.get("precision", "fp32"))
        if problem and undo is not None:  # keep the toolkit's own kernel choice rather than fail
            undo()
            problem += " -> cuDNN attention left enabled"
        _event(kind="sdpa_preflight", result=problem or "ok")
    _patch_training()
    from onmt.bin.train import main as onmt_train

    sys.argv = ["onmt_train", *argv]
    onmt_train()
    return 0


def _runner_translate(jobs_path: str, results_path: str, allow_cudnn: bool) -> int:
    """Every job of ``jobs_path`` (model, src, output, flags) in this one process, results appended."""
    _patch_imports()
    _patch_attention(allow_cudnn)
    import gc

    import torch

    from onmt.bin.translate import _get_parser
    from onmt.inference_engine import InferenceEnginePY
    from onmt.utils.misc import set_random_seed, use_gpu
    from onmt.utils.parse import ArgumentParser

    done = set()
    if os.path.exists(results_path):
        done = {json.loads(line)["name"] for line in open(results_path, encoding="utf-8") if line.strip()}
    first = True
    for job in json.load(open(jobs_path, encoding="utf-8")):
        if job["name"] in done:
            continue
        result = {"name": job["name"]}
        engine = None
        try:
            opt = _get_parser().parse_args(job["argv"])
            ArgumentParser.validate_translate_opts(opt)
            ArgumentParser._get_all_transform_translate(opt)
            ArgumentParser._validate_transforms_opts(opt)
            ArgumentParser.validate_translate_opts_dynamic(opt)
            set_random_seed(opt.seed, use_gpu(opt))
            cuda = use_gpu(opt)
            if cuda and torch.cuda.is_initialized():
                torch.cuda.reset_peak_memory_stats()
            t0 = time.time()
            engine = InferenceEnginePY(opt)
            if cuda:
                torch.cuda.synchronize()
            t1 = time.time()
            engine.infer_file()
            if cuda:
                torch.cuda.synchronize()
            t2 = time.time()
            engine.translator.out_file.close()
            result.update(load_s=round(t1 - t0, 3), translate_s=round(t2 - t1, 3), **_cuda_memory())
            if first:
                result["versions"] = _versions_in_process()
                first = False
        except Exception as exc:  # one failing job must not lose the others
            result.update(error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc()[-3000:])
        finally:
            del engine
            gc.collect()
            if torch.cuda.is_available() and torch.cuda.is_initialized():
                torch.cuda.empty_cache()
        with open(results_path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(result) + "\n")
    return 0


if os.environ.get(RUNNER_ENV) == "1":  # also true in the data loader's spawned processes
    # this folder holds onmt/ and joeynmt/ (the CPU peers' scripts): keep them off the runner's path
    sys.path[:] = [p for p in sys.path if os.path.realpath(p or ".") != os.path.dirname(os.path.realpath(__file__))]
    _patch_imports()

# ---------------------------------------------------------------------------------------------
# The parent: data, configuration, budget, parsing, decoding, the record
# ---------------------------------------------------------------------------------------------


def now_s() -> float:
    return time.time()


def log(msg: str) -> None:
    print(f"[onmt_gpu {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def tail(path: Path, n: int = 60) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


def dist_version(name: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def nvidia_smi(*query: str) -> list[str]:
    try:
        out = subprocess.run(["nvidia-smi", *query], capture_output=True, text=True, timeout=20)
        return [line.strip() for line in out.stdout.splitlines() if line.strip()] if out.returncode == 0 else []
    except (OSError, subprocess.SubprocessError):
        return []


class Record:
    """The JSON record at --out, rewritten (atomically) after every stage."""

    def __init__(self, path: Path, data: dict):
        self.path, self.data = path, data

    def write(self) -> None:
        self.data["stages"]["total_s"] = round(now_s() - self.data["_t_start"], 1)
        data = {k: v for k, v in self.data.items() if not k.startswith("_")}
        table = markdown(data)
        try:
            sys.path.insert(0, str(ROOT / "benchmarks"))
            from common import write_record  # the project's writer (atomic, .md beside)

            write_record(self.path, data, table)
            return
        except Exception:  # the project not importable: the same thing by hand
            pass
        finally:
            if sys.path and sys.path[0] == str(ROOT / "benchmarks"):
                sys.path.pop(0)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        for target, text in ((self.path, json.dumps(data, indent=2, ensure_ascii=False) + "\n"),
                             (self.path.with_suffix(".md"), table)):
            tmp = target.with_name(f".{target.name}.tmp")
            tmp.write_text(text, encoding="utf-8")
            os.replace(tmp, target)


def markdown(data: dict) -> str:
    train = data.get("train", {})
    final = data.get("final", {})
    versions = data.get("versions", {})
    lines = [f"# OpenNMT-py {versions.get('onmt', '3.5.1')} on {versions.get('gpu') or data['settings']['device']}: "
             f"Multi30k de-en, {data['settings']['minutes']} min ({data.get('status')})", ""]

    def fmt(v, spec=""):
        return "" if v is None else format(v, spec)

    rows = [("params", fmt(train.get("params"), ",")),
            ("updates", fmt(train.get("total_steps"))),
            ("train tgt tok/s (median, after 15 %)", fmt(train.get("tgt_tok_per_s_median"), ",.0f")),
            ("avg real tgt tokens / update", fmt(train.get("avg_tgt_tok_per_step"), ",.0f")),
            ("peak GPU memory MB (torch reserved / nvidia-smi)",
             f"{fmt(train.get('max_reserved_mb'))} / {fmt(train.get('nvidia_smi_max_used_mb'))}"),
            ("final BLEU greedy / beam 5", f"{fmt((final.get('greedy') or {}).get('bleu'))} / "
                                           f"{fmt((final.get('beam5') or {}).get('bleu'))}")]
    for threshold, hit in (data.get("time_to_bleu") or {}).items():
        rows.append((f"first minute with BLEU >= {threshold}", "never" if hit is None else f"{hit['minute']:.2f}"))
    lines += ["| what | value |", "|---|---|", *[f"| {a} | {b} |" for a, b in rows], ""]
    curve = data.get("curve") or []
    if curve:
        lines += ["| minute (loop) | minute (launch) | step | BLEU | sentences |", "|---|---|---|---|---|"]
        lines += [f"| {p['minute']:.2f} | {p['minute_since_launch']:.2f} | {p['step']} | "
                  f"{fmt(p.get('bleu'), '.2f') or p.get('status', '')} | {p.get('n_sents', '')} |" for p in curve]
    return "\n".join(lines) + "\n"


# --- data ----------------------------------------------------------------------------------------


def prepare_data(data_dir: Path, work: Path) -> dict:
    """prep_data.py's SentencePiece model, encoded splits and OpenNMT vocabulary, in work/data."""
    import collections

    import sentencepiece as spm

    out = work / "data"
    out.mkdir(parents=True, exist_ok=True)
    for split in SPLITS:
        for lang in ("de", "en"):
            if not (data_dir / f"{split}.{lang}").is_file():
                raise FileNotFoundError(f"{data_dir / f'{split}.{lang}'} missing (need {{train,val,test_2016_flickr}}.{{de,en}})")
    prefix = out / "spm8k"
    reused = (prefix.with_suffix(".model").is_file() and (out / "vocab.onmt.txt").is_file()
              and all((out / f"{s}.sp.{lang}").is_file() for s in ("train", "test_2016_flickr") for lang in ("de", "en")))
    t0 = now_s()
    if not reused:
        spm.SentencePieceTrainer.train(
            input=",".join(str(data_dir / f"train.{lang}") for lang in ("de", "en")),
            model_prefix=str(prefix), model_type="unigram", vocab_size=8000, character_coverage=1.0,
            input_sentence_size=0, shuffle_input_sentence=False, num_threads=2, minloglevel=1)
    t_spm = now_s() - t0
    sp = spm.SentencePieceProcessor(model_file=str(prefix.with_suffix(".model")))
    stats = {}
    if not reused:
        counts = collections.Counter()
        for split in ("train", "test_2016_flickr"):
            for lang in ("de", "en"):
                lines = (data_dir / f"{split}.{lang}").read_text(encoding="utf-8").splitlines()
                encoded = sp.encode(lines, out_type=str)
                if split == "train":
                    for pieces in encoded:
                        counts.update(pieces)
                (out / f"{split}.sp.{lang}").write_text("".join(" ".join(p) + "\n" for p in encoded), encoding="utf-8")
        specials = {"<unk>", "<s>", "</s>"}
        pieces = [sp.id_to_piece(i) for i in range(sp.get_piece_size()) if sp.id_to_piece(i) not in specials]
        (out / "vocab.onmt.txt").write_text("".join(f"{p}\t{max(counts.get(p, 0), 1)}\n" for p in pieces),
                                            encoding="utf-8")
    for split in ("train", "test_2016_flickr"):
        for lang in ("de", "en"):
            n = [len(line.split()) for line in open(out / f"{split}.sp.{lang}", encoding="utf-8")]
            stats[f"{split}.{lang}"] = {"lines": len(n), "pieces": sum(n), "avg": round(sum(n) / len(n), 2), "max": max(n)}
    vocab_lines = sum(1 for _ in open(out / "vocab.onmt.txt", encoding="utf-8"))
    return {"dir": str(out), "reused": reused, "spm_train_s": round(t_spm, 1), "vocab_file_entries": vocab_lines,
            "spm": "joint unigram 8000 (character_coverage 1.0, input_sentence_size 0, unshuffled, 2 threads) "
                   "on train.de+train.en, deterministic encode (= common/prep_data.py)",
            "splits": stats}


# --- training ----------------------------------------------------------------------------------------


def noam_factor(peak_lr: float, warmup: int, d_model: int = 256) -> float:
    """OpenNMT-py's noam: lr = factor * d^-0.5 * min(step^-0.5, step * warmup^-1.5), peak at step = warmup."""
    return peak_lr * math.sqrt(d_model) * math.sqrt(warmup)


def config_yaml(args, run: Path, data: Path) -> str:
    cuda = args.device == "cuda"
    train_steps = args.max_steps if args.max_steps > 0 else 1_000_000_000
    return f"""# OpenNMT-py 3.5.1 -- Multi30k de->en, the CPU peer's Transformer (benchmarks/peers/onmt/transformer.yaml.in)
# with GPU batches (written by benchmarks/peers/onmt_gpu.py)
save_data: {run}/data
overwrite: true
seed: 42
src_vocab: {data}/vocab.onmt.txt
tgt_vocab: {data}/vocab.onmt.txt
share_vocab: true
src_vocab_size: 10000
tgt_vocab_size: 10000
vocab_size_multiple: {8 if cuda else 1}
data:
    corpus_1:
        path_src: {data}/train.sp.de
        path_tgt: {data}/train.sp.en

save_model: {run}/model
save_checkpoint_steps: 1                   # the runner saves by wall clock (every {args.eval_every_seconds:.1f} s of the loop)
keep_checkpoint: -1
train_steps: {train_steps}
valid_steps: 100000000
report_every: {args.report_every}

world_size: 1
gpu_ranks: [{'0' if cuda else ''}]
num_workers: {args.num_workers}
bucket_size: 29000

batch_type: tokens
batch_size: {args.batch_tokens}
normalization: tokens
accum_count: [1]
model_dtype: {args.precision}

optim: adam
adam_beta1: 0.9
adam_beta2: 0.98
decay_method: noam
learning_rate: {noam_factor(args.peak_lr, args.warmup):.6f}             # peak {args.peak_lr:g} at step {args.warmup}
warmup_steps: {args.warmup}
max_grad_norm: 1.0
label_smoothing: 0.1
param_init: 0.0
param_init_glorot: true

model_type: text
encoder_type: transformer
decoder_type: transformer
enc_layers: 3
dec_layers: 3
heads: 4
hidden_size: 256
word_vec_size: 256
transformer_ff: 1024
dropout: [0.1]
attention_dropout: [0.1]
position_encoding: true
layer_norm: standard
add_qkvbias: true
add_ffnbias: true
share_decoder_embeddings: true
"""


def runner_env(events: Path | None = None, schedule: dict | None = None) -> dict:
    env = dict(os.environ)
    env.update({RUNNER_ENV: "1", "PYTHONUNBUFFERED": "1",
                "PYTHONWARNINGS": "ignore::FutureWarning,ignore::UserWarning"})
    if events is not None:
        env[EVENTS_ENV] = str(events)
    if schedule is not None:
        env[SCHEDULE_ENV] = json.dumps(schedule)
    return env


def stop_group(proc: subprocess.Popen, why: str, wait_s: float = 20.0) -> str:
    """SIGTERM to the runner's process group (it and its data-loader workers), then SIGKILL."""
    log(f"stopping pid {proc.pid}: {why}")
    for sig, wait in ((signal.SIGTERM, wait_s), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return why
        try:
            proc.wait(timeout=wait)
            return why
        except subprocess.TimeoutExpired:
            continue
    return why


class GpuPoller:
    """nvidia-smi -lms 1000 in the background: device memory used and utilisation."""

    def __init__(self):
        self.samples: list[tuple[float, float, float]] = []
        self.proc = None
        self.thread = None

    def start(self) -> None:
        try:
            self.proc = subprocess.Popen(["nvidia-smi", "-i", "0", "--query-gpu=memory.used,utilization.gpu",
                                          "--format=csv,noheader,nounits", "-lms", "1000"],
                                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        except OSError:
            return
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            try:
                mem, util = (float(x) for x in line.split(","))
            except ValueError:
                continue
            self.samples.append((now_s(), mem, util))

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()

    def summary(self, t0: float | None, t1: float | None) -> dict:
        window = [s for s in self.samples if (t0 is None or s[0] >= t0) and (t1 is None or s[0] <= t1)]
        if not self.samples:
            return {}
        return {"nvidia_smi_max_used_mb": max(s[1] for s in self.samples),
                "nvidia_smi_mean_util_pct": round(statistics.fmean(s[2] for s in window), 1) if window else None,
                "nvidia_smi_samples": len(window)}


def read_events(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            pass  # a line being written
    return out


def parse_log(path: Path, loop_start: float | None) -> dict:
    """Report lines -> intervals; params; throughput over the intervals after the first 15 %."""
    params = None
    intervals = []
    prev = 0
    for line in path.read_text(errors="replace").splitlines():
        if "* number of parameters:" in line:
            params = int(line.rsplit(":", 1)[1])
        m = STEP_RE.search(line)
        if not m:
            continue
        ts = TS_RE.search(line)
        t = (datetime.strptime(ts.group(1), "%Y-%m-%d %H:%M:%S").timestamp() + int(ts.group(2)) / 1000) if ts else None
        step = int(m.group(1))
        nb = step - prev
        prev = step
        rate = float(m.group(11))
        tgt = int(m.group(8)) * nb
        intervals.append({"step": step, "nb": nb, "t": t, "acc": float(m.group(2)), "xent": float(m.group(4)),
                          "lr": float(m.group(5)), "sents": int(m.group(6)), "src": int(m.group(7)) * nb, "tgt": tgt,
                          "tgt_tok_s": rate, "src_tok_s": float(m.group(10)), "sec": tgt / rate if rate > 0 else 0.0})
    out: dict = {"params_logged": params, "n_report_intervals": len(intervals)}
    if not intervals:
        return out
    skip = int(math.ceil(WARM_FRAC * len(intervals)))
    win = intervals[skip:] or intervals[-1:]
    sec = sum(iv["sec"] for iv in win)
    steps = sum(iv["nb"] for iv in win)
    out.update(
        last_logged_step=intervals[-1]["step"],
        tgt_tok_per_s_median=round(statistics.median(iv["tgt_tok_s"] for iv in win), 1),
        src_tok_per_s_median=round(statistics.median(iv["src_tok_s"] for iv in win), 1),
        tgt_tok_per_s_pooled=round(sum(iv["tgt"] for iv in win) / sec, 1) if sec else None,
        steps_per_s_median=round(statistics.median(iv["nb"] / iv["sec"] for iv in win if iv["sec"] > 0), 3),
        avg_tgt_tok_per_step=round(sum(iv["tgt"] for iv in win) / steps, 1),
        avg_src_tok_per_step=round(sum(iv["src"] for iv in win) / steps, 1),
        avg_sents_per_step=round(sum(iv["sents"] for iv in win) / steps, 1),
        window={"first_step": win[0]["step"] - win[0]["nb"], "last_step": win[-1]["step"], "intervals": len(win),
                "seconds": round(sec, 1), "skipped_first": skip},
        final_logged_xent=intervals[-1]["xent"], final_logged_acc=intervals[-1]["acc"],
        reports=[[iv["step"], round((iv["t"] - loop_start) / 60, 3) if (iv["t"] and loop_start) else None,
                  iv["xent"], iv["acc"], round(iv["tgt_tok_s"])] for iv in intervals],
        reports_columns=["step", "minute", "xent", "acc", "tgt_tok_s"])
    return out


def train_stage(args, rec: Record, data_dir: Path) -> list[dict]:
    """Train once; if it fails before its first checkpoint for a reason with a known way round
    (data-loader workers short of shared memory; OpenNMT-py's masked causal attention refused by
    every kernel left), once more without it."""
    train = rec.data["train"]
    train["attempts"] = []
    workers, allow_cudnn = args.num_workers, args.cudnn_attention
    for attempt in range(2):
        ckpts, problem, train_log = train_once(args, rec, data_dir, workers, allow_cudnn)
        train["attempts"].append({"num_workers": workers, "cudnn_attention": allow_cudnn, "checkpoints": len(ckpts),
                                  "problem": problem, "log_tail": tail(train_log, 40) if problem else None})
        rec.data["settings"].update(num_workers_used=workers, cudnn_attention_used=allow_cudnn)
        if ckpts or attempt:
            break
        text = tail(train_log, 300)
        if workers > 0 and re.search(r"shared memory|shm|bus error|DataLoader worker", text, re.I):
            workers = 0
        elif not allow_cudnn and "should not be set when is_causal" in text:
            allow_cudnn = True
        else:
            break
        log(f"training failed ({problem}); again with num_workers {workers}, cuDNN attention {allow_cudnn}")
        rec.write()
    if problem:
        rec.data["errors"].append({"stage": "train", "error": problem, "log_tail": tail(train_log)})
    if len(train["attempts"]) > 1:
        rec.data.setdefault("warnings", []).append(
            f"training attempt 1 failed ({train['attempts'][0]['problem']}); attempt 2 with num_workers {workers}, "
            f"cuDNN attention {allow_cudnn} (train.attempts)")
    return ckpts


def train_once(args, rec: Record, data_dir: Path, workers: int, allow_cudnn: bool):
    run = args.work / "run"
    if run.exists():
        import shutil

        shutil.rmtree(run)
    run.mkdir(parents=True)
    config = run / "train.yaml"
    args_now = argparse.Namespace(**{**vars(args), "num_workers": workers})
    config.write_text(config_yaml(args_now, run, data_dir), encoding="utf-8")
    events, train_log = run / "events.jsonl", run / "train.log"
    budget_s = args.minutes * 60.0
    schedule = {"budget_s": budget_s, "every_s": args.eval_every_seconds, "device": args.device,
                "precision": args.precision}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--_runner", "train",
           *(["--cudnn-attention"] if allow_cudnn else []), "--", "-config", str(config)]
    train = rec.data["train"]
    train.update(config_file=str(config), log=str(train_log), command=shlex.join(cmd))
    rec.data["settings"]["onmt_config"] = config.read_text(encoding="utf-8")
    poller = GpuPoller()
    if args.device == "cuda":
        poller.start()
    log(f"training: {args.minutes} min budget, checkpoint every {args.eval_every_seconds:.1f} s, "
        f"{workers} loader workers; log {train_log}")
    launch = now_s()
    with open(train_log, "w", encoding="utf-8") as handle:
        proc = subprocess.Popen(cmd, stdout=handle, stderr=subprocess.STDOUT, env=runner_env(events, schedule),
                                cwd=str(args.work), start_new_session=True)
    stopped = None
    loop_start = None
    last_ckpt = 0
    try:
        while proc.poll() is None:
            time.sleep(0.5)
            evs = read_events(events)
            start_ev = next((e for e in evs if e["kind"] == "loop_start"), None)
            if start_ev and loop_start is None:
                loop_start = start_ev["t"]
                log(f"training loop started after {loop_start - launch:.1f} s")
            ckpts = [e for e in evs if e["kind"] == "checkpoint"]
            if len(ckpts) > last_ckpt:
                last_ckpt = len(ckpts)
                c = ckpts[-1]
                log(f"checkpoint step {c['step']} at {(c['t'] - loop_start) / 60:.2f} min (save {c['save_s']} s)")
            if loop_start is None and now_s() - launch > args.startup_timeout:
                stopped = stop_group(proc, f"no training loop after {args.startup_timeout} s")
            max_save = max([c["save_s"] for c in ckpts] or [5.0])
            if loop_start is not None and now_s() > loop_start + budget_s + args.grace_seconds + 3 * max_save:
                stopped = stop_group(proc, f"still running {args.grace_seconds} s after the budget")
    finally:
        if proc.poll() is None:
            stopped = stop_group(proc, "interrupted")
        poller.stop()
    end = now_s()
    evs = read_events(events)
    start_ev = next((e for e in evs if e["kind"] == "loop_start"), {})
    first_ev = next((e for e in evs if e["kind"] == "first_step"), {})
    pre_ev = next((e for e in evs if e["kind"] == "sdpa_preflight"), {})
    ckpts = [e for e in evs if e["kind"] == "checkpoint"]
    loop_start = start_ev.get("t")
    train.update(returncode=proc.returncode, stopped_by_parent=stopped,
                 budget_stop=any(e["kind"] == "budget_stop" for e in evs), sdpa_preflight=pre_ev.get("result"),
                 params=start_ev.get("params"), amp=start_ev.get("amp"), fp16_mode=start_ev.get("fp16_mode"))
    if start_ev.get("versions"):
        rec.data["versions"].update(start_ev["versions"])
    stages = rec.data["stages"]
    stages["train_process_s"] = round(end - launch, 1)
    if loop_start:
        stages["train_startup_s"] = round(loop_start - launch, 1)
        last_t = ckpts[-1]["t"] + ckpts[-1]["save_s"] if ckpts else end
        stages["train_loop_s"] = round(last_t - loop_start, 1)
        stages["train_saves_s"] = round(sum(c["save_s"] for c in ckpts), 1)
        if first_ev:
            train["first_update_s"] = round(first_ev["t"] - loop_start, 2)
    train.update(parse_log(train_log, loop_start))
    mem = [c for c in ckpts if "max_reserved_mb" in c]
    if mem:
        train.update(max_allocated_mb=max(c["max_allocated_mb"] for c in mem),
                     max_reserved_mb=max(c["max_reserved_mb"] for c in mem))
    train.update(poller.summary(loop_start, ckpts[-1]["t"] if ckpts else None))
    train["total_steps"] = ckpts[-1]["step"] if ckpts else train.get("last_logged_step")
    first_t = first_ev.get("t", loop_start)
    train["checkpoints"] = [{"step": c["step"], "minute": round((c["t"] - loop_start) / 60, 3),
                             "minute_since_launch": round((c["t"] - launch) / 60, 3),
                             "minute_since_first_update": round((c["t"] - first_t) / 60, 3),
                             "minute_excl_saves": round((c["t"] - loop_start - c["saves_before_s"]) / 60, 3),
                             "save_s": c["save_s"], "path": c["path"]} for c in ckpts]
    problem = None  # with checkpoints left, they are decoded all the same
    if not ckpts or (proc.returncode != 0 and not train["budget_stop"]) or stopped:
        problem = (stopped or (f"runner exited with {proc.returncode}" if proc.returncode else "no checkpoint saved"))
    return train["checkpoints"], problem, train_log


# --- decoding ----------------------------------------------------------------------------------------


def decode_stage(args, rec: Record, data_dir: Path, ckpts: list[dict]) -> None:
    import sacrebleu
    import sentencepiece as spm

    prep = Path(rec.data["data"]["dir"])
    sp = spm.SentencePieceProcessor(model_file=str(prep / "spm8k.model"))
    dec = args.work / "decode"
    dec.mkdir(parents=True, exist_ok=True)
    src_all = prep / "test_2016_flickr.sp.de"
    refs_all = (data_dir / "test_2016_flickr.en").read_text(encoding="utf-8").splitlines()
    n = len(refs_all)
    src_lines = src_all.read_text(encoding="utf-8").splitlines()

    def subset(name: str, size: int):
        """All of the test set, or a fixed random sample of ``size`` sentences (in test-set order)."""
        if not 0 < size < n:
            return src_all, refs_all, "all"
        idx = sorted(random.Random(1).sample(range(n), size))
        path = dec / f"{name}.sp.de"
        path.write_text("".join(src_lines[i] + "\n" for i in idx), encoding="utf-8")
        return path, [refs_all[i] for i in idx], f"{size} of {n} (random.Random(1).sample, in order)"

    src_full, refs_full, final_sample = subset("final", args.final_sentences)
    src_curve, refs_curve, curve_sample = subset("curve", args.decode_sentences)
    if refs_curve == refs_full:
        src_curve = src_full
    gpu = "0" if args.device == "cuda" else "-1"

    def job(name, ckpt, src, beam):
        out = dec / f"{name}.sp"
        argv = ["-model", ckpt["path"], "-src", str(src), "-output", str(out), "-gpu", gpu, "-beam_size", str(beam),
                "-batch_size", str(args.decode_batch), "-batch_type", "sents", "-length_penalty", "wu", "-alpha", "1.0",
                "-max_length_ratio", "1.5", "-seed", "42"]
        if args.decode_precision == "fp16":
            argv += ["-precision", "fp16"]
        return {"name": name, "argv": argv, "out": str(out), "step": ckpt["step"]}

    final = ckpts[-1]
    full_curve = src_curve == src_full
    jobs = [job("final_greedy", final, src_full, 1), job("final_beam5", final, src_full, 5)]
    for c in ckpts if not full_curve else ckpts[:-1]:
        jobs.append(job(f"curve_step{c['step']}", c, src_curve, 1))
    by_name = {j["name"]: j for j in jobs}
    jobs_path, results_path, dec_log = dec / "jobs.json", dec / "results.jsonl", dec / "decode.log"
    jobs_path.write_text(json.dumps(jobs, indent=1), encoding="utf-8")
    if results_path.exists():
        results_path.unlink()
    rec.data["decode"] = {"settings": {"greedy": "beam_size 1 (BeamSearch with one beam, as the CPU peer)",
                                       "length_penalty": "wu, alpha 1.0", "max_length_ratio": 1.5,
                                       "batch": f"{args.decode_batch} sentences", "precision": args.decode_precision,
                                       "curve_sentences": len(refs_curve), "final_sentences": len(refs_full),
                                       "test_sentences": n, "curve_sample": curve_sample, "final_sample": final_sample},
                          "log": str(dec_log), "jobs": {}}
    final_rec = rec.data["final"] = {"step": final["step"], "minute": final["minute"],
                                     "minute_since_launch": final["minute_since_launch"]}
    curve_points = {c["step"]: dict(c, status="pending") for c in ckpts}
    for p in curve_points.values():
        p.pop("path", None)
        p.pop("save_s", None)

    def score(name: str, result: dict) -> dict:
        j = by_name[name]
        refs = refs_full if name.startswith("final") else refs_curve
        if "error" in result:
            return {"error": result["error"], "traceback": result.get("traceback")}
        hyps = [sp.decode(line.split()) for line in Path(j["out"]).read_text(encoding="utf-8").splitlines()]
        if len(hyps) != len(refs):
            return {"error": f"{len(hyps)} hypotheses for {len(refs)} references"}
        bleu = sacrebleu.metrics.BLEU()
        b = bleu.corpus_score(hyps, [refs])
        out = {"bleu": round(b.score, 2), "n_sents": len(hyps), "load_s": result.get("load_s"),
               "translate_s": result.get("translate_s"),
               "sents_per_s": round(len(hyps) / result["translate_s"], 1) if result.get("translate_s") else None,
               "ref_len_ratio": round(b.sys_len / max(b.ref_len, 1), 3),
               "empty_hyps": sum(1 for h in hyps if not h.strip())}
        if name.startswith("final"):
            out.update(bleu_str=str(b), bleu_signature=str(bleu.get_signature()),
                       chrf=round(sacrebleu.metrics.CHRF().corpus_score(hyps, [refs]).score, 2))
            (dec / f"{name}.txt").write_text("".join(h + "\n" for h in hyps), encoding="utf-8")
        for k in ("max_allocated_mb", "max_reserved_mb"):
            if k in result:
                out[k] = result[k]
        return out

    def update(result: dict) -> None:
        name = result["name"]
        scored = score(name, result)
        rec.data["decode"]["jobs"][name] = scored
        if result.get("versions"):
            rec.data["versions"].setdefault("decode", result["versions"])
        if name == "final_greedy":
            final_rec["greedy"] = scored
        elif name == "final_beam5":
            final_rec["beam5"] = scored
        if name.startswith("curve_") or (name == "final_greedy" and full_curve):
            p = curve_points[by_name[name]["step"]]
            p.update(status="error" if "error" in scored else "ok", bleu=scored.get("bleu"),
                     n_sents=scored.get("n_sents"), decode_s=scored.get("translate_s"))
        if "error" in scored:
            rec.data["errors"].append({"stage": "decode", "job": name, "error": scored["error"],
                                       "log_tail": scored.get("traceback") or tail(dec_log, 30)})
        finish_curve(rec, curve_points)
        rec.write()
        log(f"decoded {name}: BLEU {scored.get('bleu')}" + (f" ({scored['error']})" if "error" in scored else ""))

    start = now_s()
    deadline = start + args.decode_minutes * 60
    seen: set[str] = set()
    attempts = 0
    while len(seen) < len(jobs) and attempts < 2 and now_s() < deadline:
        attempts += 1
        cmd = [sys.executable, str(Path(__file__).resolve()), "--_runner", "translate",
               *(["--cudnn-attention"] if args.cudnn_attention else []), "--", str(jobs_path), str(results_path)]
        with open(dec_log, "a", encoding="utf-8") as handle:
            proc = subprocess.Popen(cmd, stdout=handle, stderr=subprocess.STDOUT, env=runner_env(),
                                    cwd=str(args.work), start_new_session=True)
        try:
            while True:
                running = proc.poll() is None
                for result in read_events(results_path):
                    if result["name"] not in seen:
                        seen.add(result["name"])
                        update(result)
                if not running:
                    break
                if now_s() > deadline:
                    stop_group(proc, f"decoding over --decode-minutes {args.decode_minutes}", wait_s=5)
                    break
                time.sleep(0.5)
        finally:
            if proc.poll() is None:
                stop_group(proc, "interrupted", wait_s=5)
        if proc.returncode not in (0, None) and len(seen) < len(jobs):
            rec.data["errors"].append({"stage": "decode", "error": f"translate runner exited with {proc.returncode}",
                                       "log_tail": tail(dec_log, 40)})
            # the job it died on is marked failed, so that a second attempt goes on with the rest
            pending = [j["name"] for j in jobs if j["name"] not in seen]
            with open(results_path, "a", encoding="utf-8") as handle:
                handle.write(json.dumps({"name": pending[0], "error": "runner died during this job"}) + "\n")
    for j in jobs:
        if j["name"] not in seen:
            rec.data["decode"]["jobs"][j["name"]] = {"status": "skipped (decode budget or runner failure)"}
            if j["name"].startswith("curve_"):
                curve_points[j["step"]]["status"] = "skipped"
    rec.data["stages"]["decode_s"] = round(now_s() - start, 1)
    finish_curve(rec, curve_points)


def finish_curve(rec: Record, points: dict) -> None:
    curve = [points[s] for s in sorted(points)]
    rec.data["curve"] = curve
    ttb = {}
    for threshold in THRESHOLDS:
        hit = next((p for p in curve if p.get("bleu") is not None and p["bleu"] >= threshold), None)
        ttb[f"{threshold:g}"] = None if hit is None else {
            k: hit.get(k) for k in ("minute", "minute_since_launch", "minute_since_first_update", "minute_excl_saves",
                                    "step", "bleu")}
    rec.data["time_to_bleu"] = ttb


# --- main ----------------------------------------------------------------------------------------


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    default_data = os.environ.get("SEQ2SEQ_MULTI30K")
    ap.add_argument("--data-dir", type=Path, default=default_data, required=default_data is None,
                    help="Multi30k {train,val,test_2016_flickr}.{de,en} (default $SEQ2SEQ_MULTI30K)")
    ap.add_argument("--work", type=Path, required=True, help="data, checkpoints, logs (several GB of checkpoints)")
    ap.add_argument("--out", type=Path, required=True, help="the JSON record (markdown table beside it)")
    ap.add_argument("--minutes", type=float, default=2.0, help="training budget, minutes of the training loop")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--precision", choices=["fp16", "fp32"], default=None,
                    help="training: fp16 = OpenNMT-py's model_dtype fp16 (torch amp); default fp16 on cuda, fp32 on cpu")
    ap.add_argument("--batch-tokens", type=int, default=12000,
                    help="OpenNMT-py batch_size with batch_type tokens (sentences x longest side, padding included)")
    ap.add_argument("--max-steps", type=int, default=0, help="also stop after this many updates (0: budget only)")
    ap.add_argument("--eval-every-seconds", type=float, default=None,
                    help="a checkpoint every this many seconds of the training loop (default: budget / 8)")
    ap.add_argument("--decode-sentences", type=int, default=0,
                    help="sentences of test_2016_flickr for the curve (0: all 1,000); the final checkpoint gets all")
    ap.add_argument("--final-sentences", type=int, default=0,
                    help="sentences for the final checkpoint's greedy and beam 5 (0: all; less only for CPU rehearsals)")
    ap.add_argument("--decode-batch", type=int, default=500, help="sentences per decoding batch")
    ap.add_argument("--decode-precision", choices=["fp32", "fp16"], default="fp32")
    ap.add_argument("--decode-minutes", type=float, default=5.0, help="bound on the decoding stage")
    ap.add_argument("--peak-lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--num-workers", type=int, default=None, help="OpenNMT-py num_workers (default: 2 on cuda, 0 on cpu)")
    ap.add_argument("--report-every", type=int, default=None, help="OpenNMT-py report_every (default: 20 on cuda, 5 on cpu)")
    ap.add_argument("--startup-timeout", type=float, default=300.0)
    ap.add_argument("--grace-seconds", type=float, default=60.0)
    ap.add_argument("--cudnn-attention", action="store_true",
                    help="leave cuDNN scaled-dot-product attention enabled (torch's choice; see the docstring)")
    ap.add_argument("--keep-logs", action="store_true", help="copy the training and decoding logs beside --out")
    args = ap.parse_args(argv)
    if args.precision is None:
        args.precision = "fp16" if args.device == "cuda" else "fp32"
    if args.num_workers is None:
        args.num_workers = 2 if args.device == "cuda" else 0
    args.shm_free_mb = None
    if args.num_workers > 0:  # spawned loader workers hand batches over in /dev/shm (64 MB in some containers)
        try:
            st = os.statvfs("/dev/shm")
            args.shm_free_mb = round(st.f_bavail * st.f_frsize / 2**20)
        except OSError:
            args.shm_free_mb = 0
        if args.shm_free_mb < 1024:
            log(f"/dev/shm has {args.shm_free_mb} MB free: num_workers 0")
            args.num_workers = 0
    if args.report_every is None:
        args.report_every = 20 if args.device == "cuda" else 5
    if args.eval_every_seconds is None:
        args.eval_every_seconds = args.minutes * 60 / 8
    if args.precision == "fp16" and args.device == "cpu":
        ap.error("--precision fp16 needs --device cuda (OpenNMT-py's amp is torch.cuda.amp)")
    args.work = args.work.resolve()
    args.data_dir = args.data_dir.resolve()
    return args


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--_runner"]:
        mode, rest = argv[1], argv[2:]
        allow_cudnn = "--cudnn-attention" in rest[: rest.index("--")] if "--" in rest else False
        rest = rest[rest.index("--") + 1:] if "--" in rest else rest
        if mode == "train":
            return _runner_train(rest, allow_cudnn)
        return _runner_translate(rest[0], rest[1], allow_cudnn)

    args = parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)

    def terminated(signum, frame):  # a command stopped at its limit: stop the runners, write the record
        raise _Terminated(f"signal {signum}")

    signal.signal(signal.SIGTERM, terminated)
    signal.signal(signal.SIGHUP, terminated)
    versions = {"onmt": dist_version("OpenNMT-py"), "configargparse": dist_version("configargparse"),
                "pyonmttok": dist_version("pyonmttok"), "torch": dist_version("torch"),
                "sentencepiece": dist_version("sentencepiece"), "sacrebleu": dist_version("sacrebleu"),
                "python": platform.python_version()}
    if args.device == "cuda":
        smi = nvidia_smi("-i", "0", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader")
        if smi:
            versions["nvidia_smi"] = smi[0]
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    settings.update(
        noam_factor=round(noam_factor(args.peak_lr, args.warmup), 6),
        model="Transformer 3+3, d_model 256, 4 heads, FF 1024, pre-norm, tied decoder embeddings, qkv+ffn biases, "
              "dropout 0.1 (+attention 0.1), label smoothing 0.1, Adam(0.9,0.98) noam, clip 1, glorot (= transformer.yaml.in)",
        differences_from_cpu_peer="batch_type tokens (CPU: 280 sentences); noam warm-up/peak as above (CPU: 30 / 1.98e-3); "
                                  "checkpoints by wall clock; vocab_size_multiple 8 and num_workers 2 on cuda; "
                                  "model_dtype fp16 (torch amp) unless --precision fp32",
        cudnn_sdpa="enabled (torch's choice)" if args.cudnn_attention else "excluded (memory-efficient / math kernels)")
    rec = Record(args.out, {
        "benchmark": "onmt_gpu", "peer": "OpenNMT-py",
        "command": shlex.join(["python3", os.path.relpath(sys.argv[0], ROOT) if sys.argv[0] else "?", *argv]),
        "date": time.strftime("%Y-%m-%d %H:%M"), "status": "running", "versions": versions, "settings": settings,
        "stages": {}, "data": {}, "train": {}, "curve": [], "time_to_bleu": {}, "final": {}, "errors": [],
        "_t_start": now_s()})
    rec.write()
    status = "failed"
    try:
        t0 = now_s()
        log(f"data: SentencePiece + encoding into {args.work / 'data'}")
        rec.data["data"] = prepare_data(args.data_dir, args.work)
        rec.data["stages"]["data_prep_s"] = round(now_s() - t0, 1)
        rec.write()
        ckpts = train_stage(args, rec, Path(rec.data["data"]["dir"]))
        rec.write()
        if ckpts:
            decode_stage(args, rec, args.data_dir, ckpts)
        final = rec.data.get("final", {})
        complete = (not rec.data["errors"] and "bleu" in (final.get("greedy") or {})
                    and "bleu" in (final.get("beam5") or {})
                    and all(p.get("status") == "ok" for p in rec.data["curve"]))
        status = "completed" if complete else ("partial" if ckpts else "failed")
    except BaseException as exc:  # record whatever happened, then fail
        rec.data["errors"].append({"stage": "main", "error": f"{type(exc).__name__}: {exc}",
                                   "traceback": traceback.format_exc()[-4000:]})
        status = "failed"
        if isinstance(exc, (KeyboardInterrupt, _Terminated)):
            status = "interrupted"
    finally:
        rec.data["status"] = status
        rec.write()
        if args.keep_logs:
            import shutil

            for src, suffix in ((args.work / "run" / "train.log", ".train.log"),
                                (args.work / "decode" / "decode.log", ".decode.log")):
                if src.is_file():
                    shutil.copy(src, args.out.with_suffix(suffix))
        try:  # the project's provenance (imports torch here, so only at the end: CUDA stays out of the parent)
            sys.path.insert(0, str(ROOT / "benchmarks"))
            from common import machine

            rec.data["machine"] = machine()
        except Exception as exc:
            rec.data["machine"] = {"platform": platform.platform(), "cpus": os.cpu_count(),
                                   "note": f"benchmarks/common.machine() unavailable: {type(exc).__name__}: {exc}"}
        rec.write()
    g = (rec.data.get("final", {}).get("greedy") or {}).get("bleu")
    b = (rec.data.get("final", {}).get("beam5") or {}).get("bleu")
    log(f"{status}: {rec.data['train'].get('total_steps')} updates, "
        f"{rec.data['train'].get('tgt_tok_per_s_median')} tgt tok/s, BLEU greedy {g} / beam5 {b}; record {args.out}")
    return 0 if status == "completed" else 1


if __name__ == "__main__":
    sys.exit(main())
