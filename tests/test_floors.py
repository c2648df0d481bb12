"""The lowest versions ``pyproject.toml`` declares are not below what the code uses.

No CI step installs the floors themselves (a torch 2.4 CPU wheel is not on this machine's disk and
PyPI's is a CUDA build of several GB), so this test holds the table the floors are read from: for
each newer API the package calls, the release that introduced it. It fails when a floor is lowered
below an entry, when an entry's API is no longer used (the table went stale), or when the installed
version lacks the API (the entry is wrong). A new API call needs a new row here."""
from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: (distribution, dotted API, the first release that has it, where the package uses it)
NEEDS = [
    ("torch", "torch.get_autocast_dtype", "2.4", "seq2seq/models/rnn.py"),
    ("torch", "torch.amp.GradScaler", "2.3", "seq2seq/training/trainer.py"),
    ("datasets", "datasets.List", "4.0", "seq2seq/data/schema.py"),
    ("pydantic", "pydantic.TypeAdapter", "2.0", "seq2seq/config/__init__.py"),
]


def version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text)[:3])


def declared_floors() -> dict[str, str]:
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    block = text[text.index("dependencies = ["):]
    block = block[: block.index("]")]
    return {name.lower(): floor for name, floor in re.findall(r'"([A-Za-z0-9_.-]+)>=([0-9.]+)', block)}


@pytest.mark.parametrize("distribution, api, since, used_in", NEEDS)
def test_the_declared_floor_has_what_the_code_calls(distribution, api, since, used_in):
    floor = declared_floors()[distribution]
    assert version_tuple(floor) >= version_tuple(since), (
        f"pyproject.toml says {distribution}>={floor}, but {used_in} uses {api}, new in {since}")
    assert api.split(".")[-1] in (ROOT / used_in).read_text(encoding="utf-8"), f"{used_in} no longer uses {api}"
    module, _, name = api.rpartition(".")
    assert hasattr(importlib.import_module(module), name), f"the installed {distribution} has no {api}"


def test_the_floor_check_can_fail():
    assert version_tuple("2.3") < version_tuple("2.4") and version_tuple("2.16") < version_tuple("4.0")
    assert declared_floors()["torch"] and declared_floors()["datasets"]
