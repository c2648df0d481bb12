"""``AnalyzeJob``: what ``seq2seq analyze`` takes, as typed options (the command's flags fill it)."""
from __future__ import annotations

from dataclasses import dataclass, field

from ...config import AlignConfig, DecodeConfig


@dataclass
class AnalyzeJob:
    """What ``seq2seq analyze`` takes: the models, the text (and optionally references and gold links),
    the report directory and the analysis settings. ``argv`` is the command line the report records."""

    checkpoint: list[str]  # run directories (their best.pt) or .pt files; one report column each
    input: str  # source sentences, one per line (empty lines are skipped)
    output_dir: str  # the report directory (new, or an earlier report to replace)
    names: list[str] | None = None
    reference: str | None = None  # force-decode these (None: the models' own translations)
    gold_alignments: str | None = None  # Pharaoh gold links of input / reference: AER per layer and head
    #: the models' own translations (without a reference) and the BLEU subset's; its batch size also force-decodes
    #: (None: FORCED_BATCH_SIZE force-decoding, 320 / beam size translating)
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    bleu_sentences: int = 100  # BLEU of masked and pruned models on the first N analysed sentences
    max_pruned: int | None = None  # pruning curve up to K heads masked (None: all)
    function_words: int = 50  # the N most frequent source words count as function words
    top_words: int = 15  # list the N source words with the most attention mass
    align: AlignConfig = field(default_factory=AlignConfig)
    device: str = "auto"
    quiet: bool = False
    argv: list[str] = field(default_factory=list)
