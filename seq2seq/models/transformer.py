"""Transformer encoder-decoder (Vaswani et al. 2017) on ``MultiHeadAttention``.

Pre-norm (``norm_first``): x = x + Dropout(Sublayer(LN(x))), with a final LayerNorm after each
stack; post-norm: x = LN(x + Dropout(Sublayer(x))). Inputs are E[y] * sqrt(d_model) + PE(pos) with
absolute positions (sinusoidal or learned); relative and rotary positions (``--positional
relative|rope``) are encoded in every self-attention instead (``self_attention``), the inputs being
E[y] * sqrt(d_model).
Cross-attention keys/values of every decoder layer are projected once in ``encode``; generation
keeps a self-attention key/value cache per layer in ``state`` (batch-first), so each
``decode_step`` costs one position. Teacher-forced ``forward`` uses the fused attention kernel
unless attention weights are asked for.
Cross-attention normalizes its scores with ``attention_normalizer`` (softmax, or sparsemax /
1.5-entmax, which always take the explicit path); self-attention is always a softmax, whose
weights no one reads and which keeps the fused kernel.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from ..nn.attention import MultiHeadAttention, RelativePositions
from ..config import ModelConfig
from ..errors import UserError
from ..tokenizer import PAD_ID
from .base import EncoderDecoder
from .fused import static_choice
from ..nn.dropout import Dropout

KV = tuple[torch.Tensor, torch.Tensor]  # projected keys, values: (B, heads, T, d_k) each

#: a preallocated self-attention cache holds a multiple of this many positions (few distinct shapes)
CACHE_BUCKET = 16


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
        x = self.res_self.post(x, a)
        a, weights = self._cross(self.res_cross.pre(x), cross_kv, src_mask, need_weights)
        x = self.res_cross.post(x, a)
        return self.res_ff.post(x, self.ff(self.res_ff.pre(x))), cache, weights

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


class TransformerEncoderDecoder(EncoderDecoder):
    """Encoder-decoder Transformer returning cross-attention of every decoder layer and head."""

    def __init__(self, cfg: ModelConfig, full_context_layer: int | None = None) -> None:
        super().__init__()
        self.cfg = cfg
        if full_context_layer is not None and not 0 <= full_context_layer < cfg.layers:
            raise UserError(f"full-context layer {full_context_layer} is out of range for {cfg.layers} decoder layers")
        #: the decoder layer whose cross-attention ``forward`` returns computed with the whole target
        #: visible (``full_context_attention``), or None
        self.full_context_layer = full_context_layer
        self.attention_layers, self.attention_heads = cfg.layers, cfg.heads
        #: decoder positions available (BOS included); None = unbounded (sinusoidal)
        self.max_positions = cfg.max_positions if cfg.positional == "learned" else None
        embed_tgt = nn.Embedding(cfg.vocab_size, cfg.d_model, padding_idx=0)
        embed_src = (embed_tgt if cfg.shares_source_embeddings
                     else nn.Embedding(cfg.vocab_size, cfg.d_model, padding_idx=0))
        self.src_embed, self.tgt_embed = Embedder(embed_src, cfg), Embedder(embed_tgt, cfg)
        self.encoder = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.layers))
        self.decoder = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.layers))
        self.enc_norm = nn.LayerNorm(cfg.d_model) if cfg.norm_first else nn.Identity()
        self.dec_norm = nn.LayerNorm(cfg.d_model) if cfg.norm_first else nn.Identity()
        self.generator = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        #: ``static_step`` and ``encode_eager`` for one sentence compiled
        #: (``seq2seq.models.compiled.compile_decoding``), else None
        self.compiled_step = self.compiled_encode = None
        #: whether ``init_state`` preallocates the cache when given ``max_steps`` (on with
        #: ``compiled_step``: the eager static step is slower than the growing cache's)
        self.static_cache = False
        self.reset_parameters()
        if cfg.tie_embeddings:
            self.generator.weight = embed_tgt.weight

    def reset_parameters(self) -> None:
        """Xavier-uniform linear weights, zero biases; embeddings, learned and relative positions
        N(0, 1/d_model) (times sqrt(d_model) at the input), pad row zero. An untied output layer
        starts like a tied one, N(0, 1/d_model): Xavier over (d_model + vocabulary) makes it 4x
        smaller, and the untied 3+3-layer Multi30k model then had validation perplexity 57.7 instead
        of 43.3 after 200 updates."""
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
        for module in self.modules():  # after the linears: a tied generator shares this weight
            if isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, std=self.cfg.d_model ** -0.5)
                if module.padding_idx is not None:
                    with torch.no_grad():
                        module.weight[module.padding_idx].zero_()
        if not self.cfg.tie_embeddings:
            nn.init.normal_(self.generator.weight, std=self.cfg.d_model ** -0.5)

    def encode(self, src: torch.Tensor, src_mask: torch.Tensor) -> dict:
        if self.compiled_encode is not None and src.size(0) == 1 and not torch.is_grad_enabled():
            return self.compiled_encode(src, src_mask)  # one sentence, decoding (compile_decoding)
        return self.encode_eager(src, src_mask)

    def encode_eager(self, src: torch.Tensor, src_mask: torch.Tensor) -> dict:
        mask = src_mask[:, None, None, :]  # (B, 1, 1, S)
        x = self.src_embed(src)  # (B, S, D)
        for layer in self.encoder:
            x = layer(x, mask)
        x = self.enc_norm(x)
        cross_kv = [layer.cross_attn.project_kv(x) for layer in self.decoder]  # once per sentence
        return {"src_mask": src_mask, "cross_kv": cross_kv}

    def init_state(self, memory: dict, max_steps: int | None = None) -> dict:
        """An empty self-attention cache per layer: growing by one position per step, or with
        ``static_cache`` for one sentence (batch 1, the interactive case) and ``max_steps`` given,
        preallocated for ``max_steps`` steps rounded up to a multiple of ``CACHE_BUCKET``, with the
        step count ``step`` (B,) beside it (the static-shape step, ``static_step``). Wide batches keep
        the growing cache: there the eager step is as fast as the compiled one, and beam search
        reorders a preallocated cache at a higher cost (docs/performance.md)."""
        k = memory["cross_kv"][0][0]  # (B, heads, S, d_k)
        if max_steps is None or not self.static_cache or k.size(0) != 1:
            empty = k.new_zeros(k.size(0), k.size(1), 0, k.size(3))  # (B, heads, 0, d_k)
            return {"self_kv": [(empty, empty) for _ in self.decoder]}
        length = -(-max(max_steps, 1) // CACHE_BUCKET) * CACHE_BUCKET
        shape = (k.size(0), k.size(1), length, k.size(3))
        return {"self_kv": [(k.new_zeros(shape), k.new_zeros(shape)) for _ in self.decoder],
                "step": torch.zeros(k.size(0), dtype=torch.long, device=k.device)}

    def _decode(self, memory: dict, x: torch.Tensor, caches: list | None, need_attention: bool,
                output_weight: torch.Tensor | None = None, attention_layer: int | None = None):
        """Run the decoder stack on embedded x (B, T, D) -> logits (B, T, V), caches, weights: every
        layer's (B, L, H, T, S) with ``need_attention``, else layer ``attention_layer``'s (B, 1, H, T, S)
        (only that layer computes its weights explicitly) or None."""
        mask = memory["src_mask"][:, None, None, :]  # (B, 1, 1, S)
        new_caches, weights = [], []
        for i, layer in enumerate(self.decoder):
            cache = None if caches is None else caches[i]
            x, cache, w = layer(x, memory["cross_kv"][i], mask, cache, need_attention or i == attention_layer)
            new_caches.append(cache), weights.append(w)
        logits = self.logits(self.dec_norm(x), output_weight)
        if need_attention:
            return logits, new_caches, torch.stack(weights, 1)  # (B, L, H, T, S)
        return logits, new_caches, None if attention_layer is None else weights[attention_layer][:, None]

    def decode_step(
        self, memory: dict, state: dict, tokens: torch.Tensor, need_attention: bool = True,
        output_weight: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, dict, torch.Tensor | None]:
        if "step" in state:  # a preallocated cache (init_state with max_steps)
            step = self.compiled_step or self.static_step
            logits, weights = step(memory, state["self_kv"], state["step"][:1], tokens, need_attention,
                                   output_weight)
            return logits, {"self_kv": state["self_kv"], "step": state["step"] + 1}, weights
        step = state["self_kv"][0][0].size(2)  # number of positions already decoded
        x = self.tgt_embed(tokens.unsqueeze(1), start=step)  # (B, 1, D)
        logits, caches, weights = self._decode(memory, x, state["self_kv"], need_attention, output_weight)
        return logits[:, 0], {"self_kv": caches}, weights[:, :, :, 0] if need_attention else None

    def static_step(self, memory: dict, caches: list[KV], position: torch.Tensor, tokens: torch.Tensor,
                    need_attention: bool,
                    output_weight: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One decoding step on preallocated caches, every shape fixed by the batch rows, the source
        length and the cache length (never by the step): tokens (B,) at ``position`` (1,) -> logits
        (B, V), attention (B, L, H, S) or None; the caches are written in place. The same numbers as
        the growing cache's step but for the order of additions in the attention (masked positions
        add exact zeros); ``compiled_step`` is this function compiled (``seq2seq.models.compiled``)."""
        x = self.tgt_embed(tokens.unsqueeze(1), start=position)  # (B, 1, D)
        mask = memory["src_mask"][:, None, None, :]  # (B, 1, 1, S)
        weights = []
        for i, layer in enumerate(self.decoder):
            x, _, w = layer(x, memory["cross_kv"][i], mask, caches[i], need_attention, position)
            weights.append(w)
        logits = self.logits(self.dec_norm(x), output_weight)[:, 0]
        return logits, torch.stack(weights, 1)[:, :, :, 0] if need_attention else None

    @property
    def fused_search(self) -> bool:
        """Whether ``greedy_step`` and ``beam_step`` run compiled (a packaged step, ``models.packaged``): then a
        search of one sentence makes one call per output token and reads one small tensor back."""
        return hasattr(self.compiled_step, "choose")

    def greedy_step(self, memory: dict, state: dict, tokens: torch.Tensor, limit: torch.Tensor,
                    score: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict]:
        """``decode_step`` and greedy search's choice in one call, on a preallocated cache (``init_state`` with
        ``max_steps``, one sentence): tokens (1,), the length bound ``limit`` (1,), ``score`` (1,) -> the chosen
        token (1,), ``score`` plus its log-probability, the state one position on (``models.fused``)."""
        tokens, score, position = self._choose("greedy", memory, state["self_kv"], state["step"][:1], tokens, limit,
                                               score)
        return tokens, score, {"self_kv": state["self_kv"], "step": position}

    def beam_step(self, memory: dict, state: dict, tokens: torch.Tensor, limit: torch.Tensor,
                  scores: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict]:
        """``decode_step``, beam search's choice and the cache reordered, in one call, on a preallocated cache of
        one sentence's k beams: tokens (k,), ``limit`` (1,), the beams' sums ``scores`` (1, k) -> the tokens that go
        on (k,), their sums (1, k), ``chosen`` (5k + 1, ``models.fused.static_beam_step``), the state one position
        on (the caches reordered)."""
        tokens, scores, chosen, position, *caches = self._choose("beam", memory, state["self_kv"], state["step"][:1],
                                                                 tokens, limit, scores)
        return tokens, scores, chosen, {"self_kv": list(zip(caches[::2], caches[1::2])),
                                        "step": position.expand(tokens.size(0))}

    def _choose(self, kind: str, *args) -> tuple[torch.Tensor, ...]:
        """``models.fused.static_choice`` of ``kind``: through the packaged step where there is one, else eagerly."""
        return self.compiled_step.choose(kind, *args) if self.fused_search else static_choice(self, kind, *args)

    def forward(
        self, src: torch.Tensor, src_mask: torch.Tensor, tgt_in: torch.Tensor, need_attention: bool = False,
        attention_layer: int | None = None, src_lengths: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        memory = self.encode(src, src_mask)  # the mask is all it needs: ``src_lengths`` is not read
        x = self.tgt_embed(tgt_in)
        full = self.full_context_layer
        if full is None or not (need_attention or attention_layer == full):
            logits, _, weights = self._decode(memory, x, None, need_attention, attention_layer=attention_layer)
            return logits, weights
        logits, _, weights = self._decode(memory, x, None, need_attention)  # layer ``full`` replaced below
        aligned = self.full_context_attention(memory, x, tgt_in != PAD_ID)  # (B, H, T, S)
        if not need_attention:
            return logits, aligned[:, None]
        return logits, torch.cat([weights[:, :full], aligned[:, None], weights[:, full + 1:]], 1)

    def full_context_attention(self, memory: dict, x: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
        """Full-context alignment (Garg et al. 2019): the cross-attention (B, H, T, S) of decoder layer
        ``full_context_layer`` with the causal mask lifted in it and every layer below, so that the row of
        position t (predicting y_t) also sees y_t and the target words after it:

            h^0 = x,   h^l = DecoderLayer_l(h^(l-1)) with self-attention over {u : real[u]},   l <= k

        x (B, T, D) the embedded target input, ``real`` (B, T) True = a real token. Layers above k and
        the output layer take no part, so a loss on this attention trains layers 0..k, the embeddings
        and the encoder only; the translation itself (``forward``'s logits) stays causal."""
        mask = memory["src_mask"][:, None, None, :]  # (B, 1, 1, S)
        target = real[:, None, None, :]  # (B, 1, 1, T)
        for i, layer in enumerate(self.decoder[: self.full_context_layer + 1]):
            x, _, weights = layer(x, memory["cross_kv"][i], mask, None, i == self.full_context_layer,
                                  target_mask=target)
        return weights
