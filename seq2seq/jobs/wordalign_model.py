"""``seq2seq wordalign --method model``: word alignments of a parallel corpus from this project's own models, used
the way eflomal or awesome-align is: a corpus in, one Pharaoh line per pair out.

The models are a source->target and a target->source one, either

- **given** (``checkpoint``, ``backward_checkpoint``: ``--checkpoint FWD [--backward-checkpoint BWD]``), checked
  as ``seq2seq align`` checks them (a backward model trained in the forward direction is an error); nothing is
  trained and eflomal is not needed; or
- **trained on the corpus** (``max_minutes``: ``--max-minutes M``) with ``preset`` (default ``transformer-align``:
  guided alignment taught by eflomal's links). eflomal aligns the corpus once, before either run starts
  (grow-diag-final-and, as the preset computes at its own start); the forward run reads those links, the backward
  run the same links transposed (``alignment.links.transpose_links``), line N for pair N as ``--guided-alignment
  FILE`` reads them. **The budget** M is the training time of both directions together: with two cores or more
  they train at once, each for M minutes on half the cores; on one core one after the other, M/2 minutes each
  (``sequential`` asks for that anywhere). Each run's clock starts after its tokenizer is trained and the corpus
  encoded; eflomal's teacher before and the alignment pass after come on top. **Validation** (checkpoint
  selection, ``best.pt``) reads the first ``VALID_PAIRS`` pairs of the corpus itself, which the run also trains
  on: a word aligner estimates its model on the pairs it aligns, so no pair is held out of training. The runs
  (``SRC-TGT``, ``TGT-SRC``), the corpus as they read it, the teacher's links and the encoded cache are kept in
  ``output_dir`` (default ``<output>.models``), so ``--checkpoint`` can align with them again. A run that a too
  small budget stopped before ``training.decisions.FEW_UPDATES`` updates (the floor below which the project warns
  that a model cannot translate yet) is a named error that says what budget to give.

**Self-training** (``rounds`` > 1, issue 66): each further round trains both directions again from scratch, within
the same budget, taught by the round before's links of the corpus (the agreement of its two models, which are
closer to the gold than eflomal's) in place of eflomal's; round K's runs and links are kept in
``output_dir/round-K``, the last round's links are the output.

Then every pair is force-decoded by both models and their word attention combined by agreement (with one model:
its links), by ``seq2seq align``'s own path (``jobs.align.evaluate`` with ``output`` and no gold), and the links
are written atomically to ``output``. Words are the whitespace tokens of the files, as eflomal's: every line needs
at least one (an empty line is an error naming the file and line: a training pair needs both sides, and a model
has no attention to read on an empty side).
"""
from __future__ import annotations

import math
import multiprocessing
import os
import re
import shutil
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from ..alignment.eflomal import eflomal_links
from ..alignment.links import read_pharaoh_file, to_pharaoh, transpose_links
from ..checkpoint.file import holds_checkpoints
from ..config import FORCED_BATCH_SIZE, MODEL_SYMMETRIZATIONS, SELF_GUIDANCE, RunConfig
from ..errors import UserError
from ..io_utils import atomic_output, counted, make_directory, read_parallel
from ..runtime import log
from ..training.corpus import EFLOMAL
from ..training.decisions import FEW_UPDATES
from ..training.run import train
from .align import AlignJob, evaluate

PRESET = "transformer-align"  # what --method model trains by default
VALID_PAIRS = 100  # validation: the corpus's first pairs (trained on too)
#: a run's first updates are slow (allocations, kernel selection): its pace is read from this many or more
PACED_UPDATES = 10
#: updates a minute of transformer-align on one CPU core (docs/guides/alignments.md: 1,805-2,001 in 25 minutes)
CPU_UPDATES_PER_MINUTE = 75
CORPUS = "corpus"  # the output directory's copy of the corpus, as the runs read it ({split}.{lang} files)


@dataclass
class ModelAlignJob:
    """What ``seq2seq wordalign --method model`` takes: the corpus, where the links go, and either the two models
    or a budget to train them in."""

    source: str
    target: str
    output: str
    checkpoint: str | None = None  # a source->target model: nothing is trained
    backward_checkpoint: str | None = None  # with ``checkpoint``: a target->source one, combined by agreement
    max_minutes: float | None = None  # train both directions in this many minutes in all
    preset: str = PRESET
    train_config: RunConfig | None = None  # the preset with options over it (None: ``preset`` as it is)
    output_dir: str | None = None  # where the runs are kept (None: ``<output>.models``)
    sequential: bool = False  # train one direction after the other even with several cores
    rounds: int = 1  # self-training: each round after the first taught by the round before's links
    symmetrize: str | None = None  # None: agreement with two models, else forward
    batch_size: int = FORCED_BATCH_SIZE
    device: str = "auto"


def model_word_align(job: ModelAlignJob) -> int:
    """Align ``job``'s corpus with its models, given or trained; returns the number of pairs written."""
    _check_options(job)
    if job.max_minutes is not None:
        _check_teacher(job)
    sources, targets = read_corpus(job.source, job.target)
    if job.checkpoint is not None:
        _align(job, job.checkpoint, job.backward_checkpoint, job.output)
        return len(sources)
    home = Path(job.output_dir) if job.output_dir else default_output_dir(job.output)
    directories = [home] if job.rounds == 1 else [home / f"round-{k}" for k in range(1, job.rounds + 1)]
    for directory in directories:  # before any training
        check_free(directory, run_directories(job, directory))
    teacher = None  # round 1: eflomal's links (if the preset learns from them)
    for directory in directories[:-1]:  # self-training: each round's links teach the next
        forward, backward = train_directions(job, sources, targets, directory, teacher)
        _align(job, str(forward), str(backward), str(directory / "links.talp"))
        teacher = read_pharaoh_file(directory / "links.talp")[0]
    forward, backward = train_directions(job, sources, targets, directories[-1], teacher)
    _align(job, str(forward), str(backward), job.output)
    return len(sources)


def _align(job: ModelAlignJob, forward: str, backward: str | None, output: str) -> None:
    """The corpus's links from ``forward`` (and ``backward``), written to ``output``."""
    evaluate(AlignJob(checkpoint=forward, source=job.source, target=job.target, output=output,
                      backward_checkpoint=backward, symmetrize=job.symmetrize, batch_size=job.batch_size,
                      device=job.device))
    log("wordalign", method="model", forward=forward, backward=backward, output=output)


def _check_options(job: ModelAlignJob) -> None:
    """Given models or a budget, one of the two, a positive budget, and links that the models give."""
    if (job.checkpoint is None) == (job.max_minutes is None):
        given = "both" if job.checkpoint is not None else "neither"
        raise UserError(f"--method model: give --checkpoint (models to align with) or --max-minutes (a budget to "
                        f"train them on the corpus in), not {given}")
    if job.backward_checkpoint is not None and job.checkpoint is None:
        raise UserError("--backward-checkpoint goes with --checkpoint (the source->target model); with "
                        "--max-minutes both directions are trained")
    if job.rounds < 1 or job.rounds > 1 and job.max_minutes is None:
        raise UserError(f"--rounds {job.rounds}: give 1 or more rounds of training (each after the first taught by "
                        "the links of the round before), with --max-minutes")
    if job.max_minutes is not None and not (math.isfinite(job.max_minutes) and job.max_minutes > 0):
        raise UserError(f"--max-minutes must be a positive number of minutes (both directions' training in all), "
                        f"got {job.max_minutes}")
    if job.symmetrize is not None and job.symmetrize not in MODEL_SYMMETRIZATIONS:
        raise UserError(f"--symmetrize must be one of {', '.join(MODEL_SYMMETRIZATIONS)}, got {job.symmetrize!r}")
    if job.symmetrize not in (None, "forward") and job.checkpoint is not None and job.backward_checkpoint is None:
        raise UserError(f"--symmetrize {job.symmetrize} needs --backward-checkpoint (a target->source model)")


def _base_config(job: ModelAlignJob) -> RunConfig:
    return job.train_config or RunConfig.from_preset(job.preset, train={"device": job.device})


def _check_teacher(job: ModelAlignJob) -> None:
    """eflomal is installed if the preset learns from its links; a preset that names a file of links is refused (the
    teacher here is eflomal's links of the corpus being aligned, or none, or the models' own)."""
    links = _base_config(job).guided.links
    if links == EFLOMAL:
        try:
            import eflomal  # noqa: F401
        except ImportError:
            raise UserError(f"--preset {job.preset} learns to align from eflomal's links of the corpus, and eflomal "
                            "is not installed: pip install 'seq2seq[align]' (or align with --checkpoint, or train "
                            "a preset without a teacher, e.g. --preset transformer, whose plain attention aligns "
                            "far worse)") from None
    elif links not in (None, "", SELF_GUIDANCE):
        raise UserError(f"guided.links {links}: seq2seq wordalign teaches its models with eflomal's links of the "
                        "corpus it aligns ('eflomal'), the models' own ('self') or none; drop the file")


def read_corpus(source: str, target: str) -> tuple[list[str], list[str]]:
    """The parallel files, line-aligned, with at least one word on every line of each (errors name the file and
    the line)."""
    sources, targets = read_parallel(source, target)
    for flag, path, lines in (("--source", source, sources), ("--target", target, targets)):
        for number, line in enumerate(lines, start=1):
            if not line.split():
                raise UserError(f"{flag} {path}, line {number}: empty; --method model aligns pairs with words on "
                                "both sides (a model trains on and attends to words): remove the pair from both "
                                "files, or align with --method eflomal, which writes an empty line for it")
    return sources, targets


def language_codes(source: str, target: str) -> tuple[str, str]:
    """The runs' language codes: the files' suffixes (``train.de``, ``train.en``) where they differ and read as
    codes, else ``src`` and ``tgt``."""
    codes = Path(source).suffix[1:], Path(target).suffix[1:]
    if codes[0] != codes[1] and all(re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", code) for code in codes):
        return codes
    return "src", "tgt"


def default_output_dir(output: str) -> Path:
    """Where the runs go without ``--output-dir``: beside ``--output``, named after it."""
    return Path(f"{output}.models")


def run_directories(job: ModelAlignJob, home: Path) -> tuple[Path, Path]:
    """The source->target and target->source runs' directories in ``home``, named by ``language_codes``."""
    src, tgt = language_codes(job.source, job.target)
    return home / f"{src}-{tgt}", home / f"{tgt}-{src}"


def check_free(home: Path, runs: tuple[Path, Path]) -> None:
    """A named error when a run directory already holds a trained run (it would be trained over)."""
    for run in runs:
        if holds_checkpoints(run):
            raise UserError(f"--output-dir {home}: {run} holds a trained run already; align with those models "
                            f"(--checkpoint {runs[0]} --backward-checkpoint {runs[1]}) or choose another --output-dir")


def train_directions(job: ModelAlignJob, sources: list[str], targets: list[str], home: Path,
                     teacher: list[set] | None = None) -> tuple[Path, Path]:
    """Train the source->target and target->source runs on the corpus in ``home`` within ``job.max_minutes``
    (module docstring), taught by ``teacher`` (links of the corpus; None: eflomal's, if the preset learns from
    them); returns their directories."""
    base = _base_config(job)
    src, tgt = language_codes(job.source, job.target)
    runs = run_directories(job, home)
    check_free(home, runs)
    _write_corpus(home / CORPUS, sources, targets, src, tgt)
    if teacher is None and base.guided.links == EFLOMAL:
        log("wordalign", teacher="eflomal", pairs=len(sources))
        teacher = eflomal_links(sources, targets)
    teachers = _write_teacher(home, teacher) if teacher is not None else None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    together = cores >= 2 and not job.sequential
    minutes = job.max_minutes if together else job.max_minutes / 2
    threads = max(1, cores // 2) if together else 0
    configs = [_run_config(base, home, run, codes, links, minutes, threads, job.device)
               for run, codes, links in zip(runs, ((src, tgt), (tgt, src)), teachers or (None, None))]
    log("wordalign", method="model", training=f"{src}-{tgt} and {tgt}-{src}", preset=job.preset,
        schedule="at once" if together else "one after the other", minutes_each=minutes, output_dir=home)
    if together:
        context = multiprocessing.get_context("spawn")  # a fresh interpreter each: torch's threads are per process
        with ProcessPoolExecutor(max_workers=2, mp_context=context) as pool:
            outcomes = [future.result() for future in [pool.submit(train_run, cfg) for cfg in configs]]
        for cfg, outcome in zip(configs, outcomes):
            _check_updates(job, cfg, outcome, runs, together)
    else:
        for cfg in configs:
            _check_updates(job, cfg, train_run(cfg), runs, together)
    return runs


def _write_corpus(directory: Path, sources: list[str], targets: list[str], src: str, tgt: str) -> None:
    """The corpus as the runs read it (``--data-dir``): ``train.*`` every pair, ``val.*`` the first
    ``VALID_PAIRS`` (the runs' validation and, unused, test split)."""
    make_directory(directory, f"creating {directory} (--output-dir)")
    for code, lines in ((src, sources), (tgt, targets)):
        for split, part in (("train", lines), ("val", lines[:VALID_PAIRS])):
            with atomic_output(directory / f"{split}.{code}") as out:
                out.writelines(line + "\n" for line in part)


def _write_teacher(home: Path, links: list[set]) -> tuple[Path, Path]:
    """The teacher's links of the corpus (``teacher.talp``: eflomal's, or the round before's) and the same links
    transposed for the backward run (``teacher.reversed.talp``): one line per pair, for both directions."""
    paths = home / "teacher.talp", home / "teacher.reversed.talp"
    for path, lines in zip(paths, (links, [transpose_links(pair) for pair in links])):
        with atomic_output(path) as out:
            out.writelines(to_pharaoh(pair) + "\n" for pair in lines)
    return paths


def _run_config(base: RunConfig, home: Path, run: Path, codes: tuple[str, str], links: Path | None, minutes: float,
                threads: int, device: str) -> RunConfig:
    """``base`` set to train one direction of the corpus in ``home`` into ``run``: the corpus, the teacher's
    links, the budget, the device and (unless ``base`` sets them) the threads."""
    raw = base.to_dict()
    raw["data"].update(data_dir=str(home / CORPUS), dataset=None, dataset_config=None, train_file=None,
                       valid_file=None, test_file=None, toy_size=0, src=codes[0], tgt=codes[1], train_split="train",
                       valid_split="val", test_split="val", cache_dir=str(home / "cache"))
    if links is not None:
        raw["guided"]["links"] = str(links)
    raw["train"].update(max_minutes=minutes, device=device, threads=base.train.threads or threads)
    raw["output_dir"] = str(run)
    return RunConfig.from_dict(raw, source="seq2seq wordalign")


def train_run(cfg: RunConfig) -> tuple[int, float, float, str]:
    """One direction's run (here or in a process of its own): its updates, seconds on its clock, seconds inside
    its updates, and why it stopped."""
    progress = train(cfg, quiet=True).progress
    return progress.step, progress.elapsed, progress.train_seconds, progress.stopped


def _check_updates(job: ModelAlignJob, cfg: RunConfig, outcome: tuple[int, float, float, str],
                   runs: tuple[Path, Path], together: bool) -> None:
    """A UserError, the runs removed, when the budget stopped a run before ``FEW_UPDATES`` updates, with a budget in
    which the same runs would make twice that many: at this run's pace (its clock's time outside the updates, once,
    and the time of an update) where it made enough updates to tell (the first ones are slow), else at
    ``CPU_UPDATES_PER_MINUTE``."""
    steps, seconds, updating, stopped = outcome
    if steps >= FEW_UPDATES or stopped != "max_minutes":
        return
    for run in runs:
        shutil.rmtree(run, ignore_errors=True)
    wanted = 2 * FEW_UPDATES
    if steps >= PACED_UPDATES:
        each, pace = max(seconds - updating, 0) / 60 + updating / 60 / steps * wanted, "at this run's pace"
    else:
        each, pace = wanted / CPU_UPDATES_PER_MINUTE, (f"at the {CPU_UPDATES_PER_MINUTE} a minute {PRESET} makes on "
                                                       "one CPU core; this run made too few to tell its own pace")
    budget = math.ceil(each * (1 if together else 2) * 10) / 10
    raise UserError(f"--max-minutes {job.max_minutes}: the {cfg.data.src}->{cfg.data.tgt} run made "
                    f"{counted(steps, 'update')} in {seconds / 60:.2f} minutes, fewer than the {FEW_UPDATES} a model "
                    f"needs before it translates, let alone aligns; give --max-minutes {budget} or more ({wanted} "
                    f"updates a direction {pace}; more align better), or align with --method eflomal (the runs were "
                    "removed)")
