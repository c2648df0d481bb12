"""Greedy search, beam search and sampling for any ``EncoderDecoder`` (one interface, no
architecture knowledge; an ensemble, ``seq2seq.decoding.ensemble``, is one more ``EncoderDecoder``).

All three decode a batch of sentences incrementally with ``decode_step`` on the fast path (no
attention weights), each sentence with its own length bound ceil(src_len * max_len_ratio) +
max_len_offset output tokens (src_len counts the source EOS; a model with learned positions lowers
the bound to what it can encode), after which EOS is forced. PAD and BOS are never generated.
Finished sentences leave the active batch. Any of them can be restricted to a subset of the
vocabulary (``OutputVocabulary``, e.g. a lexical shortlist from ``seq2seq.decoding.shortlist``).

Sampling (``sample_search``, ``Sampling``) is greedy search with the argmax replaced by a draw from
the model's next-token distribution, reshaped at every step: divided by a temperature T (logits / T;
T = 0 is the argmax), cut to the k most probable tokens (top-k), then to the smallest set of most
probable tokens whose probability reaches p (nucleus, top-p), renormalised.

Attention of the returned hypotheses is computed afterwards by one teacher-forced ``forward``
pass over the chosen outputs (``need_attention=True``). Because incremental and teacher-forced
decoding are identical (tested), these are exactly the weights the search saw, and they cannot be
scrambled by beam reordering; the search itself never carries (beam, layer, head, step, source)
tensors around.
"""
from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Sequence

import torch

from ..config import DecodeConfig
from ..errors import UserError
from ..models.base import EncoderDecoder, select_batch
from ..tokenizer import BOS_ID, EOS_ID, PAD_ID
from .prefix import Prefixes
from .sampling import Sampling
from .vocabulary import OutputVocabulary
from .scoring import eval_mode, forced_confidence, forced_pass


#: Outputs stop at ``max_output_ratio`` x source subwords + this many tokens (the module docstring).
MAX_LEN_OFFSET = 10
#: ``translate_batch``'s default: greedy search.
GREEDY = DecodeConfig(beam_size=1)


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


def length_penalty_gnmt(length: int, alpha: float) -> float:
    """GNMT (Wu et al. 2016): lp(Y) = ((5 + |Y|) / 6)^alpha, |Y| counting the EOS."""
    return ((5.0 + length) / 6.0) ** alpha


def max_lengths(model: EncoderDecoder, src_mask: torch.Tensor, ratio: float, offset: int,
                prefixes: Prefixes | None = None) -> torch.Tensor:
    """Per-sentence bound on output tokens (EOS excluded): ceil(src_len * ratio) + offset, (batch,),
    and never shorter than the sentence's target prefix (its constrained steps)."""
    src_len = src_mask.sum(1).double()
    limit = torch.ceil(src_len * ratio).long() + offset
    max_positions = getattr(model, "max_positions", None)  # learned positions: BOS + tokens must fit
    if max_positions is not None:
        limit = limit.clamp(max=max_positions - 1)
    if prefixes is not None:
        limit = torch.maximum(limit, prefixes.lengths(limit.device))
    return limit.clamp(min=0)


def finished_check_interval(device: torch.device) -> int:
    """Steps between looks for finished sentences in greedy search: every step on CPU (a look is
    free and dropping rows saves work at once); every 8 on a GPU, where a look waits for the device
    (a host sync) and finished rows cost little until they are dropped."""
    return 1 if device.type == "cpu" else 8


def greedy_search(
    model: EncoderDecoder,
    src: torch.Tensor,
    src_mask: torch.Tensor,
    max_len_ratio: float = 1.5,
    max_len_offset: int = 10,
    need_attention: bool = True,
    vocabulary: torch.Tensor | None = None,
    prefixes: Prefixes | None = None,
) -> list[list[Hypothesis]]:
    """Most probable next token at every step; one hypothesis per sentence. ``vocabulary``: the
    token ids it may produce (see ``OutputVocabulary``), default all; ``prefixes``: target prefixes
    each output must start with."""
    return _token_by_token(model, src, src_mask, max_len_ratio, max_len_offset, need_attention, vocabulary,
                           prefixes=prefixes)


def sample_search(
    model: EncoderDecoder,
    src: torch.Tensor,
    src_mask: torch.Tensor,
    sampling: Sampling,
    n_samples: int = 1,
    sentence_ids: Sequence[int] | None = None,
    max_len_ratio: float = 1.5,
    max_len_offset: int = 10,
    need_attention: bool = True,
    vocabulary: torch.Tensor | None = None,
    prefixes: Prefixes | None = None,
) -> list[list[Hypothesis]]:
    """``n_samples`` independent samples per sentence (``Sampling``: temperature, top-k, top-p),
    most probable first; duplicates are kept (they are independent draws). Decoding is greedy
    search's, the argmax replaced by a draw: same length bound with EOS forced there, PAD and BOS
    never drawn, the same ``vocabulary`` restriction (the distribution is over the subset).

    ``log_prob`` (and ``score``, as in greedy search: no length penalty) is the model's own
    log-probability of the sample, EOS included: the sum of the unmodified (temperature 1,
    untruncated) log-probabilities of its tokens, not the probability of drawing it.

    ``sentence_ids`` (default 0, 1, ...) name the sentences for the random streams: the same
    ``sampling.seed`` and sentence id give the same samples whatever else is in the batch (see
    ``Sampling``). The encoder runs once per sentence; its memory is copied for each sample."""
    if n_samples < 1:
        raise UserError(f"--n-best (samples per input) must be >= 1, got {n_samples}")
    ids = list(range(src.size(0))) if sentence_ids is None else list(sentence_ids)
    if len(ids) != src.size(0):
        raise ValueError(f"sample_search: {len(ids)} sentence ids for {src.size(0)} sentences")
    return _token_by_token(model, src, src_mask, max_len_ratio, max_len_offset, need_attention, vocabulary,
                           sampling, n_samples, ids, prefixes)


def _token_by_token(model: EncoderDecoder, src: torch.Tensor, src_mask: torch.Tensor, max_len_ratio: float,
                    max_len_offset: int, need_attention: bool, vocabulary: torch.Tensor | None,
                    sampling: Sampling | None = None, copies: int = 1,
                    sentence_ids: Sequence[int] = (), prefixes: Prefixes | None = None) -> list[list[Hypothesis]]:
    """Greedy search (``sampling`` None) or sampling (``copies`` samples per sentence): one token
    per row and step, finished rows leave the active batch."""
    with eval_mode(model, inference=True):
        output = OutputVocabulary(model, vocabulary)
        limit = max_lengths(model, src_mask, max_len_ratio, max_len_offset, prefixes)  # (B,)
        memory = model.encode(src, src_mask)
        if copies > 1:  # row i * copies + j is sample j of sentence i
            expand = torch.arange(src.size(0), device=src.device).repeat_interleave(copies)
            memory, limit = select_batch(memory, expand), limit[expand]
        state = model.init_state(memory, int(limit.max()) + 1)
        rows = torch.arange(limit.size(0), device=src.device)  # output row of each active row
        tokens = torch.full_like(rows, BOS_ID)
        ended = torch.zeros_like(rows, dtype=torch.bool)  # active rows that produced EOS
        out = torch.full((limit.size(0), int(limit.max()) + 1), PAD_ID, device=src.device)  # (rows, steps)
        log_prob = torch.zeros(limit.size(0), device=src.device)  # (rows,)
        uniform = None if sampling is None else sampling.uniforms(
            sentence_ids, copies, [n + 1 for n in limit[::copies].tolist()], out.size(1), src.device)
        interval = finished_check_interval(src.device)
        for t in range(out.size(1)):
            logits, state, _ = model.decode_step(memory, state, tokens, need_attention=False,
                                                 output_weight=output.weight)
            allowed = None if prefixes is None or t >= prefixes.longest else prefixes.allowed(
                t, (rows // copies).tolist(), src.device)
            if sampling is None:
                logp, tokens = output.best_tokens(logits, t >= limit[rows], 1, allowed)  # (active, 1) each
            else:
                logp, tokens = output.sampled_tokens(logits, t >= limit[rows], sampling, uniform[rows, t], allowed)
            tokens = tokens.squeeze(1).masked_fill(ended, PAD_ID)  # an ended row keeps its output
            log_prob[rows] += logp.squeeze(1).masked_fill(ended, 0.0)
            out[rows, t] = tokens
            ended |= tokens == EOS_ID
            if (t + 1) % interval == 0 or t + 1 == out.size(1):  # drop finished sentences from the batch
                alive = (~ended).nonzero().squeeze(1)
                if len(alive) == 0:
                    break
                if len(alive) < len(rows):
                    memory, state = select_batch(memory, alive), select_batch(state, alive)
                    rows, tokens, ended = rows[alive], tokens[alive], ended[alive]
        flat = [Hypothesis(_until_eos(row), lp, lp) for row, lp in zip(out.tolist(), log_prob.tolist())]
        hyps = [sorted(flat[i:i + copies], key=lambda h: -h.score) for i in range(0, len(flat), copies)]
        if need_attention:
            attach_attention(model, src, src_mask, hyps)
    return hyps


def _until_eos(tokens: list[int]) -> list[int]:
    return tokens[: tokens.index(EOS_ID)] if EOS_ID in tokens else tokens


def beam_search(
    model: EncoderDecoder,
    src: torch.Tensor,
    src_mask: torch.Tensor,
    beam_size: int = 5,
    length_penalty: float = 1.0,
    n_best: int = 1,
    max_len_ratio: float = 1.5,
    max_len_offset: int = 10,
    need_attention: bool = True,
    vocabulary: torch.Tensor | None = None,
    prefixes: Prefixes | None = None,
) -> list[list[Hypothesis]]:
    """Beam search batched over sentences x beams; ``n_best`` hypotheses per sentence, best first.

    Beams compete on raw log-probability; a hypothesis ending in EOS among the top ``beam_size``
    candidates is finished with score log P / lp(Y), and a sentence keeps its ``beam_size`` best
    finished hypotheses (a better one replaces the worst). A sentence is done only when it reaches
    its length bound (where EOS is forced on every beam) or no live beam can end above its
    ``n_best``-th finished hypothesis any more (``Beams.settled``: exact, the outputs are those of
    searching on to the bound; k finished are not enough, early EOS endings can fill them)."""
    if not 1 <= n_best <= beam_size:
        raise UserError(f"need 1 <= --n-best ({n_best}) <= --beam-size ({beam_size})")
    with eval_mode(model, inference=True):
        beams = Beams(model, src, src_mask, beam_size, length_penalty,
                      max_lengths(model, src_mask, max_len_ratio, max_len_offset, prefixes),
                      OutputVocabulary(model, vocabulary), prefixes, n_best)
        return run_beams(beams, n_best, need_attention, src, src_mask)


def run_beams(beams: "Beams", n_best: int, need_attention: bool, src: torch.Tensor,
              src_mask: torch.Tensor) -> list[list[Hypothesis]]:
    """Advance ``beams`` step by step to their length bound or until every sentence is done; the
    ``n_best`` finished hypotheses of each sentence, best first (with their attention if asked for)."""
    for t in range(int(beams.limit.max()) + 1):
        if not beams.advance(t):
            break
    hyps = [sorted(done, key=lambda h: -h.score)[:n_best] for done in beams.finished]
    if need_attention:
        attach_attention(beams.model, src, src_mask, hyps)
    return hyps


class Beams:
    """Search state of the active sentences: row n * k + j of the decoder state is beam j of
    sentence n; the encoder memory has one row per sentence, shared by its k beams.

    The step interface of every beam strategy (``run_beams`` drives it): ``advance(t)`` takes step t
    for every active sentence and returns False once none is left; ``finished[n]`` holds sentence n's
    finished hypotheses (its k best so far). A strategy subclasses it and overrides ``advance``
    (lexically constrained search: ``constrained._ConstrainedBeams``), reusing ``settled``, ``_keep``
    and ``_drop``: a sentence is done at its length bound or once ``settled``, never earlier."""

    def __init__(self, model: EncoderDecoder, src: torch.Tensor, src_mask: torch.Tensor, k: int,
                 alpha: float, limit: torch.Tensor, output: OutputVocabulary, prefixes: Prefixes | None = None,
                 n_best: int = 1) -> None:
        batch, device = src.size(0), src.device
        self.model, self.k, self.alpha, self.limit, self.output = model, k, alpha, limit, output
        self.n_best = n_best
        self.prefixes = prefixes
        self.memory = model.encode(src, src_mask)  # one row per sentence, read by all its beams
        self.expand = torch.arange(batch, device=device).repeat_interleave(k)  # (batch * k,)
        self.first_state: dict | None = model.init_state(self.memory, int(limit.max()) + 1)  # a row per sentence
        self.state: dict = {}
        self.rows = torch.arange(batch, device=device)  # sentence of each active sentence
        self.host_rows, self.host_limit = list(range(batch)), limit.tolist()  # the same on the host (no syncs)
        self.scores = torch.full((batch, k), float("-inf"), device=device)  # raw sum log-prob
        self.scores[:, 0] = 0.0  # only one live beam at the start
        self.prefix = torch.zeros(batch * k, 0, dtype=torch.long, device=device)  # tokens so far
        self.tokens = torch.full((batch * k,), BOS_ID, device=device)
        self.finished: list[list[Hypothesis]] = [[] for _ in range(batch)]

    def advance(self, t: int) -> bool:
        """One decoding step for every active beam; False once no sentence is left."""
        n, k = len(self.rows), self.k
        first = self.first_state is not None  # all beams still hold BOS alone: decode it once per sentence
        state, tokens = (self.first_state, self.tokens[::k]) if first else (self.state, self.tokens)
        logits, self.state, _ = self.model.decode_step(self.memory, state, tokens, need_attention=False,
                                                       output_weight=self.output.weight)
        if first:
            logits, self.state, self.first_state = logits[self.expand], select_batch(self.state, self.expand), None
        # the 2k best continuations of a sentence are among the 2k best of each of its beams
        force_eos = (t >= self.limit[self.rows]).repeat_interleave(k)  # (n * k,)
        allowed = None if self.prefixes is None or t >= self.prefixes.longest else self.prefixes.allowed(
            t, [sentence for sentence in self.host_rows for _ in range(k)], logits.device)
        logp, tokens = self.output.best_tokens(logits, force_eos, 2 * k, allowed)  # (n * k, m), m = min(2k, V)
        m = logp.size(1)
        total = (self.scores.unsqueeze(2) + logp.view(n, k, m)).view(n, k * m)
        top, index = total.topk(min(2 * k, k * m))  # (n, 2k)
        beam, token = index // m, tokens.view(n, k * m).gather(1, index)
        self._finish(top[:, :k], beam[:, :k], token[:, :k])
        # continue with the k best candidates that did not end
        top = top.masked_fill(token == EOS_ID, float("-inf"))
        keep = top.topk(k).indices  # (n, k), best first
        self.scores, beam, token = top.gather(1, keep), beam.gather(1, keep), token.gather(1, keep)
        origin = torch.arange(n, device=beam.device).unsqueeze(1) * k + beam  # (n, k) previous row
        best_live = self.scores[:, 0].tolist()  # the best live beam of each sentence (kept best first)
        finished = [t >= self.host_limit[r] or self.settled(r, best, t) for r, best in zip(self.host_rows, best_live)]
        if any(finished):
            live = torch.tensor([i for i, f in enumerate(finished) if not f], dtype=torch.long, device=beam.device)
            self._drop(live, finished)
            origin, token = origin[live], token[live]
            if not self.host_rows:
                return False
        self.state = select_batch(self.state, origin.view(-1))
        self.prefix = torch.cat([self.prefix[origin.view(-1)], token.view(-1, 1)], 1)
        self.tokens = token.view(-1)
        return True

    def settled(self, sentence: int, best_live: float, t: int) -> bool:
        """Whether no live beam of ``sentence`` (the best of them at raw log-probability ``best_live``
        after step ``t``) can end above its ``n_best``-th best finished hypothesis. Log-probabilities
        only fall as tokens are added, so a live beam ends at log P <= best_live, with a length from
        t + 2 (its t + 1 tokens and EOS) to the bound + 1: its score is at most best_live / the largest
        lp over those lengths (log P <= 0). Stopping there changes no output."""
        done = self.finished[sentence]
        if len(done) < self.n_best or best_live == float("-inf"):
            return len(done) >= self.n_best  # no live beam at all: nothing can come
        nth_best = sorted((h.score for h in done), reverse=True)[self.n_best - 1]
        largest_lp = max(length_penalty_gnmt(t + 2, self.alpha),
                         length_penalty_gnmt(self.host_limit[sentence] + 1, self.alpha))
        return nth_best >= best_live / largest_lp

    def _finish(self, top: torch.Tensor, beam: torch.Tensor, token: torch.Tensor) -> None:
        """Record candidates (among the top k) that end in EOS as finished hypotheses."""
        index = ((token == EOS_ID) & top.isfinite()).nonzero()  # (ended, 2): the one wait per step
        if not len(index):
            return
        n, j = index.unbind(1)
        prefixes = self.prefix[n * self.k + beam[n, j]].tolist()  # one copy each, not one per hypothesis
        for (row, _), words, log_prob in zip(index.tolist(), prefixes, top[n, j].tolist()):
            self._keep(self.host_rows[row], words, log_prob)

    def _keep(self, sentence: int, words: list[int], log_prob: float) -> None:
        """Add a finished hypothesis (``words`` without EOS, raw log P with EOS) to ``sentence``'s k
        best: appended while there are fewer than k, else it replaces the worst if it scores above it."""
        score = log_prob / length_penalty_gnmt(len(words) + 1, self.alpha)
        done, hypothesis = self.finished[sentence], Hypothesis(words, score, log_prob)
        if len(done) < self.k:
            done.append(hypothesis)
        elif score > min(h.score for h in done):
            done[min(range(len(done)), key=lambda i: done[i].score)] = hypothesis

    def _drop(self, live: torch.Tensor, finished: list[bool]) -> None:
        """Remove finished sentences (all their beams) from the active batch; ``live`` indexes the
        others (built on the host from ``finished``: no wait for the device)."""
        self.memory = select_batch(self.memory, live)  # one row per sentence
        self.rows, self.scores = self.rows[live], self.scores[live]
        self.host_rows = [r for r, d in zip(self.host_rows, finished) if not d]


def attach_attention(model: EncoderDecoder, src: torch.Tensor, src_mask: torch.Tensor,
                     hyps: list[list[Hypothesis]]) -> None:
    """Fill ``h.attention`` (layers, heads, len + 1, real src_len) by teacher-forcing the outputs
    (``scoring.forced_pass``: one batch for all hypotheses)."""
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


def translate_batch(
    model: EncoderDecoder,
    src: torch.Tensor,
    src_mask: torch.Tensor,
    decode: DecodeConfig = GREEDY,
    *,
    need_attention: bool = True,
    vocabulary: torch.Tensor | None = None,
    sentence_ids: Sequence[int] | None = None,
    prefixes: Prefixes | None = None,
) -> list[list[Hypothesis]]:
    """Decode one batch as ``decode`` says (a checked ``DecodeConfig``; default: greedy): greedy
    search for beam 1, beam search otherwise, or with ``sample`` ``n_best`` samples per sentence
    (``sample_search``; ``sentence_ids`` name the sentences' random streams, 0.. by default);
    ``vocabulary`` restricts the tokens any of them may produce (``OutputVocabulary``; e.g.
    ``Shortlist.vocabulary(src, src_mask)``); ``prefixes`` force each output through its sentence's
    target prefix (``Prefixes``)."""
    ratio = decode.max_output_ratio
    if decode.sample:
        sampling = Sampling(decode.top_k, decode.top_p, decode.temperature,
                            secrets.randbits(63) if decode.seed is None else decode.seed)
        ids = range(src.size(0)) if sentence_ids is None else sentence_ids
        return sample_search(model, src, src_mask, sampling, decode.n_best, ids, ratio, MAX_LEN_OFFSET,
                             need_attention, vocabulary, prefixes)
    if decode.beam == 1:
        return greedy_search(model, src, src_mask, ratio, MAX_LEN_OFFSET, need_attention, vocabulary, prefixes)
    return beam_search(model, src, src_mask, decode.beam, decode.length_penalty, decode.n_best, ratio,
                       MAX_LEN_OFFSET, need_attention, vocabulary, prefixes)
