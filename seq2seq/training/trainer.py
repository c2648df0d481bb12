"""The training loop, shared by every architecture.

Adam/AdamW; warmup + inverse-sqrt schedule for the Transformer, plateau decay (on validation loss)
for the RNN, or warmup + linear decay to zero at the end of the budget; label-smoothed cross-entropy
over target tokens, plus optional attention terms: with
``--guided-alignment`` an alignment loss on one layer's cross-attention (``guided.py``), and a
cross-attention entropy penalty (``attention_entropy.py``); gradient clipping and accumulation;
autocast precision; validation loss and BLEU every ``eval.every`` steps and/or every
``eval.every_minutes`` of the run's clock; early stopping on BLEU;
``best.pt`` and ``last.pt`` written atomically (``last.pt`` also every ``checkpoint.save_every`` steps or
``save_every_minutes``, so a killed run loses at most that much); the best / newest snapshots kept in
``RUN/checkpoints/`` for ``seq2seq average`` (``keep_best``, ``keep_last``: ``kept.py``); exact
resume; Ctrl-C leaves a resumable checkpoint.

Resume semantics: ``--resume`` reloads ``last.pt`` of the output directory and continues from the
step after it with the same model, optimizer, schedule, RNG states, epoch and position inside the
epoch, so an interrupted run ends with the same weights as an uninterrupted one. The fields a
resume may change (``config.RESUME_FIELDS``: the stopping limits, the validation rhythm, the device, compile)
come from the config passed to ``train`` (``seq2seq train --resume`` passes the run's own, changed
only by flags given explicitly); everything else comes from the checkpoint. ``max_minutes`` counts
the wall-clock time of all sessions of the run together.

Distributed (``torchrun``, see ``seq2seq.training.distributed``): every rank trains on its own shard of each
epoch's batches, in lockstep; the loss of a step is normalised by its target tokens over all ranks, so
N ranks with ``accumulate`` A compute the same update as one process with accumulate N*A over the
same batches. Rank 0 alone validates (the others wait for its scores), writes checkpoints, logs,
metrics and the summary, and decides ``max_minutes``; every other decision follows from values all
ranks share. ``last.pt`` holds every rank's RNG state (``rng_ranks``), so a resume with the same
number of ranks is exact; with another number, rank 0 takes the saved state, the others reseed
from (seed, rank, step), and the position in the epoch is converted (a few batches may repeat).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import torch

from ..checkpoint.file import checkpoint_step, load_checkpoint, save_checkpoint
from ..checkpoint.parts import bytes_to_tensor
from ..checkpoint.kept import KeptCheckpoints
from ..config import RunConfig
from ..data.batching import Batch
from ..data.prefetch import prefetch
from ..decoding.setup import ModelOrigin
from ..decoding.translator import Translator
from ..errors import OutputError, UserError
from ..metrics import corpus_scores
from ..models import build_model
from ..runtime import (
    JsonlLog,
    autocast,
    log,
    progress_bar,
    resolve_device,
    resolve_precision,
    seed_everything,
    synchronize,
)
from . import decisions, distributed
from .attention_entropy import EntropyPenalty
from .compiled import objective_runner
from .corpus import PreparedCorpus
from .guided import GuidedTraining, SelfGuidance
from .objective import Objective
from .rng import rng_state, set_rng_state
from .optim import OptimizerSettings, build_optimizer, build_scheduler, sequence_loss
from .tensorboard import TensorBoardLog


@dataclass
class Progress:
    """Everything about where a run is, saved in checkpoints."""

    step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0  # batches of the current epoch already consumed
    best_bleu: float = -1.0
    best_step: int = 0
    evals_without_improvement: int = 0
    elapsed: float = 0.0  # seconds, summed over sessions
    train_seconds: float = 0.0  # seconds inside training steps only
    tgt_tokens: int = 0  # over all ranks
    stopped: str = ""
    world_size: int = 1  # processes that trained; batch_in_epoch counts the batches of each


class StepGroup(list):
    """The micro-batches of one optimizer step on this rank, with the step's target tokens over all ranks."""

    def __init__(self, batches: list, tokens: int) -> None:
        super().__init__(batches)
        self.tokens = tokens


class Trainer:
    """Owns the model, optimizer, schedule and progress of one run; ``fit`` runs it."""

    def __init__(self, cfg: RunConfig, corpus: PreparedCorpus, quiet: bool = False) -> None:
        self.cfg = cfg
        self.corpus = corpus
        self.quiet = quiet
        self.device = distributed.local_device(resolve_device(cfg.train.device))
        self.cfg = cfg = cfg.resolved(self.device.type)  # an equal copy of a resolved config (``train`` resolves)
        self.rank, self.world, self.main = distributed.rank(), distributed.world_size(), distributed.is_main()
        self.out = Path(cfg.output_dir)
        self.model = build_model(cfg.model, **cfg.guided.model_options(cfg.model)).to(self.device)
        self.guided = GuidedTraining.for_run(cfg, self.model)  # guided alignment: the supervised attention
        self.self_guidance = SelfGuidance.for_run(cfg, self.guided, corpus.tokenizer)  # its gold from the model
        self._guided_loss = torch.zeros(())  # this rank's guided loss per target token at the last step
        self.entropy_penalty = EntropyPenalty(cfg.train.attention_entropy_weight, cfg.train.attention_entropy_layer,
                                              self.model.attention_layers)
        self.attention_entropy: torch.Tensor | None = None  # of the last step, per target token (this rank)
        self.optimizer = build_optimizer(self.model, OptimizerSettings.of_run(cfg))  # fused on CUDA: no host sync
        self._schedule_clock = 0.0  # rank 0's clock after the last step: what a time budget's schedule reads
        self.scheduler = build_scheduler(self.optimizer, cfg, clock=lambda: self._schedule_clock)
        self.precision = resolve_precision(self.device, cfg.train.precision)  # auto: this hardware's choice
        self.scaler = torch.amp.GradScaler("cuda", enabled=self.precision == "fp16")
        self.progress = Progress(world_size=self.world)
        self.metrics = JsonlLog(self.out / "metrics.jsonl", enabled=self.main)
        if self.world > 1:
            seed_everything(cfg.train.seed + self.rank)  # same initial weights, own dropout noise per rank
        self._rng_at_step = rng_state(self.device)
        self.last_step_skipped = False  # fp16: the gradient scaler skipped the update (overflow)
        self._scale = self.scaler.get_scale()  # the fp16 loss scale after the last step (1.0 when off)
        self._skipped_in_epoch = 0  # fp16 steps of this epoch skipped for overflow
        self._stop_requests = distributed.StopRequests()  # torchrun: signals stop all ranks together
        self.kept = KeptCheckpoints(self.out, cfg.checkpoint.keep_last, cfg.checkpoint.keep_best)
        self.tensorboard = TensorBoardLog(cfg.train.tensorboard, enabled=self.main)
        self._saved_at, self._saved_step = time.time(), -1  # the last write of last.pt
        self._writing: str | None = None  # the checkpoint being written, while it is
        self._validated_step, self._validated_slot = -1, 0  # the step and clock slot of the last validation
        autocast(self.device, self.precision)  # validate --precision early
        self.ddp = distributed.wrap_model(self.model, self.device)  # the model itself in one process
        self.objective = Objective(self.ddp, cfg.optim.label_smoothing, self.guided, self.entropy_penalty,
                                   lambda: autocast(self.device, self.precision))
        self.step_objective = objective_runner(self.objective, cfg.train.compile, self.device, cfg.optim.accumulate,
                                               self.world)

    # ----------------------------------------------------------------- state
    def state(self, rng_ranks: list | None = None) -> dict[str, Any]:
        extra = {"rng_ranks": rng_ranks} if rng_ranks is not None else {}
        return {
            "config": self.cfg.to_dict(),
            "tokenizer": bytes_to_tensor(self.corpus.tokenizer.to_bytes()),
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
            "progress": vars(self.progress).copy(),
            "rng": self._rng_at_step,
            **extra,
        }

    def save(self, name: str, rng_ranks: list | None = None) -> Path | None:
        """Write checkpoint ``name`` on rank 0 (other ranks write nothing and get None)."""
        if not self.main:
            return None
        path = self.out / name
        self._writing = name  # a failure names what survived besides it (``fit``)
        save_checkpoint(path, self.state(rng_ranks))
        self._writing = None
        return path

    def what_survived(self, failed: str | None = None) -> str:
        """"; ..." naming the checkpoints intact after a failed write (of checkpoint ``failed``, or of
        another file), each read back from its file so that a message never promises one that is gone
        or unreadable, and how to go on."""
        steps = {name: checkpoint_step(self.out / name) for name in ("best.pt", "last.pt")}
        intact = [f"{self.out / name} (step {step}) is intact" for name, step in steps.items()
                  if name != failed and step is not None]
        if steps["last.pt"] is not None:
            go_on = f"fix that and continue with seq2seq train --output-dir {self.out} --resume"
        elif steps["best.pt"] is not None:
            go_on = (f"there is no last.pt to resume from: fix that, keep {self.out / 'best.pt'} (translate with it, "
                     "or copy it away) and start the run again with another --output-dir")
        else:
            go_on = "fix that and start the run again"
        return "".join(f"; {s}" for s in intact + [go_on])

    def _save_last(self) -> None:
        """``last.pt`` with every rank's RNG state; all ranks must call this at the same step."""
        self.save("last.pt", distributed.gather(self._rng_at_step))
        self._saved_at, self._saved_step = time.time(), self.progress.step

    def _periodic_save(self, due_by_clock: bool) -> None:
        """``last.pt`` when ``decisions.periodic_save_due`` (rank 0's clock, agreed by all ranks); a snapshot
        too with ``keep_last``."""
        if not decisions.periodic_save_due(self.progress.step, self._saved_step, self.cfg, due_by_clock):
            return
        self._save_last()
        if self.main and self.kept.keep_last:
            self.kept.add(self.state(), self.progress.step, bleu=None)

    def restore(self, path: Path) -> None:
        payload = load_checkpoint(path)
        self.model.load_state_dict(payload["model"])
        self.optimizer.load_state_dict(payload["optimizer"])
        self.scheduler.load_state_dict(payload["scheduler"])
        self.scaler.load_state_dict(payload["scaler"])
        self._scale = self.scaler.get_scale()
        self.progress = Progress(**payload["progress"])
        self.progress.stopped = ""
        self._schedule_clock = self.progress.elapsed
        self._validated_slot = decisions.clock_slot(self.progress.elapsed, self.cfg)
        self._restore_rng(payload)
        self._reshard_position()

    def _restore_rng(self, payload: dict[str, Any]) -> None:
        states = payload.get("rng_ranks")
        if states is not None and len(states) == self.world:
            state = states[self.rank]
        elif self.rank == 0:
            state = payload["rng"]
        else:  # the run had another number of ranks: a fresh, reproducible stream for this rank
            seed_everything(self.cfg.train.seed + self.rank + 1_000_003 * self.progress.step)
            state = rng_state(self.device)
        set_rng_state(state, self.device)
        self._rng_at_step = state

    def _reshard_position(self) -> None:
        """Map the position inside the epoch to this number of ranks (exact when it did not change)."""
        p = self.progress
        if p.world_size != self.world and p.batch_in_epoch:
            converted = p.batch_in_epoch * p.world_size // self.world
            log("resume_ranks_changed", saved_ranks=p.world_size, ranks=self.world,
                batch_in_epoch=f"{p.batch_in_epoch}->{converted}")
            p.batch_in_epoch = converted
        p.world_size = self.world

    # ----------------------------------------------------------------- loop
    def fit(self) -> Progress:
        """Train until a stop. A write the disk refuses (any file: checkpoints, kept snapshots, metrics,
        TensorBoard events) ends the run with that error and what survived it, checked (``what_survived``)."""
        bar = self._progress_bar()
        session_start = time.time() - self.progress.elapsed
        try:
            try:
                with self._stop_requests:
                    self._run_epochs(bar, session_start)
            except KeyboardInterrupt:
                self.progress.stopped = "interrupted"  # checkpoint = state after the last completed step
                log("interrupted", step=self.progress.step, checkpoint=self.out / "last.pt")
            finally:
                bar.close()
            self._final_checkpoints()
        except OutputError as exc:
            raise OutputError(f"{exc}{self.what_survived(self._writing)}") from None
        self.tensorboard.close()
        return self.progress

    def _run_epochs(self, bar, session_start: float) -> None:
        """Epochs until a stop: limits, early stopping, or a stop request agreed by all ranks. A resumed
        run that already reached its step or epoch limit takes no further step."""
        self.progress.stopped = decisions.limit_reached(self.progress, self.cfg)
        while not self.progress.stopped:
            first_step, whole_epoch = self.progress.step, self.progress.batch_in_epoch == 0
            self._skipped_in_epoch = 0
            for group in self._step_groups():
                self._step(group, bar, session_start)
                if self._should_stop():
                    break
            else:
                self._end_epoch(no_step=whole_epoch and self.progress.step == first_step)

    def _step(self, group: StepGroup, bar, session_start: float) -> None:
        t0 = time.time()
        loss, tokens = self.train_step(group)
        p = self.progress
        if decisions.device_read_due(p.step + 1, self.cfg):
            synchronize(self.device)  # the device's backlog counts as training time where throughput is read
        p.train_seconds += time.time() - t0
        p.tgt_tokens += tokens
        p.batch_in_epoch += len(group)
        p.elapsed = time.time() - session_start
        self._rng_at_step = rng_state(self.device)  # what a resume after this step restores
        if self.last_step_skipped:
            self._skipped_in_epoch += 1
            log("skipped", step=p.step + 1, reason="fp16 gradient overflow", scale=self._scale)
            return
        p.step += 1
        self._after_step(loss, tokens, bar)

    def _end_epoch(self, no_step: bool) -> None:
        p, cfg = self.progress, self.cfg
        if no_step and self._skipped_in_epoch:  # every step of the epoch overflowed: would loop forever
            raise UserError(_ALL_SKIPPED.format(epoch=p.epoch, skipped=self._skipped_in_epoch, scale=self._scale))
        if no_step:  # would loop forever
            raise UserError(_NO_STEP.format(epoch=p.epoch, groups=cfg.optim.accumulate))
        p.epoch += 1
        p.batch_in_epoch = 0
        p.stopped = decisions.limit_reached(p, cfg)

    def _final_checkpoints(self) -> None:
        if self.progress.stopped == "interrupted":
            with distributed.ignore_interrupts():
                if self._stop_requests.requested:  # all ranks stopped after the same step (``agree``)
                    self._save_last()
                else:  # KeyboardInterrupt in one process: wherever it struck, no collective
                    self.save("last.pt")
        else:
            if decisions.final_validation_due(self.progress.step, self._validated_step, self.cfg):
                self._evaluate_and_checkpoint()
            self._save_last()
        if self.main and not (self.out / "best.pt").exists():
            self.save("best.pt")

    def _batch_groups(self) -> Iterator[list]:
        """Groups of ``accumulate`` batches from the current epoch, resuming mid-epoch."""
        batches = self.corpus.train_batches(self.progress.epoch, start=self.progress.batch_in_epoch)
        if self.device.type == "cuda":  # collate and pin the next batches while this step runs
            batches = prefetch(batches, Batch.pin_memory)
        group = []
        for batch in batches:
            group.append(batch)
            if len(group) == self.cfg.optim.accumulate:
                yield group
                group = []

    def _step_groups(self) -> Iterator[StepGroup]:
        """``_batch_groups`` with each step's target tokens over all ranks; all ranks stop together."""
        count = lambda group: sum(b.num_tgt_tokens for b in group)  # noqa: E731
        for group, tokens in distributed.lockstep(self._batch_groups(), count):
            yield StepGroup(group, tokens)

    def train_step(self, group: StepGroup | list) -> tuple[torch.Tensor, int]:
        """One optimizer update from ``group`` micro-batches; returns (loss, tokens).

        Each rank backpropagates sum(loss) / (tokens / world); DDP averages gradients over the world
        ranks, giving sum over all ranks' batches of loss / tokens, as one process would compute.
        ``tokens`` counts all ranks (``StepGroup.tokens``; a plain list counts its own batches).
        ``loss`` is this rank's summed loss / ``tokens``, a 0-dim tensor left on the device: reading
        it waits for the device, so the loop reads it (and sums it over ranks) on log steps only.
        """
        self.model.train()
        total_tokens = group.tokens if isinstance(group, StepGroup) else sum(b.num_tgt_tokens for b in group)
        normaliser = total_tokens / self.world
        total_loss, total_guided = torch.zeros((), device=self.device), torch.zeros((), device=self.device)
        total_entropy = torch.zeros((), device=self.device)
        for i, batch in enumerate(group):
            batch = batch.to(self.device)
            guide = batch.guide if self.self_guidance is None else \
                self.self_guidance.gold(self.model, batch, self.progress.step)
            with distributed.no_sync(self.ddp, sync=i == len(group) - 1):
                terms = self.step_objective(batch.src, batch.src_mask, batch.tgt_in, batch.tgt_out, guide,
                                            batch.src_lengths)
                self.scaler.scale(terms.objective / normaliser).backward()
            total_loss += terms.cross_entropy
            total_guided += terms.guided
            total_entropy += terms.entropy
        self.attention_entropy = total_entropy / max(total_tokens, 1) if self.entropy_penalty.active else None
        self.scaler.unscale_(self.optimizer)
        if self.cfg.optim.clip_norm > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.optim.clip_norm)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        # fp16: an overflow makes the scaler skip optimizer.step() and lower its scale; such a step
        # is no update, so neither the schedule nor the step counter (``_step``) advances. Reading the
        # new scale is the one host sync fp16 adds per step (the counter must know; the fused
        # optimizer reads the overflow flag on the device); bf16/fp32: none.
        self.last_step_skipped = False
        if self.scaler.is_enabled():
            scale = self.scaler.get_scale()
            self.last_step_skipped, self._scale = scale < self._scale, scale
        if not self.last_step_skipped and not isinstance(self.scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
            self.scheduler.step()
        self._guided_loss = total_guided / max(total_tokens, 1)
        return total_loss / max(total_tokens, 1), total_tokens

    def _after_step(self, rank_loss: torch.Tensor, tokens: int, bar) -> None:
        p, cfg = self.progress, self.cfg
        lr = self.optimizer.param_groups[0]["lr"]
        bar.update(1)
        if decisions.log_due(p.step, cfg):  # the only place the loop waits for the device's loss
            # each read waits for the device: only the terms this run has (guided: unweighted; entropy: nats)
            named = (("guided_loss", self._guided_loss if self.guided else None),
                     ("attention_entropy", self.attention_entropy))
            terms = {name: value for name, value in named if value is not None}
            loss, *values = distributed.all_reduce_sum([float(rank_loss)] + [float(v) for v in terms.values()])
            extra = dict(zip(terms, values))  # per target token
            tok_s = p.tgt_tokens / max(p.train_seconds, 1e-9)
            bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{tok_s:.0f}")
            self.tensorboard.scalars("train", {"loss": loss, **extra, "lr": lr, "tokens_per_s": tok_s}, p.step)
            self.metrics.write({"kind": "train", "step": p.step, "epoch": p.epoch, "loss": loss, **extra, "lr": lr,
                                "tokens_per_s": tok_s, "elapsed": p.elapsed})
            if self.quiet:
                log("train", step=p.step, epoch=p.epoch, loss=loss, **extra, lr=lr, tok_s=round(tok_s))
        if decisions.validation_due_by_step(p.step, cfg):
            self._evaluate_and_checkpoint()

    def _should_stop(self) -> bool:
        p, cfg = self.progress, self.cfg
        # rank 0's clock decides the time limits and the schedule's budget; a stop request on any rank stops
        # all (StopRequests)
        (out_of_time, interrupted, save_due, eval_due), self._schedule_clock = distributed.agree(
            [self.main and decisions.out_of_time(p.elapsed, cfg), self._stop_requests.requested,
             self.main and decisions.save_due_by_clock(time.time() - self._saved_at, cfg),
             self.main and decisions.validation_due_by_clock(p.elapsed, cfg, self._validated_slot)], p.elapsed)
        p.stopped = decisions.stop_reason(p, cfg, out_of_time, interrupted)
        if interrupted:
            self._stop_requests.requested = True
            log("interrupted", step=p.step, checkpoint=self.out / "last.pt")
        if not p.stopped and eval_due and p.step != self._validated_step:  # a stopping run validates anyway
            self._evaluate_and_checkpoint()
        if not p.stopped:  # a stopping run writes last.pt anyway
            self._periodic_save(save_due)
        return bool(p.stopped)

    # ----------------------------------------------------------------- evaluation
    def _evaluate_and_checkpoint(self) -> None:
        p = self.progress
        self._validated_step, self._validated_slot = p.step, decisions.clock_slot(p.elapsed, self.cfg)
        scores = distributed.broadcast(self.validate() if self.main else None)  # the others wait
        if isinstance(self.scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
            self.scheduler.step(scores["loss"])
        improved = decisions.record_validation(p, scores["bleu"])
        self.metrics.write({"kind": "valid", "step": p.step, "epoch": p.epoch, "elapsed": p.elapsed,
                            "train_seconds": p.train_seconds, **scores})
        log("valid", step=p.step, loss=scores["loss"], ppl=scores["ppl"], bleu=scores["bleu"],
            best_bleu=p.best_bleu, elapsed_s=round(p.elapsed))
        self.tensorboard.scalars("valid", scores, p.step)
        if improved:
            self.save("best.pt")
        self._save_last()
        if self.main and self.kept.enabled:
            self.kept.add(self.state(), p.step, bleu=scores["bleu"])

    def translator(self) -> Translator:
        """The model being trained as a ``Translator`` that knows its run's supervised heads (``ModelOrigin``)."""
        return Translator(self.model, self.corpus.tokenizer, origin=ModelOrigin.of_run(self.cfg))

    @torch.inference_mode()
    def validate(self) -> dict[str, float]:
        """Teacher-forced loss/perplexity and BLEU of greedy (or ``eval.beam_size``) decoding."""
        self.model.eval()
        loss_sum, tokens = torch.zeros((), device=self.device), 0
        for batch in self.corpus.eval_batches("validation"):
            batch = batch.to(self.device)
            with autocast(self.device, self.precision):
                logits, _ = self.model(batch.src, batch.src_mask, batch.tgt_in)
            loss_sum += sequence_loss(logits, batch.tgt_out)
            tokens += batch.num_tgt_tokens
        sources, references = self.corpus.texts("validation", self.cfg.eval.max_sentences)
        translator = self.translator()  # decodes in IEEE fp32, leaves --tf32
        hyps = translator.translate(sources, beam_size=self.cfg.eval.beam_size, need_attention=False)
        scores = corpus_scores([h.text for h in hyps], references, ("bleu", "chrf"))
        if self.tensorboard.writer is not None:  # the same few sentences at every validation
            self.tensorboard.attention(translator.translate(sources[: self.tensorboard.sentences], beam_size=1),
                                       self.progress.step)
        loss = float(loss_sum) / max(tokens, 1)
        return {"loss": loss, "ppl": math.exp(min(loss, 50)), "bleu": scores["bleu"].score,
                "chrf": scores["chrf"].score}

    def _progress_bar(self):
        total = self.cfg.train.max_steps or None
        return progress_bar(total=total, initial=self.progress.step, desc="train", unit="step",
                            disable=self.quiet or not self.main, dynamic_ncols=True, leave=False)


_ALL_SKIPPED = ("epoch {epoch} gave no training step: fp16 gradients overflowed at every step ({skipped} "
                "steps skipped, the loss scale fell to {scale:g}); train with --precision bf16 (or fp32) or "
                "a lower --lr")
_NO_STEP = ("epoch {epoch} gave no training step: the training data makes fewer batches than "
            "--accumulate ({groups}) times the number of processes; use more data, a smaller "
            "--max-tokens or a smaller --accumulate")

