"""A checkpoint read once: payload -> config + tokenizer + model, the one place that does it (the
Translator, export, ``seq2seq shortlist``, ``seq2seq compare`` and a resumed run all read it here)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..config import RunConfig
from ..errors import UserError
from ..models import build_model
from ..models.base import EncoderDecoder
from ..tokenizer import Tokenizer
from .file import load_checkpoint
from .parts import tensor_to_bytes


@dataclass
class LoadedCheckpoint:
    """``path``'s payload (``load_checkpoint``), with its config checked and its tokenizer loaded."""

    path: Path
    payload: dict[str, Any]
    config: RunConfig
    tokenizer: Tokenizer

    @classmethod
    def read(cls, path: str | Path) -> "LoadedCheckpoint":
        """A .pt file, a run directory (its best.pt, else last.pt) or an exported directory."""
        return cls.from_payload(path, load_checkpoint(path))

    @classmethod
    def from_payload(cls, path: str | Path, payload: dict[str, Any], source: str | None = None) -> "LoadedCheckpoint":
        """An already loaded payload; errors name ``source`` (default: "checkpoint PATH")."""
        source = source or f"checkpoint {path}"
        config = RunConfig.from_dict(payload["config"], source=source)
        try:
            tokenizer = Tokenizer.from_bytes(tensor_to_bytes(payload["tokenizer"]))
        except (UserError, AttributeError, TypeError) as exc:  # not the uint8 tensor seq2seq train stores
            raise UserError(f"{source}: its 'tokenizer' is not a SentencePiece model ({exc}); the file is not a "
                            "checkpoint written by seq2seq train, or it is damaged") from None
        return cls(Path(path), payload, config, tokenizer)

    def build_model(self) -> EncoderDecoder:
        """The model the config describes, with the checkpoint's weights (fp32, on the CPU)."""
        model = build_model(self.config.model, **self.config.guided.model_options(self.config.model))
        try:
            model.load_state_dict(self.payload["model"])
        except RuntimeError as exc:
            raise UserError(
                f"checkpoint {self.path}: weights do not fit the model its config describes "
                f"({str(exc).splitlines()[0][:200]}); was it written by another version?"
            ) from None
        return model
