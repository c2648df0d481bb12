"""The sections of a training run, by concern, as fairseq's dataclass configs and OpenNMT-py's option groups divide
them: ``TrainConfig`` (``train``: the run itself: seed, device, budget, logging, the attention-entropy term),
``OptimConfig`` (``optim``: the optimizer and what shapes each update), ``ScheduleConfig`` (``schedule``: the
learning rate over time), ``EvalConfig`` (``eval``: validation and early stopping) and ``CheckpointConfig``
(``checkpoint``: what is written besides validation's checkpoints). The flags keep their names (``--lr``,
``--eval-every``, ``--schedule``: ``option(..., flag=...)`` where a field's name reads shorter inside its section);
a config written before the sections existed (every option under ``train``) is read into them
(``layout.migrated``)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import NonNegativeFloat, NonNegativeInt

from .fields import STRICT, Device, option


@dataclass
class TrainConfig:
    """The run: its seed, where and how it computes, how long it trains, what it logs, the attention term."""

    __pydantic_config__ = STRICT

    seed: int = option(1, "random seed (same seed and data = same run on CPU)")
    init_from: str = option("", "fine-tune: start from this trained run (its best.pt) or checkpoint: its weights, "
                                "tokenizer and model config; the data, optimizer, schedule and budget are this run's")
    device: Device = option("auto", "where to train: auto (CUDA when present), cpu, cuda or cuda:N")
    tf32: bool | None = option(None, "CUDA: TF32 matmuls and cuDNN on Ampere or newer (faster fp32, ~1e-3 relative "
                                     "error); unset: on when training on CUDA")
    precision: Literal["fp32", "bf16", "fp16", "auto"] | None = option(
        None, "autocast precision (fp16: CUDA only; auto: bf16 where the hardware runs it natively, else fp32); "
              "unset: auto on CUDA, fp32 on CPU")
    attention_entropy_weight: NonNegativeFloat = option(
        0.0, "add this weight x the mean entropy of the cross-attention distributions (nats per target token) "
             "to the loss: > 0 sharpens attention (0 = off)")
    attention_entropy_layer: int | Literal["all"] = option(
        -2, "decoder layer whose cross-attention (mean over its heads) the entropy penalty reads: index (negative "
            "counts from the top; -2, the penultimate, is the layer alignments are read from, and an RNN's or a "
            "one-layer model's only layer) or 'all'")
    max_steps: int = option(0, "stop after this many optimizer steps (0 = no limit)")
    max_epochs: int = option(0, "stop after this many epochs (0 = no limit)")
    max_minutes: float = option(0.0, "wall-clock training budget in minutes (0 = no limit)")
    log_every: int = option(50, "log a training line every N steps")
    tensorboard: str | None = option(None, "write TensorBoard logs (scalars, attention heatmaps) to this directory")
    compile: bool | None = option(
        None, "compile the training step (forward, loss, backward: torch.compile; on CUDA its CUDA graphs, one per "
              "batch shape, see --fixed-shapes); slow to start on CPU; unset: on for a Transformer on CUDA")
    threads: int = option(0, "CPU threads (0 = PyTorch's default)")


@dataclass
class OptimConfig:
    """The optimizer and what shapes each update: learning rate, betas, decay, clipping, accumulation, smoothing."""

    __pydantic_config__ = STRICT

    kind: Literal["adam", "adamw"] = option("adamw", "optimizer", flag="optimizer")
    lr: float = option(1e-3, "peak learning rate")
    weight_decay: float = option(0.0, "AdamW weight decay")
    betas: tuple[float, float] | None = option(None, "Adam betas B1 B2")
    clip_norm: float | None = option(None, "gradient norm clipping (0 = off)")
    accumulate: int = option(1, "micro-batches per optimizer step (gradient accumulation)")
    label_smoothing: float = option(0.1, "label smoothing epsilon")


@dataclass
class ScheduleConfig:
    """The learning rate over the run: warmup, then inverse square root, linear decay, plateau decay or constant."""

    __pydantic_config__ = STRICT

    kind: Literal["auto", "inverse-sqrt", "linear", "plateau", "constant"] | None = option(
        None, "learning-rate schedule (auto: the architecture's; linear: warmup, then down to 0 at the end of "
              "--max-steps / --max-minutes)", flag="schedule")
    warmup_steps: int | None = option(None, "inverse-sqrt and linear: steps of linear warmup")
    plateau_patience: int = option(2, "plateau: evaluations without validation-loss improvement before decay")
    plateau_factor: float = option(0.5, "plateau: learning-rate factor at each decay")


@dataclass
class EvalConfig:
    """Validation (loss and BLEU on the validation split, a checkpoint each time) and early stopping."""

    __pydantic_config__ = STRICT

    every: int = option(500, "validate (loss + BLEU) and checkpoint every N steps (0 = off)", flag="eval-every")
    every_minutes: NonNegativeFloat = option(
        0.0, "also validate and checkpoint every N minutes of the run's wall-clock, on a fixed grid (0 = off)",
        flag="eval-every-minutes")
    beam_size: int = option(1, "beam size of validation BLEU (1 = greedy)", flag="eval-beam-size")
    max_sentences: int = option(0, "validate on at most this many sentences (0 = all)", flag="eval-max-sentences")
    patience: int = option(0, "early stopping: evaluations without BLEU improvement (0 = off)")


@dataclass
class CheckpointConfig:
    """What the run writes besides validation's checkpoints: periodic ``last.pt``, kept best and newest snapshots."""

    __pydantic_config__ = STRICT

    save_every: NonNegativeInt = option(0, "also write last.pt every N steps, independent of validation (0 = off)")
    save_every_minutes: NonNegativeFloat = option(0.0, "also write last.pt every N minutes of training (0 = off)")
    keep_best: NonNegativeInt = option(
        0, "keep the N best checkpoints by validation BLEU in RUN/checkpoints/ (for seq2seq average)")
    keep_last: NonNegativeInt = option(0, "keep the N newest validation / periodic checkpoints in RUN/checkpoints/")
