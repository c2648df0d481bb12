"""Model factory: the only place that knows the concrete architectures."""
from __future__ import annotations

from ..config import ModelConfig
from ..errors import UserError
from .base import EncoderDecoder, select_batch

__all__ = ["EncoderDecoder", "build_model", "select_batch"]


def build_model(cfg: ModelConfig, full_context_layer: int | None = None, link_classifier: bool = False
                ) -> EncoderDecoder:
    """Validate ``cfg`` and build the initialised model it describes (architecture defaults filled in);
    ``full_context_layer`` (a Transformer's, ``GuidedConfig.full_context_layer``): the decoder layer whose
    cross-attention ``forward`` returns computed with the whole target visible; ``link_classifier``
    (``GuidedConfig.link_classifier``): that layer's scores returned as link probabilities."""
    cfg = cfg.with_arch_defaults()
    cfg.validate()
    if cfg.vocab_size < 4:
        raise UserError(f"model vocab_size must be >= 4 (pad, unk, bos, eos), got {cfg.vocab_size}; "
                        "it is filled in from the tokenizer")
    if cfg.arch == "rnn":
        if full_context_layer is not None or link_classifier:
            raise UserError("full-context alignment needs a Transformer: an RNN decoder reads the target left "
                            "to right only")
        from .rnn import RNNEncoderDecoder

        return RNNEncoderDecoder(cfg)
    from .transformer import TransformerEncoderDecoder

    return TransformerEncoderDecoder(cfg, full_context_layer, link_classifier)
