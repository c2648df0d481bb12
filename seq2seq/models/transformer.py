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

import torch
from torch import nn

from ..config import ModelConfig
from ..errors import UserError
from ..tokenizer import PAD_ID
from .base import EncoderDecoder
from .fused import static_choice
from .transformer_layers import KV, DecoderLayer, Embedder, EncoderLayer

#: a preallocated self-attention cache holds a multiple of this many positions (few distinct shapes)
CACHE_BUCKET = 16


class TransformerEncoderDecoder(EncoderDecoder):
    """Encoder-decoder Transformer returning cross-attention of every decoder layer and head."""

    def __init__(self, cfg: ModelConfig, full_context_layer: int | None = None, link_classifier: bool = False) -> None:
        super().__init__()
        self.cfg = cfg
        if full_context_layer is not None and not 0 <= full_context_layer < cfg.layers:
            raise UserError(f"full-context layer {full_context_layer} is out of range for {cfg.layers} decoder layers")
        if link_classifier and full_context_layer is None:
            raise UserError("a link classifier (--guided-loss binary) reads the full-context layer: give "
                            "--full-context-alignment too")
        #: the decoder layer whose cross-attention ``forward`` returns computed with the whole target
        #: visible (``full_context_attention``), or None
        self.full_context_layer = full_context_layer
        #: whether that layer's scores are returned as link probabilities (a sigmoid each) instead of attention
        self.link_classifier = link_classifier
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
        and the encoder only; the translation itself (``forward``'s logits) stays causal. With
        ``link_classifier`` layer k's scores come back as link probabilities instead, one sigmoid per
        (target, source) pair (``DecoderLayer.link_probabilities``)."""
        mask = memory["src_mask"][:, None, None, :]  # (B, 1, 1, S)
        target = real[:, None, None, :]  # (B, 1, 1, T)
        for i, layer in enumerate(self.decoder[: self.full_context_layer + 1]):
            if i == self.full_context_layer and self.link_classifier:
                return layer.link_probabilities(x, memory["cross_kv"][i], mask, target)
            x, _, weights = layer(x, memory["cross_kv"][i], mask, None, i == self.full_context_layer,
                                  target_mask=target)
        return weights
