"""Greedy and beam search for any ``EncoderDecoder`` (one interface, no architecture knowledge).

Both decode a batch of sentences incrementally with ``decode_step`` on the fast path (no attention
weights), each sentence with its own length bound ceil(src_len * max_len_ratio) + max_len_offset
output tokens (src_len counts the source EOS; a model with learned positions lowers the bound to
what it can encode), after which EOS is forced. PAD and BOS are never generated. Finished
sentences leave the active batch. Either search can be restricted to a subset of the vocabulary
(``OutputVocabulary``, e.g. a lexical shortlist from ``seq2seq.decoding.shortlist``).

Attention of the returned hypotheses is computed afterwards by one teacher-forced ``forward``
pass over the chosen outputs (``need_attention=True``). Because incremental and teacher-forced
decoding are identical (tested), these are exactly the weights the search saw, and they cannot be
scrambled by beam reordering; the search itself never carries (beam, layer, head, step, source)
tensors around.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

import torch

from ..errors import UserError
from ..models.base import EncoderDecoder, select_batch
from ..tokenizer import BOS_ID, EOS_ID, PAD_ID
from .scoring import forced_pass


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


def length_penalty_gnmt(length: int, alpha: float) -> float:
    """GNMT (Wu et al. 2016): lp(Y) = ((5 + |Y|) / 6)^alpha, |Y| counting the EOS."""
    return ((5.0 + length) / 6.0) ** alpha


@contextmanager
def _inference(model: EncoderDecoder) -> Iterator[None]:
    """Eval mode (no dropout) and no autograd for the duration; the training flag is restored."""
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            yield
    finally:
        model.train(was_training)


def max_lengths(model: EncoderDecoder, src_mask: torch.Tensor, ratio: float, offset: int) -> torch.Tensor:
    """Per-sentence bound on output tokens (EOS excluded): ceil(src_len * ratio) + offset, (batch,)."""
    src_len = src_mask.sum(1).double()
    limit = torch.ceil(src_len * ratio).long() + offset
    max_positions = getattr(model, "max_positions", None)  # learned positions: BOS + tokens must fit
    if max_positions is not None:
        limit = limit.clamp(max=max_positions - 1)
    return limit.clamp(min=0)


def only_eos(log_p: torch.Tensor, rows: torch.Tensor, eos: int, sync_free: bool) -> None:
    """In place: every column but ``eos`` of the flagged ``rows`` (bool, one per row) becomes -inf.

    ``sync_free`` (GPUs) masks every step with no test for a flagged row, which would make the host
    wait for the device; otherwise (CPU, where the test is free) only the flagged rows are touched."""
    if sync_free:
        kept = log_p[:, eos].clone()
        log_p.masked_fill_(rows[:, None], float("-inf"))
        log_p[:, eos] = kept
    elif rows.any():
        kept = log_p[rows, eos]
        log_p[rows] = float("-inf")
        log_p[rows, eos] = kept


class OutputVocabulary:
    """The tokens a search may produce: the whole vocabulary, or a subset (a lexical shortlist).

    ``ids`` (V',) distinct token ids including EOS; ``weight`` the output layer's rows for them
    (gathered once per batch, not per step). Column c of restricted logits is token ids[c]; the
    softmax is over the subset. PAD and BOS are never produced (masked after the softmax, as with
    the whole vocabulary, so a subset that lists every token decodes exactly like no subset).
    """

    def __init__(self, model: EncoderDecoder, ids: torch.Tensor | None = None) -> None:
        self.ids, self.weight, self.eos = ids, None, EOS_ID
        self.banned = [PAD_ID, BOS_ID]  # columns never chosen
        if ids is not None:
            if ids.dim() != 1 or len(ids.unique()) != len(ids):
                raise ValueError("an output vocabulary is a 1-D tensor of distinct token ids")
            eos = (ids == EOS_ID).nonzero()
            if len(eos) != 1:
                raise ValueError("an output vocabulary must contain EOS")
            self.eos, self.weight = int(eos[0, 0]), model.output_rows(ids)
            self.banned = ((ids == PAD_ID) | (ids == BOS_ID)).nonzero().squeeze(1).tolist()

    def best_tokens(self, logits: torch.Tensor, force_eos: torch.Tensor,
                    count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The ``count`` most probable next tokens of every row and their log-probabilities.

        logits (rows, V) -> log p (rows, count), token ids (rows, count), best first, with
        log p = log_softmax(z) (over the subset, when there is one). PAD and BOS are never
        generated; where ``force_eos`` (one flag per row) holds, only EOS stays possible (the other
        entries are -inf). Masking comes after the normalisation, so a chosen token's
        log-probability is the model's own. (One fused log_softmax pass costs less than
        ``logsumexp`` alone on CPU.)"""
        log_p = torch.log_softmax(logits.float(), -1)  # (rows, V)
        for column in self.banned:
            log_p[:, column] = float("-inf")
        only_eos(log_p, force_eos, self.eos, sync_free=log_p.device.type != "cpu")
        if count == 1:
            best, column = log_p.max(-1, keepdim=True)
        else:
            best, column = log_p.topk(min(count, log_p.size(-1)), dim=-1)
        return best, column if self.ids is None else self.ids[column]


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
) -> list[list[Hypothesis]]:
    """Most probable next token at every step; one hypothesis per sentence. ``vocabulary``: the
    token ids it may produce (see ``OutputVocabulary``), default all."""
    with _inference(model):
        output = OutputVocabulary(model, vocabulary)
        limit = max_lengths(model, src_mask, max_len_ratio, max_len_offset)  # (B,)
        memory = model.encode(src, src_mask)
        state = model.init_state(memory)
        rows = torch.arange(src.size(0), device=src.device)  # sentence of each active row
        tokens = torch.full_like(rows, BOS_ID)
        ended = torch.zeros_like(rows, dtype=torch.bool)  # active rows that produced EOS
        out = torch.full((src.size(0), int(limit.max()) + 1), PAD_ID, device=src.device)  # (B, steps)
        log_prob = torch.zeros(src.size(0), device=src.device)  # (B,)
        interval = finished_check_interval(src.device)
        for t in range(out.size(1)):
            logits, state, _ = model.decode_step(memory, state, tokens, need_attention=False,
                                                 output_weight=output.weight)
            logp, tokens = output.best_tokens(logits, t >= limit[rows], 1)  # (active, 1) each
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
        hyps = [[Hypothesis(_until_eos(row), lp, lp)] for row, lp in zip(out.tolist(), log_prob.tolist())]
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
) -> list[list[Hypothesis]]:
    """Beam search batched over sentences x beams; ``n_best`` hypotheses per sentence, best first.

    Beams compete on raw log-probability; a hypothesis ending in EOS among the top ``beam_size``
    candidates is finished with score log P / lp(Y). A sentence is done once it has ``beam_size``
    finished hypotheses or reaches its length bound (where EOS is forced on every beam).
    """
    if not 1 <= n_best <= beam_size:
        raise UserError(f"need 1 <= --n-best ({n_best}) <= --beam-size ({beam_size})")
    with _inference(model):
        beams = _Beams(model, src, src_mask, beam_size, length_penalty,
                       max_lengths(model, src_mask, max_len_ratio, max_len_offset),
                       OutputVocabulary(model, vocabulary))
        for t in range(int(beams.limit.max()) + 1):
            if not beams.advance(t):
                break
        hyps = [sorted(done, key=lambda h: -h.score)[:n_best] for done in beams.finished]
        if need_attention:
            attach_attention(model, src, src_mask, hyps)
    return hyps


class _Beams:
    """Search state of the active sentences: row n * k + j of the decoder state is beam j of
    sentence n; the encoder memory has one row per sentence, shared by its k beams."""

    def __init__(self, model: EncoderDecoder, src: torch.Tensor, src_mask: torch.Tensor, k: int,
                 alpha: float, limit: torch.Tensor, output: OutputVocabulary) -> None:
        batch, device = src.size(0), src.device
        self.model, self.k, self.alpha, self.limit, self.output = model, k, alpha, limit, output
        self.memory = model.encode(src, src_mask)  # one row per sentence, read by all its beams
        self.expand = torch.arange(batch, device=device).repeat_interleave(k)  # (batch * k,)
        self.first_state: dict | None = model.init_state(self.memory)  # one row per sentence
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
        logp, tokens = self.output.best_tokens(logits, force_eos, 2 * k)  # (n * k, m), m = min(2k, V)
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
        finished = [len(self.finished[r]) >= k or t >= self.host_limit[r] for r in self.host_rows]
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

    def _finish(self, top: torch.Tensor, beam: torch.Tensor, token: torch.Tensor) -> None:
        """Record candidates (among the top k) that end in EOS as finished hypotheses."""
        index = ((token == EOS_ID) & top.isfinite()).nonzero()  # (ended, 2): the one wait per step
        if not len(index):
            return
        n, j = index.unbind(1)
        prefixes = self.prefix[n * self.k + beam[n, j]].tolist()  # one copy each, not one per hypothesis
        for (row, _), words, log_prob in zip(index.tolist(), prefixes, top[n, j].tolist()):
            sentence = self.host_rows[row]
            if len(self.finished[sentence]) >= self.k:
                continue
            score = log_prob / length_penalty_gnmt(len(words) + 1, self.alpha)
            self.finished[sentence].append(Hypothesis(words, score, log_prob))

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
    with _inference(model):
        _, attention = forced_pass(model, src[index], src_mask[index], [h.tokens for _, h in flat],
                                   need_attention=True, need_scores=False)
    for (_, h), weights in zip(flat, attention):
        h.attention = weights


def translate_batch(
    model: EncoderDecoder,
    src: torch.Tensor,
    src_mask: torch.Tensor,
    beam_size: int = 1,
    length_penalty: float = 1.0,
    n_best: int = 1,
    max_len_ratio: float = 1.5,
    max_len_offset: int = 10,
    need_attention: bool = True,
    vocabulary: torch.Tensor | None = None,
) -> list[list[Hypothesis]]:
    """Greedy search for ``beam_size == 1``, beam search otherwise; ``vocabulary`` restricts the
    tokens either may produce (``OutputVocabulary``; e.g. ``Shortlist.vocabulary(src, src_mask)``)."""
    if beam_size < 1:
        raise UserError(f"--beam-size must be >= 1, got {beam_size}")
    if beam_size == 1:
        if n_best != 1:
            raise UserError(f"need 1 <= --n-best ({n_best}) <= --beam-size ({beam_size})")
        return greedy_search(model, src, src_mask, max_len_ratio, max_len_offset, need_attention, vocabulary)
    return beam_search(model, src, src_mask, beam_size, length_penalty, n_best, max_len_ratio,
                       max_len_offset, need_attention, vocabulary)
