"""What every checkpoint format shares: the file names of a run directory and the SentencePiece model
stored as a uint8 tensor (so that a checkpoint loads with ``weights_only=True``)."""
from __future__ import annotations

import torch

#: File names inside a run directory (RUN/), read by every command that takes ``--checkpoint RUN``.
BEST, LAST, SHORTLIST = "best.pt", "last.pt", "shortlist.npz"


def bytes_to_tensor(data: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).clone()


def tensor_to_bytes(tensor: torch.Tensor) -> bytes:
    return tensor.numpy().tobytes()
