"""Isolation under ``pytest -n auto``: what test processes share is built once and stays unchanged,
``serial`` tests run alone, and two trainings sharing a corpus cache at once both succeed."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

import run_shared
from test_training import assert_same_weights

ROOT = Path(__file__).resolve().parents[1]

RACE = """
import json, sys, time
from pathlib import Path
sys.path.insert(0, {tests!r})
import run_shared

def build(directory):
    with open({log!r}, "a") as log:
        log.write("built\\n")
    time.sleep(1.0)  # long enough for the other process to ask meanwhile
    (directory / "model.txt").write_text("weights")

start = time.time()
path = run_shared.built_once("race", build)
print(json.dumps({{"path": str(path), "text": (path / "model.txt").read_text()}}))
"""


@pytest.fixture
def own_run_dir(tmp_path, monkeypatch) -> Path:
    """A run directory of this test's own (the real one is the suite's)."""
    monkeypatch.setenv(run_shared.RUN_DIR_ENV, str(tmp_path / "run"))
    return tmp_path / "run"


def test_two_processes_asking_at_once_build_once_and_share_the_result(own_run_dir, tmp_path):
    script = tmp_path / "race.py"
    log = tmp_path / "builds.log"
    script.write_text(RACE.format(tests=str(ROOT / "tests"), log=str(log)))
    procs = [subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True) for _ in range(2)]
    outputs = [json.loads(p.communicate(timeout=60)[0]) for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert log.read_text().splitlines() == ["built"]  # one build
    assert outputs[0] == outputs[1] == {"path": str(own_run_dir / "built" / "race"), "text": "weights"}


def test_a_failed_build_leaves_nothing_and_the_next_caller_builds_again(own_run_dir):
    def broken(directory: Path) -> None:
        (directory / "half.txt").write_text("half")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        run_shared.built_once("model", broken)
    assert not (own_run_dir / "built" / "model").exists()
    path = run_shared.built_once("model", lambda d: (d / "whole.txt").write_text("whole"))
    assert sorted(p.name for p in path.iterdir()) == [run_shared.BUILT_MANIFEST, "whole.txt"]


def test_a_test_that_writes_into_a_built_fixture_is_caught(own_run_dir):
    path = run_shared.built_once("model", lambda d: (d / "weights.bin").write_bytes(b"\x00" * 8))
    other = run_shared.built_once("other", lambda d: (d / "a.txt").write_text("a"))
    assert run_shared.changed_artifacts() == []
    (path / "weights.bin").write_bytes(b"\x01" * 8)  # edited
    (other / "new.txt").write_text("added")  # added
    assert run_shared.changed_artifacts() == ["model", "other"]


HOLD = """
import sys, time
sys.path.insert(0, {tests!r})
import run_shared
with run_shared.machine_share(alone={alone}):
    start = time.time()
    time.sleep({seconds})
    print(start, time.time())
"""


def test_a_serial_test_runs_while_no_other_test_does(own_run_dir, tmp_path):
    """A shared holder first, then one alone, then another shared: the lone one's interval overlaps
    neither; the two shared ones may overlap each other."""
    own_run_dir.mkdir(parents=True)

    def start(alone: bool, seconds: float) -> subprocess.Popen:
        code = HOLD.format(tests=str(ROOT / "tests"), alone=alone, seconds=seconds)
        return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)

    first = start(False, 2.0)
    time.sleep(1.0)  # the first holds its share
    alone = start(True, 0.5)
    time.sleep(0.5)
    later = start(False, 0.5)
    spans = {name: tuple(map(float, p.communicate(timeout=60)[0].split()))
             for name, p in (("first", first), ("alone", alone), ("later", later))}
    assert spans["alone"][0] >= spans["first"][1]  # waited for the running test
    assert spans["later"][0] >= spans["alone"][1]  # the gate kept the later one out until it finished


def test_two_trainings_sharing_a_cache_and_a_parent_folder_at_once(tmp_path):
    """Two workers' tests training on the same corpus at once: both finish, their results agree, and
    the cache holds the corpus once (the second writer uses the first one's)."""
    common = [sys.executable, "-m", "seq2seq", "train", "--toy-size", "200", "--vocab-size", "80", "--d-model", "32",
              "--heads", "2", "--ff-size", "64", "--layers", "1", "--max-steps", "4", "--eval-every", "0",
              "--device", "cpu", "--quiet", "--no-final-test", "--cache-dir", str(tmp_path / "cache")]
    procs = [subprocess.Popen([*common, "--output-dir", str(tmp_path / f"run{k}")], cwd=tmp_path,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for k in range(2)]
    for proc in procs:
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-2000:]
    assert_same_weights(tmp_path / "run0" / "last.pt", tmp_path / "run1" / "last.pt")
    corpora = [p.name for p in (tmp_path / "cache").iterdir() if p.name.startswith("corpus-")]
    assert len(corpora) == 1 and not [p for p in (tmp_path / "cache").iterdir() if p.name.startswith(".corpus-")]
