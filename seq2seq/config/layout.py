"""The layout of a config before its sections were grouped by concern (issue 67), and the one function that reads it
into today's: every option of a run under ``train`` (``train.lr``, ``train.eval_every``, ``train.guided_layer``) and
guided alignment switched on by ``data.guided_alignment``. Every config.yaml, ``--print-config`` and checkpoint
written before is in that layout; ``migrated`` is applied wherever a config dict is read (``RunConfig.from_dict``:
checkpoints, ``--resume``; ``RunConfig.from_layers``: config files, presets, Python arguments), silently: the
project wrote those files itself."""
from __future__ import annotations

from typing import Any

from ..errors import UserError

#: (section, key) of the old layout -> (section, key) today. Keys not listed kept their place.
MOVED: dict[tuple[str, str], tuple[str, str]] = {
    ("data", "guided_alignment"): ("guided", "links"),
    ("train", "guided_alignment_weight"): ("guided", "weight"),
    ("train", "guided_layer"): ("guided", "layer"),
    ("train", "guided_heads"): ("guided", "heads"),
    ("train", "full_context_alignment"): ("guided", "full_context"),
    ("train", "guided_unaligned"): ("guided", "unaligned"),
    ("train", "self_guidance_warmup"): ("guided", "self_warmup"),
    ("train", "optimizer"): ("optim", "kind"),
    **{("train", key): ("optim", key) for key in ("lr", "weight_decay", "betas", "clip_norm", "accumulate",
                                                  "label_smoothing")},
    ("train", "schedule"): ("schedule", "kind"),
    **{("train", key): ("schedule", key) for key in ("warmup_steps", "plateau_patience", "plateau_factor")},
    ("train", "eval_every"): ("eval", "every"),
    ("train", "eval_every_minutes"): ("eval", "every_minutes"),
    ("train", "eval_beam_size"): ("eval", "beam_size"),
    ("train", "eval_max_sentences"): ("eval", "max_sentences"),
    ("train", "patience"): ("eval", "patience"),
    **{("train", key): ("checkpoint", key) for key in ("save_every", "save_every_minutes", "keep_best", "keep_last")},
}


def migrated(raw: Any, source: str) -> Any:
    """``raw`` (a config dict: a file's, a checkpoint's, a layer of flags or Python arguments) with every key of the
    old layout moved to its section today (``MOVED``); a dict already in today's layout comes back equal. A key given
    in both places with different values is a UserError naming ``source`` and both keys. Whatever is not a dict of
    sections is returned as it is, for reading it to name the error."""
    if not isinstance(raw, dict) or not any(isinstance(raw.get(old), dict) and key in raw[old] for old, key in MOVED):
        return raw
    out = {name: dict(value) if isinstance(value, dict) else value for name, value in raw.items()}
    for (old, key), (section, new) in MOVED.items():
        if not isinstance(out.get(old), dict) or key not in out[old]:
            continue
        target = out.setdefault(section, {})
        if target is None:  # an empty section in YAML (``optim:``)
            target = out[section] = {}
        if not isinstance(target, dict):
            continue  # reading the config names the section that is not a mapping
        value = out[old].pop(key)
        if new in target and target[new] != value:
            raise UserError(f"{source}: {old}.{key} ({value!r}) and {section}.{new} ({target[new]!r}) are one option, "
                            f"{old}.{key} its place in configs written before the sections; give {section}.{new} "
                            "only")
        target[new] = value
    return out


def moved_hint(key: str) -> str:
    """For an unknown ``key`` in a section: where the old layout's option of that name lives now (``eval:
    {eval_every: 5}`` -> `` (train.eval_every is eval.every now)``), or ""."""
    for (old, old_key), (section, new) in MOVED.items():
        if old_key == key:
            return f" ({old}.{key} is {section}.{new} now)"
    return ""
