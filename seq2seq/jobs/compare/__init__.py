"""Compare trained systems on one test set and write a self-contained report directory.

    seq2seq compare RUN_A RUN_B --source test.de --reference test.en --output report

``report/report.md`` (with ``report.json`` holding every number, ``plots/*.png|svg`` and
``hypotheses/*.txt``) has four parts:

1. quality and cost, one row per system: BLEU, chrF and TER of beam-search output with 95%
   confidence intervals and p-values against the FIRST system from paired bootstrap resampling and
   paired approximate randomization (both sacrebleu's own ``significance.PairedTest``, not
   re-implemented here); parameters; training time, throughput and peak memory (``summary.json``);
   decoding speed greedy and beam (timed here);
2. BLEU by source-length bucket (source words = whitespace-separated tokens);
3. learning curves: validation BLEU against steps and against wall-clock time (``metrics.jsonl``),
   each system's validation BLEU at training budgets (``--budgets``, minutes) and where each
   system's curve crosses the first system's, in minutes and in updates (``curves``);
4. word-level attention heatmaps of a few sentences, systems side by side: once for each system's
   own translation, once force-decoding the reference (same rows and columns for every system);
   with ``--gold``, the alignment error rate of each system's argmax alignments of the reference.

A RUN is a run directory (its ``best.pt``, with ``summary.json`` / ``metrics.jsonl`` beside it) or
a ``.pt`` file (the files beside it are used when present; missing figures show as "—").
The report directory is built under a temporary name and renamed into place at the end.

Modules: ``decode`` (systems, test set, timed decoding), ``stats`` (significance, length buckets,
forced alignments, sentence choice), ``curves`` (budgets, crossings), ``figures``, ``render``
(markdown), ``report`` (the directory).
"""
from .constants import DEFAULT_BUCKETS
from .curves import BUDGET_MINUTES, at_budgets, budget_summary, crossings
from .job import CompareJob
from .decode import input_files, load_system, read_test_set
from .render import render_markdown
from .report import build_report, compare
from .stats import check_sentence_ids, forced_attention, forced_attentions, length_buckets, pick_sentences, significance

__all__ = ["BUDGET_MINUTES", "DEFAULT_BUCKETS", "CompareJob", "at_budgets", "budget_summary", "build_report",
           "check_sentence_ids", "compare", "crossings", "forced_attention", "forced_attentions", "input_files",
           "length_buckets", "load_system", "pick_sentences", "read_test_set", "render_markdown", "significance"]
