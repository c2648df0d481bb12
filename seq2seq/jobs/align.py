"""Alignment quality against gold links: ``seq2seq align``.

    seq2seq align --checkpoint RUN/best.pt --source test.de --target test.en \\
        --gold test.talp [--backward-checkpoint RUN_EN_DE/best.pt] [--output links.txt]

Gold alignments refer to the given (reference) translation, not to what the model would produce,
so the target is force-decoded: one teacher-forced pass gives the attention over the source for
every target token. Attention is aggregated (``--align-layer``, default the penultimate decoder layer;
``--align-heads``, default their mean; a model trained with guided alignment: the layer and heads it
supervised), merged to words (words = SentencePiece '▁' boundaries = the
whitespace tokens of the files, so pass the files tokenized as the gold alignments are), EOS is
dropped, and hard links are read with ``--align-method`` (``LINK_METHODS``).

With ``--backward-checkpoint`` (a target->source model) the target is aligned to the source too;
its links are transposed to (source, target) and symmetrized by intersection, grow-diag-final and
grow-diag-final-and, and both directions' word attention combined by agreement (``decoding.forced_alignment``).
Precision, recall and AER (Och & Ney 2003) are printed for every available direction; the links
of ``--symmetrize`` (default: agreement with a backward model, else forward) are written to
``--output`` as 0-based Pharaoh ``i-j`` lines (source-target), one per sentence.

Without ``--gold`` nothing is scored: the links of ``--symmetrize`` go to ``--output`` (a corpus aligner).
With ``--adapt-steps N`` each model is first fine-tuned on the pairs themselves (``training.adapt``: the
translation loss only, N updates), as a word aligner estimates its tables on the corpus it aligns: a fresh copy
for each ``--adapt-pairs`` consecutive pairs (``training.adapt.chunks``), whose links come from that copy.

Gold file: one line per sentence, 0-based ``i-j`` (or ``i-j-S``) sure links, ``i?j`` (or
``i-j-P``) possible links.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from ..alignment.links import AlignmentScores, alignment_error_rate, extract_links, read_gold_alignments, to_pharaoh
from ..alignment.matrices import Link, check_layer_heads
from ..decoding.forced_alignment import BackwardAligner, force_align_words
from ..decoding.translator import Translator
from ..config import ADAPT_LR, ADAPT_PAIRS, FORCED_BATCH_SIZE, MODEL_SYMMETRIZATION, AlignConfig
from ..errors import UserError
from ..io_utils import atomic_output, counted, markdown_table, read_parallel
from ..runtime import LOGGER
from ..training.adapt import adapt, chunks


@dataclass
class AlignJob:
    """``seq2seq align``'s options: the model(s), the parallel files and gold links, the alignment options."""

    checkpoint: str
    source: str
    target: str
    gold: str | None = None  # None: no scores, only --output
    backward_checkpoint: str | None = None  # a target->source model: symmetrized links
    symmetrize: str | None = None  # which links --output gets (None: MODEL_SYMMETRIZATION with a backward model)
    output: str | None = None  # Pharaoh lines of the chosen links
    json: bool = False  # also print the scores as one JSON line
    batch_size: int = FORCED_BATCH_SIZE  # sentence pairs per forward pass
    device: str = "auto"
    adapt_steps: int = 0  # fine-tune each model on the pairs first (``training.adapt``)
    adapt_lr: float = ADAPT_LR
    adapt_pairs: int = ADAPT_PAIRS  # a copy adapted to each this many consecutive pairs (0: one for all)
    align: AlignConfig = field(default_factory=AlignConfig)


def _read_parallel(job: AlignJob) -> tuple[list[str], list[str], list[set[Link]] | None, list[set[Link]] | None]:
    if job.gold is None and not job.output:
        raise UserError("align: give --gold (to score the links) or --output (to write them), or both")
    for flag, path in (("--source", job.source), ("--target", job.target), ("--gold", job.gold)):
        if path is not None and not Path(path).is_file():
            raise UserError(f"{flag} {path}: no such file")
    sources, targets = read_parallel(job.source, job.target, allow_empty=True)
    if job.gold is None:
        return sources, targets, None, None
    sure, possible = read_gold_alignments(job.gold, sources, targets)
    return sources, targets, sure, possible


def evaluate(job: AlignJob) -> dict[str, AlignmentScores]:
    """Align, score every direction (with --gold), write --output; returns the scores by name."""
    sources, targets, sure, possible = _read_parallel(job)
    chosen = job.symmetrize or (MODEL_SYMMETRIZATION if job.backward_checkpoint else "forward")
    if chosen != "forward" and not job.backward_checkpoint:
        raise UserError(f"--symmetrize {chosen} needs --backward-checkpoint (a target->source model)")
    forward = Translator.from_checkpoint(job.checkpoint, device=job.device)
    align = job.align.for_model(forward.supervised_attention)  # a guided model: its supervised heads
    layer, heads = check_layer_heads(align.layer, align.heads, forward.model)  # before adapting: errors first
    backward = None
    if job.backward_checkpoint:
        backward = Translator.from_checkpoint(job.backward_checkpoint, device=job.device)
        if job.adapt_steps:  # its checks (direction, layer, heads) before a minute of adapting
            BackwardAligner(forward, backward, job.align, batch_size=job.batch_size)
    systems: dict[str, list[set[Link]]] = {}
    for chunk in chunks(len(sources), job.adapt_pairs) if job.adapt_steps else [range(len(sources))]:
        src, tgt = sources[chunk.start:chunk.stop], targets[chunk.start:chunk.stop]
        adapted = adapt(forward, src, tgt, job.adapt_steps, job.adapt_lr)
        adapted_backward = adapt(backward, tgt, src, job.adapt_steps, job.adapt_lr) if backward is not None else None
        for name, links in _links(job, adapted, adapted_backward, src, tgt, layer, heads, chunk.start).items():
            systems.setdefault(name, []).extend(links)
    if job.output:
        with atomic_output(job.output) as out:
            out.writelines(to_pharaoh(links) + "\n" for links in systems[chosen])
        LOGGER.info(f"align: the {chosen} links of {counted(len(sources), 'sentence pair')} written to {job.output}")
    if sure is None or possible is None:
        return {}
    scores = {name: alignment_error_rate(links, sure, possible) for name, links in systems.items()}
    print(score_table(scores, chosen))
    if job.json:
        print(json.dumps({name: vars(s) for name, s in scores.items()}))
    return scores


def _links(job: AlignJob, forward: Translator, backward: Translator | None, sources: list[str], targets: list[str],
           layer, heads, first: int) -> dict[str, list[set[Link]]]:
    """The links of every direction for these pairs (lines ``first`` + 1 on of the files): forward, and with a
    backward model backward and each symmetrization."""
    words = force_align_words(forward, sources, targets, layer, heads, job.batch_size,
                              names=(f"--source {job.source}", f"--target {job.target}"), first_line=first + 1)
    systems = {"forward": [extract_links(m, job.align.method, job.align.threshold) for m in words]}
    if backward is not None:
        aligner = BackwardAligner(forward, backward, job.align, batch_size=job.batch_size)
        back_words = aligner.backward_words(sources, targets)
        for rule in ("backward", "intersection", "grow-diag-final", "grow-diag-final-and", "agreement"):
            systems[rule] = [aligner.combined(f, m, b, rule=rule)
                             for f, m, b in zip(systems["forward"], words, back_words)]
    return systems


def score_table(scores: dict[str, AlignmentScores], chosen: str) -> str:
    """The scores as a markdown table; an undefined precision or recall (0/0) is "n/a"."""
    number = lambda value: "n/a" if value is None else f"{value:.4f}"  # noqa: E731
    rows = [[name + (" (--output)" if name == chosen else ""), number(s.precision), number(s.recall),
             number(s.aer), s.predicted, s.sure, s.possible] for name, s in scores.items()]
    return markdown_table(["links", "precision", "recall", "AER", "predicted", "sure", "possible"], rows)
