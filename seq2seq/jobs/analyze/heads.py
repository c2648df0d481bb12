"""Head masking, head importance and pruning (Michel et al. 2019, "Are Sixteen Heads Really Better
than One?").

A Transformer decoder layer's cross-attention is MHA(x) = sum_h xi_h head_h(x) W_O^h + b_O, with
head_h(x) the context of head h (d_k features) and W_O^h its d_k rows of the output projection; the
gates xi_h are 1. Masking head h sets xi_h = 0: its slice of the concatenated context
[head_1; ...; head_H] is zeroed where it enters the output projection, so the other heads'
contributions and every attention distribution of the layer stay as they were. ``masked_heads``
does this with a forward pre-hook on the layer's ``out_proj`` for as long as it is active: the
models are untouched and nothing extra runs when no head is masked. Only cross-attention heads are
masked (the attention the rest of the analysis reads); the RNN's single attention has nothing to
compare it with, so its importance is not computed.

Importance of head h is the change of the teacher-forced loss when it alone is masked:
I_h = L(xi_h = 0) - L, with L the mean cross-entropy per target token (EOS included) over the
corpus, -sum log p(y_t | y_<t, x) / sum |y| + 1 (``seq2seq.decoding.scoring.teacher_force``). The
exact ablation is cheap at these sizes, so Michel et al.'s gradient proxy is not needed. Pruning
masks the k heads of lowest I_h together (ties: lower layer, then lower head first), k = 0 .. K,
and translates a subset with each (the search of ``Translator.translate``).
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterable, Iterator, Sequence

import numpy as np
import torch

from ...config import FORCED_BATCH_SIZE, DecodeConfig
from ...decoding.scoring import teacher_force
from ...decoding.translator import Translator
from ...metrics import corpus_bleu
from ...models.base import EncoderDecoder
from ...models.transformer import TransformerEncoderDecoder
from ...nn.attention import MultiHeadAttention
from ...runtime import progress_bar
from .job import AnalyzeJob

Head = tuple[int, int]  # (layer, head)


def cross_attention_layers(model: EncoderDecoder) -> list[MultiHeadAttention] | None:
    """The decoder layers' cross-attention modules of a Transformer, bottom first; None for a model
    whose attention cannot be masked head by head (the RNN)."""
    if not isinstance(model, TransformerEncoderDecoder):
        return None
    return [layer.cross_attn for layer in model.decoder]


@contextmanager
def masked_heads(model: EncoderDecoder, heads: Iterable[Head]) -> Iterator[None]:
    """Within the block, the cross-attention ``heads`` (layer, head) of ``model`` contribute nothing
    (xi_h = 0, see the module docstring); on exit the model is as before."""
    layers = cross_attention_layers(model)
    chosen = sorted(set(heads))
    if chosen and layers is None:
        raise ValueError(f"{type(model).__name__} has no cross-attention heads to mask")
    handles = []
    try:
        for index in sorted({layer for layer, _ in chosen}):
            module = layers[index]
            gate = torch.ones(module.heads, module.d_k)  # (H, d_k): xi_h per feature of the context
            for layer, head in chosen:
                if layer == index:
                    gate[head] = 0.0
            gate = gate.flatten()  # (D,) the concatenated heads' order

            def hook(_module, inputs, gate=gate):
                context = inputs[0]  # (B, Tq, D)
                return (context * gate.to(context.device, context.dtype),) + tuple(inputs[1:])

            handles.append(module.out_proj.register_forward_pre_hook(hook))
        yield
    finally:
        for handle in handles:
            handle.remove()


def mean_loss(model: EncoderDecoder, sources: Sequence[list[int]], targets: Sequence[list[int]],
              batch_size: int) -> float:
    """Mean cross-entropy per target token (EOS included), teacher-forced."""
    log_probs, _ = teacher_force(model, sources, targets, batch_size=batch_size)
    return -float(sum(lp.sum() for lp in log_probs)) / max(sum(len(lp) for lp in log_probs), 1)


def subset_bleu(translator: Translator, sources: Sequence[str], references: Sequence[str], decode: DecodeConfig
                ) -> float:
    """Corpus BLEU of the translator's output for ``sources`` (decoded as ``decode`` says) against ``references``."""
    hyps = translator.translate(list(sources), decode, need_attention=False)
    return corpus_bleu([h.text for h in hyps], list(references)).score


def pruning_order(delta_loss: np.ndarray) -> list[Head]:
    """Heads by importance, least important first; ties: lower layer, then lower head."""
    layers, heads = delta_loss.shape
    return sorted(((layer, head) for layer in range(layers) for head in range(heads)),
                  key=lambda lh: (float(delta_loss[lh]), lh))


def head_importance(translator: Translator, src_ids: Sequence[list[int]], tgt_ids: Sequence[list[int]],
                    bleu_sources: Sequence[str], bleu_references: Sequence[str], job: AnalyzeJob) -> dict[str, Any]:
    """Importance of every cross-attention head (the loss change I_h, the BLEU change on the subset
    when it alone is masked) and BLEU and loss with the k least important heads masked, k = 0..K
    (K = ``job.max_pruned``, default all heads). No subset (empty ``bleu_sources``): no BLEU. ``job``'s
    ``decode`` translates the subset, its ``batch_size`` (default ``FORCED_BATCH_SIZE``) force-decodes;
    ``job.quiet``: no progress bars."""
    model = translator.model
    layers = cross_attention_layers(model)
    shape = (len(layers), layers[0].heads)
    force_batch = job.decode.batch_size or FORCED_BATCH_SIZE
    with_bleu = len(bleu_sources) > 0

    def bleu(masked: Iterable[Head]) -> float | None:
        if not with_bleu:
            return None
        with masked_heads(model, masked):
            return subset_bleu(translator, bleu_sources, bleu_references, job.decode)

    def loss(masked: Iterable[Head]) -> float:
        with masked_heads(model, masked):
            return mean_loss(model, src_ids, tgt_ids, force_batch)

    base_loss, base_bleu = loss(()), bleu(())
    every = [(layer, head) for layer in range(shape[0]) for head in range(shape[1])]
    delta_loss, masked_bleu = np.zeros(shape), np.full(shape, np.nan)
    for layer, head in progress(every, "mask heads", job.quiet):
        delta_loss[layer, head] = loss([(layer, head)]) - base_loss
        if with_bleu:
            masked_bleu[layer, head] = bleu([(layer, head)])
    order = pruning_order(delta_loss)
    top = len(order) if job.max_pruned is None else min(job.max_pruned, len(order))
    pruning = [{"k": 0, "heads": [], "loss": base_loss, "bleu": base_bleu}]
    for k in progress(range(1, top + 1), "prune heads", job.quiet):
        pruning.append({"k": k, "heads": [list(h) for h in order[:k]], "loss": loss(order[:k]),
                        "bleu": bleu(order[:k])})
    return {
        "loss": base_loss, "bleu": base_bleu, "delta_loss": delta_loss,
        "bleu_masked": masked_bleu if with_bleu else None,
        "delta_bleu": masked_bleu - base_bleu if with_bleu else None,
        "order": [list(h) for h in order], "pruning": pruning,
    }


def progress(items: Sequence, desc: str, quiet: bool):
    """tqdm over ``items`` on stderr unless ``quiet``."""
    if quiet:
        return items
    return progress_bar(items, desc=desc, unit="run")
