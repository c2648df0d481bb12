"""A command run as a child process, measured: wall time, exit code, and peak memory — of its largest single
process (``ru_maxrss`` from ``os.wait4``, waited-for workers included), of its whole process tree (PSS summed over
the process and its descendants, sampled every 0.2 s: shared pages split between the processes that map them) and
the main process's anonymous and file-backed resident pages (Linux /proc). Used by ``bench_scale.py`` and
``bench_wordalign.py``.
"""
from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path

from common import ROOT


def _tree_pss_kb(root: int) -> int:
    """Sum of the proportional set size (shared pages split between their users) over ``root`` and
    its descendants (Linux /proc)."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as handle:
                    parents[int(entry)] = int(handle.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    tree, frontier = {root}, [root]
    while frontier:
        frontier = [pid for pid, parent in parents.items() if parent in frontier and pid not in tree]
        tree.update(frontier)
    total = 0
    for pid in tree:
        try:
            with open(f"/proc/{pid}/smaps_rollup") as handle:
                total += next((int(line.split()[1]) for line in handle if line.startswith("Pss:")), 0)
        except OSError:
            continue
    return total


def _rss_kb(pid: int) -> dict[str, int]:
    """``RssAnon`` and ``RssFile`` of ``pid`` in kB (Linux /proc; empty once it has exited)."""
    try:
        with open(f"/proc/{pid}/status") as handle:
            return {line.split(":")[0]: int(line.split()[1]) for line in handle
                    if line.startswith(("RssAnon:", "RssFile:"))}
    except OSError:
        return {}


def run_measured(command: list[str], log_path: Path) -> dict:
    """Run ``command``; wall time, exit code, peak RSS of the largest process and of the process
    tree, and the peak anonymous / file-backed resident memory of the main process."""
    start = time.perf_counter()
    with open(log_path, "w") as log_file:
        proc = subprocess.Popen(command, cwd=ROOT, stdout=log_file, stderr=subprocess.STDOUT)
        peak_tree, peaks, done = [0], {"RssAnon": 0, "RssFile": 0}, threading.Event()

        def sample() -> None:
            while not done.wait(0.2):
                peak_tree[0] = max(peak_tree[0], _tree_pss_kb(proc.pid))
                for key, kb in _rss_kb(proc.pid).items():
                    peaks[key] = max(peaks[key], kb)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        _, status, usage = os.wait4(proc.pid, 0)
        done.set()
        sampler.join()
        proc.returncode = os.waitstatus_to_exitcode(status)
    seconds = time.perf_counter() - start
    if proc.returncode:
        tail = log_path.read_text(errors="replace")[-3000:]
        raise SystemExit(f"{' '.join(command)} failed with exit code {proc.returncode}:\n{tail}")
    return {"seconds": seconds, "peak_rss_mb": usage.ru_maxrss / 1024, "peak_tree_pss_mb": peak_tree[0] / 1024,
            "peak_anon_mb": peaks["RssAnon"] / 1024, "peak_file_mb": peaks["RssFile"] / 1024}
