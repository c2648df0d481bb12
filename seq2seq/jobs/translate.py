"""What ``seq2seq translate`` does: stream lines through a Translator, write outputs, alignments,
plots and scores.

Input is read and translated in chunks (one line at a time when stdin is a terminal), so the
command works as an interactive filter and on files larger than memory; outputs are flushed
after each chunk and always come out in input order, one line per input line. With --compile lone sentences
translate eagerly while their compiled step builds (or loads) in the background, awaited at the end for the next start.

With --alignments / --plot-dir every sentence's attention (and, with --attribution, the chosen
methods' attribution matrices of the chosen output) is exported as one JSONL
record (+ npz arrays) and plotted; see seq2seq/alignment/ and docs/formats.md for the
schema. The aggregate matrix defaults to the penultimate decoder layer averaged over heads
(--align-layer -2 --align-heads mean): Garg et al. (2019) found that layer's attention aligns
best; RNNs have one layer and use it; a model trained with guided alignment defaults to the layer
and heads it supervised (``AlignConfig.for_model``). EOS is dropped from matrices and links unless --include-eos.
With several checkpoints (an ensemble) the record's matrices and plots are the first checkpoint's
attention, and the record's ``members`` list (+ ``member{m}_attention`` npz arrays) holds every
member's, aggregated with the same options. With --n-best N the record is the best hypothesis and
its ``alternatives`` list (+ ``alt{rank}_attention`` npz arrays) holds hypotheses 2..N, each with its
own attention, matrices and links.
"""
from __future__ import annotations

import dataclasses
import sys
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from ..decoding.ensemble import EnsembleModel
from ..decoding.forced_alignment import BackwardAligner
from ..decoding.document import page_or_lines, translate_document
from ..decoding.markup import MODES as MARKUP_MODES, mark_translations, parse, parse_lines, plain_prefixes
from ..decoding.translation import EmptyOutputs
from ..decoding.setup import compile_conflict
from ..decoding.translator import Translation, Translator
from ..config import AlignConfig, AttributionConfig, DecodeConfig
from ..errors import UserError
from ..io_utils import atomic_output, chunks, counted, read_lines
from .outputs import write_jsonl, write_text
from ..metrics import corpus_scores
from ..runtime import LOGGER
from ..alignment.matrices import check_layer_heads
from ..models.compiled import BackgroundCompile

#: What an alignment record's ``members`` entries hold besides ``checkpoint`` (docs/formats.md).
MEMBER_KEYS = ("attention_shape", "layer_used", "subword_matrix", "word_matrix", "subword_shape", "word_shape",
               "pharaoh_subword", "pharaoh_word")
#: What an alignment record's ``alternatives`` entries (hypotheses 2..N of --n-best) hold besides ``rank``,
#: ``score`` and ``log_prob``: the hypothesis with its own attention and links (docs/formats.md).
ALTERNATIVE_KEYS = ("target", "tgt_pieces", "tgt_words", *MEMBER_KEYS)


@dataclass
class TranslateJob:
    """What ``seq2seq translate`` does, as typed options: which model(s), which files, how to search, what to
    export. ``input`` / ``output`` None or "-" are stdin / stdout."""

    checkpoints: list[str]
    input: str | None = "-"
    output: str | None = "-"
    reference: str | None = None  # print BLEU and chrF against this file
    prefix: str | None = None  # one target prefix per input line ("" = none): outputs start with it
    contrast: str | None = None  # one alternative translation per input line: contrastive attribution
    constraints: str | None = None  # per input line, tab-separated target phrases every output must contain
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    device: str = "auto"
    precision: str = "fp32"
    compile: bool = False  # compiled one-sentence-at-a-time decoding (Translator.from_checkpoints)
    compile_cache: str | None = None  # a directory keeping the compiled step for later runs (implies compile)
    engine: str = "seq2seq"  # who runs the search: seq2seq, ctranslate2 or auto (Translator.from_checkpoints)
    shortlist: str | None = None  # a file, or "auto": the run's shortlist.npz
    shortlist_sizes: tuple[int, int] | None = None
    alignments: str | None = None  # JSONL (+ .npz beside it)
    plot_dir: str | None = None
    html: str | None = None
    max_plots: int = 100
    output_format: str = "text"  # "jsonl": one JSON object per input with per-token confidence
    markup: str | None = None  # "xml" / "html": inline tags carried across by the alignments (decoding.markup)
    backward_checkpoint: str | None = None  # a target->source model: exported word links symmetrized
    symmetrize: str | None = None  # how (``SYMMETRIZATIONS``; None: ``BackwardAligner``'s measured defaults)
    align: AlignConfig = field(default_factory=AlignConfig)
    attribution: AttributionConfig = field(default_factory=AttributionConfig)

    @property
    def need_attention(self) -> bool:
        return bool(self.alignments or self.plot_dir or self.html)


def translate_stream(job: TranslateJob) -> int:
    """Run ``seq2seq translate``'s job; returns the number of input lines translated."""
    _check_attribution(job)
    _check_markup(job)
    decode = job.decode
    translator = Translator.from_checkpoints(job.checkpoints, decode=decode, device=job.device, precision=job.precision,
                                             shortlist=job.shortlist, compile=False, compile_cache=job.compile_cache,
                                             shortlist_sizes=job.shortlist_sizes, engine=job.engine)
    compiling = _compile_in_background(job, translator) if job.compile or job.compile_cache else None
    backward = _backward_aligner(job, translator)  # reads its own supervised attention: before for_model
    job = dataclasses.replace(job, align=job.align.for_model(translator.supervised_attention))
    interactive = job.input in (None, "-") and sys.stdin.isatty()
    chunk_size = 1 if interactive else decode.batch * 16
    document, lines = page_or_lines(job.input, "--input", job.markup == "html" and not interactive)
    if document is not None:
        _check_document(job)
    references = read_lines(job.reference, "--reference") if job.reference else None
    if references is not None and job.markup:  # scored as translated: the text without its tags
        references = [parse(line, job.markup, f"--reference line {k + 1}")[0] for k, line in enumerate(references)]
    per_line = {flag: (path, read_lines(path, flag))  # files with one line per input line
                for flag, path in (("--prefix", job.prefix), ("--contrast", job.contrast),
                                   ("--constraints", job.constraints)) if path}
    prefixes, contrasts, constraint_lines = (per_line[flag][1] if flag in per_line else None
                                             for flag in ("--prefix", "--contrast", "--constraints"))
    if prefixes is not None and job.markup:
        prefixes = plain_prefixes(prefixes, job.markup)
    constraints = None if constraint_lines is None else [line.split("\t") for line in constraint_lines]
    texts: list[str] = []  # kept only for --reference scoring
    empty = EmptyOutputs()  # inputs with text translated to nothing: said once, at the end
    done = 0
    with ExitStack() as stack:
        out = stack.enter_context(atomic_output(job.output))
        if document is not None:
            out.write(translate_document(translator, document, decode, job.align, backward=backward))
            return document.count("\n")
        sink = (stack.enter_context(_alignment_sink(job, translator, contrasts, backward)) if job.need_attention
                else None)
        for chunk in chunks(lines, chunk_size):
            _check_per_line(per_line, job.input, done + len(chunk), final=False)
            parsed = parse_lines(chunk, job.markup, done + 1) if job.markup else None
            results = translator.translate(
                chunk if parsed is None else [text for text, _ in parsed], decode,
                prefix=None if prefixes is None else prefixes[done:done + len(chunk)],
                constraints=None if constraints is None else constraints[done:done + len(chunk)],
                need_attention=job.need_attention or parsed is not None, first_line=done + 1,
                confidence=job.output_format == "jsonl" or bool(job.html),  # the viewer shades by it
            )
            marked = None if parsed is None else mark_translations(results, parsed, job.align, backward)
            if job.output_format == "jsonl":
                write_jsonl(out, results, done, marked, chunk)
            else:
                write_text(out, results, done, decode.n_best, marked)
            if sink is not None:
                sink.add(results, first_index=done)
            if references is not None:
                texts.extend(r.text for r in results)
            empty.add(results)
            done += len(results)
        _check_per_line(per_line, job.input, done, final=True)  # inside the block: nothing is written
    if compiling is not None and compiling.status == "compiling":  # finished, so the next start loads it
        LOGGER.info("translate: the compiled step is still compiling; waiting for it"
                    + (f", to keep it in {job.compile_cache} for the next start" if job.compile_cache else ""))
        compiling.wait()
    if empty.warning():
        LOGGER.warning(empty.warning())
    if references is not None:
        _print_scores(texts, references, job)
    return done


def _compile_in_background(job: TranslateJob, translator: Translator) -> BackgroundCompile:
    """--compile: lone sentences' step compiled in the background, the first translated eagerly meanwhile."""
    if translator.engine is not None:
        raise compile_conflict(job.engine)
    return translator.compile_in_background([job.decode.beam_size or 1], threads=torch.get_num_threads())


def _check_per_line(per_line: dict[str, tuple[str, list[str]]], source: str | None, seen: int, final: bool) -> None:
    """Files with one line per input line (``--prefix``, ``--contrast``, ``--constraints``) must have as many
    as the input: more input than lines as soon as it shows, fewer at the end."""
    for flag, (path, lines) in per_line.items():
        if seen > len(lines) or (final and seen != len(lines)):
            count = f"{seen}" if final else "more"
            raise UserError(f"{flag} {path} has {counted(len(lines), 'line')} but the input {_name(source)} has "
                            f"{count}; give one line per input line (an empty line: none)")


def _name(path: str | None) -> str:
    return "(standard input)" if path in (None, "-") else str(path)


def _backward_aligner(job: TranslateJob, translator: Translator) -> BackwardAligner | None:
    """--backward-checkpoint's model, checked against the forward one, or None."""
    if not job.backward_checkpoint:
        return None
    if not job.need_attention and not job.markup:
        raise UserError("--backward-checkpoint symmetrizes the word links of --alignments, --html, --plot-dir or "
                        "--markup: give one of them too")
    backward = Translator.from_checkpoint(job.backward_checkpoint, device=job.device)
    return BackwardAligner(translator, backward, job.align, job.symmetrize, batch_size=job.decode.batch)


def _check_markup(job: TranslateJob) -> None:
    """--markup's mode is known before any model loads."""
    if job.markup is not None and job.markup not in MARKUP_MODES:
        raise UserError(f"--markup must be one of {', '.join(MARKUP_MODES)}, got {job.markup!r}")


def _check_document(job: TranslateJob) -> None:
    """An HTML document in comes out as the same document translated: the options that write or read
    something per input line are named."""
    others = {"--n-best": job.decode.n_best > 1, "--output-format jsonl": job.output_format == "jsonl",
              "--alignments": job.alignments, "--plot-dir": job.plot_dir, "--html": job.html,
              "--reference": job.reference, "--prefix": job.prefix, "--constraints": job.constraints,
              "--contrast": job.contrast}
    clash = [flag for flag, given in others.items() if given]
    if clash:
        raise UserError(f"--input {job.input} is an HTML document, translated into the same document; it does not "
                        f"combine with {', '.join(clash)}, which work per line: give the sentences one per line "
                        f"(inline tags kept with --markup html), or drop {'it' if len(clash) == 1 else 'them'}")


def _check_attribution(job: TranslateJob) -> None:
    methods = job.attribution.methods
    if job.contrast and not methods:
        raise UserError("--contrast explains translations against alternatives: it needs --attribution METHOD "
                        "(gradient, integrated-gradients, occlusion, lime or kernel-shap)")
    if job.contrast and "grad-attention" in methods:
        raise UserError("--contrast: grad-attention has no contrastive form; use gradient, integrated-gradients, "
                        "occlusion, lime or kernel-shap")
    if methods and not job.need_attention:
        raise UserError("--attribution needs --alignments FILE, --plot-dir DIR and/or --html FILE to write its "
                        "matrices to")
    from ..attribution.base import GRADIENT_METHODS
    from ..attribution.perturbation import METHODS as PERTURBATION_METHODS, min_samples

    gradients = [method for method in GRADIENT_METHODS if method in methods]
    if gradients and len(job.checkpoints) > 1:
        raise UserError(f"--attribution {' '.join(gradients)} differentiates one model; with several "
                        "--checkpoint (an ensemble) use --attribution occlusion, lime or kernel-shap")
    if gradients and job.precision == "int8":
        raise UserError(f"--attribution {' '.join(gradients)} differentiates the model, and --precision int8 "
                        "layers have no gradients; use --attribution occlusion, lime or kernel-shap, or "
                        "--precision fp32")
    if "integrated-gradients" in methods and job.attribution.ig_steps < 1:
        raise UserError(f"--ig-steps must be >= 1, got {job.attribution.ig_steps}")
    if set(PERTURBATION_METHODS) & set(methods) and job.attribution.samples < min_samples(1):
        raise UserError(f"--attribution-samples must be >= {min_samples(1)} (2 (words + 1) for a one-word "
                        f"source), got {job.attribution.samples}")


def _print_scores(texts: list[str], references: list[str], job: TranslateJob) -> None:
    if len(texts) != len(references):
        raise UserError(f"--reference {job.reference} has {counted(len(references), 'line')} but the input "
                        f"{job.input} has {len(texts)}; they must match line by line")
    for score in corpus_scores(texts, references, ("bleu", "chrf")).values():
        print(str(score), file=sys.stderr)


class _alignment_sink:
    """Collects translations for --alignments (JSONL + npz), --plot-dir (heatmaps) and --html (the viewer,
    with every layer and head); with --attribution also computes and exports/plots attribution matrices."""

    def __init__(self, job: TranslateJob, translator: Translator, contrasts: list[str] | None = None,
                 backward: BackwardAligner | None = None) -> None:
        from ..alignment.records import AlignmentWriter

        self.job, self.translator, self.contrasts, self.backward = job, translator, contrasts, backward
        self.layer, self.heads = check_layer_heads(job.align.layer, job.align.heads, translator.model)
        self.align = dataclasses.replace(job.align, layer=self.layer, heads=self.heads)  # checked against the model
        self.members: list[tuple[str, object]] = []  # (checkpoint, model) of every ensemble member
        if isinstance(translator.model, EnsembleModel):
            names = translator.checkpoints or [f"member {m}" for m in range(len(translator.model.members))]
            self.members = list(zip(names, translator.model.members))
            for name, member in self.members:
                try:
                    check_layer_heads(job.align.layer, job.align.heads, member)
                except UserError as exc:
                    raise UserError(f"{exc} (ensemble member {name})") from None
        self.options = job.align.link_options()
        self.methods = list(dict.fromkeys(job.attribution.methods))
        self.plottable = 0  # sentences with attention seen so far (--max-plots of them are plotted)
        self.writer = None
        if job.alignments:
            path = Path(job.alignments)
            if path.suffix == ".npz":
                raise UserError(f"--alignments {path}: give the JSONL path (e.g. align.jsonl); the "
                                ".npz arrays are written beside it")
            self.writer = AlignmentWriter(path, path.with_suffix(".npz"), self.align)
        self.viewer = None
        if job.html:
            from ..alignment.viewer import ViewerWriter

            name = "standard input" if job.input in (None, "-") else Path(job.input).name
            self.viewer = ViewerWriter(job.html, f"seq2seq translate: {name}")

    def __enter__(self):
        with ExitStack() as stack:
            for writer in (self.writer, self.viewer):
                if writer is not None:
                    stack.enter_context(writer)
            self._stack = stack.pop_all()
        return self

    def __exit__(self, *exc):
        return self._stack.__exit__(*exc)

    def add(self, results: list[Translation], first_index: int) -> None:
        records = [self._record(result, first_index + i) for i, result in enumerate(results)]
        if self.backward is not None:
            self._symmetrize(records)
        for result, record in zip(results, records):
            attributions = self._attributions(result, record) if result.attention is not None else []
            if self.writer is not None:
                self.writer.write(record)
            if self.viewer is not None:
                self.viewer.add(record.to_json(), record.attention)
            if self.job.plot_dir and result.attention is not None:
                self.plottable += 1
                if self.plottable <= self.job.max_plots:
                    self._plot(record, attributions)
                elif self.plottable == self.job.max_plots + 1:  # thousands of files for a large input
                    LOGGER.warning(f"--plot-dir: plotted the first {counted(self.job.max_plots, 'sentence')} "
                                   "(--max-plots); the rest are translated (and exported with --alignments) but not "
                                   "plotted")

    def _record(self, result: Translation, index: int):
        from ..alignment.records import AlignmentRecord

        if result.attention is not None:
            record = result.alignment_record(index, self.layer, self.heads, **self.options)
        else:
            record = self._empty_record(result, index, self.translator.model)
        if result.token_log_probs is not None:
            record.extra["confidence"] = result.confidence()
        if self.members:
            record.extra["members"] = []
            for m, (name, member) in enumerate(self.members):
                if result.member_attention is None:
                    own = self._empty_record(result, index, member)
                else:
                    own = AlignmentRecord.build(index, result.source, result.text, result.src_pieces,
                                                result.tgt_pieces, result.member_attention[m], self.align)
                fields = own.to_json()
                record.extra["members"].append({"checkpoint": name, **{key: fields[key] for key in MEMBER_KEYS}})
                record.extra_arrays[f"member{m}_attention"] = own.attention
        if len(result.alternatives) > 1:  # --n-best: every hypothesis with its own attention and links
            record.extra["alternatives"] = []
            for rank, alternative in enumerate(result.alternatives[1:], start=2):
                if alternative.attention is None:
                    own = self._empty_record(alternative, index, self.translator.model)
                else:
                    own = alternative.alignment_record(index, self.layer, self.heads, **self.options)
                fields = own.to_json()
                record.extra["alternatives"].append({"rank": rank, "score": alternative.score,
                                                     "log_prob": alternative.log_prob,
                                                     **{key: fields[key] for key in ALTERNATIVE_KEYS}})
                record.extra_arrays[f"alt{rank}_attention"] = own.attention
        return record

    def _symmetrize(self, records: list) -> None:
        """--backward-checkpoint: each record's word links become the symmetrized ones; the forward and
        backward links are kept beside them (``forward_pharaoh_word``, ``backward_pharaoh_word``)."""
        chosen = [r for r in records if r.source.strip() and r.target.strip()]
        fields = self.backward.symmetrized_fields([r.source for r in chosen], [r.target for r in chosen],
                                                  [r.pharaoh_word for r in chosen], [r.words for r in chosen])
        for record, own in zip(chosen, fields):
            record.pharaoh_word = own.pop("pharaoh_word")
            record.extra.update(own)

    def _empty_record(self, result: Translation, index: int, model):
        """Empty input: an empty record keeps one JSONL line per input."""
        from ..alignment.records import NO_EOS, AlignmentRecord

        empty = np.zeros((model.attention_layers, model.attention_heads, 0, 0), dtype=np.float32)
        return AlignmentRecord.build(index, result.source, result.text, [], [], empty, self.align, NO_EOS)

    def _attributions(self, result: Translation, record) -> list:
        """Attribution records of ``result``; stored in ``record``'s extra JSON keys / npz arrays."""
        from ..attribution.attribute import attribute_translation

        out = []
        line = self.contrasts[record.index].strip() if self.contrasts is not None else ""
        contrast = line or None  # an empty line: no contrast for this sentence
        for name in self.methods:
            attribution = attribute_translation(self.translator, result, name, self.job.attribution, self.align,
                                                contrast=contrast)
            attr_record = attribution.record_for(result, record.index, **self.options)
            record.extra.setdefault("attribution", {})[name] = attribution.to_json(attr_record)
            record.extra_arrays[f"attr_{name}_raw"] = attribution.raw
            record.extra_arrays[f"attr_{name}"] = attr_record.subword.astype(np.float32)
            record.extra_arrays[f"attr_{name}_words"] = attr_record.words.astype(np.float32)
            out.append((name, attr_record))
        return out

    def _plot(self, record, attributions: list) -> None:
        """``{index:05d}.png/.svg`` (+ ``_grid.png``) and, with attributions, a side-by-side
        ``{index:05d}_attribution.png``: attention | each method, word level, same colour scale."""
        from ..alignment.plotting import plot_records, plot_side_by_side

        out = Path(self.job.plot_dir)
        plot_records([record], out)
        if attributions:
            heads = record.heads if isinstance(record.heads, str) else ",".join(map(str, record.heads))
            titles = [f"attention (layer {record.layer_used}, heads {heads})"] + [n for n, _ in attributions]
            matrices = [record.words] + [r.words for _, r in attributions]
            plot_side_by_side(matrices, titles, record.src_words, [record.tgt_words] * len(matrices),
                              out / f"{record.index:05d}_attribution.png")
