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
from typing import Any

from ..errors import UserError
from ..io_utils import atomic_output, display_path
from .file import save_checkpoint

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
