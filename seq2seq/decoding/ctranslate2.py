"""CTranslate2 as a decoding engine (``--engine ctranslate2``; the ``export`` extra): greedy and beam
search run by CTranslate2's C++ runtime on the checkpoint converted into its format
(``seq2seq.checkpoint.ctranslate2``) once and cached beside it, or in the user's cache directory where
its directory cannot be written (``cached_export``).

Only the search changes engine. Everything around it stays the ``Translator``'s: tokenization,
batching, empty lines, the length bound, the ``Translation`` records, and the attention and
confidence of the outputs, computed by one teacher-forced pass of our own model over the chosen
outputs, as for our search (every layer and head, so a guided model's supervised heads align as
they do with our engine). Why an engine at all: one sentence at a time on a CPU, CTranslate2 decodes
several times faster than our eager step (docs/performance.md, bench-results/ctranslate2*.md).

The same outputs: CTranslate2 adds the source EOS and starts from ``<s>`` as we do, bounds outputs at
the same ceil(ratio x source subwords) + 10 (sentences grouped by their bound), allows an empty
output, and ranks by log-probability when the length penalty is 0, so both engines choose the same
outputs (but for ties within float error; tests/test_export.py). CTranslate2's length penalty is
another function (log p / |Y|^alpha) than ours (GNMT, ``generator.length_penalty_gnmt``), so with
alpha > 0 its beam keeps every hypothesis (``num_hypotheses`` = beam size, ranked by log-probability)
and they are re-ranked here by GNMT: ours, except where its search pruned a hypothesis ours kept.
A target prefix is forced as its pieces (``target_prefix``): where it ends inside a word, CTranslate2
completes the word after that piece (ours searches every piece that extends it).

What it cannot do is a named error that says which engine can (``unsupported``): RNN models (no
recurrent models in CTranslate2), ensembles, constraints, sampling (our seeded per-sentence streams),
a shortlist, a sparse attention normalizer.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import time
from pathlib import Path
from typing import Sequence

from ..checkpoint.ctranslate2 import not_convertible
from ..config import DecodeConfig, ModelConfig
from ..errors import UserError
from ..runtime import LOGGER, log
from ..tokenizer import EOS_ID, Tokenizer
from .generator import Hypothesis, length_penalty_gnmt

ENGINES = ("seq2seq", "ctranslate2", "auto")
PROBE_SOURCE = "Zwei junge Männer stehen vor einem großen Gebäude und sehen sich eine Karte an."  # any text will do
PROBE_STEPS = 24  # output steps of the thread-count probe (``CTranslate2Search.fastest``)
#: CTranslate2's ``compute_type`` for each ``--precision``
COMPUTE_TYPES = {"fp32": "float32", "int8": "int8", "fp16": "float16", "bf16": "bfloat16"}
SOURCE_FILE = "source.json"  # in a cached export: the checkpoint it was converted from (path, size, mtime)
#: under the user's cache directory (``user_cache_dir``): the conversions of checkpoints in read-only directories
CACHE_FOLDER = "ctranslate2"


def unsupported(model: ModelConfig, members: int, shortlist: bool) -> str | None:
    """Why CTranslate2 cannot decode this model setup (None: it can), worded for a message that
    goes on "; use --engine seq2seq": an ensemble, a shortlist, or what the conversion cannot represent
    (``checkpoint.ctranslate2.not_convertible``). What it cannot do per request: ``CTranslate2Search.check``."""
    if members > 1:
        return "an ensemble of checkpoints (CTranslate2 runs one model)"
    if shortlist:
        return "a lexical shortlist (--shortlist)"
    return not_convertible(model)


def _stamp(path: Path) -> dict:
    """What changes when ``path`` (a file, or an exported directory's files) is rewritten."""
    files = [path] if path.is_file() else sorted(p for p in path.iterdir() if p.is_file())
    stats = [f.stat() for f in files]
    return {"checkpoint": str(path), "size": sum(s.st_size for s in stats),
            "mtime_ns": max((s.st_mtime_ns for s in stats), default=0)}


def user_cache_dir() -> Path:
    """seq2seq's folder in the user's cache directory: ``$XDG_CACHE_HOME/seq2seq``, else ``~/.cache/seq2seq``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "seq2seq"


def _fresh(cache: Path, source: dict) -> bool:
    """Whether ``cache`` holds a whole conversion of the checkpoint ``source`` describes (``_stamp``)."""
    try:
        return json.loads((cache / SOURCE_FILE).read_text(encoding="utf-8")) == source
    except (OSError, ValueError):
        return False  # missing, partial or stale


def cached_export(loaded) -> Path:
    """The CTranslate2 directory of a read checkpoint (``LoadedCheckpoint``), converted now if missing or
    older than the checkpoint (its path, size and modification time are recorded in it), written whole or
    not at all, and said in the log: where it is and why there.

    Where: ``NAME.ct2`` beside the checkpoint's file (``RUN/best.pt`` -> ``RUN/best.ct2``), so that it goes
    where the checkpoint goes; where that directory cannot be written (a read-only run directory, a shared
    model folder), ``user_cache_dir()/ctranslate2/<hash of the checkpoint's path>-NAME.ct2``, one per
    checkpoint, converted again when the checkpoint changes. Nothing is then written beside the checkpoint."""
    from ..checkpoint.file import checkpoint_file
    from ..errors import OutputError

    checkpoint = checkpoint_file(Path(loaded.path).resolve())
    source = _stamp(checkpoint)
    beside = checkpoint.with_name(checkpoint.stem + ".ct2")
    digest = hashlib.sha256(str(checkpoint).encode("utf-8")).hexdigest()[:16]
    elsewhere = user_cache_dir() / CACHE_FOLDER / f"{digest}-{beside.name}"
    for cache in (beside, elsewhere):
        if _fresh(cache, source):
            LOGGER.info("ctranslate2: using %s, the CTranslate2 conversion of %s made earlier", cache, checkpoint)
            return cache
    if not os.access(checkpoint.parent, os.W_OK | os.X_OK):
        return _convert(loaded, source, elsewhere, f"in the user cache directory, as {checkpoint.parent} cannot be "
                                                   "written (nothing is written there)")
    try:
        return _convert(loaded, source, beside, "beside it")
    except OutputError as exc:
        return _convert(loaded, source, elsewhere, f"in the user cache directory, as writing beside it failed ({exc})")


def _convert(loaded, source: dict, cache: Path, why: str) -> Path:
    """Convert the checkpoint ``source`` describes into ``cache`` (``cached_export``), saying so first."""
    from ..checkpoint.ctranslate2 import write_ctranslate2
    from ..io_utils import atomic_directory

    checkpoint = source["checkpoint"]
    LOGGER.info("ctranslate2: converting %s into CTranslate2's format for its search, once (reused until the "
                "checkpoint changes): into %s, %s", checkpoint, cache, why)
    with atomic_directory(cache, force=True, flag="--engine ctranslate2: the converted model") as out:
        write_ctranslate2(loaded, out)
        (out / SOURCE_FILE).write_text(json.dumps(source), encoding="utf-8")
    LOGGER.info("ctranslate2: converted %s into %s", checkpoint, cache)
    return cache


def open_engine(engine: str, loaded: Sequence, device, precision: str, shortlist: bool,
                threads: int) -> CTranslate2Search | None:
    """The search ``engine`` gives for these read checkpoints (``LoadedCheckpoint``; several: an
    ensemble): None for our own; CTranslate2's (converted and cached: ``cached_export``) for
    "ctranslate2", or a named error where it cannot decode them; for "auto" CTranslate2 where it can
    and is installed, ours otherwise. The choice is logged with its reason."""
    if engine not in ENGINES:
        raise UserError(f"--engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    if engine == "seq2seq":
        return None
    why = unsupported(loaded[0].config.model, len(loaded), shortlist)
    if why is None and engine == "auto":
        try:
            import ctranslate2  # noqa: F401
        except ImportError:
            why = "the ctranslate2 package is not installed (pip install 'seq2seq[export]')"
    if why is not None:
        if engine == "ctranslate2":
            raise UserError(f"--engine ctranslate2 cannot decode {why}; use --engine seq2seq")
        log("engine", name="seq2seq", reason=repr(why))
        return None
    search = CTranslate2Search(cached_export(loaded[0]), loaded[0].tokenizer, device.type, precision, threads)
    log("engine", name="ctranslate2", precision=precision)
    return search


class CTranslate2Search:
    """Greedy and beam search by CTranslate2 on an exported model directory (module docstring);
    called with our token ids, returns our ``Hypothesis`` lists. ``threads`` (0: every core) on a CPU: with
    ``fastest_threads``, that many or one, whichever decodes a probe faster (``fastest``); ``self.threads``
    says which."""

    name = "ctranslate2"

    def __init__(self, model_dir: str | Path, tokenizer: Tokenizer, device: str = "cpu",
                 precision: str = "fp32", threads: int = 0, fastest_threads: bool = True) -> None:
        from ..checkpoint.ctranslate2 import require_ctranslate2

        ctranslate2 = require_ctranslate2()
        self.tokenizer = tokenizer
        self.model_dir = Path(model_dir)  # what it decodes with (``cached_export``'s conversion)

        def load(intra_threads: int):
            try:
                return ctranslate2.Translator(str(model_dir), device=device, compute_type=COMPUTE_TYPES[precision],
                                              inter_threads=1, intra_threads=intra_threads)
            except (RuntimeError, ValueError) as exc:  # e.g. a compute type this CPU cannot run
                raise UserError(f"--engine ctranslate2: CTranslate2 cannot load {model_dir} for --precision "
                                f"{precision} on {device} ({exc}); try another --precision or --engine "
                                "seq2seq") from None

        threads = threads or os.cpu_count() or 1
        self.translator, self.threads = load(threads), threads
        if fastest_threads and device == "cpu" and threads > 1:
            self.translator, self.threads = self.fastest(self.translator, load(1), threads)

    def fastest(self, many, one, threads: int) -> tuple:
        """Of CTranslate2 on ``threads`` threads (``many``) and on one (``one``), the one that decodes a probe
        sentence faster, with its thread count (the other is dropped).

        Why measure: on some CPUs CTranslate2's multi-threaded matrix products (Intel MKL) are several times
        slower than one thread at every batch width (a 2-core Intel Xeon VM: docs/guides/deploying.md,
        bench-results/ctranslate2-2026-11-27-intel-mkl.md), on others more threads are faster; which holds
        cannot be told from the CPU's name. The probe forces PROBE_STEPS output steps (the same work for
        both), greedy, one sentence; best of 3 after a warm-up (a fraction of a second)."""
        probe = [self.tokenizer.pieces(self.tokenizer.encode(PROBE_SOURCE))]
        seconds = []
        for translator in (many, one):
            best = math.inf
            for attempt in range(4):  # the first: a warm-up
                start = time.perf_counter()
                translator.translate_batch(probe, beam_size=1, min_decoding_length=PROBE_STEPS,
                                           max_decoding_length=PROBE_STEPS)
                best = min(best, time.perf_counter() - start) if attempt else best
            seconds.append(best)
        choice = (one, 1) if seconds[1] < seconds[0] else (many, threads)
        log("ctranslate2_threads", threads=choice[1], probe_ms=f"{1e3 * seconds[0]:.1f}/{1e3 * seconds[1]:.1f}",
            compared=f"{threads}/1")
        return choice

    @staticmethod
    def check(decode: DecodeConfig, constraints: bool = False) -> None:
        """A named error for a request CTranslate2's search cannot run: sampling, constraints."""
        if decode.sample:
            raise UserError("--engine ctranslate2 does not sample (--sample draws from our own seeded random "
                            "streams); use --engine seq2seq")
        if constraints:
            raise UserError("--constraints: --engine ctranslate2 has no constrained search; use --engine seq2seq")

    def __call__(self, sources: Sequence[Sequence[int]], decode: DecodeConfig,
                 prefixes: Sequence[str] | None = None) -> list[list[Hypothesis]]:
        """Each source's hypotheses, best first (``decode.n_best`` of them). ``sources``: token ids
        with their EOS, none empty; ``prefixes``: each output's target prefix text ("" = none)."""
        self.check(decode)
        beam, alpha = decode.beam, decode.length_penalty
        keep = beam if alpha and beam > 1 else decode.n_best  # re-ranked here by GNMT (module docstring)
        pieces = [self.tokenizer.pieces(list(ids[:-1])) for ids in sources]  # CTranslate2 adds the EOS
        forced = [self.tokenizer.pieces(self.tokenizer.encode(p.strip())) if p and p.strip() else None
                  for p in (prefixes or [""] * len(sources))]
        groups: dict[int, list[int]] = {}
        for i, ids in enumerate(sources):
            groups.setdefault(math.ceil(len(ids) * decode.max_output_ratio) + decode.max_output_offset, []).append(i)
        out: list[list[Hypothesis]] = [[] for _ in sources]
        for limit, rows in groups.items():
            prefix = [forced[i] for i in rows]
            results = self.translator.translate_batch(
                [pieces[i] for i in rows], target_prefix=prefix if any(prefix) else None, beam_size=beam,
                num_hypotheses=keep, length_penalty=0.0, return_scores=True, max_batch_size=decode.batch,
                batch_type="examples", max_decoding_length=limit, min_decoding_length=0, max_input_length=0)
            cut = [(i, tokens) for i, result in zip(rows, results) for tokens in result.hypotheses
                   if len(tokens) >= limit]  # stopped by the bound: no EOS in CTranslate2's score
            with_eos = iter(sum(lps) for lps in self.token_log_probs([pieces[i] for i, _ in cut],
                                                                    [tokens for _, tokens in cut]))
            for i, result in zip(rows, results):
                hyps = []
                for tokens, log_prob in zip(result.hypotheses, result.scores):
                    if len(tokens) >= limit:  # ours ends such an output with EOS's log-probability too
                        log_prob = next(with_eos)
                    ids = [self.tokenizer.piece_to_id(p) for p in tokens]
                    score = log_prob / length_penalty_gnmt(len(ids) + 1, alpha) if beam > 1 else log_prob
                    hyps.append(Hypothesis(ids, score, log_prob))
                out[i] = sorted(hyps, key=lambda h: -h.score)[: decode.n_best]
        return out

    def token_log_probs(self, sources: list[list[str]], targets: list[list[str]]) -> list[list[float]]:
        """CTranslate2's teacher-forced log p(y_t | y_<t, x) of every target piece and EOS."""
        if not sources:
            return []
        return [list(r.log_probs) for r in self.translator.score_batch(sources, targets, max_input_length=0)]


class CTranslate2Translator:
    """Translate text with an exported CTranslate2 model directory and the SentencePiece model
    beside it (``seq2seq export --format ctranslate2``), without our model: our tokenization in,
    our detokenization out, ``CTranslate2Search`` in between. ``translate`` returns one string per
    sentence; ``length_penalty`` is ours (GNMT), 0 ranks by log-probability. ``intra_threads`` (0: every
    core) and ``fastest_threads`` as ``CTranslate2Search`` takes them (False: exactly ``intra_threads``)."""

    def __init__(self, model_dir: str | Path, device: str = "cpu", compute_type: str = "float32",
                 intra_threads: int = 0, fastest_threads: bool = True) -> None:
        from ..checkpoint.ctranslate2 import SPM_FILE

        model_dir = Path(model_dir)
        if not (model_dir / SPM_FILE).is_file():
            raise UserError(f"{model_dir}: no {SPM_FILE}; pass a directory written by "
                            "seq2seq export --format ctranslate2")
        self.tokenizer = Tokenizer.load(model_dir / SPM_FILE)
        precision = {v: k for k, v in COMPUTE_TYPES.items()}.get(compute_type, "fp32")
        self.search = CTranslate2Search(model_dir, self.tokenizer, device, precision, intra_threads, fastest_threads)
        self.translator = self.search.translator

    def translate(self, sentences: Sequence[str], decode: DecodeConfig | None = None, **options) -> list[str]:
        """Like ``Translator.translate`` (``decode``: a ``DecodeConfig``, default ``DecodeConfig()``, its fields
        overridable as keywords: the same defaults): the best output's text per sentence; an empty line
        gives an empty line."""
        decode = dataclasses.replace(decode or DecodeConfig(), **options)
        sources = [self.tokenizer.encode(s.strip())[:decode.max_input_tokens] + [EOS_ID] for s in sentences]
        rows = [i for i, ids in enumerate(sources) if len(ids) > 1]
        out = [""] * len(sentences)
        for i, hyps in zip(rows, self.search([sources[i] for i in rows], decode)):
            out[i] = self.tokenizer.decode(hyps[0].tokens)
        return out

    def score(self, sources: Sequence[str], targets: Sequence[str]) -> list[list[float]]:
        """CTranslate2's teacher-forced log p(y_t | y_<t, x) of every target subword and EOS."""
        pieces = lambda texts: [self.tokenizer.pieces(self.tokenizer.encode(t.strip())) for t in texts]  # noqa: E731
        return self.search.token_log_probs(pieces(sources), pieces(targets))
