"""``CompareJob``: what ``seq2seq compare`` takes, as typed options (the command's flags fill it)."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ...config import DecodeConfig
from .constants import DEFAULT_BUCKETS
from .curves import BUDGET_MINUTES


@dataclass
class CompareJob:
    """The systems, the test set (``source`` + ``reference``, or ``data_dir``/``split``.``src``/``tgt``) and
    how the report is made. ``argv`` is the command line the report records."""

    runs: list[str]  # run directories (their best.pt) or .pt files; the first is the baseline
    output: str  # the report directory (new, or an earlier report to replace)
    source: str | None = None
    reference: str | None = None
    data_dir: str | None = None
    src: str | None = None
    tgt: str | None = None
    split: str = "test_2016_flickr"
    names: list[str] | None = None  # one display name per system (None: run directory names)
    decode: DecodeConfig = field(default_factory=DecodeConfig)  # the scored translations (greedy: its beam 1)
    sentences: int = 3  # plot the N sentences whose chrF differs most between systems
    sentence_ids: list[int] | None = None  # or plot these (0-based line numbers)
    gold: str | None = None  # gold word alignments (Pharaoh): report AER
    bootstrap: int = 1000
    ar_trials: int = 10000
    length_buckets: list[int] = field(default_factory=lambda: list(DEFAULT_BUCKETS))
    budgets: list[float] = field(default_factory=lambda: list(BUDGET_MINUTES))
    device: str = "auto"
    quiet: bool = False
    argv: list[str] = field(default_factory=list)
    source_path: Path | None = None  # resolved by ``compare`` from source or data_dir
    reference_path: Path | None = None
