"""The random generators of a training run, saved in checkpoints and restored on resume, in a
weights_only-loadable form."""
from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch


def rng_state(device: torch.device | str = "cpu") -> dict[str, Any]:
    """Every RNG that influences training on ``device``, in a weights_only-loadable form: the CPU
    generators and, when the rank trains on a GPU, that GPU's generator only (never other GPUs',
    and a CPU run never initialises CUDA)."""
    np_name, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()
    state = {
        "torch": torch.get_rng_state(),
        "numpy": {"keys": torch.from_numpy(np_keys.astype(np.int64)), "pos": int(np_pos),
                  "has_gauss": int(np_has_gauss), "gauss": float(np_gauss)},
        "python": _python_state_to_lists(random.getstate()),
    }
    device = torch.device(device)
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict[str, Any], device: torch.device | str = "cpu") -> None:
    """Restore ``rng_state``'s generators; the GPU one only onto a GPU device. Older checkpoints hold
    a list with every visible GPU's state: the entry of this device is used when there is one."""
    torch.set_rng_state(state["torch"])
    np_state = state["numpy"]
    np.random.set_state(("MT19937", np_state["keys"].numpy().astype(np.uint32), np_state["pos"],
                         np_state["has_gauss"], np_state["gauss"]))
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    device = torch.device(device)
    cuda = state.get("cuda")
    if cuda is None or device.type != "cuda":
        return
    if isinstance(cuda, (list, tuple)):  # format of older checkpoints: all visible GPUs
        index = device.index if device.index is not None else torch.cuda.current_device()
        if index >= len(cuda):
            return  # saved with fewer GPUs: this device keeps its fresh seeded stream
        cuda = cuda[index]
    torch.cuda.set_rng_state(cuda, device)


def _python_state_to_lists(state: tuple) -> list:
    version, internal, gauss = state
    return [version, list(internal), gauss]
