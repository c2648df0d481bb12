"""What a search chooses the next token from: the model's log-probabilities log p = log_softmax(z) with the tokens that
may not come next at -inf (``masked_log_probs``: banned columns, every column but EOS on rows at their length bound),
greedy search's choice among them, the most probable (``greedy_choice``), and beam search's, the best continuations
(``beam_choice``). Below both the search (``seq2seq.decoding``) and the model's packaged steps with the search's choice
(``models.fused.static_greedy_step`` / ``static_beam_step``), which compute the same choice inside their compiled
graph: one mechanism, two callers."""
from __future__ import annotations

import torch


def only_eos(log_p: torch.Tensor, rows: torch.Tensor, eos: int, sync_free: bool) -> None:
    """In place: every column but ``eos`` of the flagged ``rows`` (bool, one per row) becomes -inf.

    ``sync_free`` (GPUs, and compiled graphs, which cannot branch on a tensor) masks every row with no test for a
    flagged one, which would make the host wait for the device; otherwise (CPU, where the test is free) only the
    flagged rows are touched."""
    if sync_free:
        kept = log_p[:, eos].clone()
        log_p.masked_fill_(rows[:, None], float("-inf"))
        log_p[:, eos] = kept
    elif rows.any():
        kept = log_p[rows, eos]
        log_p[rows] = float("-inf")
        log_p[rows, eos] = kept


def masked_log_probs(logits: torch.Tensor, banned: torch.Tensor, force_eos: torch.Tensor | None, eos: int,
                     sync_free: bool) -> torch.Tensor:
    """logits (rows, V) -> log p = log_softmax(z) (rows, V) in fp32 with the ``banned`` columns (a long tensor) at -inf
    and, where ``force_eos`` (one flag per row; None: no row) holds, every column but ``eos`` (``only_eos``). Masks come
    after the normalisation, so a chosen token's log-probability is the model's own. (One fused log_softmax pass
    costs less than ``logsumexp`` alone on CPU.)"""
    log_p = torch.log_softmax(logits.float(), -1)  # (rows, V)
    log_p.index_fill_(1, banned, float("-inf"))  # one operation for every banned column
    if force_eos is not None:
        only_eos(log_p, force_eos, eos, sync_free)
    return log_p


def greedy_choice(logits: torch.Tensor, banned: torch.Tensor, force_eos: torch.Tensor,
                  eos: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy search's step: the most probable allowed token of each row (``masked_log_probs``, with no host sync:
    it runs inside a compiled graph too) -> its log-probability (rows,) and column (rows,)."""
    return masked_log_probs(logits, banned, force_eos, eos, sync_free=True).max(-1)


def beam_choice(log_p: torch.Tensor, scores: torch.Tensor, eos: int) -> tuple[torch.Tensor, ...]:
    """Beam search's step for n sentences of k beams: ``log_p`` (n * k, V) the next-token log-probabilities of each
    beam (``masked_log_probs``), ``scores`` (n, k) each beam's sum so far -> the 2k best continuations of each
    sentence, best first: their sums ``top`` (n, 2k), the beam each continues ``beam`` and its column ``column``; and
    the k best of them that do not end in ``eos`` (the beams that go on): ``live`` sums (n, k) (-inf where fewer than
    k), ``live_beam``, ``live_column``. The 2k best continuations of a sentence are among the 2k best columns of each
    of its beams, and at most k of them end in EOS (one column per beam). No host sync: it runs inside a compiled
    graph too."""
    n, k = scores.shape
    logp, columns = log_p.topk(min(2 * k, log_p.size(-1)), dim=-1)  # (n * k, m)
    m = logp.size(1)
    total = (scores.unsqueeze(2) + logp.view(n, k, m)).view(n, k * m)
    top, index = total.topk(min(2 * k, k * m))  # (n, 2k)
    beam, column = index // m, columns.view(n, k * m).gather(1, index)
    live = top.masked_fill(column == eos, float("-inf"))
    keep = live.topk(k).indices  # (n, k), best first
    return top, beam, column, live.gather(1, keep), beam.gather(1, keep), column.gather(1, keep)
