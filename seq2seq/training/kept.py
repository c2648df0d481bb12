"""Checkpoints kept beside ``best.pt`` and ``last.pt`` (``--keep-best N``, ``--keep-last N``), and
their average (``seq2seq average``).

A run that keeps checkpoints writes weights-only snapshots (config, tokenizer, model, progress: what
``seq2seq translate`` reads, without optimizer or RNG state) to ``RUN/checkpoints/step-NNNNNNN.pt``
at every validation and, with ``--keep-last``, at every periodic save (``--save-every``), and lists
them in ``RUN/checkpoints/index.json`` as ``{"file", "step", "bleu"}`` (``bleu`` null for a save
without validation). A snapshot stays while it is among the ``keep_last`` newest or among the
``keep_best`` best by validation BLEU; the others are deleted.

Averaging (Vaswani et al. 2017 averaged the last checkpoints; Junczys-Dowmunt et al. 2016 the best):
theta = (1/N) sum_i theta_i for every floating-point weight, computed in fp32 and stored in the
checkpoints' dtype. All checkpoints must describe the same model (architecture and sizes) and the
same tokenizer; anything else is an error naming the two files that differ.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

import torch

from ..errors import UserError
from ..io_utils import atomic_output, display_path
from .checkpoint import load_checkpoint, save_checkpoint

KEPT_DIR = "checkpoints"
INDEX = "index.json"
WEIGHTS_ONLY = ("config", "tokenizer", "model", "progress")


class KeptCheckpoints:
    """``RUN/checkpoints/``: snapshots and their index, pruned to the newest and the best."""

    def __init__(self, run_dir: str | Path, keep_last: int = 0, keep_best: int = 0) -> None:
        if keep_last < 0 or keep_best < 0:
            raise UserError(f"--keep-last and --keep-best must be >= 0, got {keep_last} and {keep_best}")
        self.dir = Path(run_dir) / KEPT_DIR
        self.keep_last, self.keep_best = keep_last, keep_best

    @property
    def enabled(self) -> bool:
        return bool(self.keep_last or self.keep_best)

    def entries(self) -> list[dict[str, Any]]:
        """The index, oldest first; an absent directory has none."""
        path = self.dir / INDEX
        if not path.is_file():
            return []
        try:
            entries = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise UserError(f"{display_path(path)}: unreadable checkpoint index ({exc})") from None
        return sorted(entries, key=lambda e: e["step"])

    def add(self, payload: dict[str, Any], step: int, bleu: float | None) -> None:
        """Snapshot ``payload``'s weights at ``step`` (with its validation BLEU, if any), then prune.
        A second snapshot of the same step (validation and periodic save together) keeps one file and
        the BLEU."""
        self.dir.mkdir(parents=True, exist_ok=True)
        name = f"step-{step:07d}.pt"
        existing = self.entries()
        previous = next((e for e in existing if e["step"] == step), None)
        entries = [e for e in existing if e["step"] != step]
        if bleu is None and previous is not None:
            bleu = previous["bleu"]
        save_checkpoint(self.dir / name, {key: payload[key] for key in WEIGHTS_ONLY})
        entries.append({"file": name, "step": step, "bleu": bleu})
        self._write(self._prune(entries))

    def _prune(self, entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
        newest = {e["step"] for e in sorted(entries, key=lambda e: -e["step"])[: self.keep_last]}
        scored = [e for e in entries if e["bleu"] is not None]
        best = {e["step"] for e in sorted(scored, key=lambda e: (-e["bleu"], -e["step"]))[: self.keep_best]}
        kept = [e for e in entries if e["step"] in newest | best]
        for entry in entries:
            if entry not in kept:
                (self.dir / entry["file"]).unlink(missing_ok=True)
        return sorted(kept, key=lambda e: e["step"])

    def _write(self, entries: list[dict[str, Any]]) -> None:
        with atomic_output(self.dir / INDEX) as handle:
            json.dump(entries, handle, indent=1)

    def select(self, kind: str, count: int) -> list[Path]:
        """The ``count`` newest (``last``) or best by validation BLEU (``best``) snapshots."""
        entries = self.entries()
        if kind == "best":
            entries = sorted((e for e in entries if e["bleu"] is not None), key=lambda e: (-e["bleu"], -e["step"]))
        else:
            entries = entries[::-1]
        chosen = entries[:count]
        if len(chosen) < count:
            raise UserError(f"{display_path(self.dir)} holds {len(chosen)} {kind} checkpoint(s), {count} asked; "
                            f"train with --keep-{kind} {count} (or more) to keep them")
        return [self.dir / e["file"] for e in chosen]


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
