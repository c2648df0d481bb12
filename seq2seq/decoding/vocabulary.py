"""What the search may produce next: the output vocabulary (all tokens, or a subset such as a lexical
shortlist), with PAD and BOS banned, EOS forced at the length bound, and a target prefix's mask; the
chosen token's log-probability is always the model's own (masks come after the softmax)."""
from __future__ import annotations

import torch

from ..models.base import EncoderDecoder
from ..nn.next_token import masked_log_probs
from ..tokenizer import BOS_ID, EOS_ID, PAD_ID


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
        self._banned = torch.tensor(self.banned, dtype=torch.long, device=None if ids is None else ids.device)

    def log_probs(self, logits: torch.Tensor, force_eos: torch.Tensor | None,
                  allowed: torch.Tensor | None = None) -> torch.Tensor:
        """logits (rows, V) -> log p = log_softmax(z) (rows, V) (over the subset, when there is
        one), with the tokens that may not come next at -inf: PAD and BOS always, every token but
        EOS where ``force_eos`` (one flag per row; None: no row) holds, and with ``allowed`` (rows, all token ids) bool
        (a target prefix: ``Prefixes``) every token it excludes. Masking comes after the normalisation, so
        a chosen token's log-probability is the model's own (``nn.next_token.masked_log_probs``)."""
        if self._banned.device != logits.device:
            self._banned = self._banned.to(logits.device)
        log_p = masked_log_probs(logits, self._banned, force_eos, self.eos, sync_free=logits.device.type != "cpu")
        if allowed is not None:
            log_p = log_p.masked_fill(~(allowed if self.ids is None else allowed[:, self.ids]), float("-inf"))
        return log_p

    def token_ids(self, columns: torch.Tensor) -> torch.Tensor:
        """Columns of ``log_probs`` -> token ids."""
        return columns if self.ids is None else self.ids[columns]
