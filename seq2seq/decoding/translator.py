"""Translate text with a trained model: the Python API behind translate.py and validation BLEU.

    from seq2seq import Translator
    translator = Translator.from_checkpoint("checkpoints/run/best.pt")
    for t in translator.translate(["Ein Hund läuft."]):   # beam 5, as seq2seq translate
        print(t.text, t.score, t.attention.shape)   # (layers, heads, tgt_len + 1, src_len + 1)

Inputs are encoded with the run's SentencePiece model, sorted by length into batches, decoded by
greedy or beam search (or sampled, ``sample=True``), and returned in input order. Several
checkpoints decode as an ensemble (``Translator.from_checkpoints``, ``seq2seq.decoding.ensemble``).
Empty inputs give empty outputs without touching the model. Inputs longer than
``max_input_tokens`` subwords are cut to that length with a warning naming the line (the model
never saw longer sentences; decoding cost grows with length).
"""
from __future__ import annotations

import copy
import dataclasses
import secrets
import time
import warnings
from pathlib import Path
from typing import Any, Sequence

import torch

from ..checkpoint.loaded import LoadedCheckpoint
from ..config import DecodeConfig
from ..errors import UserError
from ..io_utils import counted
from ..models.base import EncoderDecoder
from ..models.compiled import BackgroundCompile, compile_decoding, compile_pays
from ..runtime import LOGGER, ieee_fp32, precision_warning, progress_bar, resolve_device, torch_threads
from .scoring import pad_ids
from .shortlist import FILE_NAME, Shortlist
from .ensemble import EnsembleModel
from .constrained import ConstraintTooLong
from .constraints import SentenceConstraints
from .ctranslate2 import CTranslate2Search, open_engine
from .prefix import Prefixes, PrefixSpeller
from .generator import Hypothesis, SearchBatch, attach_attention, attach_confidence
from .search import translate_batch
from .setup import (DECODING_DTYPES, ModelOrigin, TranslatorSetup, build_decoding_model, compile_conflict,
                    decode_config, input_bound, setup_and_decode)
from .translation import Translation
from ..tokenizer import EOS_ID, PAD_ID, Tokenizer


class Translator:
    """Translates with a model and its tokenizer; with a ``shortlist`` every batch is decoded over
    the target tokens its sources can produce (``seq2seq.decoding.shortlist``), not the whole vocabulary.

    ``decode`` is the translator's default decoding (``translate`` without one; ``DecodeConfig()``
    when None); ``engine`` another engine's search (``from_checkpoints``' ``engine``), None: ours;
    ``compiled``: whether the model decodes one sentence at a time through a compiled step (kept in
    ``compile_cache`` for later processes); ``origin``: where the model came from. The device is the
    model's."""

    def __init__(self, model: EncoderDecoder, tokenizer: Tokenizer, decode: DecodeConfig | None = None,
                 shortlist: Shortlist | None = None, engine: CTranslate2Search | None = None,
                 compiled: bool = False, compile_cache: str | None = None, origin: ModelOrigin = ModelOrigin()) -> None:
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.device = next(model.parameters()).device
        self.decode = DecodeConfig() if decode is None else decode
        #: the most subwords the model can take (learned positions: what it can encode), whatever ``decode`` says
        self.input_bound = input_bound(model)
        self.shortlist = shortlist
        self.engine = engine
        self.compiled = compiled
        self.compile_cache = compile_cache
        self.origin = origin
        self._speller: PrefixSpeller | None = None  # built on the first call with prefixes

    @property
    def max_input_tokens(self) -> int:
        """Inputs are cut to this many subwords by default (the default decoding's, within the model's bound)."""
        return min(self.decode.max_input_tokens, self.input_bound)

    @property
    def checkpoints(self) -> list[str]:
        return list(self.origin.checkpoints)

    @property
    def supervised_attention(self) -> tuple[int, list[int]] | None:
        return self.origin.supervised_attention

    @property
    def languages(self) -> tuple[str, str] | None:
        return self.origin.languages

    @classmethod
    def from_checkpoint(cls, path: str | Path | Sequence[str | Path], setup: TranslatorSetup | None = None,
                        decode: DecodeConfig | None = None, **options: Any) -> "Translator":
        """A checkpoint file or run directory; a list of them is ``from_checkpoints`` (an ensemble).
        ``options``: fields of ``TranslatorSetup`` (``device="cpu"``, ``precision``, ...) or of the
        default ``DecodeConfig`` (``max_input_tokens=40``), overriding ``setup`` and ``decode``.

        ``precision`` fp16 / bf16 stores the weights and runs decoding in half precision: it
        halves the bytes every step reads, which is what bounds one-sentence-at-a-time decoding on
        CPU; wide CPU batches are slower in fp16 (no fast half-precision matrix kernels there). On a
        CPU with native bf16 (AVX512-BF16 / AMX) bf16 is faster at every width; elsewhere bf16 is
        emulated and slow. On GPUs both are fast at any width. Outputs may differ slightly from fp32
        (measurements: docs/performance.md).

        ``precision`` int8 (CPU only) quantizes the linear layers and the decoder's RNN cells
        (``seq2seq.nn.quantize``: int8 weights, one scale per row; inputs quantized at each
        call) and needs no half-precision kernels. An input's scale covers its whole batch, so an
        int8 translation can depend on the sentences batched with it.

        ``shortlist``: a file written by ``seq2seq shortlist`` (training writes the run's
        ``shortlist.npz``), or "auto" for the one next to the checkpoint; ``shortlist_sizes``
        (translations per source token, frequent tokens; None keeps the file's) resizes it.
        ``compile``, ``compile_cache`` and ``engine``: see ``from_checkpoints``."""
        paths = [path] if isinstance(path, (str, Path, LoadedCheckpoint)) else list(path)
        return cls.from_checkpoints(paths, setup, decode, **options)

    @classmethod
    def from_checkpoints(cls, paths: Sequence[str | Path | LoadedCheckpoint], setup: TranslatorSetup | None = None,
                         decode: DecodeConfig | None = None, **options: Any) -> "Translator":
        """One checkpoint: its model; several: their ensemble (``EnsembleModel``: at every step the
        mean of the members' probabilities), of any mix of architectures. They must share the
        SentencePiece model (else a UserError naming both files, before any model is built).
        ``shortlist`` "auto" is the one next to the first checkpoint; the other options are
        ``from_checkpoint``'s, applied to every member. A member may be given already read
        (``LoadedCheckpoint``).

        ``compile`` decodes one sentence at a time (batch size 1: interactive use, ``serve``) with
        the decoding step compiled by ``torch.compile`` (``seq2seq.models.compiled``: the Transformer's
        static-shape step and encoder, the RNN's step): the first sentence of each beam size waits for its
        compilation (15-40 s), every later one is about 2x faster (docs/performance.md). None: where that
        was measured to pay (``compile_pays``: fp32 on CPU); False (the default): the eager step, the
        reference. ``compile_cache`` (a directory): a Transformer's compiled step is kept there as AOTInductor
        packages (``seq2seq.models.packaged``) that a later process loads instead of compiling.

        ``engine`` runs the search: "seq2seq" (ours, the default), "ctranslate2" (CTranslate2's
        runtime on the checkpoint converted once and cached beside it; a named error for what it
        cannot decode) or "auto" (CTranslate2 where it can decode the model and is installed);
        ``seq2seq.decoding.ctranslate2``. Attention and confidence come from our model either way."""
        setup, decode = setup_and_decode(setup, decode, options)
        device, precision, shortlist, compile = setup.device, setup.precision, setup.shortlist, setup.compile
        if isinstance(paths, (str, Path, LoadedCheckpoint)):
            paths = [paths]
        if not paths:
            raise UserError("--checkpoint: give at least one checkpoint")
        if precision not in DECODING_DTYPES:
            raise UserError(f"--precision must be one of {', '.join(DECODING_DTYPES)}, got {precision!r}")
        loaded: list[LoadedCheckpoint] = []  # every member, checked before any is built
        for path in paths:
            member = path if isinstance(path, LoadedCheckpoint) else LoadedCheckpoint.read(path)
            if loaded and member.tokenizer.sha256() != loaded[0].tokenizer.sha256():
                raise UserError(
                    f"checkpoints {loaded[0].path} and {member.path} use different SentencePiece models (sha256 "
                    f"{loaded[0].tokenizer.sha256()[:12]}... vs {member.tokenizer.sha256()[:12]}...); an ensemble's "
                    "members must share one tokenizer (train them on the same spm.model)")
            loaded.append(member)
        path, config, tokenizer = loaded[0].path, loaded[0].config, loaded[0].tokenizer
        dev = resolve_device(device)
        if precision == "int8" and dev.type != "cpu":
            raise UserError(f"--precision int8 runs on CPU only (quantized CPU kernels); on {dev.type} "
                            "use --precision fp16 or bf16, or --device cpu")
        slow = precision_warning(dev, precision) if precision == "bf16" else None  # fp16 is CUDA-only in training
        if slow:
            warnings.warn(slow, stacklevel=2)
        if setup.shortlist_sizes is not None and shortlist is None:
            raise UserError("--shortlist-sizes needs --shortlist")
        if shortlist is not None:
            if str(shortlist) == "auto":
                run_dir = Path(path) if Path(path).is_dir() else Path(path).parent
                shortlist = run_dir / FILE_NAME
            shortlist = Shortlist.load(shortlist, tokenizer.sha256())
            if shortlist.vocab_size != config.model.vocab_size:
                raise UserError(f"shortlist covers {shortlist.vocab_size} tokens, checkpoint {path} has "
                                f"{config.model.vocab_size}; rebuild it with `seq2seq shortlist`")
            if setup.shortlist_sizes is not None:
                shortlist = shortlist.with_sizes(*setup.shortlist_sizes)
        search = open_engine(setup.engine, loaded, dev, precision, shortlist is not None, torch.get_num_threads())
        with torch_threads(1 if search is not None else None):  # see ``translate``
            models = [build_decoding_model(member, dev, precision) for member in loaded]
        model = models[0] if len(models) == 1 else EnsembleModel(models)
        if compile and search is not None:
            raise compile_conflict(setup.engine)
        wanted = compile_pays(dev, precision) if compile is None else compile
        compiled = compile_decoding(model, setup.compile_cache) if wanted and search is None else False
        checkpoints = tuple(str(p.path if isinstance(p, LoadedCheckpoint) else p) for p in paths)
        origin = ModelOrigin.of_run(config, checkpoints)  # an ensemble: its first member's config
        return cls(model, tokenizer, decode, shortlist, search, compiled, setup.compile_cache, origin)

    def warm_up(self, beam_sizes: Sequence[int]) -> float:
        """Translate one sentence alone at each beam size, so that a compiled model (``compile``)
        compiles now rather than in the first request; returns the seconds it took."""
        start = time.perf_counter()
        for beam_size in beam_sizes:
            self.translate(["warm up"], beam_size=beam_size, batch_size=1, need_attention=False)
        return time.perf_counter() - start

    def compile_in_background(self, beam_sizes: Sequence[int], threads: int | None = None) -> BackgroundCompile:
        """Compile the decoding of lone sentences (``from_checkpoints``' ``compile``) for ``beam_sizes`` in a thread
        of its own (packages: in a child process) while this translator goes on translating eagerly; then lone
        sentences decode through the compiled step (``compiled`` turns True). ``threads``: the torch threads lone
        sentences will run on. The returned job's ``status`` says where it stands (``BackgroundCompile``)."""
        twin = copy.copy(self)

        def warm_up(view: torch.nn.Module) -> None:
            twin.model = view
            twin.warm_up(beam_sizes)

        return BackgroundCompile(self.model, warm_up, threads, on_ready=lambda: setattr(self, "compiled", True),
                                 packages=self.compile_cache).start()

    def translate(
        self,
        sentences: Sequence[str],
        decode: DecodeConfig | None = None,
        *,
        prefix: Sequence[str] | None = None,
        constraints: Sequence[Sequence[str]] | None = None,
        need_attention: bool = True,
        confidence: bool = False,
        first_line: int = 1,
        progress: bool = False,
        **options: Any,
    ) -> list[Translation]:
        """Translate ``sentences`` (a list of strings, one sentence each); the result is in input
        order. ``decode`` says how (``DecodeConfig``; default: the translator's own, ``self.decode``: that
        of ``seq2seq translate``, beam 5, unless it was built with another); ``options`` are ``DecodeConfig``
        fields that override it for this call
        (``translate(texts, beam_size=1)``). ``first_line`` numbers the first sentence in warnings
        (for streamed input); ``progress`` shows a bar per batch.

        ``sample=True`` draws ``n_best`` independent samples per sentence instead of searching
        (``temperature``, ``top_k``, ``top_p``; ``beam_size`` None or 1; see ``search.Sampling``),
        most probable first; ``log_prob`` and ``score`` are the model's own (temperature 1)
        log-probability of the sample. Sentence i of the input draws from its own random streams,
        seeded by (``seed``, ``first_line`` - 1 + i): the same seed gives the same samples for the
        same input position whatever the batch size or the rest of the input (to floating-point
        rounding; ``seed`` None: fresh samples every call).

        ``need_attention`` (default True) keeps each output's attention; ``confidence=True`` adds
        each output's per-token log-probabilities and entropies (``Translation.token_log_probs``,
        ``token_entropy``, ``confidence()``): one more teacher-forced pass over the outputs.

        Per-sentence inputs: ``prefix`` (one string per sentence, "" = none) forces each output to
        start with that text (greedy, beam, sampling and ensembles alike; ``seq2seq.decoding.prefix``):
        the search goes through the prefix's pieces and continues from there; a prefix not ending in
        whitespace may end inside a word, which the search completes. The prefix's tokens are part of
        the output (its attention, its log-probability). An empty input still gives an empty output.

        ``constraints`` (one list of target phrases per sentence, [] = none) makes every output of
        that sentence contain every phrase (terminology; lexically constrained beam search with
        dynamic beam allocation, ``seq2seq.decoding.constrained``; beam or greedy, not sampling), in
        the order given with ``ordered_constraints``. Phrases more than the sentence's length bound
        can hold are an error naming the input line.

        Decoding runs in IEEE fp32 where fp32 is asked for (TF32 off for the call, ``runtime.ieee_fp32``),
        whatever the process set."""
        if isinstance(sentences, (str, bytes)):
            raise UserError("Translator.translate takes a list of sentences, got one string; "
                            "use translate([text]) (a string would be read as one sentence per character)")
        decode = decode_config(self.decode if decode is None else decode, options)
        if decode.sample and decode.seed is None:  # one seed for the whole call: sentence i's samples
            decode = dataclasses.replace(decode, seed=secrets.randbits(63))  # do not depend on the batching
        # with another engine our model's passes (attention, confidence) run on one thread: once
        # torch's own thread pool has started, CTranslate2's search in the same process runs 4-5x
        # slower (measured, 2 cores; docs/guides/deploying.md)
        with ieee_fp32(), torch_threads(1 if self.engine is not None else None):
            return self._translate(sentences, decode, prefix, constraints, need_attention, confidence, first_line,
                                   progress)

    def _translate(self, sentences: Sequence[str], decode: DecodeConfig, prefix: Sequence[str] | None,
                   constraints: Sequence[Sequence[str]] | None, need_attention: bool, confidence: bool,
                   first_line: int, progress: bool) -> list[Translation]:
        limit = min(decode.max_input_tokens, self.input_bound)
        encoded = [self._encode(text, line, limit) for line, text in enumerate(sentences, start=first_line)]
        steps = self._prefix_steps(prefix, len(sentences), first_line)
        wanted = self._constraints(constraints, decode.ordered_constraints, len(sentences), decode.sample)
        results: list[Translation | None] = [None] * len(sentences)
        order = sorted((i for i, ids in enumerate(encoded) if ids), key=lambda i: -len(encoded[i]))
        for i, text in enumerate(sentences):
            if not encoded[i]:
                results[i] = Translation(source=text, text="", tokens=[], score=0.0, log_prob=0.0)
        batches = [order[k:k + decode.batch] for k in range(0, len(order), decode.batch)]
        if progress:
            batches = progress_bar(batches, desc="translate", unit="batch")
        ensemble = isinstance(self.model, EnsembleModel)
        for batch in batches:
            src = pad_ids([encoded[i] for i in batch], self.device)  # (batch, src_len)
            inputs = SearchBatch(src, src != PAD_ID, sentence_ids=[first_line - 1 + i for i in batch],
                                 prefixes=None if steps is None else Prefixes([steps[i] for i in batch],
                                                                              self.tokenizer.vocab_size))
            batch_constraints = None if wanted is None or not any(wanted[i].phrases for i in batch) else [
                wanted[i] for i in batch]
            inputs.vocabulary = self._vocabulary(inputs, batch_constraints)
            if self.engine is not None:  # another engine's search; the attention is our model's
                self.engine.check(decode, constraints=batch_constraints is not None)
                hypotheses = self.engine([encoded[i] for i in batch], decode,
                                         None if prefix is None else [prefix[i] for i in batch])
                if need_attention:
                    attach_attention(self.model, inputs.src, inputs.src_mask, hypotheses)
            else:
                hypotheses = self._search(inputs, decode, batch_constraints, need_attention and not ensemble,
                                          [first_line + i for i in batch])
            members = (self.model.attach_member_attention(inputs.src, inputs.src_mask, hypotheses)
                       if ensemble and need_attention else [None] * len(batch))
            if confidence:
                attach_confidence(self.model, inputs.src, inputs.src_mask, hypotheses)
            for i, hyps, member_attention in zip(batch, hypotheses, members):
                results[i] = self._to_translation(sentences[i], encoded[i], hyps, member_attention)
        return results  # type: ignore[return-value]

    def _search(self, inputs: SearchBatch, decode: DecodeConfig, constraints: list[SentenceConstraints] | None,
                need_attention: bool, lines: list[int]) -> list[list[Hypothesis]]:
        """Our search of one batch (``translate_batch``); ``lines`` number its sentences in errors."""
        try:
            return translate_batch(self.model, inputs, decode, need_attention=need_attention, constraints=constraints)
        except ConstraintTooLong as exc:
            raise UserError(
                f"--constraints line {lines[exc.index]}: the phrases need {exc.needed} target pieces"
                f"{' with the prefix' if inputs.prefixes is not None else ''}, but this input's output may have at "
                f"most {exc.bound} (its source length x --max-output-ratio {decode.max_output_ratio:g} + "
                f"{decode.max_output_offset}): shorten or drop a phrase, or raise --max-output-ratio") from None

    def _vocabulary(self, inputs: SearchBatch, constraints: list[SentenceConstraints] | None) -> torch.Tensor | None:
        """The batch's shortlist (None: the whole vocabulary), keeping its prefixes' and constraints' tokens."""
        if self.shortlist is None:
            return None
        vocabulary = self.shortlist.vocabulary(inputs.src, inputs.src_mask)
        kept = [] if inputs.prefixes is None else [inputs.prefixes.token_ids().to(vocabulary.device)]
        if constraints is not None:
            ids = sorted(set().union(*(c.token_ids() for c in constraints)))
            kept.append(torch.tensor(ids, dtype=vocabulary.dtype, device=vocabulary.device))
        return torch.unique(torch.cat([vocabulary, *kept])) if kept else vocabulary

    def _prefix_steps(self, prefix: Sequence[str] | None, count: int, first_line: int) -> list | None:
        """Each sentence's allowed tokens per step (``PrefixSpeller``), or None without prefixes."""
        if prefix is None:
            return None
        if isinstance(prefix, (str, bytes)) or len(prefix) != count:
            given = "one string" if isinstance(prefix, (str, bytes)) else counted(len(prefix), "prefix", "prefixes")
            raise UserError(f"--prefix: {given} for {counted(count, 'sentence')}; give one prefix per sentence "
                            "(\"\" = none)")
        if self._speller is None:
            self._speller = PrefixSpeller(self.tokenizer)
        steps = [self._speller.steps(text) for text in prefix]
        bound = getattr(self.model, "max_positions", None)
        for line, sentence_steps in enumerate(steps, start=first_line):
            if bound is not None and len(sentence_steps) > bound - 1:
                raise UserError(f"--prefix line {line} has {len(sentence_steps)} pieces; this model (learned "
                                f"positions) produces at most {bound - 1}: shorten the prefix")
        return steps

    def _constraints(self, constraints: Sequence[Sequence[str]] | None, ordered: bool, count: int,
                     sample: bool) -> list[SentenceConstraints] | None:
        """Each sentence's phrases as token ids (empty phrases dropped), or None without constraints."""
        if constraints is None:
            return None
        if isinstance(constraints, (str, bytes)) or len(constraints) != count:
            given = ("one string" if isinstance(constraints, (str, bytes))
                     else counted(len(constraints), "constraint list"))
            raise UserError(f"--constraints: {given} for {counted(count, 'sentence')}; give one list of phrases per "
                            "sentence ([] = none)")
        result = []
        for phrases in constraints:
            if isinstance(phrases, (str, bytes)):
                raise UserError("--constraints: each sentence's constraints are a list of phrases, got a string; "
                                "use [[\"phrase\", ...], ...]")
            ids = tuple(tuple(self.tokenizer.encode(p.strip())) for p in phrases if p.strip())
            result.append(SentenceConstraints(ids, ordered))
        if sample and any(c.phrases for c in result):
            raise UserError("--constraints work with beam search and greedy search, not with --sample; "
                            "drop --sample or the constraints")
        return result

    def _encode(self, text: str, line: int, limit: int) -> list[int]:
        """The subwords of ``text`` and EOS, cut to ``limit`` subwords with a warning naming the line."""
        text = text.strip()
        if not text:
            return []
        ids = self.tokenizer.encode(text)
        if len(ids) > limit:
            LOGGER.warning(f"warning: input line {line} has {len(ids)} subword tokens; translating only the "
                           f"first {limit} (raise --max-input-tokens to change)")
            ids = ids[:limit]
        return ids + [EOS_ID]

    def _to_translation(self, source: str, src_ids: list[int], hyps: list,
                        member_attention: list[list[torch.Tensor]] | None = None) -> Translation:
        src_pieces = self.tokenizer.pieces(src_ids)
        alternatives = []
        for j, hyp in enumerate(hyps):
            attention = hyp.attention.float().cpu().numpy() if hyp.attention is not None else None
            members = None if member_attention is None else [a.float().cpu().numpy() for a in member_attention[j]]
            log_probs, entropy = (None, None) if hyp.confidence is None else (
                [float(x) for x in hyp.confidence[0].cpu()], [float(x) for x in hyp.confidence[1].cpu()])
            alternatives.append(Translation(
                source=source, text=self.tokenizer.decode(hyp.tokens), tokens=list(hyp.tokens),
                score=float(hyp.score), log_prob=float(hyp.log_prob), src_pieces=src_pieces,
                tgt_pieces=self.tokenizer.pieces(list(hyp.tokens) + [EOS_ID]), attention=attention,
                src_tokens=list(src_ids), member_attention=members, token_log_probs=log_probs,
                token_entropy=entropy, supervised_attention=self.supervised_attention,
            ))
        best = alternatives[0]
        best.alternatives = alternatives
        return best
