"""What a search chooses the next token from: the model's log-probabilities log p = log_softmax(z) with the tokens that
may not come next at -inf (``masked_log_probs``: banned columns, every column but EOS on rows at their length bound),
and greedy search's choice among them, the most probable (``greedy_choice``). Below both the search
(``seq2seq.decoding.vocabulary``) and the model's packaged greedy step
(``TransformerEncoderDecoder.static_greedy_step``), which computes the same choice inside its compiled graph: one
mechanism, two callers."""
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
