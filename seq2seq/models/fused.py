"""The Transformer's one-sentence decoding step with the search's choice after it (``static_greedy_step``,
``static_beam_step``): what a greedy or beam search does after each ``static_step`` (the log-softmax, the banned and
forced tokens, the argmax or the best continuations, the scores, a beam's cache reordered, the next position) in the
same function, so that compiled into one package (``models.packaged``) a search of one sentence makes one call per
output token with nothing between them. The choices themselves are ``nn.next_token``'s, the search's own."""
from __future__ import annotations

import torch

from ..nn.next_token import beam_choice, greedy_choice, masked_log_probs
from ..tokenizer import BOS_ID, EOS_ID, PAD_ID

#: What ``static_choice`` computes: greedy search's choice, or beam search's.
KINDS = ("greedy", "beam")


def static_choice(model: torch.nn.Module, kind: str, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """``static_greedy_step`` or ``static_beam_step`` of ``model``, as ``kind`` says."""
    return (static_greedy_step if kind == "greedy" else static_beam_step)(model, *args)


def static_greedy_step(model: torch.nn.Module, memory: dict, caches: list, position: torch.Tensor,
                       tokens: torch.Tensor, limit: torch.Tensor,
                       score: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``model.static_step`` followed by greedy search's choice (``greedy_choice``: PAD and BOS never, EOS alone once
    ``position`` reaches a row's ``limit``) -> the chosen tokens (B,), ``score`` (B,) plus their log-probabilities,
    ``position + 1``."""
    logits, _ = model.static_step(memory, caches, position, tokens, False, None)
    log_p, chosen = greedy_choice(logits, _banned(logits), position >= limit, EOS_ID)
    return chosen, score + log_p, position + 1


def static_beam_step(model: torch.nn.Module, memory: dict, caches: list, position: torch.Tensor, tokens: torch.Tensor,
                     limit: torch.Tensor, scores: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """``model.static_step`` for one sentence's k beams (tokens (k,), their sums ``scores`` (1, k)) followed by beam
    search's choice (``beam_choice`` on ``masked_log_probs``) and the caches reordered (row i continues the beam that
    the i-th best live continuation extends) -> the live continuations' tokens (k,) and sums (1, k), ``chosen``,
    ``position + 1``, then each layer's reordered cache key and value. ``chosen`` (5k + 1,) is what the search reads on
    the host, in one go: the k best continuations' sums, beams and tokens (the finished among them end in EOS), the
    best live sum, and the live continuations' beams and tokens (indices as floats: exact below 2^24).

    The reordered caches are new tensors, not written over the old ones: Inductor compiles ``cache.copy_(
    cache.index_select(0, origin))`` into one loop that reads rows it has already overwritten (a row that continues
    an earlier row gets that row's new contents; torch 2.13: a beam of 5 then matched eager on 66% of 50 sentences).
    ``tests/test_packaged.py`` checks a package against this function where the beams swap rows."""
    logits, _ = model.static_step(memory, caches, position, tokens, False, None)
    k = tokens.size(0)
    log_p = masked_log_probs(logits, _banned(logits), (position >= limit).expand(k), EOS_ID, sync_free=True)
    top, beam, column, live, live_beam, live_column = beam_choice(log_p, scores, EOS_ID)
    origin = live_beam[0]
    chosen = torch.cat([top[0, :k], beam[0, :k].float(), column[0, :k].float(), live[0, :1], origin.float(),
                        live_column[0].float()])
    reordered = [t.index_select(0, origin) for kv in caches for t in kv]  # row i continues row origin[i]
    return live_column[0], live, chosen, position + 1, *reordered


def _banned(logits: torch.Tensor) -> torch.Tensor:
    """The columns no search chooses: PAD and BOS."""
    return torch.tensor([PAD_ID, BOS_ID], device=logits.device)
