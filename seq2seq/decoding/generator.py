"""The model side of every search: one ``Generator`` makes the model calls, the strategies only choose
tokens (greedy and sampling: ``search``; beam: ``beam``; lexically constrained beam: ``constrained``),
as fairseq's ``SequenceGenerator`` with its ``search.*`` strategies and OpenNMT-py's ``DecodeStrategy``
divide the work.

A ``Generator`` decodes one ``SearchBatch`` (sources, and what restricts their outputs: an output
vocabulary, target prefixes) as a ``DecodeConfig`` says: it encodes once, starts the decoder state,
and at every step gives the log-probabilities of each active row's next token (``log_probs``) with
what may not come next at -inf: PAD and BOS always, every token but EOS once a sentence reaches its
length bound, and outside the sentence's target prefix. It reorders the decoder state as the strategy
asks and lets finished rows or sentences leave the batch.

Each sentence has its own length bound, ceil(src_len x ``max_output_ratio``) + ``max_output_offset``
output tokens (``max_lengths``; src_len counts the source EOS; a model with learned positions lowers
it to what it can encode; never shorter than the sentence's target prefix), after which EOS is forced.
Log-probabilities are the model's own (masks come after the softmax: ``OutputVocabulary``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from ..config import DecodeConfig
from ..models.base import EncoderDecoder, select_batch
from .prefix import Prefixes
from .scoring import eval_mode, forced_confidence, forced_pass
from .vocabulary import OutputVocabulary


@dataclass
class Hypothesis:
    """One output. ``tokens`` exclude BOS/EOS; ``log_prob`` is the raw sum of log-probabilities
    including EOS; ``score`` is ``log_prob`` (greedy) or ``log_prob / lp`` (beam, GNMT penalty);
    ``attention`` is (layers, heads, len(tokens) + 1, src_len): a row per output token plus the
    EOS step, a column per real source token (source EOS included, padding removed)."""

    tokens: list[int]
    score: float
    log_prob: float
    attention: torch.Tensor | None = None
    #: (log p, entropy) of each token and EOS under the model (``attach_confidence``), when asked for
    confidence: tuple[torch.Tensor, torch.Tensor] | None = None


@dataclass
class SearchBatch:
    """One batch to decode: ``src`` (B, S) token ids with their EOS, right-padded, ``src_mask`` (B, S)
    True at real tokens; ``vocabulary`` the token ids every output may use (``OutputVocabulary``, e.g.
    ``Shortlist.vocabulary(src, src_mask)``; None: all); ``prefixes`` the target prefix each output
    must start with (``Prefixes``); ``sentence_ids`` name the sentences' random streams when sampling
    (default 0, 1, ...)."""

    src: torch.Tensor
    src_mask: torch.Tensor
    vocabulary: torch.Tensor | None = None
    prefixes: Prefixes | None = None
    sentence_ids: Sequence[int] | None = None

    def __len__(self) -> int:
        return self.src.size(0)


def length_penalty_gnmt(length: int, alpha: float) -> float:
    """GNMT (Wu et al. 2016): lp(Y) = ((5 + |Y|) / 6)^alpha, |Y| counting the EOS."""
    return ((5.0 + length) / 6.0) ** alpha


def max_lengths(model: EncoderDecoder, src_mask: torch.Tensor, decode: DecodeConfig,
                prefixes: Prefixes | None = None) -> torch.Tensor:
    """Per-sentence bound on output tokens (EOS excluded): ceil(src_len x ``decode.max_output_ratio``)
    + ``decode.max_output_offset``, (batch,), and never shorter than the sentence's target prefix."""
    src_len = src_mask.sum(1).double()
    limit = torch.ceil(src_len * decode.max_output_ratio).long() + decode.max_output_offset
    max_positions = getattr(model, "max_positions", None)  # learned positions: BOS + tokens must fit
    if max_positions is not None:
        limit = limit.clamp(max=max_positions - 1)
    if prefixes is not None:
        limit = torch.maximum(limit, prefixes.lengths(limit.device))
    return limit.clamp(min=0)


class Generator:
    """The model calls of a search over one ``SearchBatch`` (module docstring).

    Rows: ``width`` consecutive decoder rows per sentence (a beam of ``width``: they share the
    sentence's encoder memory row, ``EncoderDecoder.decode_step``'s contract, and leave together,
    ``keep_sentences``), or with ``copies`` > 1 that many independent rows per sentence (samples),
    each with its own memory row so that each can leave alone (``keep_rows``). At the first step every
    row of a sentence holds BOS alone: it is decoded once per sentence and copied to its ``width`` rows (on a
    preallocated cache, whose compiled step has a graph per row count, each row is decoded).

    ``limit`` (B,) is each sentence's length bound, also on the host (``host_limit``); ``sentence`` (rows of
    memory,) the sentence of each memory row, on the device and (``host_sentence``) on the host, so that no
    step waits for the device to know it. Before the earliest bound of the active sentences
    (``first_forced``, a host int) no row can be forced to EOS, and a step skips that mask altogether: at one
    sentence at a time the step's own operations are few, and each one skipped counts."""

    def __init__(self, model: EncoderDecoder, batch: SearchBatch, decode: DecodeConfig, width: int = 1,
                 copies: int = 1) -> None:
        device = batch.src.device
        self.model, self.prefixes, self.width = model, batch.prefixes, width
        self.output = OutputVocabulary(model, batch.vocabulary)
        self.limit = max_lengths(model, batch.src_mask, decode, batch.prefixes)  # (B,)
        self.memory = model.encode(batch.src, batch.src_mask)
        self.sentence = torch.arange(len(batch), device=device)
        if copies > 1:  # row i * copies + j is copy j of sentence i
            self.sentence = self.sentence.repeat_interleave(copies)
            self.memory = select_batch(self.memory, self.sentence)
        self.host_sentence = self.sentence.tolist()
        self.host_limit = self.limit.tolist()
        self.first_forced = self._first_forced()
        self.steps = int(self.limit.max()) + 1 if len(batch) else 0  # the longest output and its EOS
        self.state = model.init_state(self.memory, self.steps)  # a row per memory row until the first step
        self._first = width > 1
        if self._first and "step" in self.state:  # a preallocated cache: a compiled step per row count, so every
            # row is decoded from the start (one graph or package less to build than for BOS alone)
            self.state = select_batch(self.state, self.sentence.repeat_interleave(width))
            self._first = False

    def log_probs(self, tokens: torch.Tensor, t: int) -> torch.Tensor:
        """Step ``t``: ``tokens`` (rows,) the last token of each active row -> log p of its next token
        (rows, V') over the output vocabulary, what may not come next at -inf."""
        k = self.width
        first, self._first = self._first, False
        logits, self.state, _ = self.model.decode_step(self.memory, self.state, tokens[::k] if first else tokens,
                                                       need_attention=False, output_weight=self.output.weight)
        if first:  # BOS decoded once per sentence: copied to its k rows
            expand = torch.arange(logits.size(0), device=logits.device).repeat_interleave(k)
            logits, self.state = logits[expand], select_batch(self.state, expand)
        force_eos = None
        if t >= self.first_forced:  # else no active row has reached its bound (module docstring)
            force_eos = t >= self.limit[self.sentence]
            if k > 1:
                force_eos = force_eos.repeat_interleave(k)
        allowed = None if self.prefixes is None or t >= self.prefixes.longest else self.prefixes.allowed(
            t, [sentence for sentence in self.host_sentence for _ in range(k)], logits.device)
        return self.output.log_probs(logits, force_eos, allowed)

    def reorder(self, origin: torch.Tensor) -> None:
        """Row i of the decoder state continues row ``origin[i]`` (a beam's new hypotheses)."""
        self.state = select_batch(self.state, origin)

    def keep_rows(self, live: torch.Tensor) -> None:
        """Only the rows ``live`` (indices of active rows, ``width`` 1) go on, state and memory."""
        self.memory, self.state = select_batch(self.memory, live), select_batch(self.state, live)
        self.sentence = self.sentence[live]
        self.host_sentence = [self.host_sentence[i] for i in live.tolist()]
        self.first_forced = self._first_forced()

    def keep_sentences(self, live: list[int]) -> None:
        """Only the active sentences at positions ``live`` (host indices) go on: their memory rows; their
        decoder rows are chosen by the next ``reorder``."""
        index = torch.tensor(live, dtype=torch.long, device=self.sentence.device)
        self.memory, self.sentence = select_batch(self.memory, index), self.sentence[index]
        self.host_sentence = [self.host_sentence[i] for i in live]
        self.first_forced = self._first_forced()

    def _first_forced(self) -> int:
        """The first step at which some active row is forced to EOS (its sentence's bound)."""
        return min((self.host_limit[s] for s in self.host_sentence), default=0)


def fused(model: EncoderDecoder, generator: Generator) -> bool:
    """Whether a search of ``generator``'s sentence (one) can run on the model's step with the search's choice
    compiled in (``greedy_step`` / ``beam_step``; ``fused_search``: a packaged Transformer): the cache is
    preallocated, and nothing restricts the output (an output vocabulary, a target prefix) beyond what that step
    masks itself (PAD, BOS, EOS at the bound)."""
    return (getattr(model, "fused_search", False) and len(generator.host_sentence) == 1 and "step" in generator.state
            and generator.output.ids is None and generator.prefixes is None)


def attach_attention(model: EncoderDecoder, src: torch.Tensor, src_mask: torch.Tensor,
                     hyps: list[list[Hypothesis]]) -> None:
    """Fill ``h.attention`` (layers, heads, len + 1, real src_len) by teacher-forcing the outputs
    (``scoring.forced_pass``: one batch for all hypotheses). Because incremental and teacher-forced
    decoding are identical (tested), these are exactly the weights the search saw, and they cannot be
    scrambled by beam reordering; the search itself never carries attention around."""
    flat = [(i, h) for i, sentence in enumerate(hyps) for h in sentence]
    if not flat:
        return
    index = torch.tensor([i for i, _ in flat], device=src.device)
    with eval_mode(model, inference=True):
        _, attention = forced_pass(model, src[index], src_mask[index], [h.tokens for _, h in flat],
                                   need_attention=True, need_scores=False)
    for (_, h), weights in zip(flat, attention):
        h.attention = weights


def attach_confidence(model: EncoderDecoder, src: torch.Tensor, src_mask: torch.Tensor,
                      hyps: list[list[Hypothesis]]) -> None:
    """Fill ``h.confidence`` (log p and entropy per output token and EOS) by teacher-forcing the
    outputs (``scoring.forced_confidence``: one batch for all hypotheses)."""
    flat = [(i, h) for i, sentence in enumerate(hyps) for h in sentence]
    if not flat:
        return
    index = torch.tensor([i for i, _ in flat], device=src.device)
    with eval_mode(model, inference=True):
        confidence = forced_confidence(model, src[index], src_mask[index], [h.tokens for _, h in flat])
    for (_, h), pair in zip(flat, confidence):
        h.confidence = pair
