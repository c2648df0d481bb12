"""``train()``: a training run and its directory (config.yaml, shortlist, summary.json, the final test),
around the loop of ``trainer.py``. See ``trainer.py`` for the resume semantics."""
from __future__ import annotations

import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..checkpoint.file import holds_checkpoints, load_checkpoint
from ..checkpoint.loaded import LoadedCheckpoint
from ..config import RESUME_FIELDS, RunConfig
from ..decoding.translation import EmptyOutputs
from ..errors import OutputError, UserError
from ..io_utils import make_directory
from ..metrics import corpus_scores
from ..tokenizer import Tokenizer
from ..runtime import (
    log,
    peak_cuda_memory_mb,
    peak_rss_mb,
    precision_warning,
    resolve_device,
    resolve_precision,
    seed_everything,
)
from . import decisions, distributed
from .corpus import StreamingCorpus
from .optim import check_schedule
from .tensorboard import check_log_dir
from .trainer import Progress, Trainer

@dataclass
class TrainResult:
    output_dir: Path
    best_checkpoint: Path
    last_checkpoint: Path
    progress: Progress
    test_scores: dict[str, Any] = field(default_factory=dict)
    parameters: int = 0
    peak_rss_mb: float = 0.0
    peak_cuda_memory_mb: float | None = None  # None off CUDA
    rank: int = 0  # under torchrun, only rank 0's result has test scores and reports

    @property
    def tokens_per_second(self) -> float:
        return self.progress.tgt_tokens / max(self.progress.train_seconds, 1e-9)



def train(cfg: RunConfig, resume: bool = False, quiet: bool = False, final_test: bool = False) -> TrainResult:
    """Train a model as ``cfg`` says. With ``final_test``, the best checkpoint then translates the
    test split (beam 5), its BLEU/chrF are returned and a few alignment heatmaps are plotted.

    Under ``torchrun`` every process calls this: it joins the process group, trains its shard and
    leaves; rank 0 prepares the corpus first, the others then load it (see ``seq2seq.training.distributed``).
    """
    cfg = cfg.resolved()  # the architecture's defaults as `seq2seq train` fills them in (its config: resolved once)
    with distributed.process_group(resolve_device(cfg.train.device)):
        return _train(cfg, resume, quiet, final_test)


def _train(cfg: RunConfig, resume: bool, quiet: bool, final_test: bool) -> TrainResult:
    from ..runtime import allow_tf32, set_threads
    from .corpus import prepare_run_corpus

    out = Path(cfg.output_dir)
    if resume:
        cfg = _resumed_config(cfg, out)
    elif (out / "last.pt").exists():
        raise UserError(f"{out} already holds a run (last.pt); pass --resume to continue it "
                        "or choose another --output-dir")
    elif holds_checkpoints(out):  # best.pt or kept snapshots of a run that could not write last.pt
        raise UserError(f"{out} holds checkpoints of an earlier run (best.pt or checkpoints/) but no last.pt to "
                        "resume from; choose another --output-dir, or move them away first (a new run would "
                        "overwrite them)")
    cfg.model.validate()
    check_schedule(cfg)  # before minutes of preparing data
    set_threads(cfg.train.threads)
    allow_tf32(cfg.train.tf32)
    seed_everything(cfg.train.seed)
    device = resolve_device(cfg.train.device)
    slow = precision_warning(device, resolve_precision(device, cfg.train.precision))  # before any work
    if slow:
        log("warning", message=slow)
    if cfg.train.tensorboard and distributed.is_main():
        check_log_dir(cfg.train.tensorboard)  # installed and writable, before any work
    start = _fine_tuning_start(cfg, out) if cfg.train.init_from and not resume else None
    created = not out.exists()  # a run that fails before its first checkpoint removes what it created
    make_directory(out, f"creating the run directory {out}", "choose another --output-dir")
    try:
        tokenizer = start.tokenizer if start else _own_tokenizer(out) if cfg.train.init_from else None
        corpus = prepare_run_corpus(cfg, out, quiet=quiet, tokenizer=tokenizer)
        cfg.model.vocab_size = corpus.tokenizer.vocab_size
        if distributed.is_main():
            write_config(cfg, out)
            _write_shortlist(corpus, out, quiet)
        trainer = Trainer(cfg, corpus, quiet=quiet)
        if start is not None:
            trainer.model.load_state_dict(start.payload["model"])
            log("init", checkpoint=start.path, step=(start.payload.get("progress") or {}).get("step", "?"))
        if resume:
            trainer.restore(out / "last.pt")
            log("resume", step=trainer.progress.step, epoch=trainer.progress.epoch)
        ranks = {"processes": trainer.world} if trainer.world > 1 else {}
        log("start", arch=cfg.model.arch, attention=cfg.model.attention if cfg.model.arch == "rnn" else "-",
            parameters=trainer.model.num_parameters(), device=trainer.device, precision=trainer.precision,
            output_dir=out, **ranks)
        progress = trainer.fit()
    except BaseException:
        # a failed start removes the directory it created, unless something of value is in it by now
        if created and distributed.is_main() and not holds_checkpoints(out):
            shutil.rmtree(out, ignore_errors=True)
        raise
    result = TrainResult(out, out / "best.pt", out / "last.pt", progress,
                         parameters=trainer.model.num_parameters(), peak_rss_mb=peak_rss_mb(),
                         peak_cuda_memory_mb=peak_cuda_memory_mb(trainer.device), rank=trainer.rank)
    log("stop", reason=progress.stopped, step=progress.step, best_bleu=progress.best_bleu,
        best_step=progress.best_step, tok_s=round(result.tokens_per_second))
    if not trainer.main:
        return result
    if final_test and progress.stopped != "interrupted" and len(corpus.splits.get("test", [])):
        result.test_scores = test_best_checkpoint(trainer, out)
    too_few = decisions.few_updates_warning(progress)  # last: beside the test scores it explains
    if too_few:
        log("warning", message=too_few)
    try:
        write_summary(result)
    except OutputError as exc:  # the checkpoints are written: say so, and how to finish
        raise OutputError(f"{exc}{trainer.what_survived()}") from None
    return result


def _fine_tuning_start(cfg: RunConfig, out: Path) -> LoadedCheckpoint:
    """``--init-from``: the trained checkpoint a new run starts from, checked to fit ``cfg.model``."""
    start = LoadedCheckpoint.read(cfg.train.init_from)
    differences = cfg.model.differences(start.config.model)
    if differences:
        listed = ", ".join(f"{name} {mine} (the checkpoint has {theirs})" for name, mine, theirs in differences)
        raise UserError(f"--init-from {cfg.train.init_from}: fine-tuning keeps the trained model's architecture "
                        f"and size, but this run asks for {listed}; drop those options (from Python: "
                        "cfg.model = LoadedCheckpoint.read(path).config.model)")
    return start


def _own_tokenizer(out: Path) -> Tokenizer:
    """A resumed fine-tuning run keeps the tokenizer it copied from its start (it may be gone by now)."""
    return Tokenizer.load(out / "spm.model")


def write_config(cfg: RunConfig, out: Path) -> None:
    """``RUN/config.yaml``: the effective config, which ``seq2seq train --config`` reads back to an equal one."""
    from ..config import config_to_yaml
    from ..io_utils import atomic_output

    with atomic_output(out / "config.yaml") as handle:
        header = f"# seq2seq train --config {out / 'config.yaml'} reproduces this run's config"
        handle.write(config_to_yaml(cfg, header=header))


def _write_shortlist(corpus, out: Path, quiet: bool) -> None:
    """The run's lexical shortlist for ``translate.py --shortlist`` (IBM Model 1 on the training
    split, at most 100k pairs; ~10 s for Multi30k), unless a resumed run already has one."""
    from ..decoding import shortlist

    path = out / shortlist.FILE_NAME
    try:
        if path.exists() and shortlist.Shortlist.load(path).tokenizer == corpus.tokenizer.sha256():
            return
    except UserError:  # unreadable: write it again
        pass
    if isinstance(corpus, StreamingCorpus):
        log("shortlist", quiet=quiet, skipped="--streaming", build_with="seq2seq shortlist")
        return
    start = time.perf_counter()
    try:
        shortlist.build_for_run(corpus.columns["train"], corpus.tokenizer, path)
    except UserError as exc:  # an optional decoding aid: never the reason a training run fails
        log("warning", message=f"shortlist not written (seq2seq shortlist builds it later): {exc}")
        return
    log("shortlist", quiet=quiet, path=path, seconds=round(time.perf_counter() - start, 1))


def write_summary(result: TrainResult) -> None:
    """``summary.json``: what a comparison or benchmark needs without loading the checkpoint."""
    import json

    from ..io_utils import atomic_output

    p = result.progress
    summary = {
        "parameters": result.parameters, "steps": p.step, "epochs": p.epoch, "stopped": p.stopped,
        "best_valid_bleu": p.best_bleu, "best_step": p.best_step, "elapsed_s": p.elapsed,
        "train_s": p.train_seconds, "train_tgt_tokens": p.tgt_tokens,
        "train_tgt_tokens_per_s": result.tokens_per_second, "peak_rss_mb": result.peak_rss_mb,
        "peak_cuda_memory_mb": result.peak_cuda_memory_mb,
        "test": {name: {"score": s.score, "signature": s.signature} for name, s in result.test_scores.items()},
    }
    with atomic_output(result.output_dir / "summary.json") as handle:
        json.dump(summary, handle, indent=2)


def test_best_checkpoint(trainer: Trainer, out: Path, beam_size: int = 5, plots: int = 3) -> dict[str, Any]:
    """Translate the test split with ``best.pt``; write test.hyp, score it, plot a few alignments."""
    from ..alignment.plotting import plot_records
    from ..io_utils import atomic_output

    trainer.model.load_state_dict(load_checkpoint(out / "best.pt")["model"])
    sources, references = trainer.corpus.texts("test")
    translator = trainer.translator()
    hyps = translator.translate(sources, beam_size=beam_size, need_attention=False)
    with atomic_output(out / "test.hyp") as handle:
        handle.writelines(h.text + "\n" for h in hyps)
    scores = corpus_scores([h.text for h in hyps], references, ("bleu", "chrf"))
    examples = translator.translate(sources[:plots], beam_size=beam_size, need_attention=True)
    plot_records([t.alignment_record(i) for i, t in enumerate(examples)], out / "plots")
    log("test", beam=beam_size, **{name: round(s.score, 2) for name, s in scores.items()},
        hypotheses=out / "test.hyp", plots=out / "plots")
    empty = EmptyOutputs()
    empty.add(hyps)
    message = empty.warning("non-empty test sources")
    if message:
        log("warning", message=f"{message} ({out / 'test.hyp'})")
    return scores


def _resumed_config(cfg: RunConfig, out: Path) -> RunConfig:
    """The checkpoint's config, with this invocation's stopping limits and device (``RESUME_FIELDS``)."""
    saved = LoadedCheckpoint.read(out / "last.pt").config
    for key in RESUME_FIELDS:
        section, name = key.split(".")
        setattr(getattr(saved, section), name, getattr(getattr(cfg, section), name))
    saved.output_dir = str(out)
    return saved
