"""Loading the compared systems and the test set, and decoding it with each (timed)."""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Sequence

from ...checkpoint.loaded import LoadedCheckpoint
from ...config import DecodeConfig
from ...data.files import read_lines
from ...decoding.translator import Translator
from ...errors import UserError
from ...io_utils import counted
from ...runtime import log
from .job import CompareJob


@dataclass
class System:
    """One system to compare: its translator and what its run directory says about training."""

    name: str
    checkpoint: Path
    model: str  # short description, e.g. "transformer (3 layers, d 256, 4 heads)"
    parameters: int
    translator: Translator
    training: dict[str, Any]  # from summary.json; empty if there is none
    curve: list[dict[str, Any]]  # the validation lines of metrics.jsonl, by step


def resolve_checkpoint(arg: str) -> Path:
    """A run directory means its best.pt; a file is taken as is."""
    path = Path(arg)
    if path.is_dir():
        if not (path / "best.pt").is_file():
            raise UserError(f"{path}: run directory without best.pt; pass a .pt file instead "
                            f"(e.g. {path / 'last.pt'}) or a finished run")
        return path / "best.pt"
    if not path.is_file():
        raise UserError(f"{arg}: no such checkpoint or run directory; pass RUN_DIR or RUN_DIR/best.pt")
    return path


def default_name(checkpoint: Path) -> str:
    """``run`` for run/best.pt, ``run/step5`` for run/step5.pt."""
    if checkpoint.name == "best.pt":
        return checkpoint.parent.name or "best"
    return f"{checkpoint.parent.name}/{checkpoint.stem}" if checkpoint.parent.name else checkpoint.stem


def system_names(checkpoints: Sequence[Path], names: Sequence[str] | None) -> list[str]:
    """``--names`` if given (one per system, unique), else names from the paths made unique."""
    if names:
        if len(names) != len(checkpoints):
            raise UserError(f"--names gives {counted(len(names), 'name')} for {counted(len(checkpoints), 'system')}; "
                            "give one name per RUN_OR_CKPT, in the same order")
        if len(set(names)) != len(names):
            raise UserError(f"--names must be distinct, got {' '.join(names)}")
        return list(names)
    result: list[str] = []
    for checkpoint in checkpoints:
        name = default_name(checkpoint)
        result.append(name if name not in result else f"{name}#{len(result) + 1}")
    return result


def describe_model(model_cfg: dict[str, Any]) -> str:
    if model_cfg.get("arch") == "rnn":
        return (f"rnn ({model_cfg.get('attention')}, {model_cfg.get('rnn_cell')} "
                f"{model_cfg.get('hidden_size')}/{model_cfg.get('decoder_hidden_size')})")
    return (f"transformer ({counted(model_cfg.get('layers'), 'layer')}, d {model_cfg.get('d_model')}, "
            f"{counted(model_cfg.get('heads'), 'head')})")


def read_json_file(path: Path) -> dict[str, Any]:
    """A JSON object from ``path``, or {} if the file is absent or unreadable (with a warning)."""
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        log("warning", message=f"ignoring {path}: {exc}")
        return {}
    return data if isinstance(data, dict) else {}


def validation_curve(metrics_path: Path) -> list[dict[str, Any]]:
    """The ``"kind": "valid"`` lines of metrics.jsonl sorted by step; a step logged twice (a run
    killed between logging and checkpointing, then resumed) keeps its last line; broken lines
    (a run killed mid-write) are skipped."""
    if not metrics_path.is_file():
        return []
    by_step: dict[int, dict[str, Any]] = {}
    for line in metrics_path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("kind") == "valid" and {"step", "bleu"} <= record.keys():
            by_step[int(record["step"])] = record
    return [by_step[step] for step in sorted(by_step)]


def load_system(arg: str, name: str, device: str) -> System:
    checkpoint = resolve_checkpoint(arg)
    loaded = LoadedCheckpoint.read(checkpoint)
    translator = Translator.from_checkpoint(loaded, device=device)
    return System(
        name=name, checkpoint=checkpoint, model=describe_model(loaded.payload["config"].get("model", {})),
        parameters=translator.model.num_parameters(), translator=translator,
        training=read_json_file(checkpoint.parent / "summary.json"),
        curve=validation_curve(checkpoint.parent / "metrics.jsonl"),
    )




def input_files(job: CompareJob) -> tuple[Path, Path]:
    """--source/--reference, or the --data-dir shortcut DIR/SPLIT.SRC and DIR/SPLIT.TGT."""
    explicit = job.source is not None or job.reference is not None
    if explicit and job.data_dir is not None:
        raise UserError("give either --source and --reference or --data-dir (with --src, --tgt), not both")
    if job.data_dir is not None:
        if not (job.src and job.tgt):
            raise UserError("--data-dir needs --src and --tgt (language suffixes, e.g. --src de --tgt en)")
        return (Path(job.data_dir) / f"{job.split}.{job.src}",
                Path(job.data_dir) / f"{job.split}.{job.tgt}")
    if job.source is None or job.reference is None:
        raise UserError("give --source and --reference (parallel text files), or --data-dir DIR "
                        "--src de --tgt en [--split test_2016_flickr]")
    return Path(job.source), Path(job.reference)


def read_test_set(source: Path, reference: Path) -> tuple[list[str], list[str]]:
    sources = read_lines(source, "--source")
    references = read_lines(reference, "--reference")
    if len(sources) != len(references):
        raise UserError(f"--source {source} has {counted(len(sources), 'line')} but --reference {reference} has "
                        f"{len(references)}; they must be parallel, one reference line per source line")
    if not sources:
        raise UserError(f"--source {source} is empty; nothing to compare on")
    return sources, references




@dataclass
class Decoded:
    """One system's translations of the test set, greedy and beam, with their wall-clock times."""

    greedy: list[str]
    beam: list[str]
    greedy_seconds: float
    beam_seconds: float


def timed_translate(translator: Translator, sources: list[str], decode: DecodeConfig,
                    quiet: bool) -> tuple[list[str], float]:
    start = time.perf_counter()
    hyps = translator.translate(sources, decode, need_attention=False, progress=not quiet)
    return [h.text for h in hyps], time.perf_counter() - start


def decode_system(system: System, sources: list[str], decode: DecodeConfig, quiet: bool) -> Decoded:
    """Greedy (``decode`` at beam 1) and ``decode``'s beam translations, each timed after an untimed warm-up on a
    few sentences (first calls pay for lazy initialisation); beam size 1 reuses the greedy run."""
    system.translator.translate(sources[:4], decode, need_attention=False)
    greedy, greedy_s = timed_translate(system.translator, sources, replace(decode, beam_size=1, n_best=1), quiet)
    if decode.beam == 1:
        return Decoded(greedy, greedy, greedy_s, greedy_s)
    beam, beam_s = timed_translate(system.translator, sources, decode, quiet)
    return Decoded(greedy, beam, greedy_s, beam_s)
