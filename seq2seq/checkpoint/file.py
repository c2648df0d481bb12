"""Checkpoints: one self-contained file per save, written atomically, loaded without unpickling code.

A checkpoint is a plain dict of tensors, numbers, strings, lists and dicts, so it loads with
``torch.load(..., weights_only=True)``: loading never executes pickled code. It holds

    format_version  int           bumped when the layout changes incompatibly
    config          dict          the full RunConfig (translate.py needs nothing else)
    tokenizer       uint8 tensor  the serialized SentencePiece model
    model           state_dict
    optimizer, scheduler, scaler  state_dicts (training only)
    progress        dict          step, epoch, batch position, best BLEU, elapsed time, ...
    rng             dict          torch / CUDA / numpy / python RNG states

``load_checkpoint`` also reads a directory written by ``seq2seq export --format safetensors``
(config, tokenizer and model only: ``seq2seq.checkpoint.safetensors``).
"""
from __future__ import annotations

import io
import os
import pickle
from pathlib import Path
from typing import Any

import torch

from ..errors import UserError
from ..io_utils import atomic_output
from .parts import BEST, LAST

FORMAT_VERSION = 1


def save_checkpoint(path: str | Path, payload: dict[str, Any]) -> None:
    """Write ``payload`` to ``path`` atomically (temp file in the same directory, then rename).

    The payload is serialized in memory first: torch's zip writer turns a failed write (a full disk)
    into an opaque RuntimeError, while a plain file write raises the ``OSError`` that ``atomic_output``
    reports as "no space left on device writing PATH"."""
    buffer = io.BytesIO()
    torch.save({"format_version": FORMAT_VERSION, **payload}, buffer)
    with atomic_output(path, "wb") as handle:
        handle.write(buffer.getbuffer())


def checkpoint_step(path: str | Path) -> int | None:
    """The training step a checkpoint file holds, read back from the file; None when it is missing or
    cannot be loaded. What a message may call intact is what this reads."""
    if not Path(path).is_file():
        return None
    try:
        return int((load_checkpoint(path).get("progress") or {}).get("step", -1))
    except UserError:
        return None


def holds_checkpoints(run_dir: str | Path) -> bool:
    """Whether a run directory holds any checkpoint (``best.pt``, ``last.pt`` or a kept snapshot):
    something of value that no clean-up may remove."""
    run_dir = Path(run_dir)
    return any((run_dir / name).exists() for name in (BEST, LAST)) or any(run_dir.glob("checkpoints/*.pt"))


def checkpoint_file(path: str | Path) -> Path:
    """What a checkpoint path reads: a run directory's best.pt, else its last.pt; a .pt file or an
    exported safetensors directory as it is."""
    path = Path(path)
    if path.is_dir():
        from .safetensors import is_exported

        if not is_exported(path):
            return path / BEST if (path / BEST).is_file() else path / LAST
    return path


def compile_cache_beside(path: str | Path) -> Path | None:
    """Where a served checkpoint's compiled decoding steps are kept by default (``serve --compile-cache auto``):
    ``compiled/`` in the directory that holds it (the run directory, or an exported model's), created if need
    be; None where that cannot be written (a read-only model directory: the server then compiles at each start)."""
    path = Path(path)
    folder = (path if path.is_dir() else path.parent) / "compiled"
    try:
        folder.mkdir(exist_ok=True)
    except OSError:
        return None
    return folder if os.access(folder, os.W_OK | os.X_OK) else None


#: What every ``--checkpoint`` takes, for the messages that refuse something else.
EXPECTED = ("expected a .pt checkpoint written by seq2seq train, a run directory (its best.pt, else last.pt) "
            "or a model directory written by seq2seq export")
_ZIP_MAGIC = b"PK\x03\x04"  # torch.save writes a zip archive


def _no_checkpoint_in(directory: Path) -> UserError:
    """Why a directory that is neither a run directory with a checkpoint nor an exported model is refused."""
    from .safetensors import WEIGHTS

    looked = f"looked for {directory / BEST} and {directory / LAST}"
    if (directory / "config.yaml").is_file():
        return UserError(f"checkpoint {directory}: the run directory holds no checkpoint yet ({looked}); "
                         "training writes last.pt at its first validation (--eval-every, --eval-every-minutes) "
                         "or save (--save-every, --save-every-minutes) and when it ends, best.pt at its first "
                         "validation")
    return UserError(f"checkpoint {directory}: a directory without a checkpoint ({looked}, and for an exported "
                     f"model {directory / WEIGHTS}); {EXPECTED}")


def _not_a_checkpoint(path: Path, what: str, beside: bool = False) -> UserError:
    """A file that cannot be a checkpoint: ``what`` it is and what was expected; ``beside``: the file is
    no torch file at all, so when it lies in a run directory with a checkpoint (``RUN/spm.model``), that
    run directory is what to pass."""
    hint = ""
    if beside and holds_checkpoints(path.parent):
        hint = f"; to read the checkpoint of the run it lies in, pass the run directory {path.parent}"
    return UserError(f"checkpoint {path}: {what}; {EXPECTED}{hint}")


def _read_payload(path: Path) -> Any:
    """``torch.load`` of ``path`` without unpickling code; a file that is not one torch.save wrote, or that
    holds more than tensors and plain data, is a UserError that says what was expected (never torch's own
    advice to load it with ``weights_only=False``)."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(len(_ZIP_MAGIC))
    except OSError as exc:
        raise UserError(f"checkpoint {path}: cannot be read ({exc.strerror or exc})") from None
    if not head:
        raise _not_a_checkpoint(path, "an empty file (a save that never finished?)")
    if head != _ZIP_MAGIC:
        raise _not_a_checkpoint(path, "not a seq2seq checkpoint (not a file that torch.save writes)", beside=True)
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        raise _not_a_checkpoint(path, "not a seq2seq checkpoint: it holds Python objects besides tensors and "
                                      "plain data, which seq2seq never loads (unpickling them can run code)") from None
    except Exception:
        raise _not_a_checkpoint(path, "cannot be read as a seq2seq checkpoint: truncated or corrupt (a save "
                                      "or copy that did not finish?)") from None


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Load a checkpoint (a .pt file, a run directory: its best.pt, else last.pt, or an exported
    safetensors directory) safely; any problem becomes a UserError naming the file and what was expected."""
    given = Path(path)
    path = checkpoint_file(given)
    if path.is_dir():
        from .safetensors import read_safetensors

        return read_safetensors(path)
    if given.is_dir() and not path.is_file():
        raise _no_checkpoint_in(given)
    if not path.is_file():
        raise UserError(f"checkpoint {path}: no such file; {EXPECTED}")
    payload = _read_payload(path)
    if not isinstance(payload, dict) or "format_version" not in payload:
        raise _not_a_checkpoint(path, "not a seq2seq checkpoint (no format_version: written by another program?)")
    version = payload["format_version"]
    if version != FORMAT_VERSION:
        raise UserError(
            f"checkpoint {path}: format version {version}, this seq2seq reads version "
            f"{FORMAT_VERSION}; use the seq2seq release that wrote it or retrain"
        )
    for key in ("config", "tokenizer", "model"):
        if key not in payload:
            raise UserError(f"checkpoint {path}: missing '{key}'; the file is incomplete")
    return payload
