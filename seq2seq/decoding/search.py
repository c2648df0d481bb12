"""Search for any ``EncoderDecoder``: ``translate_batch`` decodes one ``SearchBatch`` as a
``DecodeConfig`` says, with the strategy it names, every strategy on the model calls of one
``Generator`` (``seq2seq.decoding.generator``; an ensemble, ``seq2seq.decoding.ensemble``, is one more
``EncoderDecoder``):

- greedy search (beam 1): the most probable next token of every row;
- sampling (``sample``): greedy search with the argmax replaced by a draw from the model's
  next-token distribution, reshaped at every step: divided by a temperature T (logits / T; T = 0 is
  the argmax), cut to the k most probable tokens (top-k), then to the smallest set of most probable
  tokens whose probability reaches p (nucleus, top-p), renormalised (``Sampling``);
- beam search (``seq2seq.decoding.beam``), and with constraints lexically constrained beam search
  (``seq2seq.decoding.constrained``).

Greedy search and sampling (this module) decode one row per output, finished rows leaving the
active batch. Attention of the returned hypotheses is computed afterwards by one teacher-forced
``forward`` pass over the chosen outputs (``generator.attach_attention``).
"""
from __future__ import annotations

import secrets
from typing import Sequence

import torch

from ..config import DecodeConfig
from ..models.base import EncoderDecoder
from ..tokenizer import BOS_ID, EOS_ID, PAD_ID
from .beam import beam_search
from .constrained import constrained_beam_search
from .constraints import SentenceConstraints
from .generator import Generator, Hypothesis, SearchBatch, attach_attention, fused
from .sampling import Sampling
from .scoring import eval_mode

#: ``greedy_search``'s and ``translate_batch``'s default: greedy search.
GREEDY = DecodeConfig(beam_size=1)


def finished_check_interval(device: torch.device) -> int:
    """Steps between looks for finished sentences in greedy search: every step on CPU (a look is
    free and dropping rows saves work at once); every 8 on a GPU, where a look waits for the device
    (a host sync) and finished rows cost little until they are dropped."""
    return 1 if device.type == "cpu" else 8


def translate_batch(model: EncoderDecoder, batch: SearchBatch, decode: DecodeConfig = GREEDY, *,
                    need_attention: bool = True,
                    constraints: Sequence[SentenceConstraints] | None = None) -> list[list[Hypothesis]]:
    """Decode one batch as ``decode`` says (a checked ``DecodeConfig``; default: greedy): with
    ``constraints`` (one ``SentenceConstraints`` per sentence) constrained beam search; with
    ``decode.sample`` ``decode.n_best`` samples per sentence; greedy search for beam 1; beam search
    otherwise. Each sentence's hypotheses, best first."""
    if constraints is not None:
        return constrained_beam_search(model, batch, constraints, decode, need_attention)
    if decode.sample:
        return sample_search(model, batch, decode, need_attention)
    if decode.beam == 1:
        return greedy_search(model, batch, decode, need_attention)
    return beam_search(model, batch, decode, need_attention)


def greedy_search(model: EncoderDecoder, batch: SearchBatch, decode: DecodeConfig = GREEDY,
                  need_attention: bool = True) -> list[list[Hypothesis]]:
    """The most probable next token at every step; one hypothesis per sentence, scored by its raw
    log-probability (no length penalty; ``decode``'s length bound)."""
    return _token_by_token(model, batch, decode, need_attention)


def sample_search(model: EncoderDecoder, batch: SearchBatch, decode: DecodeConfig,
                  need_attention: bool = True) -> list[list[Hypothesis]]:
    """``decode.n_best`` independent samples per sentence (``Sampling``: ``decode.temperature``,
    ``top_k``, ``top_p``, ``seed``; None: a fresh one), most probable first; duplicates are kept (they
    are independent draws). Decoding is greedy search's, the argmax replaced by a draw: same length
    bound with EOS forced there, PAD and BOS never drawn, the same ``vocabulary`` restriction (the
    distribution is over the subset).

    ``log_prob`` (and ``score``, as in greedy search: no length penalty) is the model's own
    log-probability of the sample, EOS included: the sum of the unmodified (temperature 1,
    untruncated) log-probabilities of its tokens, not the probability of drawing it.

    ``batch.sentence_ids`` (default 0, 1, ...) name the sentences for the random streams: the same
    seed and sentence id give the same samples whatever else is in the batch (see ``Sampling``). The
    encoder runs once per sentence; its memory is copied for each sample."""
    sampling = Sampling(decode.top_k, decode.top_p, decode.temperature,
                        secrets.randbits(63) if decode.seed is None else decode.seed)
    ids = list(range(len(batch))) if batch.sentence_ids is None else list(batch.sentence_ids)
    if len(ids) != len(batch):
        raise ValueError(f"sample_search: {len(ids)} sentence ids for {len(batch)} sentences")
    return _token_by_token(model, batch, decode, need_attention, sampling, ids)


def _token_by_token(model: EncoderDecoder, batch: SearchBatch, decode: DecodeConfig, need_attention: bool,
                    sampling: Sampling | None = None, sentence_ids: Sequence[int] = ()) -> list[list[Hypothesis]]:
    """Greedy search (``sampling`` None) or sampling (``decode.n_best`` samples per sentence): one
    token per row and step, finished rows leave the active batch. Where they leave at every step (CPU) no
    active row has ended at a step's start, so nothing is masked for ended rows; while every row is active
    the outputs are written without an index (at one sentence at a time each operation saved counts)."""
    copies = 1 if sampling is None else decode.n_best
    with eval_mode(model, inference=True):
        generator = Generator(model, batch, decode, copies=copies)
        if sampling is None and fused(model, generator):
            hyps = [[_fused_greedy(model, generator)]]
            if need_attention:
                attach_attention(model, batch.src, batch.src_mask, hyps)
            return hyps
        limit = generator.limit[generator.sentence]  # (rows,) each output row's bound
        rows = torch.arange(limit.size(0), device=limit.device)  # output row of each active row
        tokens = torch.full_like(rows, BOS_ID)
        ended = torch.zeros_like(rows, dtype=torch.bool)  # active rows that produced EOS
        out = torch.full((limit.size(0), generator.steps), PAD_ID, device=limit.device)  # (rows, steps)
        log_prob = torch.zeros(limit.size(0), device=limit.device)  # (rows,)
        uniform = None if sampling is None else sampling.uniforms(
            sentence_ids, copies, [n + 1 for n in generator.limit.tolist()], out.size(1), limit.device)
        interval = finished_check_interval(limit.device)
        for t in range(out.size(1)):
            log_p = generator.log_probs(tokens, t)  # (active, V')
            if sampling is None:
                logp, column = log_p.max(-1)
            else:
                column = sampling.choose(log_p, uniform[rows, t]).squeeze(1)
                logp = log_p.gather(1, column.unsqueeze(1)).squeeze(1)
            tokens = generator.output.token_ids(column)
            if interval > 1:  # ended rows may still be in the batch: each keeps its output
                tokens, logp = tokens.masked_fill(ended, PAD_ID), logp.masked_fill(ended, 0.0)
            if len(rows) == out.size(0):  # every row still active: no index to go through
                log_prob += logp
                out[:, t] = tokens
            else:
                log_prob[rows] += logp
                out[rows, t] = tokens
            ended |= tokens == EOS_ID
            if ((t + 1) % interval == 0 or t + 1 == out.size(1)) and bool(ended.any()):  # drop finished rows
                alive = (~ended).nonzero().squeeze(1)
                if len(alive) == 0:
                    break
                generator.keep_rows(alive)
                rows, tokens, ended = rows[alive], tokens[alive], ended[alive]
        flat = [Hypothesis(_until_eos(row), lp, lp) for row, lp in zip(out.tolist(), log_prob.tolist())]
        hyps = [sorted(flat[i:i + copies], key=lambda h: -h.score) for i in range(0, len(flat), copies)]
        if need_attention:
            attach_attention(model, batch.src, batch.src_mask, hyps)
    return hyps


def _fused_greedy(model: EncoderDecoder, generator: Generator) -> Hypothesis:
    """Greedy search of one sentence, the step and the choice in one compiled call (``model.greedy_step``): the
    same tokens as the step-by-step loop of ``_token_by_token``, one host read (the chosen token) per step."""
    state, limit = generator.state, generator.limit
    tokens = torch.full((1,), BOS_ID, device=limit.device)
    score = torch.zeros(1, device=limit.device)
    words: list[int] = []
    for _ in range(generator.steps):
        tokens, score, state = model.greedy_step(generator.memory, state, tokens, limit, score)
        token = int(tokens)
        if token == EOS_ID:
            break
        words.append(token)
    log_prob = float(score)
    return Hypothesis(words, log_prob, log_prob)


def _until_eos(tokens: list[int]) -> list[int]:
    return tokens[: tokens.index(EOS_ID)] if EOS_ID in tokens else tokens
