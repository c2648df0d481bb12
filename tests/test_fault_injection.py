"""Fault injection at every write of a training run (issue 49): each file a run writes, hit by a full disk at
its first write (no temp file can be made), in the middle of writing, at the rename, or an I/O error at the
fsync, and the run killed at random points. What must hold for each: one named error (exit 1, no
traceback), no half file under a final name, nothing a run directory held of value lost or changed, every
checkpoint a message calls intact loads at the step it names, and rerunning (``--resume`` when there is a
``last.pt``) finishes the job.

Every atomic write goes through ``seq2seq.io_utils.atomic_output`` (temp file, write, fsync, rename); the
faults are injected there, at the operating-system calls it makes, and nowhere else: the test first runs
the command cleanly and records every write it makes, then replays it once per (file, fault) with the
fault at that file's first write. The append-only metrics log has its own case.
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest
from conftest import run_main

import seq2seq.io_utils as io_utils
from seq2seq.checkpoint.file import checkpoint_step
from seq2seq.cli import main

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--toy-size", "200", "--vocab-size", "100", "--d-model", "32", "--heads", "2", "--ff-size", "64",
        "--layers", "1", "--warmup-steps", "5", "--eval-max-sentences", "8", "--device", "cpu", "--threads", "1",
        "--no-final-test", "--quiet", "--max-steps", "6", "--eval-every", "2", "--keep-last", "2",
        "--save-every", "3", "--log-every", "1"]
OPTIONAL = {"shortlist.npz"}  # written for decoding; a failure is logged and the run goes on
FAULTS = {  # the kind of fault -> the errno it raises
    "first write": errno.ENOSPC,  # the temp file cannot be created
    "middle": errno.ENOSPC,  # half the data is written, then the disk is full
    "fsync": errno.EIO,  # the data cannot be flushed to the disk
    "rename": errno.ENOSPC,  # the temp file cannot take the final name
}


class Injector:
    """Stands in for ``os`` and ``tempfile`` inside ``io_utils``: records each atomic write's target and
    raises the planned fault at the planned write (``kind`` at the ``at``-th write of ``name``)."""

    def __init__(self, run: Path, kind: str | None = None, name: str | None = None) -> None:
        self.run, self.kind, self.name = run, kind, name
        self.writes: list[str] = []  # final names (relative to the run directory when inside it)
        self.fired: dict[str, str] | None = None  # the run directory's files and hashes when the fault fired
        self._temp_target: dict[str, str] = {}
        self.os = types.SimpleNamespace(**{k: getattr(os, k) for k in dir(os) if not k.startswith("__")})
        self.os.fdopen, self.os.fsync, self.os.replace = self._fdopen, self._fsync, self._replace
        self.tempfile = types.SimpleNamespace(mkstemp=self._mkstemp)

    def _label(self, target: str) -> str:
        path = Path(target)
        try:
            label = path.relative_to(self.run).as_posix()
        except ValueError:
            label = path.name
        return re.sub(r"step-\d+", "step-N", label)

    def _matches(self, label: str | None) -> bool:
        """The planned file: its name, or a file of that name inside a directory written whole (an
        export's temp directory, whose name changes from run to run)."""
        return label is not None and self.name is not None and (label == self.name or label.endswith(
            "/" + self.name) and ".tmp/" in label)

    def _fire(self, kind: str, label: str) -> None:
        if self.fired is None and kind == self.kind and self._matches(label):
            self.fired = snapshot(self.run)
            raise OSError(FAULTS[kind], os.strerror(FAULTS[kind]))

    def _mkstemp(self, dir, prefix, suffix):
        label = self._label(str(Path(dir) / prefix[1:-1]))
        self.writes.append(label)
        self._fire("first write", label)
        fd, tmp = __import__("tempfile").mkstemp(dir=dir, prefix=prefix, suffix=suffix)
        self._temp_target[tmp] = label
        self._temp_target[fd] = label
        return fd, tmp

    def _fdopen(self, fd, mode, **kwargs):
        handle = os.fdopen(fd, mode, **kwargs)
        label = self._temp_target.get(fd)
        if not (self.kind == "middle" and self._matches(label) and self.fired is None):
            return handle
        injector, real_write = self, handle.write

        def write(data):  # half of it, then a full disk
            real_write(data[: len(data) // 2])
            injector._fire("middle", label)
            return real_write(data)

        handle.write = write
        return handle

    def _fsync(self, fd):
        label = self._temp_target.get(fd)
        if label is not None:
            self._fire("fsync", label)
        return os.fsync(fd)

    def _replace(self, src, dst):
        label = self._temp_target.pop(str(src), None)
        self._temp_target = {k: v for k, v in self._temp_target.items() if not isinstance(k, int)}  # fds closed
        if label is not None:
            self._fire("rename", label)
        return os.replace(src, dst)


def snapshot(run: Path) -> dict[str, str]:
    if not run.is_dir():
        return {}
    return {p.relative_to(run).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in run.rglob("*") if p.is_file() and not p.name.endswith(".tmp")}


def train(tmp_path: Path, run: Path, injector: Injector, monkeypatch, *extra: str) -> int:
    monkeypatch.setattr(io_utils, "os", injector.os)
    monkeypatch.setattr(io_utils, "tempfile", injector.tempfile)
    try:
        return main(["train", *TINY, "--cache-dir", str(tmp_path / "cache"), "--output-dir", str(run), *extra])
    finally:
        monkeypatch.setattr(io_utils, "os", os)
        monkeypatch.setattr(io_utils, "tempfile", __import__("tempfile"))


@pytest.fixture(scope="module")
def clean_writes(tmp_path_factory) -> list[str]:
    """The files a clean run writes, in order (the cache and tokenizer prepared once for every case)."""
    tmp = tmp_path_factory.mktemp("clean")
    mp = pytest.MonkeyPatch()
    injector = Injector(tmp / "run")
    try:
        assert train(tmp, tmp / "run", injector, mp) == 0
    finally:
        mp.undo()
    return injector.writes


def cases() -> list[tuple[str, str]]:
    """(file, fault): every file of a run under every fault kind would be 4 x ~10 runs; each file gets
    one fault, rotating through the kinds, and each kind hits the checkpoints at least once."""
    names = ["spm.model", "spm.json", "config.yaml", "shortlist.npz", "best.pt", "last.pt", "checkpoints/step-N.pt",
             "checkpoints/index.json", "summary.json"]
    kinds = list(FAULTS)
    chosen = [(name, kinds[i % len(kinds)]) for i, name in enumerate(names)]
    chosen += [("last.pt", kind) for kind in kinds if (("last.pt", kind)) not in chosen]
    chosen += [("best.pt", kind) for kind in kinds if (("best.pt", kind)) not in chosen]
    return chosen


def test_the_cases_cover_every_file_a_run_writes(clean_writes):
    covered = {name for name, _ in cases()}
    assert set(clean_writes) <= covered, set(clean_writes) - covered


@pytest.mark.parametrize("name,kind", cases())
def test_a_fault_at_a_write_loses_nothing_and_the_rerun_finishes(tmp_path, monkeypatch, capsys, clean_writes,
                                                                 name, kind):
    if name not in clean_writes:
        pytest.skip(f"a clean run writes no {name}")
    run = tmp_path / "run"
    injector = Injector(run, kind, name)
    code = train(tmp_path, run, injector, monkeypatch)
    err = capsys.readouterr().err
    assert injector.fired is not None, f"no {kind} fault at {name}: {injector.writes}"
    assert "Traceback" not in err, err
    reason = "input/output error" if FAULTS[kind] == errno.EIO else "no space left on device"
    named = f"writing {run / name.split('step-N')[0]}"  # checkpoints/step-N.pt: any step
    if name in OPTIONAL:  # a decoding aid: the run goes on without it, and says so
        assert code == 0 and f"shortlist not written (seq2seq shortlist builds it later): {reason} {named}" in err
        assert not list(run.rglob("*.tmp")) and checkpoint_step(run / "last.pt") == 6
        return
    assert code == 1 and reason in err and named in err, err
    assert not [p for p in run.rglob("*.tmp")] if run.exists() else True  # no half file anywhere
    before = injector.fired
    if any(key.endswith(".pt") for key in before):  # something of value: all of it still there, unchanged
        assert snapshot(run) == {**snapshot(run), **before}
        for path_text, step in re.findall(r"(\S+\.pt) \(step (\d+)\) is intact", err):
            assert checkpoint_step(path_text) == int(step)
    else:  # a failed start: nothing of value was written and nothing is left
        assert not run.exists()
    # the rerun: --resume from last.pt, or a fresh start where nothing of value was left
    if (run / "last.pt").exists():
        assert "--resume" in err
        assert train(tmp_path, run, Injector(run), monkeypatch, "--resume") == 0
    elif run.exists():
        assert "there is no last.pt to resume from" in err and "another --output-dir" in err
        run = tmp_path / "again"
        assert train(tmp_path, run, Injector(run), monkeypatch) == 0
    else:
        assert train(tmp_path, run, Injector(run), monkeypatch) == 0
    assert checkpoint_step(run / "last.pt") == 6 and (run / "summary.json").is_file()


def test_a_full_disk_while_appending_metrics_is_named_and_the_log_stays_whole(tmp_path, monkeypatch, capsys):
    """metrics.jsonl is appended to, not replaced: a full disk halfway through a line is an error naming
    the file; on --resume the half line is cut off, so every line of the log is one JSON object."""
    import builtins
    import json

    run, real_open, calls = tmp_path / "run", builtins.open, {"n": 0}

    class HalfWriter:
        def __init__(self, handle):
            self.handle = handle

        def write(self, text):
            self.handle.write(text[: len(text) // 2])
            self.handle.flush()
            raise OSError(errno.ENOSPC, "No space left on device")

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.handle.close()

    def opening(file, mode="r", *args, **kwargs):
        handle = real_open(file, mode, *args, **kwargs)
        if str(file).endswith("metrics.jsonl") and mode == "a":
            calls["n"] += 1
            if calls["n"] == 4:
                return HalfWriter(handle)
        return handle

    monkeypatch.setattr(builtins, "open", opening)
    code = train(tmp_path, run, Injector(run), monkeypatch)
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err
    assert f"no space left on device appending to {run / 'metrics.jsonl'}; the lines before are intact" in err
    monkeypatch.setattr(builtins, "open", real_open)
    assert train(tmp_path, run, Injector(run), monkeypatch, "--resume") == 0
    lines = (run / "metrics.jsonl").read_text().splitlines()
    assert all(json.loads(line) for line in lines)


def logged_step(run: Path) -> int:
    metrics = run / "metrics.jsonl"
    lines = metrics.read_text(encoding="utf-8").splitlines() if metrics.is_file() else []
    steps = [json.loads(line)["step"] for line in lines if line.endswith("}")]
    return max(steps, default=0)


def test_a_run_killed_at_random_points_resumes_to_the_end(tmp_path):
    """SIGKILL at three random moments of a subprocess run (once it has logged step 5, 17, 29, plus up to
    0.3 s): every checkpoint on disk loads each time, and --resume finishes the run at exactly its
    last step; a finished run resumed takes no further step."""
    run, rng = tmp_path / "run", random.Random(49)
    command = [sys.executable, "-m", "seq2seq", "train", *TINY, "--cache-dir", str(tmp_path / "cache"),
               "--output-dir", str(run)]
    command[command.index("--max-steps") + 1] = "40"
    for target in (5, 17, 29):
        resume = ["--resume"] if (run / "last.pt").is_file() else []
        proc = subprocess.Popen(command + resume, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 120
        while logged_step(run) < target and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(rng.uniform(0, 0.3))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert not list(run.rglob("*.tmp")) or all(p.name.startswith(".") for p in run.rglob("*.tmp"))
        for path in list(run.glob("*.pt")) + list(run.glob("checkpoints/*.pt")):
            assert checkpoint_step(path) is not None, f"{path} does not load after SIGKILL"
    for _ in range(2):  # the second resume finds the run finished; in this process (nothing to kill)
        resume = ["--resume"] if (run / "last.pt").is_file() else []
        code, _, err = run_main(command[3:] + resume)
        assert code == 0, err[-2000:]
        assert checkpoint_step(run / "last.pt") == 40


def test_a_damaged_corpus_cache_is_rebuilt_with_a_warning(tmp_path, monkeypatch, capsys, caplog):
    """A truncated Arrow file or a missing manifest in the encoded-corpus cache: the next run warns,
    rebuilds the cache and trains, instead of a traceback from the Arrow reader."""
    run = tmp_path / "first"
    assert train(tmp_path, run, Injector(run), monkeypatch, "--max-steps", "1") == 0
    [cache] = (tmp_path / "cache").glob("corpus-*")
    [arrow] = (cache / "train").glob("*.arrow")
    arrow.write_bytes(arrow.read_bytes()[: arrow.stat().st_size // 3])
    for damaged in ("truncated", "no manifest"):
        if damaged == "no manifest":
            (next((tmp_path / "cache").glob("corpus-*")) / "seq2seq.json").unlink()
        run = tmp_path / damaged.replace(" ", "-")
        caplog.clear()
        assert train(tmp_path, run, Injector(run), monkeypatch, "--max-steps", "1") == 0
        assert "is damaged" in caplog.text and "rebuilding it" in caplog.text
        assert "Traceback" not in capsys.readouterr().err


# ----------------------------------------------------------------------------- the other commands' outputs

def command_line(name: str, model: Path, out: Path, source: Path) -> list[str]:
    if name == "translate":
        return ["translate", "--checkpoint", str(model), "--input", str(source), "--output", str(out / "hyp.txt"),
                "--alignments", str(out / "align.jsonl"), "--html", str(out / "view.html"), "--device", "cpu",
                "--beam-size", "2"]
    if name == "average":
        return ["average", "--checkpoint", str(model), "--last", "2", "--output", str(out / "average.pt")]
    if name == "export":
        return ["export", "--format", "safetensors", "--force", str(model), str(out / "export")]
    raise ValueError(name)


COMMAND_CASES = [("translate", "hyp.txt", "first write"), ("translate", "hyp.txt", "middle"),
                 ("translate", "view.html", "fsync"), ("translate", "view.html", "rename"),
                 ("average", "average.pt", "middle"), ("average", "average.pt", "rename"),
                 ("export", "config.json", "first write"), ("export", "config.json", "fsync")]


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, Path]:
    """A tiny trained run (2 kept snapshots) and a few source lines."""
    tmp = tmp_path_factory.mktemp("trained")
    mp = pytest.MonkeyPatch()
    try:
        assert train(tmp, tmp / "run", Injector(tmp / "run"), mp) == 0
    finally:
        mp.undo()
    source = tmp / "source.txt"
    source.write_text("twenty-one\nthree hundred and four\nseven\n", encoding="utf-8")
    return tmp / "run", source


def run_command(argv: list[str], injector: Injector, monkeypatch) -> int:
    monkeypatch.setattr(io_utils, "os", injector.os)
    monkeypatch.setattr(io_utils, "tempfile", injector.tempfile)
    try:
        return main(argv)
    finally:
        monkeypatch.setattr(io_utils, "os", os)
        monkeypatch.setattr(io_utils, "tempfile", __import__("tempfile"))


@pytest.mark.parametrize("command,name,kind", COMMAND_CASES)
def test_a_fault_at_a_commands_output_keeps_the_earlier_outputs(tmp_path, monkeypatch, capsys, trained, command,
                                                                name, kind):
    """translate (the translations, the HTML viewer), average and export: a fault at one output
    is one named error (exit 1), no temp file is left, every output of an earlier run of the same command
    is still there unchanged, and running the command again succeeds."""
    model, source = trained
    out = tmp_path / "out"
    argv = command_line(command, model, out, source)
    clean = Injector(out)
    assert run_command(argv, clean, monkeypatch) == 0
    assert any(label.endswith(name) for label in clean.writes), clean.writes
    capsys.readouterr()
    before = snapshot(out)
    injector = Injector(out, kind, name)
    code = run_command(argv, injector, monkeypatch)
    err = capsys.readouterr().err
    assert injector.fired is not None and code == 1 and "Traceback" not in err, err
    reason = "input/output error" if FAULTS[kind] == errno.EIO else "no space left on device"
    assert f"error: {reason}" in err and f"writing {out / command_output(command, name)}" in err, err
    assert not [p for p in out.rglob("*") if p.name.endswith(".tmp") or ".tmp" in p.name], list(out.rglob("*"))
    assert snapshot(out) == before  # the earlier outputs, unchanged (a rewrite of one is the same bytes)
    assert run_command(argv, Injector(out), monkeypatch) == 0 and set(snapshot(out)) == set(before)


def command_output(command: str, name: str) -> str:
    """What a message names: the file, or the directory an export writes whole (with the file in it)."""
    return f"export/{name}" if command == "export" else name


@pytest.mark.parametrize("fault", ["write", "fsync", "rename"])
def test_a_fault_while_writing_alignments_publishes_nothing_half(tmp_path, monkeypatch, capsys, trained, fault):
    """translate --alignments streams JSONL and NPZ to temp files and renames both at the end: a full disk
    while writing, an I/O error at the flush or a full disk at the rename is one named error, leaves no
    temp file, and the earlier JSONL and NPZ stay whole."""
    import seq2seq.alignment.records as records

    model, source = trained
    out = tmp_path / "out"
    argv = ["translate", "--checkpoint", str(model), "--input", str(source), "--output", str(out / "hyp.txt"),
            "--alignments", str(out / "align.jsonl"), "--device", "cpu", "--beam-size", "2"]
    assert main(argv) == 0
    capsys.readouterr()
    before = snapshot(out)
    errors = {"write": errno.ENOSPC, "fsync": errno.EIO, "rename": errno.ENOSPC}

    def fail(*args, **kwargs):
        raise OSError(errors[fault], os.strerror(errors[fault]))

    if fault == "write":
        monkeypatch.setattr(records.AlignmentWriter, "_write", fail)
    else:
        proxy = types.SimpleNamespace(**{k: getattr(os, k) for k in dir(os) if not k.startswith("__")})
        setattr(proxy, "fsync" if fault == "fsync" else "replace", fail)
        monkeypatch.setattr(records, "os", proxy)
    code = main(argv)
    err = capsys.readouterr().err
    reason = "input/output error" if fault == "fsync" else "no space left on device"
    assert code == 1 and "Traceback" not in err and f"error: {reason}" in err and f"writing {out / 'align'}" in err
    assert not [p for p in out.iterdir() if ".tmp" in p.name]
    assert snapshot(out) == before
    monkeypatch.undo()
    assert main(argv) == 0 and snapshot(out) == before
