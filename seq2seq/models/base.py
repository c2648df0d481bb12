"""The one interface between models and the rest of the toolkit (training, search, export).

Every architecture implements ``EncoderDecoder``:

* ``encode(src, src_mask) -> memory`` runs the encoder once per batch.
* ``init_state(memory, max_steps=None) -> state`` gives the decoder state before the first target
  token. With ``max_steps`` (the search's bound on decoding steps) a model may preallocate its state
  for that many steps, so that every step has the same shapes (the Transformer's static-shape step,
  which can be compiled); without, the state may grow step by step (the reference path).
* ``decode_step(memory, state, tokens) -> (logits, state, attention)`` advances one target
  position for a batch of previous tokens. Generation is incremental: RNNs carry their hidden
  state, Transformers a key/value cache. ``output_weight`` (rows of ``generator.weight``, from
  ``output_rows``) restricts the logits to a vocabulary subset (lexical shortlists).
* ``generator`` is the bias-free output layer, ``nn.Linear(features, vocab)``.
* ``forward(src, src_mask, tgt_in) -> (logits, attention)`` is teacher-forced decoding of a whole
  target prefix, used for training and for re-scoring / exporting chosen hypotheses.

Attention has one shape everywhere, so that export and plotting never look at the architecture:
``(batch, layers, heads, tgt_len, src_len)`` for ``forward`` and ``(batch, layers, heads, src_len)``
for ``decode_step``. The RNN has layers = heads = 1; the Transformer returns the decoder's
cross-attention of every layer and head.

``memory`` and ``state`` are dicts (possibly nested, lists allowed) of tensors whose **first
dimension is the batch**; search expands and reorders them with ``select_batch`` alone, without
knowing what they contain.

``decode_step`` also takes a memory of n sentences for n * k rows of state and tokens (k >= 1; row
r decodes sentence r // k): beam search keeps the encoder memory once per sentence, not once per
beam, so its k beams read the same keys and values (the models attend with the k rows of a
sentence as k query positions) and nothing of the memory is copied when beams are reordered.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

Tree = Any  # dict / list / tuple of tensors (batch-first), or None


def select_batch(tree: Tree, index: torch.Tensor) -> Tree:
    """Index every tensor in a nested dict/list/tuple along dim 0 (batch) with ``index``."""
    if tree is None:
        return None
    if isinstance(tree, torch.Tensor):
        return tree.index_select(0, index)
    if isinstance(tree, dict):
        return {key: select_batch(value, index) for key, value in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(select_batch(value, index) for value in tree)
    raise TypeError(f"select_batch: unsupported state element of type {type(tree).__name__}")


class EncoderDecoder(nn.Module):
    """Abstract encoder-decoder; see the module docstring for the contract."""

    #: number of decoder layers / heads whose attention is returned (RNN: 1, 1)
    attention_layers: int = 1
    attention_heads: int = 1

    def encode(self, src: torch.Tensor, src_mask: torch.Tensor) -> dict:
        """src (batch, src_len) token ids; src_mask (batch, src_len) True = real token."""
        raise NotImplementedError

    def init_state(self, memory: dict, max_steps: int | None = None) -> dict:
        raise NotImplementedError

    generator: nn.Linear  # features -> vocabulary logits, no bias

    def decode_step(
        self, memory: dict, state: dict, tokens: torch.Tensor, need_attention: bool = True,
        output_weight: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, dict, torch.Tensor | None]:
        """tokens (batch,) -> logits (batch, vocab), new state, attention (batch, L, H, src_len).
        ``memory`` holds batch or batch / k sentences (k consecutive rows per sentence, see above).

        With ``need_attention=False`` a model may take a faster path and return None. With
        ``output_weight`` (V', features) = ``output_rows(ids)`` the logits are (batch, V'), those of
        the tokens ``ids`` only.
        """
        raise NotImplementedError

    def output_rows(self, ids: torch.Tensor) -> torch.Tensor:
        """The output layer's rows for the token ids (V',) -> (V', features), for ``decode_step``."""
        from ..nn.quantize import output_rows  # an int8 output layer gives its rows in fp32

        return output_rows(self.generator, ids)

    def logits(self, features: torch.Tensor, output_weight: torch.Tensor | None = None) -> torch.Tensor:
        """features (..., D) -> logits over the vocabulary, or over ``output_weight``'s rows only."""
        return self.generator(features) if output_weight is None else F.linear(features, output_weight)

    def forward(
        self, src: torch.Tensor, src_mask: torch.Tensor, tgt_in: torch.Tensor, need_attention: bool = False,
        attention_layer: int | None = None, src_lengths: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Teacher forcing: tgt_in (batch, tgt_len) starting with bos -> logits (batch, tgt_len, vocab)
        and, if asked, attention (batch, L, H, tgt_len, src_len); without ``need_attention``, an
        ``attention_layer`` index in 0..L-1 asks for that layer's alone, (batch, 1, H, tgt_len, src_len),
        differentiable (guided alignment training), at the cost of that layer's weights only.
        ``src_lengths`` (batch,) on the host, when the caller has them: a model that needs the lengths
        there (the RNN's packed sequences) then reads them without a device sync."""
        raise NotImplementedError

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())
