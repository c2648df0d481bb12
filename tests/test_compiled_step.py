"""The GPU-shaped training step on any machine: fixed batch shapes that train exactly like the batch
itself, a step that reads nothing back from the device, the compiled step (with guided alignment and
the entropy penalty) against the eager one, and the device-sized defaults."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.overrides import TorchFunctionMode

from seq2seq.config import DEVICE_DEFAULTS, PRESETS, RunConfig
from seq2seq.data.batching import TokenBatchSampler, pad_batch
from seq2seq.data.shapes import bucket_length, bucket_lengths, bucket_rows, pad_to_shape
from seq2seq.models import build_model
from seq2seq.runtime import autocast
from seq2seq.training import compiled
from seq2seq.training.attention_entropy import EntropyPenalty
from seq2seq.training.guided import GuidedTraining
from seq2seq.training.objective import Objective
from seq2seq.training.run import train
from seq2seq.training.trainer import Trainer
from test_guided_alignment import toy_alignment_file

TINY = {"d_model": 32, "heads": 2, "ff_size": 64, "layers": 2, "embed_dim": 32, "hidden_size": 32,
        "decoder_hidden_size": 48, "dropout": 0.0}


# ----------------------------------------------------------------------------- fixed shapes


def test_bucket_lengths_cover_each_cost_with_little_padding():
    costs = np.arange(1, 600)
    lengths = bucket_lengths(costs)
    assert (lengths >= costs).all() and (lengths % 8 == 0).all()
    assert (lengths[costs > 64] - costs[costs > 64] < costs[costs > 64] / 8).all()  # < 1/8 padding past 64
    assert (lengths[costs <= 64] - costs[costs <= 64] < 8).all()
    assert len(set(lengths[costs <= 128].tolist())) == 16  # 8..128 by 8, then by 16, ...
    assert bucket_length(17) == 24 and bucket_length(65) == 72 and bucket_length(129) == 144


def test_fixed_shape_packing_gives_one_shape_per_bucket_and_keeps_every_pair():
    rng = np.random.default_rng(0)
    src, tgt = rng.integers(1, 90, 3000), rng.integers(1, 90, 3000)
    sampler = TokenBatchSampler(src, tgt, max_tokens=1000, seed=1, fixed_shapes=True)
    shapes = set()
    for rows in sampler.batches(0):
        src_length, tgt_length = bucket_length(int(src[rows].max())), bucket_length(int(tgt[rows].max() + 1))
        assert len(rows) <= bucket_rows(max(src_length, tgt_length), 1000)
        shapes.add((bucket_rows(max(src_length, tgt_length), 1000), src_length, tgt_length))
    assert np.array_equal(np.sort(np.concatenate(sampler.batches(0))), np.arange(3000))
    assert len(shapes) <= 13 * 13  # lengths up to 90: 8..96 by 8 on each side


def _random_batch(rng: np.random.Generator, rows: int, vocab: int):
    src = [rng.integers(4, vocab, rng.integers(1, 9)).tolist() + [2] for _ in range(rows)]  # EOS = 2
    tgt = [rng.integers(4, vocab, rng.integers(1, 9)).tolist() for _ in range(rows)]
    batch = pad_batch(src, tgt, list(range(rows)))
    guide = torch.zeros(rows, batch.tgt_in.size(1), batch.src.size(1))
    for r in range(rows):  # a gold row per real target position: uniform over the first two source positions
        guide[r, : len(tgt[r]), : min(2, len(src[r]))] = 1 / min(2, len(src[r]))
    batch.guide = guide
    return batch


@pytest.mark.parametrize("arch", ["transformer", "rnn"])
def test_a_padded_batch_trains_exactly_like_the_batch(arch):
    """Empty rows and padded columns change neither the objective, nor any of its terms, nor a gradient."""
    torch.manual_seed(0)
    cfg = RunConfig.from_dict({"model": {"arch": arch, "vocab_size": 40, **TINY}}).resolved("cpu")
    model = build_model(cfg.model).train()
    objective = Objective(model, 0.1, GuidedTraining(0, [0], 0.5), EntropyPenalty(0.3, -1, model.attention_layers),
                          lambda: autocast(torch.device("cpu"), "fp32"))
    batch = _random_batch(np.random.default_rng(1), 5, 40)
    padded = pad_to_shape(batch, max_tokens=400)
    rows = 400 // max(bucket_length(batch.src.size(1)), bucket_length(batch.tgt_in.size(1)))
    assert padded.src.shape == (rows, bucket_length(batch.src.size(1)))
    assert padded.tgt_in.shape == padded.tgt_out.shape == (rows, bucket_length(batch.tgt_in.size(1)))
    assert (padded.num_src_tokens, padded.num_tgt_tokens) == (batch.num_src_tokens, batch.num_tgt_tokens)
    results = []
    for b in (batch, padded):
        model.zero_grad()
        terms = objective(b.src, b.src_mask, b.tgt_in, b.tgt_out, b.guide, b.src_lengths)
        terms.objective.backward()
        results.append((terms, [p.grad.clone() for p in model.parameters()]))
    (plain, plain_grads), (shaped, shaped_grads) = results
    for a, b in zip(plain, shaped):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert float(plain.guided) > 0 and float(plain.entropy) > 0
    for a, b in zip(plain_grads, shaped_grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


# ----------------------------------------------------------------------------- no host reads in a step


class HostReads(TorchFunctionMode):
    """Counts what would wait for a GPU: a tensor's value read on the host (item, bool, float, int,
    tolist, numpy, cpu), except of tensors that live on the host on a GPU too: the optimizer's step
    counters (``exempt``) and a packed sequence's lengths and batch sizes (read by torch's RNN code)."""

    READS = {"item", "__bool__", "__float__", "__int__", "__index__", "tolist", "numpy", "cpu"}
    HOST_SIDE = ("torch/nn/utils/rnn.py", "torch/nn/modules/rnn.py")

    def __init__(self, exempt) -> None:
        super().__init__()
        self.exempt, self.reads = exempt, []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in self.READS and args and isinstance(args[0], torch.Tensor) and \
                not any(args[0] is t for t in self.exempt()) and not self._in_packing():
            self.reads.append(name)
        return func(*args, **(kwargs or {}))

    def _in_packing(self) -> bool:
        frame = sys._getframe(2)
        while frame is not None:
            if frame.f_code.co_filename.replace("\\", "/").endswith(self.HOST_SIDE):
                return True
            frame = frame.f_back
        return False


def tiny_run(out: Path, arch: str, **train_options) -> RunConfig:
    cfg = RunConfig.from_dict({
        "model": {"arch": arch, **TINY, "dropout": 0.1},
        "data": {"toy_size": 200, "vocab_size": 100, "max_tokens": 400, "cache_dir": str(out.parent / "cache")},
        "train": {"max_steps": 4, "eval_every": 0, "warmup_steps": 2, "seed": 3, "device": "cpu", "threads": 1,
                  "log_every": 2, **train_options},
    })
    cfg.output_dir = str(out)
    return cfg


@pytest.mark.parametrize("arch", ["transformer", "rnn"])
def test_a_training_step_reads_nothing_back_from_the_device(tmp_path, monkeypatch, arch):
    """On a GPU each read is a host sync that stalls the queue: a step with guided alignment and the
    entropy penalty reads nothing (loss and metrics wait for the log steps, the RNN's packing takes
    the lengths the batch carries on the host); a log step reads its few values, once."""
    links = toy_alignment_file(tmp_path / "toy.talp", 200)
    counts = {"steps": [], "after": []}
    original_step, original_after = Trainer.train_step, Trainer._after_step

    def exempt_of(trainer):
        return lambda: [state["step"] for state in trainer.optimizer.state.values() if "step" in state]

    def counted_step(self, group):
        with HostReads(exempt_of(self)) as mode:
            out = original_step(self, group)
        counts["steps"].append(mode.reads)
        return out

    def counted_after(self, loss, tokens, bar):
        with HostReads(exempt_of(self)) as mode:
            original_after(self, loss, tokens, bar)
        counts["after"].append(mode.reads)

    monkeypatch.setattr(Trainer, "train_step", counted_step)
    monkeypatch.setattr(Trainer, "_after_step", counted_after)
    cfg = tiny_run(tmp_path / "run", arch, attention_entropy_weight=0.1)
    cfg.guided.links = str(links)
    result = train(cfg, quiet=True)
    assert result.progress.step == 4
    assert counts["steps"] == [[]] * 4
    # log steps (2 and 4) read the loss, the guided loss and the entropy; other steps read nothing
    assert [len(reads) for reads in counts["after"]] == [0, 3, 0, 3]


# ----------------------------------------------------------------------------- the compiled step


def _losses(run: Path) -> list[float]:
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in records if r["kind"] == "train"]


@pytest.mark.slow  # traces and differentiates a graph of dynamic shapes
@pytest.mark.parametrize("arch", ["transformer", "rnn"])
def test_the_compiled_step_with_guided_alignment_trains_like_the_eager_one(tmp_path, monkeypatch, arch):
    """--compile with every attention term (guided alignment, the entropy penalty) and fixed shapes:
    the same losses as eager training on the same fixed-shape batches (the 'aot_eager' backend traces
    and differentiates like Inductor, without generating code)."""
    monkeypatch.setattr(compiled, "BACKEND", "aot_eager")
    links = toy_alignment_file(tmp_path / "toy.talp", 200)
    losses = {}
    for name, compile_step in (("eager", False), ("compiled", True)):
        cfg = tiny_run(tmp_path / name, arch, attention_entropy_weight=0.1, compile=compile_step, log_every=1,
                       max_steps=3)
        cfg.guided.links, cfg.data.fixed_shapes = str(links), True
        cfg.model.layers = 1  # tracing and differentiating a graph of dynamic shapes is what costs here
        train(cfg, quiet=True)
        losses[name] = _losses(tmp_path / name)
    assert len(losses["compiled"]) == 3
    assert losses["compiled"] == pytest.approx(losses["eager"], rel=1e-4)


def test_compiled_step_uses_cuda_graphs_only_where_they_are_safe():
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert compiled.graphs_apply(cuda, accumulate=1, world_size=1)
    assert not compiled.graphs_apply(cuda, accumulate=2, world_size=1)  # a replay would overwrite live gradients
    assert not compiled.graphs_apply(cuda, accumulate=1, world_size=2)
    assert not compiled.graphs_apply(cpu, accumulate=1, world_size=1)


# ----------------------------------------------------------------------------- device-sized defaults


def test_device_defaults_fill_only_what_is_unset_and_the_cpu_keeps_its_numbers():
    for name in PRESETS:
        cpu = RunConfig.from_preset(name, train={"device": "cpu"})
        assert (cpu.train.precision, cpu.train.tf32, cpu.train.compile) == ("fp32", False, False)
    gpu = RunConfig.from_dict({"model": {"arch": "transformer"}}).resolved("cuda")
    expected = DEVICE_DEFAULTS["cuda"]
    assert gpu.data.max_tokens == expected["data"]["max_tokens"]["transformer"] > 3000
    assert (gpu.train.precision, gpu.train.tf32, gpu.train.compile, gpu.data.fixed_shapes) == ("auto", True, True, True)
    rnn = RunConfig.from_dict({"model": {"arch": "rnn"}}).resolved("cuda")  # bf16 measured slower for cuDNN's GRU
    assert (rnn.train.precision, rnn.train.compile, rnn.data.max_tokens) == ("fp32", False, 8000)
    assert RunConfig.from_dict({"model": {"arch": "rnn"}}).resolved("cpu").data.max_tokens == 1000
    chosen = dict((key, value) for key, value, _ in RunConfig.from_dict(
        {"train": {"precision": "fp32"}}).device_choices("cuda"))
    assert "train.precision" not in chosen and chosen["train.tf32"] is True  # what was set stays
    explicit = RunConfig.from_dict({"data": {"max_tokens": 500}, "train": {"tf32": False}}).resolved("cuda")
    assert (explicit.data.max_tokens, explicit.train.tf32) == (500, False)
    assert not RunConfig().resolved("cpu").data.fixed_shapes
    assert RunConfig.from_dict({"train": {"compile": True}}).resolved("cpu").data.fixed_shapes


def test_print_config_names_what_the_device_chose(capsys):
    from seq2seq.cli.train import main

    assert main(["--preset", "transformer", "--device", "cuda", "--print-config"]) == 0
    text = capsys.readouterr().out
    assert "# Chosen for training on CUDA" in text and "data.max_tokens: 12000" in text
    assert "  max_tokens: 12000" in text and "  precision: auto" in text


def test_the_base_preset_is_the_base_transformer():
    cfg = RunConfig.from_preset("transformer-base")
    cfg.model.vocab_size = 8000
    model = build_model(cfg.model)
    assert (cfg.model.layers, cfg.model.d_model, cfg.model.heads, cfg.model.ff_size) == (6, 512, 8, 2048)
    assert 47e6 < model.num_parameters() < 50e6
