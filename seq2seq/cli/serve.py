"""``seq2seq serve``: an HTTP JSON API over a trained checkpoint (needs the serve extra:
pip install 'seq2seq[serve]'). Concurrent requests are translated together (dynamic batching).

    seq2seq serve --checkpoint RUN                       # http://127.0.0.1:8000, docs at /docs
    curl -s localhost:8000/translate -H 'Content-Type: application/json' \\
         -d '{"sentences": ["Ein Hund rennt."], "n_best": 2, "alignments": true}'
    seq2seq serve --checkpoint RUN --host 0.0.0.0 --port 8080 --max-batch-sentences 32 --max-wait-ms 5
    seq2seq serve --model transformer=RUN_T --model rnn=RUN_R   # side by side; the page at / shows both

The page at / (--no-ui: none) translates what you type with every served model and shows each one's
attention (layers, heads, words, subwords) and, on request, its attribution.

SIGINT / SIGTERM stop it gracefully: no new connections, the requests in flight are answered, exit 0.
API, limits and the load test: docs/guides/serving.md.
"""
from __future__ import annotations

import dataclasses
import os

from ..config import AttributionConfig
from ..errors import UserError
from ..runtime import LOGGER
from .translate import ATTRIBUTION_METHODS
from .common import (
    add_alignment_flags, add_backward_flags, add_dataclass_flags, add_decode_flags, add_device_flag, align_config,
    decode_config, parser_for, run_cli,
)

API_KEY_ENV = "SEQ2SEQ_API_KEY"
#: the ``DecodeConfig`` fields that are ``serve`` flags: the defaults of requests that set none of their own
DECODE_FLAGS = ("beam_size", "length_penalty", "n_best", "max_output_ratio", "max_input_tokens")
MISSING_EXTRA = "seq2seq serve needs the serve extra: pip install 'seq2seq[serve]'"


def parse_args(argv: list[str] | None):
    from ..serve.settings import Limits

    p = parser_for("serve", __doc__)
    p.add_argument("--checkpoint", nargs="+", action="extend", metavar="CHECKPOINT",
                   help="a .pt checkpoint or a run directory (uses best.pt); several: their ensemble "
                        "(as seq2seq translate --checkpoint). Served as the model named 'default'")
    p.add_argument("--model", action="append", default=[], metavar="NAME=CHECKPOINT[,CHECKPOINT...]",
                   help="serve this checkpoint (several, comma-separated: their ensemble) as the model NAME, beside "
                        "the others: repeat the flag for models side by side (--model transformer=RUN_T --model "
                        "rnn=RUN_R); requests choose one by name (\"model\": NAME), the first (--checkpoint's, "
                        "else the first --model) answers those that name none")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default: 127.0.0.1, this machine only; 0.0.0.0: every interface)")
    p.add_argument("--port", type=int, default=8000, help="TCP port (default: 8000; 0: any free port, logged)")
    p.add_argument("--api-key", metavar="KEY", default=None,
                   help=f"requests to /translate, /alignments and /attribution must carry this key ('Authorization: "
                        f"Bearer KEY' or 'X-API-Key: KEY'; 401 otherwise; the page asks for it); default: the "
                        f"environment variable {API_KEY_ENV}, which other users cannot read in the process list as "
                        "they can a flag. /health, /docs, /models and the page itself stay open")
    add_device_flag(p)
    p.add_argument("--precision", default="fp32", choices=["fp32", "fp16", "bf16", "int8"],
                   help="decoding precision, as seq2seq translate --precision (default: fp32); with int8 a "
                        "translation can depend on the sentences batched with it")
    p.add_argument("--engine", choices=("seq2seq", "ctranslate2", "auto"), default="auto",
                   help="who runs the search, as seq2seq translate --engine; auto (default): CTranslate2 where it "
                        "can decode the model and is installed (the log and /health say which), else ours")
    p.add_argument("--compile", choices=["auto", "on", "off"], default="auto",
                   help="decode requests of one sentence with the Transformer's decoding step compiled "
                        "(torch.compile; about 2x faster), compiled in the background from start-up for the "
                        "default beam size and greedy search (30-90 s each) while requests are answered "
                        "uncompiled; GET /health says when it is live. auto (default): on for fp32 on CPU")
    p.add_argument("--compile-cache", metavar="DIR", default="auto",
                   help="keep the Transformer's compiled decoding step in DIR (AOTInductor packages): a later start "
                        "of the same model loads it in a fraction of a second instead of compiling it again. auto "
                        "(default): compiled/ beside the (first) checkpoint where that can be written; none: "
                        "compile anew at every start")
    p.add_argument("--shortlist", nargs="?", const="auto", default=None, metavar="FILE",
                   help="decode over a lexical shortlist, as seq2seq translate --shortlist (no FILE: the run's)")
    p.add_argument("--shortlist-sizes", nargs=2, type=int, metavar=("K", "N"), default=None,
                   help="with --shortlist: K translations per source token and the N most frequent target tokens")
    d = p.add_argument_group("decoding", "Defaults for requests that do not set beam_size / n_best / length_penalty "
                                         "(the same as seq2seq translate's).")
    add_decode_flags(d, DECODE_FLAGS)
    add_dataclass_flags(p.add_argument_group("batching and limits"), Limits)
    a = p.add_argument_group("alignments", 'How attention becomes the alignments of requests with "alignments": true.')
    add_alignment_flags(a, include_eos=True)
    add_backward_flags(a)
    u = p.add_argument_group("the page", "The page at / and the endpoints behind it (docs/guides/serving.md).")
    u.add_argument("--no-ui", dest="ui", action="store_false",
                   help="serve the JSON API alone: no page at / (its endpoints /models, /alignments and "
                        "/attribution stay)")
    u.add_argument("--markup", choices=("xml", "html"), default=None,
                   help="the page's input carries inline tags of this kind, shown carried across to each "
                        "translation (the API takes \"markup\" per request either way)")
    u.add_argument("--attribution", nargs="+", metavar="METHOD", default=list(ATTRIBUTION_METHODS),
                   choices=(*ATTRIBUTION_METHODS, "none"),
                   help="the attribution methods POST /attribution and the page may run (default: all, each where "
                        "the model allows it; none: no attribution): " + " | ".join(ATTRIBUTION_METHODS))
    u.add_argument("--ig-steps", type=int, default=AttributionConfig.ig_steps,
                   help=f"integration steps for integrated-gradients (default: {AttributionConfig.ig_steps})")
    u.add_argument("--attribution-samples", type=int, default=AttributionConfig.samples,
                   help="perturbed sources per sentence for lime and kernel-shap (default: "
                        f"{AttributionConfig.samples})")
    u.add_argument("--attribution-seed", type=int, default=AttributionConfig.seed,
                   help=f"seed of the lime and kernel-shap samples (default: {AttributionConfig.seed})")
    p.add_argument("--quiet", action="store_true", help="log warnings only (no request log)")
    return p.parse_args(argv)


def model_specs(args) -> list[tuple[str, list[str]]]:
    """(name, checkpoints) of every model to serve, in order: --checkpoint's as 'default', then each --model
    NAME=A[,B]; a UserError for none, a malformed --model, or names that are not ``check_names``'."""
    from ..serve.models import DEFAULT_NAME, check_names

    specs = [(DEFAULT_NAME, list(args.checkpoint))] if args.checkpoint else []
    for given in args.model:
        name, _, paths = given.partition("=")
        checkpoints = [path.strip() for path in paths.split(",") if path.strip()]
        if not name.strip() or not checkpoints:
            raise UserError(f"--model {given}: give NAME=CHECKPOINT (a .pt file or run directory; several, "
                            "comma-separated: their ensemble), e.g. --model rnn=runs/rnn")
        specs.append((name.strip(), checkpoints))
    if not specs:
        raise UserError("give the model to serve: --checkpoint RUN, or --model NAME=RUN (repeated for models side "
                        "by side)")
    check_names([name for name, _ in specs])
    return specs


def attribution_config(args) -> AttributionConfig:
    """The attribution the server offers (--attribution, --ig-steps, --attribution-samples, --attribution-seed;
    the numbers are checked by ``Explainer``)."""
    methods = [] if "none" in args.attribution else list(dict.fromkeys(args.attribution))
    if "none" in args.attribution and len(args.attribution) > 1:
        raise UserError("--attribution none means no attribution: give it alone, or name the methods")
    return AttributionConfig(methods=methods, ig_steps=args.ig_steps, samples=args.attribution_samples,
                             seed=args.attribution_seed)


def api_key(args) -> str | None:
    """--api-key, else $SEQ2SEQ_API_KEY (unset or empty: none), checked: visible ASCII, as HTTP
    headers carry it (the message never shows the key)."""
    key, source = args.api_key, "--api-key"
    if key is None:
        key, source = os.environ.get(API_KEY_ENV), API_KEY_ENV
    if args.api_key is None and not key:
        return None
    if not key or not all("!" <= c <= "~" for c in key):
        raise UserError(f"{source} must be a non-empty string of visible ASCII characters (no spaces), as HTTP headers "
                        "carry it; generate one with: python -c 'import secrets; print(secrets.token_urlsafe(32))'")
    return key


def limits_from_args(args):
    """The ``Limits`` the flags give (unset flags: the defaults), checked."""
    from ..serve.settings import Limits

    limits = Limits(**{f.name: getattr(args, f.name) for f in dataclasses.fields(Limits) if hasattr(args, f.name)})
    limits.validate()
    return limits


def compile_cache(flag: str, checkpoints: list[str]) -> str | None:
    """``--compile-cache``: a directory, ``none``, or ``auto``: ``compiled/`` beside the first checkpoint
    (``checkpoint.file.compile_cache_beside``), or none where that cannot be written."""
    if flag == "none":
        return None
    if flag != "auto":
        return flag
    from ..checkpoint.file import compile_cache_beside

    folder = compile_cache_beside(checkpoints[0])
    if folder is None:
        LOGGER.info(f"serve: {checkpoints[0]}'s directory cannot be written: the compiled decoding step is not kept "
                    "(--compile-cache DIR keeps it elsewhere)")
    return None if folder is None else str(folder)


@run_cli
def main(argv: list[str] | None = None) -> int:
    from ..serve.settings import ServeSettings

    args = parse_args(argv)
    limits = limits_from_args(args)
    key = api_key(args)
    align = align_config(args)
    decode = limits.allowed(decode_config(args))
    attribution = attribution_config(args)
    if not 0 <= args.port <= 65535:
        raise UserError(f"--port must be in 0..65535, got {args.port}")
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        raise UserError(MISSING_EXTRA) from None
    from ..serve.models import DEFAULT_NAME
    from ..serve.server import run_server

    specs = model_specs(args)
    backward = None
    if args.backward_checkpoint:  # one backward model for every served one
        from ..decoding.translator import Translator

        backward = Translator.from_checkpoint(args.backward_checkpoint, device=args.device)
    models = [served_model(name, checkpoints, args, decode, align, backward) for name, checkpoints in specs]
    explain = None
    if attribution.methods:
        from ..attribution.explain import Explainer

        explain = Explainer(attribution)
    settings = ServeSettings(limits=limits, decode=decode, align=align, precision=args.precision, api_key=key,
                             ui=args.ui, markup=args.markup, explain=explain)
    if len(models) == 1 and models[0].name == DEFAULT_NAME:  # one model: served as before (--checkpoint)
        only = models[0]
        settings.align = only.align
        run_server(only.translator, settings, args.host, args.port, args.quiet, only.compiling, only.backward)
    else:
        run_server(models, settings, args.host, args.port, args.quiet, None, None)
    return 0


def served_model(name: str, checkpoints: list[str], args, decode, align, backward_model=None):
    """One ``ServedModel``: its translator (as the flags say), its compiled decoding started in the background
    where it pays, ``backward_model`` (--backward-checkpoint's) as its backward aligner, and the alignment
    settings checked against it."""
    from ..alignment.matrices import check_layer_heads
    from ..decoding.translator import Translator
    from ..models.compiled import compile_pays
    from ..serve.app import lone_sentence_threads
    from ..serve.models import DEFAULT_NAME, ServedModel

    translator = Translator.from_checkpoints(checkpoints, decode=decode, device=args.device,
                                             precision=args.precision, shortlist=args.shortlist,
                                             shortlist_sizes=args.shortlist_sizes, engine=args.engine)
    compiling = None
    if args.compile == "on" and translator.engine is not None:
        raise UserError(f"--compile on compiles our engine's decoding step; the server runs CTranslate2's search "
                        f"(--engine {args.engine}): use --engine seq2seq, or drop --compile on")
    wanted = args.compile == "on" or (args.compile == "auto" and compile_pays(translator.device, args.precision))
    if wanted and translator.engine is None:  # compiled decoding is our engine's
        translator.compile_cache = compile_cache(args.compile_cache, checkpoints)
        # as lone requests will run it, on their thread count; the server listens meanwhile
        compiling = translator.compile_in_background(sorted({1, decode.beam}), lone_sentence_threads(translator))
    backward = None
    if backward_model is not None:  # with the align options as given: it reads its own supervised heads
        from ..decoding.forced_alignment import BackwardAligner

        backward = BackwardAligner(translator, backward_model, align, args.symmetrize)
    own = align.for_model(translator.supervised_attention)  # a guided model: its supervised heads
    try:
        check_layer_heads(own.layer, own.heads, translator.model)
    except UserError as exc:
        raise (exc if name == DEFAULT_NAME else UserError(f"{exc} (model {name})")) from None
    return ServedModel(name, translator, own, compiling, backward)
