"""A trained model adapted to the sentence pairs it is about to align (test-time adaptation).

A statistical word aligner such as eflomal estimates its lexical tables on the very corpus it aligns; a
translation model has seen only its training data, and its attention over a word it barely knows
("Schnappschuss" -> "snapshot") is diffuse. ``adapt`` fine-tunes a copy of the model on the pairs to be
aligned with the translation loss alone, the way awesome-align (Dou & Neubig 2021) fine-tunes on the parallel
corpus it aligns, and the links are then read from the copy:

    theta <- theta - Adam_lr( grad_theta  sum_t CE_ls(y_t | y_<t, x) / #target tokens )

over token batches of the pairs (reshuffled each pass), ``steps`` times, with dropout, constant learning
rate, the gradient's norm clipped to 1. No link enters the loss, so nothing supervised is learnt from the
pairs, and the attention heads trained to align (guided alignment, full context) keep their role: only
their inputs now know the pairs' words. The model given is left as it was. Written here rather than
through ``train()``: the pairs are in memory, there is no run directory, validation or checkpoint, and the
step is the plain teacher-forced loss.
"""
from __future__ import annotations

import itertools
import time
from typing import Sequence

import torch

from ..config import ADAPT_LR
from ..io_utils import counted
from ..data.batching import TokenBatchSampler, pad_batch
from ..decoding.translator import Translator
from ..errors import UserError
from ..models.packaged import plain_copy
from ..nn.packed import PackedLinear, pack_for_decoding
from ..runtime import LOGGER
from ..tokenizer import EOS_ID
from .optim import OptimizerSettings, build_optimizer, sequence_loss

ADAPT_MAX_TOKENS = 3000  # the CPU presets' batch
ADAPT_BETAS, ADAPT_EPS = (0.9, 0.98), 1e-9  # Adam's, no weight decay (the Transformer's training betas)


def chunks(count: int, size: int) -> list[range]:
    """The consecutive chunks of at most ``size`` of ``count`` pairs (``size`` 0: all in one) that ``align
    --adapt-pairs`` adapts a copy of the model to, one after the other."""
    size = size or count or 1
    return [range(start, min(start + size, count)) for start in range(0, count, size)] or [range(0)]


def adapt(translator: Translator, sources: Sequence[str], targets: Sequence[str], steps: int,
          lr: float = ADAPT_LR, max_tokens: int = ADAPT_MAX_TOKENS, label_smoothing: float = 0.1,
          seed: int = 1) -> Translator:
    """A Translator whose model is a copy of ``translator``'s trained ``steps`` updates on the pairs
    (``sources[i]``, ``targets[i]``); ``steps`` 0 returns ``translator`` itself."""
    if steps < 0 or lr <= 0 or max_tokens <= 0:
        raise UserError(f"adapting needs steps >= 0, a positive learning rate and --max-tokens; got steps {steps}, "
                        f"lr {lr}, max_tokens {max_tokens}")
    if steps == 0:
        return translator
    if translator.engine is not None:
        raise UserError("adapting a model trains our engine's copy of it; use --engine seq2seq")
    if any(p.dtype != torch.float32 for p in translator.model.parameters()) or any(
            "quantized" in type(m).__module__ for m in translator.model.modules()):
        raise UserError("adapting trains the model: load it in fp32 (--precision fp32), not fp16, bf16 or int8")
    if len(sources) != len(targets) or not sources:
        raise UserError(f"adapting needs pairs: {counted(len(sources), 'source')}, {counted(len(targets), 'target')}")
    tok, device = translator.tokenizer, translator.device
    src_ids = [tok.encode(s) + [EOS_ID] for s in sources]
    tgt_ids = [tok.encode(t) for t in targets]
    sampler = TokenBatchSampler([len(s) for s in src_ids], [len(t) for t in tgt_ids], max_tokens, shuffle=True,
                                seed=seed, drop_oversized=False)
    model = plain_copy(translator.model).to(device).train()  # not the compiled parts: they hold the old weights
    optimizer = build_optimizer(model, OptimizerSettings("adam", lr, ADAPT_BETAS, weight_decay=0.0, eps=ADAPT_EPS))
    per_pass = len(sampler.batches(0))  # every pass packs the same lengths into as many batches
    batches = itertools.chain.from_iterable(sampler.batches(epoch) for epoch in itertools.count())
    started, losses = time.perf_counter(), []
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)  # dropout: the same copy for the same pairs
        for rows in itertools.islice(batches, steps):
            batch = pad_batch([src_ids[i] for i in rows], [tgt_ids[i] for i in rows], rows.tolist()).to(device)
            logits, _ = model(batch.src, batch.src_mask, batch.tgt_in, src_lengths=batch.host_src_lengths())
            loss = sequence_loss(logits, batch.tgt_out, label_smoothing) / batch.num_tgt_tokens
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            losses.append(loss.detach())  # read once at the end: no host sync per update on a GPU
    losses = torch.stack(losses).cpu()
    passes = counted(-(-steps // per_pass), "pass", "passes")
    LOGGER.info(f"adapt: {counted(steps, 'update')} on {counted(len(sources), 'pair')} ({passes}) in "
                f"{time.perf_counter() - started:.1f} s; loss per token {float(losses[:per_pass].mean()):.3f} (first "
                f"pass) -> {float(losses[-1]):.3f}")
    if any(isinstance(m, PackedLinear) for m in translator.model.modules()):
        pack_for_decoding(model)  # decodes as fast as the model it came from
    return Translator(model.eval(), tok, translator.decode, shortlist=translator.shortlist, origin=translator.origin)
