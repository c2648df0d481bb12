"""What every benchmark shares: the provenance of a record (command, date, versions, CPU model and
the instruction-set flags that decide its kernels) and writing a record with its markdown table.

Benchmarks use only the installed ``seq2seq`` package and write their records to ``bench-results/``
(JSON, with the table as ``.md`` beside it); compare speeds only within one record or one session.
"""
from __future__ import annotations

import json
import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
KERNEL_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16",
                "amx_int8")


def cpu_model_and_flags() -> tuple[str, list[str]]:
    """The CPU model name and which of ``KERNEL_FLAGS`` it has (Linux; elsewhere best effort)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor(), []
    model = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), "")
    flags = set(next((line.split(":", 1)[1].split() for line in lines if line.startswith("flags")), []))
    return model, [flag for flag in KERNEL_FLAGS if flag in flags]


def machine() -> dict[str, Any]:
    """Where a measurement ran: CPU model and flags, threads, library versions, GPU if any."""
    import datasets
    import sentencepiece
    import torch

    import seq2seq
    from seq2seq.runtime import cpu_has_native_bf16

    model, flags = cpu_model_and_flags()
    return {"platform": platform.platform(), "python": platform.python_version(), "cpu": model, "cpu_flags": flags,
            "cpu_capability": torch.backends.cpu.get_cpu_capability(), "native_bf16": cpu_has_native_bf16(),
            "cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
            "versions": {"seq2seq": seq2seq.__version__, "torch": torch.__version__,
                         "datasets": datasets.__version__, "sentencepiece": sentencepiece.__version__}}


def provenance(benchmark: str) -> dict[str, Any]:
    """The head of every record: which benchmark, the command that ran it, when, and on what."""
    command = shlex.join(["python", os.path.relpath(sys.argv[0], ROOT) if sys.argv[0] else "?", *sys.argv[1:]])
    return {"benchmark": benchmark, "command": command, "date": time.strftime("%Y-%m-%d %H:%M"), "machine": machine()}


def write_record(path: str | Path, record: dict[str, Any], table: str | None = None) -> Path:
    """``record`` as JSON at ``path`` and, if given, ``table`` as markdown beside it (``.md``), atomically."""
    from seq2seq.io_utils import atomic_output

    path = Path(path)
    with atomic_output(path) as handle:
        handle.write(json.dumps(record, indent=2, ensure_ascii=False) + "\n")
    if table is not None:
        with atomic_output(path.with_suffix(".md")) as handle:
            handle.write(table if table.endswith("\n") else table + "\n")
    return path


#: The two checkpoints the A/B scripts (``ab_speed.py``, ``ab_outputs.py``) decode with: pre-tiers toy models.
AB_CHECKPOINTS = {arch: ROOT / "tests" / "data" / "pre-tiers" / f"{arch}.pt" for arch in ("transformer", "rnn")}
#: The head of an A/B child process (``run_in_tree``): one torch thread, the job (JSON) as ``args``, and a stop
#: unless ``seq2seq`` was imported from the job's tree.
TREE_CHILD_HEAD = """
import json, sys
from pathlib import Path
import torch
torch.set_num_threads(1)
import seq2seq

args = json.loads(sys.argv[1])
imported = Path(seq2seq.__file__).resolve()
if Path(args["tree"]).resolve() not in imported.parents:
    sys.exit(f"{args['tree']}: imported seq2seq from {imported}, not from the tree")
"""


def run_in_tree(tree: Path, child: str, job: dict[str, Any]) -> Any:
    """Run ``TREE_CHILD_HEAD + child`` in a fresh process with ``tree`` first on ``PYTHONPATH`` (its ``seq2seq``
    is the one imported) and one thread, ``job`` (plus the tree and ``AB_CHECKPOINTS``) as its JSON argument;
    the JSON its last stdout line prints. A failed child stops the benchmark with its stderr."""
    job = {"tree": str(tree), "checkpoints": {name: str(path) for name, path in AB_CHECKPOINTS.items()}, **job}
    env = {**os.environ, "PYTHONPATH": str(tree.resolve()), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", TREE_CHILD_HEAD + child, json.dumps(job)], capture_output=True,
                          text=True, env=env, cwd=tree)
    if done.returncode:
        raise SystemExit(f"{tree}: exit {done.returncode}\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


DEFAULT_DATA = os.environ.get("SEQ2SEQ_MULTI30K")  # Multi30k {split}.{lang} files, or --data-dir


def add_multi30k_flags(parser) -> None:
    """--data-dir (default $SEQ2SEQ_MULTI30K), --src, --tgt, --test-split: where a benchmark reads Multi30k."""
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA, required=DEFAULT_DATA is None)
    parser.add_argument("--src", default="de")
    parser.add_argument("--tgt", default="en")
    parser.add_argument("--test-split", default="test_2016_flickr")


def add_run_flags(parser, default_out: str, runs_help: str = "reused if finished") -> None:
    """--seed, --device, --runs, --out and the trailing ``-- extra train flags``: how a benchmark that
    trains presets (``train_preset``) is told where its runs and record go."""
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--runs", type=Path, help=f"where the runs go ({runs_help}; default: beside --out)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench-results" / default_out)
    parser.add_argument("extra", nargs="*", help="extra train flags after --, applied to every run")


def add_step_flags(parser, preset: str, default_out: str) -> None:
    """The flags of the one-sentence decoding-step benchmarks (``bench_rnn_step.py``, ``bench_aoti_step.py``):
    the preset whose sizes the model takes (``step_model``), the source, the decoder rows, the steps and rounds
    timed, torch's threads, torch.compile's backend and the record."""
    parser.add_argument("--preset", default=preset)
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--source-length", type=int, default=14, help="source tokens incl. EOS (Multi30k: ~14)")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 5], help="decoder rows: 1 greedy, k a beam")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (a server decodes lone sentences on 1)")
    parser.add_argument("--backend", default="inductor", help="torch.compile's backend (eager: a quick smoke run)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench-results" / default_out)


def step_model(args, **sizes: int):
    """``args.preset``'s model with ``args.vocab_size`` tokens (and ``sizes``: model options that replace the
    preset's), random weights (seed 0: a step's time does not depend on them), in eval mode, on
    ``args.threads`` torch threads."""
    import torch

    from seq2seq.config import RunConfig
    from seq2seq.models import build_model

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    cfg = RunConfig.from_preset(args.preset).resolved("cpu")
    cfg.model.vocab_size = args.vocab_size
    for name, value in sizes.items():
        setattr(cfg.model, name, value)
    return build_model(cfg.model).eval()


def greedy_steps(step, rows: int, steps: int) -> tuple[float, list]:
    """Seconds per step of ``steps`` greedy steps of ``rows`` decoder rows from BOS, ``step(t, tokens)``
    returning the logits of step t (each row's argmax is fed back), and the first five steps' logits."""
    import torch

    from seq2seq.tokenizer import BOS_ID

    tokens = torch.full((rows,), BOS_ID, dtype=torch.long)
    seen = []
    start = time.perf_counter()
    for t in range(steps):
        logits = step(t, tokens)
        tokens = logits.argmax(-1)
        if t < 5:
            seen.append(logits.clone())
    return (time.perf_counter() - start) / steps, seen


def gold_pairs(data_dir: Path, src: str, tgt: str, gold: Path, split: str = "val") -> tuple[list[str], list[str]]:
    """The sentence pairs a gold alignment file aligns: the first lines of ``split``, one per line of ``gold``."""
    from seq2seq.io_utils import read_lines

    count = len(read_lines(gold))
    return tuple(read_lines(data_dir / f"{split}.{lang}")[:count] for lang in (src, tgt))


def score_links(lines: list[str], gold: tuple[list, list]) -> dict:
    """Precision, recall and AER of Pharaoh ``lines`` against ``gold``'s (sure, possible) links, one per pair."""
    from seq2seq.alignment.links import alignment_error_rate, parse_pharaoh

    sure, possible = gold
    return vars(alignment_error_rate([parse_pharaoh(line)[0] for line in lines], sure, possible))


def runs_dir(args) -> Path:
    """The directory of ``add_run_flags``' runs (``--runs``, or ``--out`` without its suffix), created."""
    runs = args.runs or args.out.with_suffix("")
    runs.mkdir(parents=True, exist_ok=True)
    return runs


def for_arch(flags: list[str]) -> list[str]:
    """Train flags without the model options of the architecture the run does not train (``--arch``, else
    its ``--preset``'s, else the default): one set of extra flags (``-- --d-model 32 --embed-dim 32``) may
    size every run of a benchmark, where ``seq2seq train`` rejects an option of the other architecture."""
    from seq2seq.config import ARCH_OPTIONS, PRESETS, ModelConfig

    def last(flag: str) -> str | None:
        return next((flags[i + 1] for i in range(len(flags) - 2, -1, -1) if flags[i] == flag), None)

    preset = last("--preset")
    arch = last("--arch") or (PRESETS.get(preset, {}).get("model", {}).get("arch") if preset else None)
    arch = arch or ModelConfig.arch
    other = {f"--{key.replace('_', '-')}" for name, keys in ARCH_OPTIONS.items() if name != arch for key in keys}
    kept, i = [], 0
    while i < len(flags):
        name = flags[i].split("=", 1)[0]
        if name in other or name.startswith("--no-") and f"--{name[5:]}" in other:
            takes_value = "=" not in flags[i] and i + 1 < len(flags) and not flags[i + 1].startswith("--")
            i += 2 if takes_value and not name.startswith("--no-") else 1
            continue
        kept.append(flags[i])
        i += 1
    return kept


def preset_command(label: str, preset: str, args, run_dir: Path, *flags: str) -> list[str]:
    """The command line of ``train_preset`` (printed, labelled, to stderr); model options of the other
    architecture in ``flags`` and ``args.extra`` are left out (``for_arch``)."""
    command = [sys.executable, "-m", "seq2seq", "train", *for_arch([
        "--preset", preset, "--data-dir", str(args.data_dir), "--src", args.src, "--tgt", args.tgt, "--seed",
        str(args.seed), "--device", args.device, "--output-dir", str(run_dir), "--quiet", "--no-final-test", *flags,
        *args.extra])]
    print(f"[{label}] {' '.join(command)}", file=sys.stderr, flush=True)
    return command


def train_preset(label: str, preset: str, args, run_dir: Path, *flags: str) -> dict:
    """``python -m seq2seq train --preset PRESET`` on ``args``' Multi30k flags into ``run_dir``, in its
    own process (so peak memory and speed are the run's own), quiet, without the final test; ``flags``
    and ``args.extra`` (the benchmark's ``-- extra train flags``) come last. Returns its summary."""
    subprocess.run(preset_command(label, preset, args, run_dir, *flags), check=True, cwd=ROOT)
    return json.loads((run_dir / "summary.json").read_text())


def step_flops_per_target_token(trainer, batch) -> float:
    """Model FLOPs of one optimizer step of ``trainer`` on ``batch`` (forward and backward matrix
    products as ``torch.utils.flop_counter`` counts them) per target token of the batch."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        _, tokens = trainer.train_step([batch])
    return counter.get_total_flops() / tokens


def copy_tokenizer(source: Path, run_dir: Path) -> None:
    """Put ``source``'s SentencePiece model into a new run directory, which the run then reuses."""
    import shutil

    run_dir.mkdir(parents=True, exist_ok=True)
    for suffix in (".model", ".json"):
        shutil.copy(source / f"spm{suffix}", run_dir / f"spm{suffix}")


def shared_tokenizer(args, home: Path) -> Path:
    """One SentencePiece model for several runs (no run spends its budget on it): trained once by a
    one-step Transformer run in ``home`` and reused while ``home/spm.model`` exists."""
    import shutil

    if not (home / "spm.model").is_file():
        shutil.rmtree(home, ignore_errors=True)
        train_preset("tokenizer", "transformer", args, home, "--max-steps", "1", "--eval-every", "0")
    return home
