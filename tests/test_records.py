"""Committed records and reports hold no absolute paths of the machines they were made on.

Every committed ``.json`` and ``.md`` file is scanned line by line. Paths inside the repository are written
relative to its root; places outside it are placeholders (``MULTI30K``, ``RUN``, ``RUN_RNN``,
``QUALITY_DIR``, ``BENCH_PEERS/...``, ``OUT``). URLs (``https://host/home/...``), relative paths
(``docs/data/``, ``../shared/data/``) and API routes (``/translate``, ``/v1/...``) are not machine paths.
"""
from __future__ import annotations

import fnmatch
import os
import re
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SUFFIXES = (".json", ".md")
ALWAYS_SKIPPED = {".git", ".venv", "venv", "checkpoints", "data", "build", "node_modules", "__pycache__"}

# A root directory of a filesystem (followed by "/"), where a path can start: the start of a line, after
# white space, a quote, "=", "(", "[", "{", ",", ":", ";", "<", ">", "|", a backtick, an escaped newline or
# tab inside a JSON string ("\n/tmp/..."), or "file://". Not after a letter, digit, "." or "/", so that
# "https://host/home/x", "docs/data/x" and "../shared/data/x" pass.
ROOTS = r"(?:work|tmp|root|home|Users|opt|mnt|scratch|var|private|data|srv|media|Volumes|dev/shm)"
MACHINE_PATH = re.compile(
    r"(?:^|(?<=[\s\"'=(\[{,:;<>|`])|(?<=\\n)|(?<=\\t)|(?<=file://))"
    rf"(/{ROOTS}/[^\s\"'`)\]}}>,;|\\]*)",
    re.MULTILINE,
)


def machine_paths(text: str) -> list[tuple[int, str]]:
    """(line number from 1, path) for each absolute machine path in ``text``."""
    found = []
    for number, line in enumerate(text.splitlines(), start=1):
        found.extend((number, match.group(1)) for match in MACHINE_PATH.finditer(line))
    return found


def _git_files() -> list[str] | None:
    """The committed .json/.md files (``git ls-files``), or None without git or outside a checkout."""
    if shutil.which("git") is None:
        return None
    try:
        top = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--show-toplevel"],
                             capture_output=True, text=True, timeout=30)
        if top.returncode != 0 or Path(top.stdout.strip()).resolve() != ROOT:
            return None
        listed = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "--", *(f"*{s}" for s in SUFFIXES)],
                                capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    if listed.returncode != 0:
        return None
    return sorted(name for name in listed.stdout.split("\0") if name and (ROOT / name).is_file())


def _gitignore_rules() -> list[tuple[bool, bool, bool, str]]:
    """(negated, directory only, anchored, pattern) for each rule of the top-level .gitignore."""
    rules = []
    path = ROOT / ".gitignore"
    lines = path.read_text(encoding="utf-8").splitlines() if path.is_file() else []
    for line in lines:
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negated = line.startswith("!")
        line = line[1:] if negated else line
        directory_only = line.endswith("/")
        line = line.rstrip("/")
        anchored = "/" in line
        rules.append((negated, directory_only, anchored, line.lstrip("/")))
    return rules


def _ignored(relative: str, is_dir: bool, rules) -> bool:
    ignored = False
    for negated, directory_only, anchored, pattern in rules:
        if directory_only and not is_dir:
            continue
        name = relative if anchored else relative.rsplit("/", 1)[-1]
        if fnmatch.fnmatchcase(name, pattern):
            ignored = not negated
    return ignored


def _walked_files() -> list[str]:
    """Without git: the .json/.md files of the tree, less .git, virtual environments, checkpoints/, data/
    and what the top-level .gitignore ignores."""
    rules = _gitignore_rules()
    found = []
    for directory, subdirs, files in os.walk(ROOT):
        base = Path(directory).relative_to(ROOT).as_posix()
        prefix = "" if base == "." else base + "/"
        subdirs[:] = sorted(d for d in subdirs if d not in ALWAYS_SKIPPED and not _ignored(prefix + d, True, rules))
        found.extend(prefix + f for f in files if f.endswith(SUFFIXES) and not _ignored(prefix + f, False, rules))
    return sorted(found)


def committed_files() -> list[str]:
    files = _git_files()
    return _walked_files() if files is None else files


def test_committed_records_hold_no_machine_paths():
    files = committed_files()
    assert files, "no .json or .md files found"
    problems = []
    for name in files:
        text = (ROOT / name).read_text(encoding="utf-8", errors="replace")
        problems.extend(f"{name}:{number}: {path}" for number, path in machine_paths(text))
    assert not problems, ("absolute machine paths in committed files (write paths in the repository relative to "
                          "its root, others as placeholders such as MULTI30K or RUN):\n" + "\n".join(problems))


def test_the_check_flags_machine_paths_and_passes_urls_and_relative_paths():
    flagged = "\n".join([
        '  "command": "/work/main/seq2seq/bench.py decode --data-dir /work/shared/data/multi30k",',
        '  "checkpoint": "/tmp/runs/q12/rnn-bahdanau/best.pt",',
        "python train.py --output-dir=/home/alice/runs/r1",
        "see (/root/cache/x) and `/Users/bob/nmt` and [a](/mnt/disk/file.txt)",
        "/scratch/job/out.json at the start of a line",
        '"train_config": "name: x\\nmodel_dir: /opt/peers/model\\n"',
        "open file:///var/tmp/report.html, /private/var/folders/x and /data/multi30k/train.de",
    ])
    assert [number for number, _ in machine_paths(flagged)] == [1, 1, 2, 3, 4, 4, 4, 5, 6, 7, 7, 7]
    assert [path for _, path in machine_paths(flagged)][:3] == [
        "/work/main/seq2seq/bench.py", "/work/shared/data/multi30k", "/tmp/runs/q12/rnn-bahdanau/best.pt"]
    clean = "\n".join([
        "https://github.com/home/tmp/work and http://localhost:8080/data/x and https://host/Users/x",
        "relative: docs/data/README.md, ../shared/data/multi30k/test.de, checkpoints/foo/best.pt, bench-results/x",
        "placeholders: --data-dir MULTI30K --checkpoint RUN_RNN RUN_TRANSFORMER BENCH_PEERS/data/train",
        "API routes: POST /translate, GET /health, /v1/models, /openapi.json; docs link [x](/docs/guide.md)",
        'defaults: ${TMPDIR:-/tmp}/bench-peers, /tmp, "/work", a regex r"^/\\w+$", /usr/bin/time -v',
    ])
    assert machine_paths(clean) == []
