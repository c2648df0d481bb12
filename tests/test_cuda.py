"""On a CUDA GPU (skipped without one): training in fp32 / fp16 / bf16 for both architectures,
resume, decoding and attribution compared with CPU decoding of the same checkpoint, int8 refused.

What is exact and what only approximately equal on a GPU is explained in ``docs/guides/gpu.md``:
cuDNN RNNs, fused attention and atomics-based reductions give results that differ from the CPU's in
the last bits, so outputs are compared by share, scores and weights with tolerances.
``benchmarks/gpu_smoke.py`` runs these together with the quickstart and short Multi30k runs (the whole
suite with ``--tests suite``).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from seq2seq.errors import UserError
from seq2seq.checkpoint.file import load_checkpoint
from seq2seq.training.run import train
from seq2seq.decoding.translator import Translator
from test_training import tiny_config

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
SENTENCES = ["twenty-one", "three hundred and four", "seven", "ninety-nine", "one thousand and twelve",
             "forty", "eighteen", "five hundred and sixty-six"]


def bf16_supported() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_bf16_supported()


@pytest.fixture(scope="module", params=["transformer", "rnn"])
def cuda_run(request, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp(f"cuda-{request.param}") / "run"
    result = train(tiny_config(out, request.param, device="cuda", compile=False, max_steps=60, eval_every=30),
                   quiet=True)
    assert result.progress.step == 60
    return out


@pytest.mark.parametrize("arch", ["transformer", "rnn"])
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_half_precision_training_on_cuda(tmp_path, arch, precision):
    if precision == "bf16" and not bf16_supported():
        pytest.skip("this GPU has no bf16")
    result = train(tiny_config(tmp_path / "run", arch, device="cuda", compile=False, precision=precision, max_steps=30,
                               eval_every=15), quiet=True)
    assert result.progress.step == 30 and result.progress.best_bleu >= 0
    payload = load_checkpoint(tmp_path / "run" / "last.pt")
    assert all(torch.isfinite(w).all() for w in payload["model"].values())
    assert set(payload["rng"]) == {"python", "numpy", "torch", "cuda"}  # the training device's RNG only


@pytest.mark.parametrize("arch", ["transformer", "rnn"])
def test_resume_on_cuda_continues_the_run(tmp_path, arch):
    straight = train(tiny_config(tmp_path / "a", arch, device="cuda", compile=False, max_steps=12), quiet=True)
    train(tiny_config(tmp_path / "b", arch, device="cuda", compile=False, max_steps=6), quiet=True)
    resumed = train(tiny_config(tmp_path / "b", arch, device="cuda", compile=False, max_steps=12), resume=True,
                    quiet=True)
    assert resumed.progress.step == straight.progress.step == 12
    a, b = (load_checkpoint(tmp_path / run / "last.pt")["model"] for run in ("a", "b"))
    for key in a:  # cuDNN and atomics reorder sums: close, not bitwise
        torch.testing.assert_close(a[key], b[key], rtol=1e-3, atol=1e-4, msg=key)


@pytest.mark.parametrize("beam", [1, 5])
def test_cuda_decoding_matches_cpu_decoding_of_the_same_checkpoint(cuda_run, beam):
    cpu = Translator.from_checkpoint(cuda_run / "best.pt", device="cpu")
    gpu = Translator.from_checkpoint(cuda_run / "best.pt", device="cuda")
    on_cpu = cpu.translate(SENTENCES, beam_size=beam)
    on_gpu = gpu.translate(SENTENCES, beam_size=beam)
    same = [a.text == b.text for a, b in zip(on_cpu, on_gpu)]
    assert sum(same) >= len(same) - 1  # a near-tie may flip; more would be a defect
    for a, b, equal in zip(on_cpu, on_gpu, same):
        if equal:
            assert a.score == pytest.approx(b.score, abs=1e-3)
            np.testing.assert_allclose(a.attention, b.attention, atol=1e-3)
    shortlisted = Translator.from_checkpoint(cuda_run / "best.pt", device="cuda", shortlist="auto")
    listed = [t.text for t in shortlisted.translate(SENTENCES, beam_size=beam, need_attention=False)]
    assert sum(a == b.text for a, b in zip(listed, on_gpu)) >= len(SENTENCES) - 1


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_half_precision_decoding_on_cuda(cuda_run, precision):
    if precision == "bf16" and not bf16_supported():
        pytest.skip("this GPU has no bf16")
    full = Translator.from_checkpoint(cuda_run / "best.pt", device="cuda").translate(SENTENCES, beam_size=5)
    half = Translator.from_checkpoint(cuda_run / "best.pt", device="cuda", precision=precision)
    outputs = half.translate(SENTENCES, beam_size=5)
    assert sum(a.text == b.text for a, b in zip(full, outputs)) >= len(SENTENCES) // 2
    assert all(o.attention.dtype == np.float32 for o in outputs)


def test_attribution_on_cuda_matches_cpu(cuda_run):
    from seq2seq.attribution.attribute import attribute_translation

    cpu = Translator.from_checkpoint(cuda_run / "best.pt", device="cpu")
    gpu = Translator.from_checkpoint(cuda_run / "best.pt", device="cuda")
    [translation] = cpu.translate(SENTENCES[:1], beam_size=1)
    for method in ("gradient", "integrated-gradients", "occlusion"):
        a = attribute_translation(cpu, translation, method)
        b = attribute_translation(gpu, translation, method)
        np.testing.assert_allclose(a.raw, b.raw, rtol=1e-2, atol=1e-3, err_msg=method)


def test_int8_is_refused_on_cuda_with_a_clear_message(cuda_run):
    with pytest.raises(UserError, match="int8 runs on CPU only"):
        Translator.from_checkpoint(cuda_run / "best.pt", device="cuda", precision="int8")


def test_pinned_prefetched_batches_arrive_intact_on_the_gpu():
    from seq2seq.data.batching import pad_batch
    from seq2seq.data.prefetch import prefetch

    batches = [pad_batch([[5, 6, 3]] * (i + 1), [[7, 8]] * (i + 1), list(range(i + 1))) for i in range(5)]
    moved = [b.to(torch.device("cuda")) for b in prefetch(iter(batches), lambda b: b.pin_memory())]
    assert all(m.src.is_cuda for m in moved)
    assert all(torch.equal(m.src.cpu(), b.src) and torch.equal(m.tgt_out.cpu(), b.tgt_out)
               for m, b in zip(moved, batches))


def test_bf16_rnn_recurrence_runs_in_fp32_under_autocast():
    from seq2seq.models.rnn import run_recurrence

    rnn = torch.nn.GRU(8, 8, batch_first=True).cuda()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        output, _ = run_recurrence(rnn, torch.randn(2, 5, 8, device="cuda"))
    assert output.dtype == torch.float32  # cuDNN would otherwise run it in unscaled fp16


@pytest.mark.parametrize("arch", ["transformer", "rnn"])
@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_a_cuda_training_step_never_waits_for_the_gpu_but_fp16_reads_its_scale_once(tmp_path, monkeypatch, arch,
                                                                                    precision):
    """CUDA's own sync detector (``torch.cuda.set_sync_debug_mode``) inside every training step: no host
    sync in fp32 and bf16, exactly one in fp16 (the loss scale the step counter needs); the RNN's packing
    included (``pack_padded_sequence(enforce_sorted=False)`` alone would add two)."""
    import warnings

    from seq2seq.training.trainer import Trainer

    if precision == "bf16" and not bf16_supported():
        pytest.skip("this GPU has no bf16")
    syncs, original = [], Trainer.train_step

    def watched(self, group):
        group = [batch.to(self.device) for batch in group]  # the copies are not the step's
        torch.cuda.synchronize()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                out = original(self, group)
            finally:
                torch.cuda.set_sync_debug_mode(0)
        syncs.append(sum("synchronizing" in str(w.message) for w in caught))
        return out

    monkeypatch.setattr(Trainer, "train_step", watched)
    train(tiny_config(tmp_path / "run", arch, device="cuda", compile=False, precision=precision, max_steps=6,
                      eval_every=0), quiet=True)
    expected = 1 if precision == "fp16" else 0
    # the first step may wait once more (seen once, fp32, on an H200): kernels and optimizer state start lazily
    assert syncs[0] <= expected + 1 and syncs[1:] == [expected] * 5, syncs


def test_inductor_finds_triton_for_the_gpu_inside_the_test_process():
    """Inductor compiles CUDA graphs with Triton. On an H200 (2026-11-27) the graphed-step test below failed
    with TritonMissing inside pytest while a plain process on the same machine found Triton: this names what
    Inductor's check (``torch.utils._triton.has_triton``) saw here, for the next GPU session. On the next H200
    session the same day it passed, and the graphed step compiled inside pytest: kept as a guard."""
    import os
    import sys

    import torch._inductor.config
    from torch.utils import _triton

    try:
        import triton
        found = f"triton {triton.__version__} at {triton.__file__}"
    except ImportError as exc:
        found = f"import triton failed: {exc!r}"
    seen = {"has_triton_package": _triton.has_triton_package(), "import": found,
            "cuda available": torch.cuda.is_available(), "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "inductor detection off": torch._inductor.config.triton_disable_device_detection,
            "has_triton cached": _triton.has_triton(), "sys.path head": sys.path[:4]}
    from torch._dynamo.device_interface import get_interface_for_device

    for name, probe in (("interface available", lambda: get_interface_for_device("cuda").is_available()),
                        ("worker properties", lambda: get_interface_for_device("cuda").Worker.get_device_properties()),
                        ("cuda.is_available is real", lambda: torch.cuda.is_available.__module__)):
        try:
            seen[name] = repr(probe())
        except Exception as exc:  # noqa: BLE001 - each probe is a clue
            seen[name] = f"{type(exc).__name__}: {exc}"
    _triton.has_triton.cache_clear()
    assert _triton.has_triton(), seen


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_the_graphed_step_trains_like_the_eager_step_on_cuda(tmp_path, precision):
    """--compile on CUDA (CUDA graphs per fixed shape) against eager training on the same fixed-shape
    batches: the logged losses agree to a tolerance (kernels differ in summation order). No dropout: the
    compiled graph draws its masks from another generator (seen on an H200: 1.3 % apart with dropout 0.1)."""
    import json

    if precision == "bf16" and not bf16_supported():
        pytest.skip("this GPU has no bf16")
    losses = {}
    for name, compile_step in (("eager", False), ("graphed", True)):
        cfg = tiny_config(tmp_path / name, "transformer", device="cuda", precision=precision, max_steps=40,
                          eval_every=0, log_every=10, compile=compile_step)
        cfg.data.fixed_shapes, cfg.model.dropout = True, 0.0
        train(cfg, quiet=True)
        records = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
        losses[name] = [r["loss"] for r in records if r["kind"] == "train"]
    assert len(losses["graphed"]) == 4
    assert losses["graphed"] == pytest.approx(losses["eager"], rel=0.02 if precision == "bf16" else 2e-3)
