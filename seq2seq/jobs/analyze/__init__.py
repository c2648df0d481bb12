"""Corpus-level analysis of attention: ``seq2seq analyze``.

    seq2seq analyze --checkpoint RUN_RNN RUN_TRANSFORMER --input test.de --reference test.en \\
        [--gold-alignments test.talp] --output-dir analysis

For every model (columns side by side in the report) the decoder's cross-attention is read from one
teacher-forced pass (``seq2seq.decoding.scoring.teacher_force``) over the references, or, without
``--reference``, over the model's own translations (``--beam-size``; 1 = greedy). The report
directory holds ``report.md``, ``report.json`` (every number) and ``plots/*.png``:

1. per decoder layer and head (the RNN: one layer, one head), means over every target position of
   the corpus: attention entropy, top-1 share, Gini, share on the source EOS, on punctuation, on
   numbers and on function words, distance from the diagonal (``stats``), and with gold links the
   AER of the head's word-level hard links;
2. head importance (Transformer): the change of the teacher-forced loss, and of BLEU on the first
   ``--bleu-sentences`` sentences, when one cross-attention head is masked, and loss and BLEU with
   the k least important heads masked, k = 0..K (Michel et al. 2019; ``heads``);
3. concentration: which source classes and words receive the attention mass of the aggregate
   (``--align-layer`` / ``--align-heads``), against their share of the source;
4. layer x head heatmaps of these statistics (``figures``).

Inputs are read and checked before any model runs; the directory is built under a temporary name
and renamed into place at the end (``compare.report.staged_directory``), so an error leaves nothing.

Modules: ``stats`` (the statistics and classes, with their formulas), ``heads`` (masking,
importance, pruning), ``figures``, ``render`` (markdown), ``report`` (inputs, models, the directory),
``job`` (``AnalyzeJob``, the typed options).
"""
from .heads import cross_attention_layers, head_importance, masked_heads, pruning_order
from .render import render_markdown
from .job import AnalyzeJob
from .report import analyze, build_report, read_corpus
from .stats import (
    CLASSES,
    RowStatistics,
    SourceMass,
    diagonal_distance,
    entropy,
    function_words,
    gini,
    head_aer,
    normalized_entropy,
    piece_classes,
    row_statistics,
)

__all__ = ["AnalyzeJob", "CLASSES", "RowStatistics", "SourceMass", "analyze", "build_report", "cross_attention_layers",
           "diagonal_distance", "entropy", "function_words", "gini", "head_aer", "head_importance", "masked_heads",
           "normalized_entropy", "piece_classes", "pruning_order", "read_corpus", "render_markdown", "row_statistics"]
