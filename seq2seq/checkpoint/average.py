"""Checkpoint averaging (``seq2seq average``): the element-wise mean of the weights of several
checkpoints of one run, written as a checkpoint every command reads."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import torch

from ..errors import UserError
from ..io_utils import display_path
from .file import load_checkpoint, save_checkpoint


def average_checkpoints(paths: Sequence[str | Path]) -> dict[str, Any]:
    """One weights-only checkpoint whose model is the mean of the checkpoints' models (see module
    docstring); config, tokenizer and progress are the newest checkpoint's."""
    if len(paths) < 2:
        raise UserError(f"averaging needs at least two checkpoints, got {len(paths)}")
    payloads = [(Path(p), load_checkpoint(p)) for p in paths]
    first_path, first = payloads[0]
    for path, payload in payloads[1:]:
        _check_compatible(first_path, first, path, payload)
    newest = max(payloads, key=lambda item: item[1].get("progress", {}).get("step", 0))[1]
    averaged = {}
    for key, value in first["model"].items():
        tensors = [payload["model"][key] for _, payload in payloads]
        if value.is_floating_point():
            averaged[key] = torch.stack([t.float() for t in tensors]).mean(0).to(value.dtype)
        else:  # integer buffers (counters, ids) are not weights: the newest checkpoint's
            averaged[key] = newest["model"][key]
    return {"config": newest["config"], "tokenizer": newest["tokenizer"], "model": averaged,
            "progress": newest.get("progress", {}),
            "averaged_from": [{"file": str(path), "step": payload.get("progress", {}).get("step")}
                              for path, payload in payloads]}


def _check_compatible(path_a: Path, a: dict[str, Any], path_b: Path, b: dict[str, Any]) -> None:
    both = f"{display_path(path_a)} and {display_path(path_b)}"
    model_a, model_b = a["config"].get("model", {}), b["config"].get("model", {})
    differing = sorted(k for k in model_a.keys() | model_b.keys() if model_a.get(k) != model_b.get(k))
    if differing:
        shown = ", ".join(f"{k}: {model_a.get(k)!r} vs {model_b.get(k)!r}" for k in differing[:4])
        raise UserError(f"cannot average {both}: different models ({shown}); average checkpoints of one run")
    if not torch.equal(a["tokenizer"], b["tokenizer"]):
        raise UserError(f"cannot average {both}: different tokenizers (SentencePiece models)")
    shapes_a = {k: tuple(v.shape) for k, v in a["model"].items()}
    shapes_b = {k: tuple(v.shape) for k, v in b["model"].items()}
    if shapes_a != shapes_b:
        key = next(iter(sorted(k for k in shapes_a.keys() | shapes_b.keys() if shapes_a.get(k) != shapes_b.get(k))))
        raise UserError(f"cannot average {both}: weight {key} is {shapes_a.get(key)} vs {shapes_b.get(key)}")


def write_average(paths: Sequence[str | Path], output: str | Path) -> Path:
    """``average_checkpoints(paths)`` written atomically to ``output`` (checked before anything is written)."""
    payload = average_checkpoints(paths)
    save_checkpoint(output, payload)
    return Path(output)
