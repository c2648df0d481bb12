"""What every config section is made of: ``option`` (a field with its help text, from which the flag is
generated) and the strictness shared by the sections read from files."""
from __future__ import annotations

from dataclasses import field
from typing import Annotated, Any

from pydantic import ConfigDict, StringConstraints

STRICT = ConfigDict(extra="forbid")  # unknown keys are errors
Device = Annotated[str, StringConstraints(pattern=r"^(auto|cpu|cuda(:\d+)?)$")]  # auto, cpu, cuda, cuda:N


def option(default: Any, help: str, **kwargs: Any) -> Any:
    """A config field with its help text (shown by ``--help``; the flag is generated from the name)."""
    factory = kwargs.pop("default_factory", None)
    metadata = {"help": help, **kwargs}
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)
