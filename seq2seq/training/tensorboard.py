"""TensorBoard logging of a training run (``--tensorboard DIR``; the optional ``tensorboard`` extra).

Scalars: ``train/loss``, ``train/lr``, ``train/tokens_per_s`` at every logged step;
``valid/loss``, ``valid/ppl``, ``valid/bleu``, ``valid/chrf`` at every validation. Images:
``attention/N``: the word-level attention heatmap (as the run's plots: layer and heads of
``alignment_record``'s defaults) of
validation sentence N for the first ``sentences`` validation sentences, redrawn at each
validation, so the slider shows how alignments form during training. Written by rank 0 only.
Point TensorBoard at the directory: ``tensorboard --logdir DIR``.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import UserError

INSTALL_HINT = "pip install 'seq2seq[tensorboard]' (or pip install tensorboard)"


def check_log_dir(log_dir: str | Path) -> Path:
    """Create ``log_dir`` and check it is writable, and that TensorBoard is installed: both before any
    work, as named errors."""
    try:
        from torch.utils.tensorboard import SummaryWriter  # noqa: F401  (needs the tensorboard package)
    except ImportError:
        raise UserError(f"--tensorboard needs the tensorboard package: {INSTALL_HINT}") from None
    path = Path(log_dir)
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".seq2seq-write-test"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise UserError(f"--tensorboard {log_dir}: cannot write there ({exc.strerror or exc})") from None
    return path


class TensorBoardLog:
    """A ``SummaryWriter`` for one run; a no-op without a directory (or on ranks other than 0)."""

    def __init__(self, log_dir: str | Path | None, enabled: bool = True, sentences: int = 3) -> None:
        self.writer: Any = None
        self.sentences = sentences
        if log_dir and enabled:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(str(check_log_dir(log_dir)))

    def scalars(self, prefix: str, values: dict[str, float], step: int) -> None:
        if self.writer is None:
            return
        for name, value in values.items():
            self.writer.add_scalar(f"{prefix}/{name}", value, step)
        self.writer.flush()

    def attention(self, translations: list, step: int) -> None:
        """Heatmaps of ``translations`` (``Translation`` objects with attention) as ``attention/N``."""
        if self.writer is None:
            return
        from ..alignment.plotting import alignment_figure, label_fonts

        for index, translation in enumerate(translations):
            record = translation.alignment_record(index)
            with label_fonts([*record.src_words, *record.tgt_words]):
                figure = alignment_figure(record.words, record.src_words, record.tgt_words, title=f"step {step}")
                self.writer.add_figure(f"attention/{index}", figure, step, close=False)
        self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None
