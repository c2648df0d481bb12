"""The Transformer's layers (Vaswani et al. 2017), which ``transformer.TransformerEncoderDecoder`` stacks: the
embedding with absolute positions, the residual wrapper (pre- or post-norm), the feed-forward block, and the
encoder and decoder layers on ``MultiHeadAttention``."""
from __future__ import annotations

import math

import torch
from torch import nn

from ..config import ModelConfig
from ..errors import UserError
from ..nn.attention import MultiHeadAttention, RelativePositions
from ..nn.dropout import Dropout

KV = tuple[torch.Tensor, torch.Tensor]  # projected keys, values: (B, heads, T, d_k) each

def sinusoidal(start: int | torch.Tensor, length: int, d_model: int,
               device: torch.device | None = None) -> torch.Tensor:
    """PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d)) -> (length, d),
    pos = start .. start + length - 1 (``start`` an int or a one-element tensor)."""
    pos = (start + torch.arange(length, device=device)).to(torch.float32).unsqueeze(1)
    inv_freq = torch.exp(torch.arange(0, d_model, 2, device=device) * (-math.log(10000.0) / d_model))
    angles = pos * inv_freq  # (length, ceil(d / 2))
    pe = torch.zeros(length, d_model, device=device)
    pe[:, 0::2] = torch.sin(angles)
    pe[:, 1::2] = torch.cos(angles[:, : d_model // 2])
    return pe


class Embedder(nn.Module):
    """Token embedding * sqrt(d_model) + absolute positional encoding (sinusoidal or learned; none
    with relative or rotary positions, which self-attention encodes), then dropout."""

    def __init__(self, tokens: nn.Embedding, cfg: ModelConfig) -> None:
        super().__init__()
        self.tokens, self.d_model, self.max_positions = tokens, cfg.d_model, cfg.max_positions
        self.absolute = cfg.positional in ("sinusoidal", "learned")
        self.positions = nn.Embedding(cfg.max_positions, cfg.d_model) if cfg.positional == "learned" else None
        self.dropout = Dropout(cfg.dropout)

    def forward(self, ids: torch.Tensor, start: int | torch.Tensor = 0) -> torch.Tensor:
        """ids (B, T) at positions start .. start + T - 1 -> (B, T, d_model)."""
        tokens = self.tokens(ids)
        if not self.absolute:
            return self.dropout(tokens * math.sqrt(self.d_model))
        pe = self.absolute_positions(start, ids.size(1), ids.device)
        return self.dropout(tokens * math.sqrt(self.d_model) + pe.to(tokens.dtype))  # fp16/bf16 decoding

    def absolute_positions(self, start: int | torch.Tensor, length: int, device: torch.device) -> torch.Tensor:
        """PE of positions start .. start + length - 1 -> (length, d_model). A tensor ``start`` (the
        static decoding step) is not checked against --max-positions: the search bounds lengths."""
        if self.positions is None:
            return sinusoidal(start, length, self.d_model, device)
        if isinstance(start, torch.Tensor):
            return self.positions(start + torch.arange(length, device=device))
        if start + length > self.max_positions:
            raise UserError(
                f"sequence of {start + length} positions exceeds --max-positions {self.max_positions} "
                "(learned positions); shorten the input or retrain with a larger --max-positions"
            )
        return self.positions.weight[start : start + length]


class Residual(nn.Module):
    """Pre-norm: x + Dropout(f(LN(x))); post-norm: LN(x + Dropout(f(x))). Splits into pre/post."""

    def __init__(self, d_model: int, dropout: float, norm_first: bool) -> None:
        super().__init__()
        self.norm, self.dropout, self.norm_first = nn.LayerNorm(d_model), Dropout(dropout), norm_first

    def pre(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x) if self.norm_first else x

    def post(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        out = x + self.dropout(y)
        return out if self.norm_first else self.norm(out)


def feed_forward(cfg: ModelConfig) -> nn.Sequential:
    """FFN(x) = W_2 Dropout(ReLU(W_1 x + b_1)) + b_2."""
    return nn.Sequential(nn.Linear(cfg.d_model, cfg.ff_size), nn.ReLU(), Dropout(cfg.dropout),
                         nn.Linear(cfg.ff_size, cfg.d_model))


def self_attention(cfg: ModelConfig) -> MultiHeadAttention:
    """Self-attention with the layer's own relative position table (``--positional relative``:
    2k + 1 embeddings of size d_model / heads for keys, and for values with --relative-values) or
    rotary positions (``--positional rope``); plain for absolute positions (no extra parameters)."""
    relative = None
    if cfg.positional == "relative":
        relative = RelativePositions(cfg.d_model // cfg.heads, cfg.relative_clip, cfg.relative_values)
    return MultiHeadAttention(cfg.d_model, cfg.heads, cfg.dropout, relative=relative,
                              rotary=cfg.positional == "rope")


class EncoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.self_attn = self_attention(cfg)
        self.ff = feed_forward(cfg)
        self.res_attn, self.res_ff = (Residual(cfg.d_model, cfg.dropout, cfg.norm_first) for _ in range(2))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """x (B, S, D); mask (B, 1, 1, S) True = real token."""
        h = self.res_attn.pre(x)
        x = self.res_attn.post(x, self.self_attn(h, h, h, mask)[0])
        return self.res_ff.post(x, self.ff(self.res_ff.pre(x)))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.self_attn = self_attention(cfg)
        self.cross_attn = MultiHeadAttention(cfg.d_model, cfg.heads, cfg.dropout, normalizer=cfg.attention_normalizer)
        self.ff = feed_forward(cfg)
        self.res_self, self.res_cross, self.res_ff = (
            Residual(cfg.d_model, cfg.dropout, cfg.norm_first) for _ in range(3))

    def forward(
        self, x: torch.Tensor, cross_kv: KV, src_mask: torch.Tensor, cache: KV | None = None,
        need_weights: bool = False, position: torch.Tensor | None = None, target_mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, KV | None, torch.Tensor | None]:
        """x (B, T, D). Without ``cache``: causal self-attention over x itself (teacher forcing), or
        with ``target_mask`` (B, 1, 1, T), True = real token, self-attention over every real position
        of x, later ones included (full-context alignment).
        With ``cache`` (keys/values of earlier positions): x holds the next position (T = 1); returns
        the extended cache. With ``position`` (a one-element tensor) the cache is preallocated
        (B, heads, T_max, d_k): the new keys/values are written in place at that position and the
        query attends to positions 0 .. position only. Also returns cross-attention weights
        (B, heads, T, S) if asked."""
        x, cache = self._attend_self(x, cache, position, target_mask)
        a, weights = self._cross(self.res_cross.pre(x), cross_kv, src_mask, need_weights)
        x = self.res_cross.post(x, a)
        return self.res_ff.post(x, self.ff(self.res_ff.pre(x))), cache, weights

    def link_probabilities(self, x: torch.Tensor, cross_kv: KV, src_mask: torch.Tensor,
                           target_mask: torch.Tensor) -> torch.Tensor:
        """The cross-attention's scores of x (B, T, D) read as link classifiers (``--guided-loss binary``): the
        self-attention sublayer over every real target position (``target_mask``, full context), then
        ``MultiHeadAttention.link_probabilities`` -> (B, heads, T, S); the rest of the layer is not computed."""
        x, _ = self._attend_self(x, None, None, target_mask)
        return self.cross_attn.link_probabilities(self.res_cross.pre(x), cross_kv, src_mask)

    def _attend_self(self, x: torch.Tensor, cache: KV | None, position: torch.Tensor | None,
                     target_mask: torch.Tensor | None) -> tuple[torch.Tensor, KV | None]:
        """The self-attention sublayer (``forward``'s cases) -> x after its residual, the cache."""
        h = self.res_self.pre(x)
        if cache is None:
            a, _ = self.self_attn(h, h, h, target_mask, is_causal=target_mask is None)
        elif position is None:
            k, v = self.self_attn.project_kv(h, start=cache[0].size(2))  # (B, heads, T, d_k)
            cache = (torch.cat([cache[0], k], 2), torch.cat([cache[1], v], 2))
            a, _ = self.self_attn(h, kv_cache=cache)  # new positions come after all cached ones
        else:
            k, v = self.self_attn.project_kv(h, start=position)  # (B, heads, 1, d_k)
            cache[0].index_copy_(2, position, k)
            cache[1].index_copy_(2, position, v)
            visible = torch.arange(cache[0].size(2), device=x.device) <= position  # (T_max,) decoded so far
            a, _ = self.self_attn(h, kv_cache=cache, mask=visible, query_start=position)
        return self.res_self.post(x, a), cache

    def _cross(self, h: torch.Tensor, cross_kv: KV, src_mask: torch.Tensor, need_weights: bool):
        """Cross-attention of h (B, T, D). With keys/values of n = B / k sentences (beam search: k
        rows per sentence) a sentence's k rows attend as k * T query positions of one sequence."""
        sentences = cross_kv[0].size(0)
        if h.size(0) == sentences:
            return self.cross_attn(h, mask=src_mask, need_weights=need_weights, kv_cache=cross_kv)
        batch, steps = h.shape[:2]
        a, weights = self.cross_attn(h.reshape(sentences, -1, h.size(-1)), mask=src_mask,
                                     need_weights=need_weights, kv_cache=cross_kv)  # (n, k * T, D)
        if weights is not None:  # (n, heads, k * T, S) -> (B, heads, T, S)
            heads, source = weights.size(1), weights.size(-1)
            weights = weights.view(sentences, heads, -1, steps, source).transpose(1, 2).reshape(
                batch, heads, steps, source)
        return a.reshape(h.shape), weights
