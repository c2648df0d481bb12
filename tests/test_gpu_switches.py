"""GPU-path decisions that can be checked on a CPU: the TF32 switch of decoding, and the fp16 loss
scaler's skipped steps (one host sync per step, a named error when every step of an epoch overflows).
An enabled CPU ``GradScaler`` stands in for the CUDA one: the skip logic is the same."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

import seq2seq.training.trainer as trainer_module
from seq2seq.config import RunConfig
from seq2seq.decoding.translator import Translator
from seq2seq.errors import UserError
from seq2seq.training.run import train
from seq2seq.training.trainer import Trainer

pytestmark = pytest.mark.cuda  # with a GPU, these run with it visible (tests/conftest.py)

OLD_RNN = Path(__file__).parent / "data" / "pre-tiers" / "rnn.pt"


def test_decoding_in_fp32_turns_tf32_off_for_the_call_only(monkeypatch):
    """PyTorch's default leaves cuDNN in TF32; a translation must not inherit it from the process, and
    building or using a Translator must not change the process's switches either."""
    from conftest import run_main

    def flags():
        return torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32

    matmul, cudnn = flags()
    try:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
        translator = Translator.from_checkpoint(OLD_RNN, device="cpu")
        assert flags() == (True, True)  # building switches nothing
        seen, encode = [], translator.model.encode
        monkeypatch.setattr(translator.model, "encode", lambda *a, **k: seen.append(flags()) or encode(*a, **k))
        translator.translate(["seven"], beam_size=1)
        assert seen and set(seen) == {(False, False)} and flags() == (True, True)  # off inside, restored after
        assert run_main(["translate", "--checkpoint", str(OLD_RNN), "--beam-size", "0"])[0] == 2
        assert flags() == (False, False)  # a command starts in IEEE fp32
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = matmul, cudnn


def tiny(out: Path, **train) -> RunConfig:
    cfg = RunConfig.from_dict({
        "model": {"arch": "transformer", "d_model": 32, "heads": 2, "ff_size": 64, "layers": 1, "dropout": 0.1},
        "data": {"toy_size": 120, "vocab_size": 100, "max_tokens": 400, "cache_dir": str(out.parent / "cache")},
        "train": {"max_steps": 6, "eval_every": 0, "warmup_steps": 2, "seed": 3, "device": "cpu", "threads": 1,
                  **train},
    })
    cfg.output_dir = str(out)
    return cfg


@pytest.fixture
def cpu_scaler(monkeypatch):
    """Trainers get an enabled CPU gradient scaler starting at ``init_scale`` (set by the test)."""
    settings = {"init_scale": 2.0 ** 16}
    real = torch.amp.GradScaler

    def scaler(device: str = "cuda", enabled: bool = True, **kwargs):
        return real("cpu", init_scale=settings["init_scale"], enabled=True)

    monkeypatch.setattr(trainer_module.torch.amp, "GradScaler", scaler)
    return settings


def test_an_fp16_step_reads_the_loss_scale_once(tmp_path, cpu_scaler, monkeypatch):
    """Each read of the scale is a host sync on a GPU: one per step (the step counter needs it), not two."""
    reads, steps = {"n": 0}, {"n": 0}
    scaler_class = type(trainer_module.torch.amp.GradScaler())  # the real class behind the fixture's factory
    original_get, original_step = scaler_class.get_scale, Trainer.train_step

    def counted_get(self):
        reads["n"] += 1
        return original_get(self)

    def counted_step(self, group):
        steps["n"] += 1
        before = reads["n"]
        out = original_step(self, group)
        reads["in steps"] = reads.get("in steps", 0) + reads["n"] - before
        return out

    monkeypatch.setattr(scaler_class, "get_scale", counted_get)
    monkeypatch.setattr(Trainer, "train_step", counted_step)
    result = train(tiny(tmp_path / "run"), quiet=True)
    assert result.progress.step == 6 == steps["n"]  # a normal scale: no step skipped
    assert reads["in steps"] == steps["n"]  # one per step (saving a checkpoint reads it too, rarely)


def test_an_epoch_whose_every_step_overflows_says_so(tmp_path, cpu_scaler, monkeypatch):
    from seq2seq.training import objective

    loss = objective.sequence_loss
    # an infinite loss: every gradient overflows, the scaler halves its scale and skips every step
    monkeypatch.setattr(objective, "sequence_loss", lambda *args, **kwargs: loss(*args, **kwargs) * float("inf"))
    with pytest.raises(UserError) as info:
        train(tiny(tmp_path / "run"), quiet=True)
    message = str(info.value)
    assert "epoch 0 gave no training step: fp16 gradients overflowed at every step" in message
    assert "--precision bf16" in message and "--accumulate" not in message


def test_the_fused_attention_kernel_never_runs_as_cudnn_attention_and_the_callers_switches_come_back(monkeypatch):
    """cuDNN attention builds a plan for every new shape (25x slower fp16 beam search on an H100): the
    fused path excludes it, keeps the other kernels, and leaves the process's own switches as they were."""
    import torch.nn.functional as F

    from seq2seq.nn import attention

    seen = []
    kernel = F.scaled_dot_product_attention

    def spy(*args, **kwargs):
        seen.append((torch.backends.cuda.cudnn_sdp_enabled(), torch.backends.cuda.flash_sdp_enabled(),
                     torch.backends.cuda.mem_efficient_sdp_enabled(), torch.backends.cuda.math_sdp_enabled()))
        return kernel(*args, **kwargs)

    monkeypatch.setattr(attention, "fused_kernel_pays", lambda device: True)
    monkeypatch.setattr(attention.F, "scaled_dot_product_attention", spy)
    mha = attention.MultiHeadAttention(16, 4).eval()
    x = torch.randn(2, 5, 16)
    mask = torch.tensor([[True] * 5, [True] * 3 + [False] * 2])[:, None, None, :]
    before = torch.backends.cuda.cudnn_sdp_enabled()
    fused, _ = mha(x, x, x, mask=mask)
    assert seen == [(False, True, True, True)]
    assert torch.backends.cuda.cudnn_sdp_enabled() == before
    torch.testing.assert_close(fused, mha(x, x, x, mask=mask, need_weights=True)[0], rtol=1e-5, atol=1e-5)
