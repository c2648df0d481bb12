"""What every config section is made of: ``option`` (a field with its help text, from which the flag is
generated; ``flag_of``) and the strictness shared by the sections read from files."""
from __future__ import annotations

import copy
import dataclasses
from dataclasses import field
from typing import Annotated, Any

from pydantic import ConfigDict, StringConstraints

STRICT = ConfigDict(extra="forbid")  # unknown keys are errors
Device = Annotated[str, StringConstraints(pattern=r"^(auto|cpu|cuda(:\d+)?)$")]  # auto, cpu, cuda, cuda:N


def option(default: Any, help: str, **kwargs: Any) -> Any:
    """A config field with its help text (shown by ``--help``; the flag is generated from the name, or named by
    ``flag``: ``option(-2, "...", flag="guided-layer")`` is ``--guided-layer`` for the ``guided`` section's
    ``layer``); ``lone_help``: the text for a command that offers only some of the section's flags (``{field}``:
    that field's default), where ``help`` names a flag such a command may not have."""
    factory = kwargs.pop("default_factory", None)
    metadata = {"help": help, **kwargs}
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


def flag_of(cls: type, name: str) -> str:
    """The command-line flag of field ``name`` of section ``cls``: ``--`` and its ``flag``, or its name with dashes
    (``max_tokens`` -> ``--max-tokens``)."""
    found = next(f for f in dataclasses.fields(cls) if f.name == name)
    return "--" + found.metadata.get("flag", name.replace("_", "-"))


def field_default(f: dataclasses.Field) -> Any:
    """A field's default, made by its ``default_factory`` where it has one."""
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def fill_defaults(section: Any, defaults: dict[str, Any], arch: str) -> Any:
    """A copy of a config section with its None fields set from ``defaults`` (a value, or a dict of
    values by architecture)."""
    missing = {key: copy.copy(value[arch] if isinstance(value, dict) else value) for key, value in defaults.items()
               if getattr(section, key) is None}
    return dataclasses.replace(section, **missing)
