"""A slim, pickle-free model directory: what translating needs and nothing else.

    OUT/model.safetensors   the weights (safetensors: no code runs when they load), fp32 as trained
    OUT/config.json         the run's full config (the same keys as config.yaml)
    OUT/spm.model           the SentencePiece model
    OUT/shortlist.npz       the run's lexical shortlist, when the run has one

No optimizer, scheduler or RNG state. A tied weight (the output layer sharing the target
embedding, a shared source embedding) is stored once: safetensors refuses aliased tensors, so the
file's metadata lists each alias and the reader restores it. ``load_checkpoint`` (and therefore
``Translator.from_checkpoint`` and every ``--checkpoint`` flag) reads such a directory like a
training checkpoint.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch

from ..errors import UserError
from ..io_utils import atomic_output, current_umask
from .parts import SHORTLIST, bytes_to_tensor, tensor_to_bytes

WEIGHTS, CONFIG, TOKENIZER = "model.safetensors", "config.json", "spm.model"
FORMAT, FORMAT_VERSION = "seq2seq-safetensors", 1


def is_exported(path: str | Path) -> bool:
    """Whether ``path`` is a directory written by ``write_safetensors``."""
    return (Path(path) / WEIGHTS).is_file()


def split_aliases(state: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """The state without aliased entries, and {alias: name kept} for each entry that shares its
    storage, shape and strides with an earlier one (tied embeddings)."""
    unique: dict[str, torch.Tensor] = {}
    seen: dict[tuple, str] = {}
    aliases: dict[str, str] = {}
    for name, tensor in state.items():
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape),
               tuple(tensor.stride()), tensor.dtype)
        if key in seen:
            aliases[name] = seen[key]
        else:
            seen[key] = name
            unique[name] = tensor.contiguous()
    return unique, aliases


def write_safetensors(payload: dict[str, Any], out: Path, shortlist: Path | None = None) -> None:
    """Write the exported files of a loaded checkpoint ``payload`` into the directory ``out``."""
    from safetensors.torch import save_file

    weights, aliases = split_aliases(payload["model"])
    progress = payload.get("progress") or {}
    metadata = {"format": FORMAT, "format_version": str(FORMAT_VERSION), "aliases": json.dumps(aliases),
                "step": str(progress.get("step", "")), "best_bleu": str(progress.get("best_bleu", ""))}
    save_file(weights, str(out / WEIGHTS), metadata=metadata)
    (out / WEIGHTS).chmod(0o666 & ~current_umask())  # safetensors creates it private (0600)
    with atomic_output(out / CONFIG) as handle:
        json.dump(payload["config"], handle, indent=2, sort_keys=True)
        handle.write("\n")
    (out / TOKENIZER).write_bytes(tensor_to_bytes(payload["tokenizer"]))
    if shortlist is not None and shortlist.is_file():
        shutil.copyfile(shortlist, out / SHORTLIST)


def read_safetensors(path: str | Path) -> dict[str, Any]:
    """A checkpoint-shaped payload (config, tokenizer, model) from an exported directory; any
    problem is a UserError naming the file."""
    from safetensors import safe_open

    path = Path(path)
    for name in (WEIGHTS, CONFIG, TOKENIZER):
        if not (path / name).is_file():
            raise UserError(f"exported model {path}: {name} is missing; re-run seq2seq export --format safetensors")
    weights_file = path / WEIGHTS
    try:
        with safe_open(str(weights_file), framework="pt") as handle:
            metadata = handle.metadata() or {}
            state = {name: handle.get_tensor(name) for name in handle.keys()}
    except Exception as exc:
        reason = str(exc).splitlines()[0][:200] if str(exc) else ""
        raise UserError(f"exported model {weights_file}: cannot be read as safetensors ({type(exc).__name__}: "
                        f"{reason}); it may be truncated or corrupt") from None
    if metadata.get("format") != FORMAT:
        raise UserError(f"exported model {weights_file}: not written by seq2seq export (metadata format "
                        f"{metadata.get('format')!r})")
    if metadata.get("format_version") != str(FORMAT_VERSION):
        raise UserError(f"exported model {weights_file}: format version {metadata.get('format_version')}, this "
                        f"seq2seq reads version {FORMAT_VERSION}; use the seq2seq release that wrote it")
    for alias, name in json.loads(metadata.get("aliases", "{}")).items():
        state[alias] = state[name]  # tied weights are one tensor again, as in the trained model
    try:
        config = json.loads((path / CONFIG).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UserError(f"exported model {path / CONFIG}: not valid JSON ({exc})") from None
    return {"config": config, "tokenizer": bytes_to_tensor((path / TOKENIZER).read_bytes()), "model": state}
