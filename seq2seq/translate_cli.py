"""What translate.py does: stream lines through a Translator, write outputs, alignments, plots, scores.

Input is read and translated in chunks (one line at a time when stdin is a terminal), so the
command works as an interactive filter and on files larger than memory; outputs are flushed
after each chunk and always come out in input order, one line per input line.
"""
from __future__ import annotations

import argparse
import sys
from contextlib import ExitStack
from pathlib import Path

from .errors import UserError
from .evaluation import corpus_scores
from .io_utils import atomic_output, chunks
from .translator import Translation, Translator, read_lines


def translate_stream(args: argparse.Namespace) -> list[Translation]:
    translator = Translator.from_checkpoint(args.checkpoint, device=args.device,
                                            max_input_tokens=args.max_input_tokens)
    references = list(read_lines(args.reference)) if args.reference else None
    need_attention = bool(args.alignments or args.plot_dir)
    interactive = args.input in (None, "-") and sys.stdin.isatty()
    chunk_size = 1 if interactive else args.batch_size * 16
    texts: list[str] = []
    with ExitStack() as stack:
        out = stack.enter_context(atomic_output(args.output))
        sink = stack.enter_context(_alignment_sink(args, translator)) if need_attention else None
        for chunk in chunks(read_lines(args.input), chunk_size):
            results = translator.translate(
                chunk, beam_size=args.beam_size, length_penalty=args.length_penalty, n_best=args.n_best,
                batch_size=args.batch_size, max_len_ratio=args.max_len_ratio, need_attention=need_attention,
                first_line=len(texts) + 1,
            )
            _write_results(out, results, len(texts), args.n_best)
            if sink is not None:
                sink.add(results, first_index=len(texts))
            texts.extend(r.text for r in results)
    if references is not None:
        _print_scores(texts, references, args)
    return texts


def _write_results(out, results: list[Translation], offset: int, n_best: int) -> None:
    for i, result in enumerate(results):
        if n_best == 1:
            out.write(result.text + "\n")
        else:
            for alt in result.alternatives or [result]:
                out.write(f"{offset + i} ||| {alt.text} ||| {alt.score:.4f}\n")
    out.flush()


def _print_scores(texts: list[str], references: list[str], args: argparse.Namespace) -> None:
    if len(texts) != len(references):
        raise UserError(f"--reference {args.reference} has {len(references)} lines but the input "
                        f"{args.input} has {len(texts)}; they must match line by line")
    for score in corpus_scores(texts, references, ("bleu", "chrf")).values():
        print(str(score), file=sys.stderr)


class _alignment_sink:
    """Collects translations for --alignments (JSONL + npz) and --plot-dir (heatmaps)."""

    def __init__(self, args: argparse.Namespace, translator: Translator) -> None:
        from .alignment import AlignmentWriter

        self.args = args
        self.layer = parse_layer(args.layer)
        self.heads = parse_heads(args.heads)
        self.writer = None
        if args.alignments:
            path = Path(args.alignments)
            self.writer = AlignmentWriter(path, path.with_suffix(".npz"), layer=self.layer, heads=self.heads)

    def __enter__(self):
        if self.writer is not None:
            self.writer.__enter__()
        return self

    def __exit__(self, *exc):
        if self.writer is not None:
            return self.writer.__exit__(*exc)
        return False

    def add(self, results: list[Translation], first_index: int) -> None:
        from .plotting import plot_records

        records = [r.alignment_record(first_index + i, self.layer, self.heads)
                   for i, r in enumerate(results) if r.attention is not None]
        if self.writer is not None:
            for record in records:
                self.writer.write(record)
        if self.args.plot_dir:
            plot_records(records, self.args.plot_dir)


def parse_layer(value: str) -> int | str:
    if value == "all":
        return value
    try:
        return int(value)
    except ValueError:
        raise UserError(f"--layer must be an integer layer index or 'all', got {value!r}") from None


def parse_heads(value: str) -> str | list[int]:
    if value == "mean":
        return value
    try:
        return [int(h) for h in value.split(",")]
    except ValueError:
        raise UserError(f"--heads must be 'mean' or comma-separated integers like 0,2, got {value!r}") from None
