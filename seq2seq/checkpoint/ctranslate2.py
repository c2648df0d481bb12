"""A Transformer checkpoint in CTranslate2's format (``seq2seq export --format ctranslate2``, and the
cache of ``--engine ctranslate2``: ``seq2seq.decoding.ctranslate2``), built through CTranslate2's
own model specifications.

CTranslate2 (the ``export`` extra) has no recurrent models, so only ``--arch transformer``
converts. The mapping, weight by weight:

    ours                                          CTranslate2 TransformerSpec
    {src,tgt}_embed.tokens (x sqrt(d_model))      {encoder,decoder}.embeddings (scale_embeddings)
    sinusoidal / learned positions                position_encodings.encodings: our table, row p =
                                                  position p (ours interleaves sin and cos, so the
                                                  table is passed explicitly, not CTranslate2's own)
    relative positions (Shaw), clip k             self_attention.relative_position_{keys,values}
                                                  (2k + 1, d_k); keys-only tables get zero values
    rotary positions (half-split pairs)           rotary_dim 0 (all), rotary_interleave False
    self_attn q_proj ; kv_proj = [W_K; W_V]       self_attention.linear[0] = [W_Q; W_K; W_V]
    cross_attn q_proj ; kv_proj                   attention.linear[0] = W_Q, linear[1] = [W_K; W_V]
    out_proj                                      linear[-1]
    res_*.norm (pre-norm: before the sublayer;    the sublayer's layer_norm (CTranslate2 applies it
      post-norm: after the residual)              on the same side, from the pre_norm flag)
    ff.0 / ff.3 (ReLU between)                    ffn.linear_0 / ffn.linear_1
    enc_norm / dec_norm (pre-norm only)           {encoder,decoder}.layer_norm
    generator (no bias; tied or not)              decoder.projection

The source gets EOS appended (``add_source_eos``), the decoder starts from ``<s>``; the
vocabulary is the SentencePiece model's pieces in id order (pad 0, unk 1, bos 2, eos 3), so
CTranslate2 takes the pieces our tokenizer produces. Layer-norm epsilon is PyTorch's 1e-5.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from ..checkpoint.loaded import LoadedCheckpoint
from ..checkpoint.parts import tensor_to_bytes
from ..config import ModelConfig
from ..errors import UserError

SPM_FILE = "spm.model"  # the SentencePiece model, beside CTranslate2's files


def require_ctranslate2():
    """The ``ctranslate2`` module, or a UserError saying how to install it."""
    try:
        import ctranslate2
    except ImportError:
        raise UserError("the CTranslate2 export needs the ctranslate2 package: pip install 'seq2seq[export]'") from None
    return ctranslate2


def not_convertible(cfg: ModelConfig) -> str | None:
    """What in this model CTranslate2 cannot represent (None: nothing), worded to follow "cannot
    decode" or a checkpoint's name: the one rule set of the conversion and of ``--engine``."""
    if cfg.arch != "transformer":
        return f"a {cfg.arch} model (CTranslate2 has no recurrent encoder-decoders)"
    if cfg.attention_normalizer != "softmax":
        return (f"cross-attention normalized by {cfg.attention_normalizer} (--attention-normalizer; CTranslate2 "
                "computes a softmax only, so its translations would differ)")
    return None


def check_convertible(cfg: ModelConfig, source: str) -> None:
    """A UserError naming what CTranslate2 cannot represent (``not_convertible``)."""
    why = not_convertible(cfg)
    if why is not None:
        raise UserError(f"{source}: {why}; only such models export to CTranslate2 (export with --format "
                        "safetensors)")


def _array(tensor: torch.Tensor) -> np.ndarray:
    return tensor.detach().float().cpu().numpy()


def _linear(spec, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
    spec.weight = _array(weight)
    if bias is not None:
        spec.bias = _array(bias)


def _norm(spec, state: dict[str, torch.Tensor], name: str) -> None:
    spec.gamma, spec.beta = _array(state[f"{name}.weight"]), _array(state[f"{name}.bias"])


def _attention(spec, state: dict[str, torch.Tensor], name: str, self_attention: bool, cfg: ModelConfig) -> None:
    q_w, q_b = state[f"{name}.q_proj.weight"], state[f"{name}.q_proj.bias"]
    kv_w, kv_b = state[f"{name}.kv_proj.weight"], state[f"{name}.kv_proj.bias"]
    if self_attention:
        _linear(spec.linear[0], torch.cat([q_w, kv_w]), torch.cat([q_b, kv_b]))
    else:
        _linear(spec.linear[0], q_w, q_b)
        _linear(spec.linear[1], kv_w, kv_b)
    _linear(spec.linear[-1], state[f"{name}.out_proj.weight"], state[f"{name}.out_proj.bias"])
    if self_attention and cfg.positional == "relative":
        keys = state[f"{name}.relative.keys.weight"]
        values = state.get(f"{name}.relative.values.weight")
        spec.relative_position_keys = _array(keys)
        spec.relative_position_values = _array(torch.zeros_like(keys) if values is None else values)


def _positions(spec, state: dict[str, torch.Tensor], embedder: str, cfg: ModelConfig) -> None:
    from ..models.transformer_layers import sinusoidal

    if cfg.positional == "sinusoidal":
        spec.position_encodings.encodings = _array(sinusoidal(0, cfg.max_positions, cfg.d_model))
    elif cfg.positional == "learned":
        spec.position_encodings.encodings = _array(state[f"{embedder}.positions.weight"])
    # relative / rotary: encoded in the self-attention; CTranslate2 then builds no position encoder


def transformer_spec(cfg: ModelConfig, state: dict[str, torch.Tensor]):
    """The CTranslate2 ``TransformerSpec`` of a Transformer ``state`` dict, weights set."""
    ctranslate2 = require_ctranslate2()
    specs = ctranslate2.specs
    rotary = {"rotary_dim": 0, "rotary_interleave": False} if cfg.positional == "rope" else {}
    common = {"pre_norm": cfg.norm_first, "relative_position": cfg.positional == "relative",
              "activation": specs.common_spec.Activation.RELU, **rotary}
    encoder = specs.TransformerEncoderSpec(cfg.layers, cfg.heads, **common)
    decoder = specs.TransformerDecoderSpec(cfg.layers, cfg.heads, **common)
    encoder.embeddings[0].weight = _array(state["src_embed.tokens.weight"])
    decoder.embeddings.weight = _array(state["tgt_embed.tokens.weight"])
    if hasattr(encoder, "position_encodings"):
        _positions(encoder, state, "src_embed", cfg)
    if hasattr(decoder, "position_encodings"):
        _positions(decoder, state, "tgt_embed", cfg)
    if cfg.norm_first:
        _norm(encoder.layer_norm, state, "enc_norm")
        _norm(decoder.layer_norm, state, "dec_norm")
    for i, layer in enumerate(encoder.layer):
        name = f"encoder.{i}"
        _attention(layer.self_attention, state, f"{name}.self_attn", True, cfg)
        _norm(layer.self_attention.layer_norm, state, f"{name}.res_attn.norm")
        _feed_forward(layer.ffn, state, name, "res_ff")
    for i, layer in enumerate(decoder.layer):
        name = f"decoder.{i}"
        _attention(layer.self_attention, state, f"{name}.self_attn", True, cfg)
        _norm(layer.self_attention.layer_norm, state, f"{name}.res_self.norm")
        _attention(layer.attention, state, f"{name}.cross_attn", False, cfg)
        _norm(layer.attention.layer_norm, state, f"{name}.res_cross.norm")
        _feed_forward(layer.ffn, state, name, "res_ff")
    _linear(decoder.projection, state["generator.weight"], None)
    spec = specs.TransformerSpec(encoder, decoder)
    spec.config.add_source_eos = True
    spec.config.decoder_start_token = "<s>"
    spec.config.layer_norm_epsilon = 1e-5  # torch.nn.LayerNorm's default
    return spec


def _feed_forward(spec, state: dict[str, torch.Tensor], layer: str, residual: str) -> None:
    _linear(spec.linear_0, state[f"{layer}.ff.0.weight"], state[f"{layer}.ff.0.bias"])
    _linear(spec.linear_1, state[f"{layer}.ff.3.weight"], state[f"{layer}.ff.3.bias"])
    _norm(spec.layer_norm, state, f"{layer}.{residual}.norm")


def write_ctranslate2(loaded: LoadedCheckpoint, out: Path, quantization: str | None = None) -> None:
    """Convert a read Transformer checkpoint into the CTranslate2 model directory ``out`` (which must
    exist and be empty), with the SentencePiece model beside it. ``quantization`` (e.g. int8) stores the
    weights quantized; any model can also be quantized when loaded (``compute_type``)."""
    config, tokenizer, payload = loaded.config, loaded.tokenizer, loaded.payload
    check_convertible(config.model, f"checkpoint {loaded.path}")
    require_ctranslate2()
    spec = transformer_spec(config.model, payload["model"])
    vocabulary = tokenizer.pieces(range(tokenizer.vocab_size))
    spec.register_source_vocabulary(vocabulary)
    spec.register_target_vocabulary(vocabulary)
    try:
        spec.validate()
        spec.optimize(quantization=quantization)
    except (ValueError, TypeError) as exc:  # a weight CTranslate2 rejects: a bug in the mapping above
        raise UserError(f"checkpoint {loaded.path}: CTranslate2 rejected the converted model ({exc})") from None
    spec.save(str(out))
    (out / SPM_FILE).write_bytes(tensor_to_bytes(payload["tokenizer"]))
