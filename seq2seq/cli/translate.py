"""``seq2seq translate``: translate text with a trained checkpoint; a Unix filter without --input/--output.

    echo "Ein Hund läuft." | seq2seq translate --checkpoint checkpoints/run/best.pt
    seq2seq translate --checkpoint RUN --input test.de --output test.hyp --reference test.en
    seq2seq translate --checkpoint RUN --input test.de --alignments align.jsonl --plot-dir plots/
    seq2seq translate --checkpoint RUN --input test.de --alignments align.jsonl --attribution gradient occlusion
    seq2seq translate --checkpoint RUN --input test.de --html view.html --attribution gradient
    seq2seq translate --checkpoint RUN --input mono.de --sample --top-p 0.9 --seed 1   # back-translation
    seq2seq translate --checkpoint RUN_RNN RUN_TRANSFORMER --input test.de              # an ensemble
"""
from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from ..config import AttributionConfig, check_decoding
from ..errors import UserError
from .common import (
    add_alignment_flags, add_backward_flags, add_decode_flags, add_device_flag, align_config, decode_config, parser_for,
    run_cli,
)

if TYPE_CHECKING:
    from ..jobs.translate import TranslateJob

#: ``seq2seq.attribution.base.METHODS``, spelled out so that parsing flags imports no torch (a test
#: keeps the two equal)
ATTRIBUTION_METHODS = ("gradient", "integrated-gradients", "occlusion", "grad-attention", "lime", "kernel-shap")


def parse_args(argv: list[str] | None):
    p = parser_for("translate", __doc__)
    p.add_argument("--checkpoint", required=True, nargs="+", action="extend", metavar="CHECKPOINT",
                   help="a .pt checkpoint or a run directory (uses best.pt); several (--checkpoint A B, or the "
                        "flag repeated): decode with their ensemble (at every step the mean of their "
                        "probabilities; any architectures sharing one SentencePiece model)")
    p.add_argument("--input", default="-", help="input file, one sentence per line (default: stdin)")
    p.add_argument("--output", default="-", help="output file (default: stdout); written atomically")
    add_decode_flags(p)
    add_device_flag(p)
    p.add_argument("--shortlist", nargs="?", const="auto", default=None, metavar="FILE",
                   help="decode each batch over the target tokens its sources can produce (a lexical "
                        "shortlist; faster, outputs may differ slightly). Without FILE: the run's "
                        "shortlist.npz next to the checkpoint (training writes it; build others with "
                        "seq2seq shortlist)")
    p.add_argument("--shortlist-sizes", nargs=2, type=int, metavar=("K", "N"), default=None,
                   help="with --shortlist: K translations per source token and the N most frequent "
                        "target tokens (default: 30 300; smaller is faster)")
    p.add_argument("--precision", default="fp32", choices=["fp32", "fp16", "bf16", "int8"],
                   help="decoding precision (default: fp32). fp16 / bf16: half-precision weights (fp16 "
                        "helps one-sentence-at-a-time CPU decoding, bf16 CPUs with native bf16); int8 "
                        "(CPU only): quantized linear layers. Outputs may differ slightly from fp32; "
                        "measured speeds: docs/performance.md")
    p.add_argument("--compile", action="store_true",
                   help="decode one sentence at a time (--batch-size 1) with the Transformer's encoder and decoding "
                        "step compiled ahead of time into compiled/ beside the checkpoint (--compile-cache; the RNN's "
                        "step: torch.compile): about 2x faster per sentence on CPU after a one-off compilation per "
                        "beam size that a later run loads instead; the first lines translate eagerly while it "
                        "compiles in the background, and the command waits for it at the end (docs/performance.md)")
    p.add_argument("--compile-cache", metavar="DIR",
                   help="with --compile (implied): keep the Transformer's compiled encoder and decoding step in DIR "
                        "(AOTInductor packages, ~30 MB per beam size), so that a later run loads them in a fraction "
                        "of a second instead of compiling them again; default with --compile: compiled/ beside the "
                        "checkpoint (where it can be written), as serve does; none: torch.compile, kept by no one")
    p.add_argument("--engine", choices=("seq2seq", "ctranslate2", "auto"), default="seq2seq",
                   help="who runs the search: seq2seq (ours, default), ctranslate2 (CTranslate2's runtime on the "
                        "checkpoint converted once into NAME.ct2 beside it, or into the user cache directory where the "
                        "checkpoint's directory is read-only; Transformers only, no constraints, "
                        "sampling, shortlist or ensembles; several times faster one sentence at a time on CPU) "
                        "or auto (ctranslate2 where it can, else ours). Alignments and confidence come from our "
                        "model either way")
    p.add_argument("--markup", choices=("xml", "html"),
                   help="input lines carry inline tags (<b>, <a href=...>, <br/>): they are removed, the text "
                        "translated, and each element put back around the target words aligned to the words it "
                        "enclosed; the output is always well formed (xml: broken markup is an error naming the "
                        "line; html: repaired). docs/guides/translating.md")
    p.add_argument("--reference", help="reference file: print sacrebleu BLEU and chrF with signatures")
    p.add_argument("--prefix", metavar="FILE",
                   help="target prefixes, one per input line (an empty line: none): each translation starts with "
                        "its prefix verbatim, the search continues from there; a prefix not ending in a space "
                        "may end inside a word, which the search completes")
    p.add_argument("--constraints", metavar="FILE",
                   help="terminology: per input line, the target phrases (tab-separated; an empty line: none) "
                        "that its translation must contain, each verbatim (constrained beam search with dynamic "
                        "beam allocation; with --beam-size 1 a constrained greedy search)")
    p.add_argument("--output-format", choices=("text", "jsonl"), default="text",
                   help="text: one translation per line (with --n-best: 'index ||| translation ||| score'); "
                        "jsonl: one JSON object per input with score, log_prob and each target piece's and "
                        "word's log-probability and entropy (how sure the model was; docs/formats.md)")
    a = p.add_argument_group(
        "alignments and attribution",
        "Attention is exported per sentence as the raw (layers, heads, tgt+1, src+1) array and as one "
        "aggregate matrix, merged to words, from which hard links are read.")
    a.add_argument("--alignments", metavar="FILE",
                   help="write alignments/attention as JSONL here (+ .npz arrays beside it), atomically")
    a.add_argument("--plot-dir", metavar="DIR",
                   help="write word-level heatmaps per sentence here: NNNNN.png/.svg, NNNNN_grid.png "
                        "(layers x heads, multi-head models), NNNNN_attribution.png (with --attribution)")
    a.add_argument("--html", metavar="FILE",
                   help="write an interactive viewer here: one self-contained HTML page (hover a target word to "
                        "see its source weights; layers, heads, attribution methods); see seq2seq view")
    a.add_argument("--max-plots", type=int, default=100,
                   help="plot at most this many sentences into --plot-dir, with a message when it cuts "
                        "(default: 100)")
    add_alignment_flags(a, include_eos=True)
    add_backward_flags(a)
    a.add_argument("--attribution", nargs="+", metavar="METHOD", choices=ATTRIBUTION_METHODS,
                   help="also compute attribution matrices (one or more of " + " | ".join(ATTRIBUTION_METHODS) +
                        "; grad-attention reads --align-layer / --align-heads; lime and kernel-shap need "
                        "pip install 'seq2seq[explain]') into the --alignments export and --plot-dir; see "
                        "docs/guides/attribution.md")
    a.add_argument("--contrast", metavar="FILE",
                   help="an alternative translation per input line (an empty line: none): --attribution then "
                        "explains why the model chose its output rather than that one, log p(y_t) - log p(y'_t) "
                        "position by position (not for grad-attention)")
    a.add_argument("--ig-steps", type=int, default=AttributionConfig.ig_steps,
                   help=f"integration steps for integrated-gradients (default: {AttributionConfig.ig_steps})")
    a.add_argument("--attribution-samples", type=int, default=AttributionConfig.samples,
                   help="perturbed sources per sentence for lime and kernel-shap; a source of M words needs at "
                        f"least 2 (M + 1) (default: {AttributionConfig.samples})")
    a.add_argument("--attribution-seed", type=int, default=AttributionConfig.seed,
                   help="seed of the lime and kernel-shap samples: the same seed gives the same attributions "
                        f"(default: {AttributionConfig.seed})")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    return p.parse_args(argv)


@run_cli
def main(argv: list[str] | None = None) -> int:
    job = job_from_args(parse_args(argv))
    from ..jobs.translate import translate_stream  # torch and the model code only once the flags are valid

    translate_stream(job)
    return 0


def compile_cache(flag: str | None, compile: bool, checkpoints: list[str]) -> str | None:
    """``--compile-cache``: a directory; ``none``: no packages (``torch.compile``); not given: with ``--compile``
    ``compiled/`` beside the first checkpoint (``checkpoint.file.compile_cache_beside``, as ``serve --compile-cache
    auto``), so that a second run loads what the first compiled; none where that cannot be written."""
    if flag == "none" or (flag is None and not compile):
        return None
    if flag is not None:
        return flag
    from ..checkpoint.file import compile_cache_beside

    folder = compile_cache_beside(checkpoints[0])
    return None if folder is None else str(folder)


def job_from_args(args: argparse.Namespace) -> TranslateJob:
    """The flags as a checked ``TranslateJob`` (torch and the model code are imported only once they are valid)."""
    align = align_config(args)
    check_decoding(args.beam_size, args.n_best, args.sample, args.top_k, args.top_p, args.temperature, args.seed)
    if args.ordered_constraints and not args.constraints:
        raise UserError("--ordered-constraints orders the phrases of --constraints FILE; give --constraints too")
    if args.max_plots < 0:
        raise UserError(f"--max-plots must be >= 0, got {args.max_plots}")
    from ..jobs.translate import TranslateJob

    attribution = AttributionConfig(methods=list(args.attribution or []), ig_steps=args.ig_steps,
                                    samples=args.attribution_samples, seed=args.attribution_seed)
    return TranslateJob(
        checkpoints=list(args.checkpoint), input=args.input, output=args.output, reference=args.reference,
        decode=decode_config(args), device=args.device, precision=args.precision, compile=args.compile,
        compile_cache=compile_cache(args.compile_cache, args.compile, args.checkpoint),
        engine=args.engine, shortlist=args.shortlist,
        shortlist_sizes=tuple(args.shortlist_sizes) if args.shortlist_sizes else None, alignments=args.alignments,
        plot_dir=args.plot_dir, html=args.html, max_plots=args.max_plots, align=align, attribution=attribution,
        output_format=args.output_format, markup=args.markup, prefix=args.prefix, contrast=args.contrast,
        constraints=args.constraints, backward_checkpoint=args.backward_checkpoint, symmetrize=args.symmetrize)
