"""Distributed training on CPU: ``torchrun`` with two gloo processes on tiny data.

Two processes with one batch each per step must compute exactly the update of one process that
accumulates the same two batches (the loss is normalised by the step's target tokens over all
ranks), write one set of files, and resume exactly across an epoch boundary.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from seq2seq.checkpoint.file import load_checkpoint
from seq2seq.cli import add_config_flags, build_run_config
from seq2seq.training.run import train

ROOT = Path(__file__).resolve().parents[1]
# 300 toy pairs at --max-tokens 200 make 19 batches: 9 steps per epoch on 2 ranks (one batch dropped),
# and 9 steps of 2 accumulated batches in one process (the incomplete group dropped).
TINY = ["--toy-size", "300", "--vocab-size", "120", "--d-model", "32", "--heads", "2", "--ff-size", "64",
        "--layers", "1", "--max-tokens", "200", "--dropout", "0", "--eval-every", "6", "--eval-max-sentences", "8",
        "--warmup-steps", "5", "--lr", "3e-3", "--log-every", "1", "--seed", "3", "--threads", "1",
        "--device", "cpu", "--quiet", "--no-final-test"]


def torchrun(*args: str, nproc: int = 2) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc), *args]
    proc = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def config_from_flags(flags: list[str]):
    parser = argparse.ArgumentParser()
    parser.add_argument("--output-dir")
    parser.add_argument("--no-final-test", action="store_true")
    parser.add_argument("--quiet", action="store_true")
    add_config_flags(parser)
    return build_run_config(parser.parse_args(flags))


@pytest.mark.slow  # torchrun: two training processes
@pytest.mark.serial
def test_two_processes_match_one_accumulating_process_and_resume_exactly(tmp_path):
    run = tmp_path / "ddp"
    common = [str(ROOT / "train.py"), *TINY, "--cache-dir", str(tmp_path / "cache"), "--output-dir", str(run)]
    torchrun(*common, "--max-steps", "5")  # stops mid-epoch 0
    resumed = torchrun(*common, "--max-steps", "12", "--resume")  # continues into epoch 1
    assert resumed.stdout.count("run:") == 1 and resumed.stderr.count("stop reason=max_steps") == 1
    assert sorted(p.name for p in run.iterdir()) == [
        "best.pt", "config.yaml", "last.pt", "metrics.jsonl", "shortlist.npz", "spm.json", "spm.model", "summary.json"]
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    train_steps = [r["step"] for r in records if r["kind"] == "train"]
    assert train_steps == list(range(1, 13))  # one writer: every step logged once
    assert [r["step"] for r in records if r["kind"] == "valid"] == [5, 6, 12]
    ddp = load_checkpoint(run / "last.pt")
    assert ddp["progress"]["world_size"] == 2 and ddp["progress"]["epoch"] == 1
    assert len(ddp["rng_ranks"]) == 2

    threads = torch.get_num_threads()
    try:
        cfg = config_from_flags([*TINY, "--accumulate", "2", "--max-steps", "12",
                                 "--cache-dir", str(tmp_path / "cache"), "--output-dir", str(tmp_path / "single")])
        single = train(cfg, quiet=True)
    finally:
        torch.set_num_threads(threads)
    assert single.progress.step == 12 and single.progress.tgt_tokens == ddp["progress"]["tgt_tokens"]
    reference = load_checkpoint(tmp_path / "single" / "last.pt")["model"]
    for key, value in reference.items():
        torch.testing.assert_close(ddp["model"][key], value, rtol=1e-5, atol=1e-6, msg=key)


HELPERS = """
import json, sys
from pathlib import Path
import pytest
import torch
from seq2seq.training import distributed

out = Path(sys.argv[1])
with distributed.process_group(torch.device("cpu")) as created:
    rank = distributed.rank()
    items = list(range(5 if rank == 0 else 3))  # rank 1 runs out first
    steps = [list(step) for step in distributed.lockstep(items, count=lambda item: item + 1)]
    first = distributed.main_first(
        lambda: (out / f"marker{rank}").touch() or sorted(p.name for p in out.glob("marker*")))
    record = {"created": created, "rank": rank, "world": distributed.world_size(), "steps": steps,
              "broadcast": distributed.broadcast(f"from {rank}"), "flag": distributed.broadcast_flag(rank == 0),
              "gathered": distributed.gather(rank * 10), "sum": distributed.all_reduce_sum([rank, 1.0]),
              "first": first}
    (out / f"rank{rank}.json").write_text(json.dumps(record))
"""


@pytest.mark.serial
def test_process_group_helpers(tmp_path):
    script = tmp_path / "helpers.py"
    script.write_text(HELPERS)
    torchrun(str(script), str(tmp_path))
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert r0["created"] and r0["world"] == 2 and (r0["rank"], r1["rank"]) == (0, 1)
    assert r0["steps"] == r1["steps"][: len(r0["steps"])] and [s[1] for s in r1["steps"]] == [2, 4, 6]
    assert r0["steps"] == [[0, 2], [1, 4], [2, 6]]  # same number of steps on both ranks
    assert r0["broadcast"] == r1["broadcast"] == "from 0" and r0["flag"] is r1["flag"] is True
    assert r0["gathered"] == [0, 10] and r1["gathered"] is None
    assert r0["sum"] == r1["sum"] == [1.0, 2.0]
    assert r0["first"] == ["marker0"] and r1["first"] == ["marker0", "marker1"]  # rank 0 went first


def test_single_process_helpers_are_identities():
    from seq2seq.training import distributed

    assert not distributed.is_distributed() and distributed.is_main() and distributed.world_size() == 1
    assert list(distributed.lockstep([[1], [2, 3]], len)) == [([1], 1), ([2, 3], 2)]
    assert distributed.broadcast("x") == "x" and distributed.gather(1) is None
    assert distributed.all_reduce_sum([1.5]) == [1.5] and distributed.main_first(lambda: 7) == 7


def _worker_pids(parent: int) -> dict[int, int]:
    """{rank: pid} of the torchrun workers below ``parent`` (read from /proc)."""
    found = {}
    for stat in Path("/proc").glob("[0-9]*/environ"):
        try:
            environ = dict(item.split("=", 1) for item in stat.read_text().split("\0") if "=" in item)
            ppid = int((stat.parent / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if "RANK" in environ and "LOCAL_RANK" in environ and ppid == parent:
            found[int(environ["RANK"])] = int(stat.parent.name)
    return found


@pytest.mark.slow  # torchrun: two training processes
@pytest.mark.serial
def test_a_signal_to_one_rank_stops_every_rank_after_the_same_step_and_resumes(tmp_path):
    """Ctrl-C or SIGTERM reaching one rank must not leave the other inside a collective: both stop
    after one step they agree on, write last.pt with both RNG states, exit cleanly and resume."""
    import signal
    import time

    if not Path("/proc/self/environ").exists():
        pytest.skip("needs /proc to find torchrun's workers")
    run = tmp_path / "ddp"
    common = [str(ROOT / "train.py"), *TINY, "--cache-dir", str(tmp_path / "cache"), "--output-dir", str(run)]
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
               *common, "--max-steps", "100000", "--eval-every", "0"]
    proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"}, stdin=subprocess.DEVNULL)
    try:
        deadline = time.time() + 240
        metrics = run / "metrics.jsonl"
        while not (metrics.exists() and metrics.read_text().count("\n") >= 3):
            assert proc.poll() is None and time.time() < deadline, proc.communicate()[1][-3000:]
            time.sleep(0.2)
        workers = _worker_pids(proc.pid)
        assert sorted(workers) == [0, 1], workers
        os.kill(workers[1], signal.SIGINT)  # one rank only, in the middle of training
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-3000:]
    assert err.count("\ninterrupted step=") == 1 and "Traceback" not in err, err[-3000:]
    saved = load_checkpoint(run / "last.pt")
    assert saved["progress"]["stopped"] == "interrupted" and len(saved["rng_ranks"]) == 2
    step = saved["progress"]["step"]
    resumed = torchrun(*common, "--max-steps", str(step + 2), "--resume", "--eval-every", "0")
    assert f"resume step={step}" in resumed.stderr and "stop reason=max_steps" in resumed.stderr
    assert load_checkpoint(run / "last.pt")["progress"]["step"] == step + 2
