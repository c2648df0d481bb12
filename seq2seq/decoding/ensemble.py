"""Ensembles: several models that decode as one ``EncoderDecoder``.

    from seq2seq import Translator
    translator = Translator.from_checkpoints(["rnn/best.pt", "transformer/best.pt"])
    # = seq2seq translate --checkpoint rnn/best.pt transformer/best.pt

At every step the ensemble's next-token distribution is the mean of its M members' distributions
(a mixture; what fairseq does), returned as log-probabilities:

    p(y | y_<t, x) = 1/M sum_m p_m(y | y_<t, x),    log p = logsumexp_m(log p_m) - log M.

A mean of probabilities is itself normalised, so the log_softmax the search applies to what
``decode_step`` returns leaves it unchanged (to rounding): greedy search, beam search and sampling
use the ensemble like any model, and a hypothesis's ``log_prob`` is its log-probability under the
mixture. (The other common choice, the mean of log-probabilities, is a product of experts and needs
renormalising; the mixture is never more confident than its most confident member.) With a shortlist
(``output_weight``), ``output_rows`` gives each member its own output rows for the same token ids and
each member's softmax is over the subset. A one-member ensemble returns that member's logits
untouched: it decodes exactly like the member.

The members may be of any architecture (an RNN and a Transformer, say) but must share the
tokenizer (``Translator.from_checkpoints`` checks the SentencePiece models' sha256). The memory and
state are ``{"members": [member 0's, member 1's, ...]}``, so ``select_batch`` reorders and drops
rows of all members at once and the search needs no ensemble-specific code. ``max_positions`` is
the smallest of the members' (learned positions).

Attention: an ensemble has no attention of its own. ``decode_step`` / ``forward`` return member 0's
(the first checkpoint's), so ``attention_layers`` / ``attention_heads`` are member 0's and the
alignment export and plots use it; ``attach_member_attention`` gives every member's attention of
the chosen outputs (the translator exports them as the alignment record's ``members``, see
docs/formats.md).
"""
from __future__ import annotations

import math
from typing import Sequence

import torch
from torch import nn

from ..models.base import EncoderDecoder
from .generator import Hypothesis, attach_attention


class EnsembleModel(EncoderDecoder):
    """Members decoding in lockstep, combined by the mean of their probabilities (module docstring)."""

    def __init__(self, members: Sequence[EncoderDecoder]) -> None:
        super().__init__()
        if not members:
            raise ValueError("an ensemble needs at least one model")
        self.members = nn.ModuleList(members)
        self.attention_layers, self.attention_heads = members[0].attention_layers, members[0].attention_heads
        limits = [m.max_positions for m in members if getattr(m, "max_positions", None) is not None]
        #: decoder positions every member can encode (BOS included); None = unbounded
        self.max_positions = min(limits) if limits else None

    def combine(self, logits: Sequence[torch.Tensor]) -> torch.Tensor:
        """Members' logits (..., V) each -> log of the mean of their probabilities (..., V), fp32
        (one member: its logits, unchanged)."""
        if len(logits) == 1:
            return logits[0]
        log_p = torch.stack([z.float().log_softmax(-1) for z in logits])  # (M, ..., V)
        return torch.logsumexp(log_p, 0) - math.log(len(logits))

    def encode(self, src: torch.Tensor, src_mask: torch.Tensor) -> dict:
        return {"members": [m.encode(src, src_mask) for m in self.members]}

    def init_state(self, memory: dict, max_steps: int | None = None) -> dict:
        return {"members": [m.init_state(mem, max_steps) for m, mem in zip(self.members, memory["members"])]}

    def output_rows(self, ids: torch.Tensor) -> tuple[torch.Tensor, ...]:  # type: ignore[override]
        """Every member's output rows for the token ids, one tensor each (for ``decode_step``)."""
        return tuple(m.output_rows(ids) for m in self.members)

    def decode_step(
        self, memory: dict, state: dict, tokens: torch.Tensor, need_attention: bool = True,
        output_weight: Sequence[torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, dict, torch.Tensor | None]:
        """One step of every member -> log p of the mixture (rows, V), the members' states, member
        0's attention (or None)."""
        weights = [None] * len(self.members) if output_weight is None else list(output_weight)
        logits, states, attention = [], [], None
        for i, (member, mem, st, weight) in enumerate(zip(self.members, memory["members"], state["members"],
                                                          weights)):
            z, st, att = member.decode_step(mem, st, tokens, need_attention=need_attention and i == 0,
                                            output_weight=weight)
            logits.append(z), states.append(st)
            attention = att if i == 0 else attention
        return self.combine(logits), {"members": states}, attention

    def forward(
        self, src: torch.Tensor, src_mask: torch.Tensor, tgt_in: torch.Tensor, need_attention: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Teacher forcing: log p of the mixture (batch, tgt_len, V) and member 0's attention."""
        outputs = [m(src, src_mask, tgt_in, need_attention=need_attention and i == 0)
                   for i, m in enumerate(self.members)]
        return self.combine([logits for logits, _ in outputs]), outputs[0][1]

    def attach_member_attention(self, src: torch.Tensor, src_mask: torch.Tensor,
                                hyps: list[list[Hypothesis]]) -> list[list[list[torch.Tensor]]]:
        """Every member's attention of the hypotheses (teacher-forced, one pass per member):
        ``[sentence][hypothesis][member]`` -> (L_m, H_m, len + 1, src_len); ``h.attention`` is set
        to member 0's, as ``generator.attach_attention`` with the ensemble would."""
        per_member = []
        for member in self.members:
            attach_attention(member, src, src_mask, hyps)
            per_member.append([[h.attention for h in sentence] for sentence in hyps])
        for i, sentence in enumerate(hyps):
            for j, h in enumerate(sentence):
                h.attention = per_member[0][i][j]
        return [[[weights[i][j] for weights in per_member] for j in range(len(sentence))]
                for i, sentence in enumerate(hyps)]
