"""The compiled training step (``--compile``): the batch's objective (``objective.py``: forward, every
loss term, and through AOTAutograd its backward) compiled whole by ``torch.compile``.

On CUDA, with one process and no gradient accumulation, it runs in ``mode="reduce-overhead"``: each
batch shape's forward and backward are captured as CUDA graphs and replayed, so a step costs a few
launches instead of hundreds (a small model at GPU batch sizes is bound by kernel launches, not
arithmetic). Shapes are dynamic (one compilation serves every shape) and ``--fixed-shapes`` (on with
``--compile`` unless set) keeps their number to a dozen, so the graphs are recorded once each and
replayed for the rest of the run. With ``accumulate`` > 1 (the gradients of one replay must survive
the next) or several processes (DDP's hooks run between the graphs) it compiles without graphs. The
fused AdamW update (``optim.build_optimizer``) is left outside: it is one multi-tensor kernel per
parameter group, and keeping it out leaves the schedule a plain float. On a CPU it compiles through
Inductor's C++ backend (minutes at the first shapes; it needs a C++ compiler).
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from ..errors import UserError
from ..runtime import log
from .objective import LossTerms, Objective

#: The ``torch.compile`` backend (tests use "aot_eager": the same tracing and autograd, no code generation).
BACKEND = "inductor"


def graphs_apply(device: torch.device, accumulate: int, world_size: int) -> bool:
    """Whether the compiled step captures CUDA graphs (see the module docstring)."""
    return device.type == "cuda" and accumulate == 1 and world_size == 1


class CompiledObjective:
    """``objective`` compiled; called like it. Compilation happens at the first steps; a failure
    there (e.g. no C++ compiler for the CPU backend) becomes a UserError naming ``--compile``."""

    def __init__(self, objective: Objective, graphs: bool) -> None:
        self.graphs = graphs
        mode = "reduce-overhead" if graphs and BACKEND == "inductor" else None
        self._compiled = torch.compile(objective.__call__, backend=BACKEND, mode=mode, dynamic=True)
        log("compile", mode=mode or "default", cuda_graphs=graphs, backend=BACKEND)

    def __call__(self, *args: Any) -> LossTerms:
        from torch._dynamo.exc import TorchDynamoException

        if self.graphs:  # a new training step: the previous step's graph outputs are consumed
            torch.compiler.cudagraph_mark_step_begin()
        try:
            # Without duck sizing, equal sizes of different dimensions (a batch as long as it is
            # wide) are not assumed equal ever after: one graph, not a recompile at the next step.
            with torch.fx.experimental._config.patch(use_duck_shape=False):
                return self._compiled(*args)
        except TorchDynamoException as exc:
            reason = (str(exc).strip().splitlines() or [""])[0][:300]
            raise UserError(f"--compile: torch.compile failed ({type(exc).__name__}: {reason}); "
                            "train without --compile") from exc


def objective_runner(objective: Objective, compile: bool, device: torch.device, accumulate: int,
                     world_size: int) -> Callable[..., LossTerms]:
    """What the trainer calls per micro-batch: ``objective`` itself, or compiled with ``compile``."""
    if not compile:
        return objective
    return CompiledObjective(objective, graphs_apply(device, accumulate, world_size))
