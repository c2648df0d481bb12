"""Teacher-forced scoring: given outputs y for sources x, one forward pass gives
log p(y_t | y_<t, x) for every target token and EOS, and the attention behind each of them.

This is the one teacher-forced path: the search attaches attention to its hypotheses with it
(``seq2seq.decoding.search``), alignment against gold links and the comparison report force the
references through it, and attribution scores perturbed sources with it. ``pad_ids`` is the one
way a list of id sequences becomes a padded batch.
"""
from __future__ import annotations

import contextlib
from typing import Iterator, Sequence

import numpy as np
import torch
from torch import nn

from ..io_utils import counted
from ..models.base import EncoderDecoder
from ..tokenizer import BOS_ID, EOS_ID, PAD_ID


def pad_ids(rows: Sequence[Sequence[int]], device: torch.device | str = "cpu") -> torch.Tensor:
    """Id sequences -> (len(rows), longest) long tensor, right-padded with PAD_ID."""
    out = torch.full((len(rows), max((len(r) for r in rows), default=0)), PAD_ID, dtype=torch.long)  # (B, len)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.as_tensor(list(row), dtype=torch.long)
    return out.to(device)


def target_tensors(targets: Sequence[Sequence[int]], device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor]:
    """tgt_in = BOS y (B, T+1) and tgt_out = y EOS (B, T+1), padded, for targets without BOS/EOS."""
    return pad_ids([[BOS_ID, *t] for t in targets], device), pad_ids([[*t, EOS_ID] for t in targets], device)


def model_device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


@contextlib.contextmanager
def eval_mode(model: nn.Module, grad: bool = False, inference: bool = False) -> Iterator[None]:
    """Eval mode (no dropout); autograd on (attribution) or off; with ``inference`` in
    ``torch.inference_mode`` (the search: its tensors never meet autograd, and it skips version
    counting); the training flag is restored afterwards."""
    was_training = model.training
    if was_training:  # eval() walks every submodule: a noticeable cost per sentence at batch 1
        model.eval()
    try:
        if grad:
            with torch.inference_mode(False), torch.enable_grad(), torch.backends.cudnn.flags(enabled=False):
                yield
        elif inference:
            with torch.inference_mode():
                yield
        else:
            with torch.no_grad():
                yield
    finally:
        if was_training:
            model.train()


def forced_pass(model: EncoderDecoder, src: torch.Tensor, src_mask: torch.Tensor, targets: Sequence[Sequence[int]],
                need_attention: bool = False,
                need_scores: bool = True) -> tuple[list[torch.Tensor] | None, list[torch.Tensor] | None]:
    """One batch: src (B, S) with mask (B, S), one target per row (ids without BOS/EOS) ->
    per row log p of its T tokens and EOS (T+1,) and, if asked, the attention (L, H, T+1, S_real)
    over that row's real source positions. ``need_scores=False`` skips the softmax over the
    vocabulary when only attention is wanted. The caller sets eval / no-grad mode."""
    tgt_in, tgt_out = target_tensors(targets, src.device)
    logits, attention = model(src, src_mask, tgt_in, need_attention=need_attention)
    lengths = [len(t) + 1 for t in targets]
    scores = None
    if need_scores:
        log_p = logits.float().log_softmax(-1).gather(2, tgt_out.unsqueeze(2)).squeeze(2)  # (B, T+1)
        scores = [log_p[row, :n] for row, n in enumerate(lengths)]
    if not need_attention:
        return scores, None
    return scores, [attention[row, :, :, :n][..., src_mask[row]] for row, n in enumerate(lengths)]


def forced_confidence(model: EncoderDecoder, src: torch.Tensor, src_mask: torch.Tensor,
                      targets: Sequence[Sequence[int]]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """How sure the model is of each token of given outputs: per target row, log p(y_t | y_<t, x) of
    its T tokens and EOS (T+1,) and the entropy of the model's whole distribution at those steps,
    H_t = -sum_v p_t(v) log p_t(v) in nats (T+1,) (0: certain; log V: uniform). Under the full
    vocabulary, whatever shortlist the search used. One teacher-forced pass; the caller sets eval mode."""
    tgt_in, tgt_out = target_tensors(targets, src.device)
    logits, _ = model(src, src_mask, tgt_in, need_attention=False)
    log_p = logits.float().log_softmax(-1)  # (B, T+1, V)
    chosen = log_p.gather(2, tgt_out.unsqueeze(2)).squeeze(2)  # (B, T+1)
    entropy = -(log_p.exp() * log_p).sum(-1)  # (B, T+1)
    return [(chosen[row, :len(t) + 1], entropy[row, :len(t) + 1]) for row, t in enumerate(targets)]


def teacher_force(model: EncoderDecoder, sources: Sequence[Sequence[int]], targets: Sequence[Sequence[int]],
                  need_attention: bool = False, batch_size: int = 64,
                  need_scores: bool = True) -> tuple[list[np.ndarray] | None, list[np.ndarray] | None]:
    """Score given outputs, ``batch_size`` pairs per pass: per pair log p(y_t | y_<t, x) for the
    T tokens and EOS -> (T+1,), and with ``need_attention`` the attention (L, H, T+1, S) over the
    real source positions, as numpy arrays.

    ``sources`` are ids with their trailing EOS (PAD positions are masked out); ``targets`` are ids
    without BOS/EOS. The model runs in eval mode without autograd (its mode is restored). With
    ``need_scores=False`` only the attention is computed (the log-probabilities are None)."""
    if len(sources) != len(targets):
        raise ValueError(f"teacher_force: {counted(len(sources), 'source')} but {counted(len(targets), 'target')}")
    device = model_device(model)
    log_probs: list[np.ndarray] = []
    attentions: list[np.ndarray] = []
    with eval_mode(model):
        for start in range(0, len(sources), batch_size):
            src = pad_ids(sources[start:start + batch_size], device)  # (B, S)
            scores, attention = forced_pass(model, src, src != PAD_ID, targets[start:start + batch_size],
                                            need_attention, need_scores)
            if scores is not None:
                log_probs.extend(s.cpu().numpy() for s in scores)
            if attention is not None:
                attentions.extend(a.float().cpu().numpy() for a in attention)
    return log_probs if need_scores else None, attentions if need_attention else None
