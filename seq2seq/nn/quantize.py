"""Dynamic int8 quantization of a trained model's linear layers for CPU decoding (``--precision int8``).

Each weight matrix is stored once as int8 with one scale per output row (per-channel, symmetric):
W ~ s_w * W_q. At every call the input gets a scale from its own range (dynamic) and goes to uint8,
the product runs in integer arithmetic (FBGEMM / oneDNN kernels) and comes back as fp32:
y = s_x s_w (X_q W_q^T) + b. Everything else (attention scores, softmax, normalisation, the
embeddings, the search) stays fp32.

Quantized: every ``nn.Linear`` (the output layer included; a tied output layer keeps its fp32
embedding table for the inputs) and the decoder's GRU / LSTM cells, which ``StackedRNN`` first
splits into explicit W_ih / W_hh linears (``split_cells``). A module that reads a linear's weight
directly marks it ``keep_float = True`` (the additive attention's v, a 512 -> 1 map).

What is guaranteed, and tested: an int8 model stays within int8 rounding of the fp32 one, not
equal to it. With a lexical shortlist the int8 output layer's rows are dequantized once and
multiplied with fp32 features (``output_rows``), while the full int8 layer also rounds the features
to 8 bits, so for every token v the two logits differ by at most s_x * ||w_v||_1 (s_x: the
activation scale, range(x) / 127 at worst). They are different kernels and pick different tokens
where the top two logits are closer than that, so a shortlist that lists every token decodes like
a weight-only int8 output layer, not exactly like the full int8 layer. The
int8 kernels themselves (FBGEMM, or oneDNN on CPUs with VNNI) are chosen by PyTorch from the CPU,
so the same model can round differently on another CPU family.

It uses PyTorch's eager-mode ``torch.ao.quantization.quantize_dynamic`` (deprecated in favour of
torchao since 2.10, still in 2.13); where it is missing, asking for int8 is a clear error.
"""
from __future__ import annotations

import warnings

import torch
from torch import nn

from ..errors import UserError


def quantize_for_decoding(model: nn.Module) -> nn.Module:
    """The model (evaluation mode, on CPU) with int8 linear layers; the original is left unchanged."""
    try:
        from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic
    except ImportError:  # pragma: no cover - depends on the installed PyTorch
        raise UserError(f"--precision int8 needs torch.ao.quantization, which PyTorch {torch.__version__} "
                        "does not have; decode with --precision fp32 (or fp16 / bf16)") from None
    if torch.backends.quantized.engine == "none":
        raise UserError("--precision int8: this PyTorch build has no quantized CPU kernels; use --precision fp32")
    import copy

    model = copy.deepcopy(model).cpu().float().eval()
    for module in list(model.modules()):
        split = getattr(module, "split_cells", None)
        if split is not None:
            split()
    spec = {name: per_channel_dynamic_qconfig for name, module in model.named_modules()
            if isinstance(module, nn.Linear) and not getattr(module, "keep_float", False)}
    with warnings.catch_warnings():  # the eager-mode API announces its deprecation on every call
        warnings.simplefilter("ignore")
        return quantize_dynamic(model, spec, dtype=torch.qint8)


def is_quantized(model: nn.Module) -> bool:
    """Whether ``quantize_for_decoding`` made this model (its int8 layers have no gradients)."""
    return any(type(module).__module__.startswith("torch.ao.nn.quantized") for module in model.modules())


def output_rows(layer: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """fp32 rows (V', features) of an output layer for the token ids, int8 or not.

    An int8 layer's weight is dequantized once and kept (``layer.dequantized_weight``): indexing it
    per batch is far cheaper than dequantizing per batch or packing a new int8 layer over the rows,
    which would cost more than a one-sentence batch spends in the output layer."""
    if not callable(layer.weight):  # an nn.Linear
        return layer.weight.index_select(0, ids)
    if getattr(layer, "dequantized_weight", None) is None:  # int8 layers return their weight from a call
        layer.dequantized_weight = layer.weight().dequantize()
    return layer.dequantized_weight.index_select(0, ids)
