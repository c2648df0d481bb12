"""The GPU path, tested on CPU: each behaviour that differs on a GPU is reachable here through the
switch that selects it (device selection, TF32, bf16 capability, sync-free search, one-pass loss,
pinned prefetching, stop requests). The same on a real GPU: ``tests/test_cuda.py``."""
from __future__ import annotations

import signal
import threading

import pytest
import torch

import seq2seq.decoding.search as search
from seq2seq.decoding.generator import SearchBatch
import seq2seq.nn.next_token as next_token
import seq2seq.nn.loss as loss_module
from seq2seq.data.prefetch import prefetch
from seq2seq.errors import UserError
from seq2seq.runtime import allow_tf32, precision_warning, resolve_device
from seq2seq.training import distributed
from test_models import reverse_batch, trained_once

pytestmark = pytest.mark.cuda  # with a GPU, these run with it visible (tests/conftest.py)


@pytest.fixture
def fake_gpus(monkeypatch):
    """Two CUDA devices as far as the device helpers can tell; records set_device calls."""
    selected = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: selected.append(torch.device(device)))
    return selected


def test_device_cuda_n_selects_gpu_n(fake_gpus):
    assert resolve_device("cuda:1") == torch.device("cuda", 1)
    assert fake_gpus == [torch.device("cuda", 1)]  # kernels without an explicit index land there too
    assert resolve_device("cuda") == torch.device("cuda") and len(fake_gpus) == 1  # the current one
    with pytest.raises(UserError, match="--device cuda:2: this machine has 2 CUDA device"):
        resolve_device("cuda:2")
    for bad in ("cuda:x", "gpu", "cuda:-1"):
        with pytest.raises(UserError, match="--device must be auto, cpu, cuda or cuda:N"):
            resolve_device(bad)


def test_device_flags_accept_cuda_n_and_reject_junk_before_any_work():
    from seq2seq.config import RunConfig

    assert RunConfig.from_dict({"train": {"device": "cuda:3"}}).train.device == "cuda:3"
    with pytest.raises(UserError, match="train.device"):
        RunConfig.from_dict({"train": {"device": "cuda3"}})


def test_tf32_is_opt_in_and_off_means_ieee_everywhere():
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    try:
        allow_tf32(True)
        assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
        allow_tf32(False)  # PyTorch's own default leaves cuDNN (the RNNs) on TF32
        assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
        # Attribution's context (scoring.eval_mode with grad, around the RNN backward) wraps
        # torch.backends.cudnn.flags(enabled=False), which reads the old TF32 switch: entering it must
        # not raise after allow_tf32(False), must turn cuDNN off inside (catches the flags dropped from
        # eval_mode: cuDNN's RNN backward refuses eval mode) and must leave the switches IEEE afterwards.
        from seq2seq.decoding.scoring import eval_mode

        enabled = torch.backends.cudnn.enabled
        model = torch.nn.Linear(2, 2).train()
        with eval_mode(model, grad=True):
            assert not torch.backends.cudnn.enabled and torch.is_grad_enabled() and not model.training
        assert torch.backends.cudnn.enabled == enabled and model.training
        assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


@pytest.mark.parametrize("capability, warns", [((7, 5), True), ((8, 0), False), ((9, 0), False)])
def test_bf16_on_a_gpu_without_bf16_tensor_cores_warns(monkeypatch, capability, warns):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla T4")
    with pytest.warns(UserWarning) if not torch.cuda.is_available() else _nothing():  # autocast on a CPU build
        message = precision_warning(torch.device("cuda"), "bf16")
    assert (message is not None) == warns
    if warns:
        assert "Tesla T4 (compute capability 7.5)" in message and "--precision fp16" in message


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_the_loss_in_one_pass_equals_the_loss_in_cache_sized_chunks(monkeypatch):
    """On a GPU the loss runs over all rows at once; on CPU in chunks: the same values and gradients."""
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(700, 50, generator=generator)  # 700 rows: three CPU chunks
    target = torch.randint(0, 50, (700,), generator=generator)
    target[::7] = 0  # padding rows

    def run():
        z = logits.clone().requires_grad_()
        value = loss_module.label_smoothed_cross_entropy(z, target, 0.1, ignore_index=0)
        value.backward()
        return value.detach(), z.grad

    chunked = run()
    assert loss_module.chunk_rows(logits) == loss_module.CHUNK_ROWS
    monkeypatch.setattr(loss_module, "chunk_rows", lambda z: z.size(0))
    whole = run()
    torch.testing.assert_close(whole[0], chunked[0], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(whole[1], chunked[1], rtol=1e-6, atol=1e-7)


def test_sync_free_eos_forcing_equals_the_cpu_branch():
    generator = torch.Generator().manual_seed(1)
    log_p = torch.randn(6, 9, generator=generator).log_softmax(-1)
    for rows in (torch.tensor([0, 1, 0, 0, 1, 0], dtype=torch.bool), torch.zeros(6, dtype=torch.bool)):
        branch, masked = log_p.clone(), log_p.clone()
        next_token.only_eos(branch, rows, 2, sync_free=False)
        next_token.only_eos(masked, rows, 2, sync_free=True)
        assert torch.equal(branch, masked)
        assert torch.isinf(masked[rows][:, [0, 1, 3]]).all() and torch.equal(masked[rows, 2], log_p[rows, 2])
        assert torch.equal(masked[~rows], log_p[~rows])


@pytest.fixture(scope="module")
def trained():
    return {variant: trained_once(variant, 30, 1e-2) for variant in ("bahdanau", "transformer-pre")}


@pytest.mark.parametrize("variant", ["bahdanau", "transformer-pre"])
def test_greedy_search_looking_for_finished_sentences_every_8_steps_gives_the_same_outputs(trained, monkeypatch,
                                                                                          variant):
    """On a GPU greedy search drops finished sentences every 8 steps (each look is a host sync):
    the finished rows decoded meanwhile must change no output and no score."""
    model = trained[variant]
    src, mask, _, _ = reverse_batch(12, torch.Generator().manual_seed(5), 1, 6)
    every_step = search.greedy_search(model, SearchBatch(src, mask), need_attention=False)
    lengths = {len(h[0].tokens) for h in every_step}
    assert len(lengths) > 1  # sentences end at different steps: the rows really are dropped late
    assert search.finished_check_interval(src.device) == 1
    monkeypatch.setattr(search, "finished_check_interval", lambda device: 8)
    every_8 = search.greedy_search(model, SearchBatch(src, mask), need_attention=False)
    assert [h[0].tokens for h in every_8] == [h[0].tokens for h in every_step]
    for late, early in zip(every_8, every_step):
        assert late[0].log_prob == pytest.approx(early[0].log_prob, abs=1e-5)


def test_prefetch_keeps_order_raises_where_the_source_fails_and_stops_when_closed():
    assert list(prefetch(range(10), lambda x: x * x)) == [x * x for x in range(10)]

    def failing():
        yield 1
        raise ValueError("line 2 is broken")

    stream = prefetch(failing(), lambda x: x)
    assert next(stream) == 1
    with pytest.raises(ValueError, match="line 2 is broken"):
        next(stream)

    produced = []
    stream = prefetch(iter(range(1000)), lambda x: produced.append(x) or x, depth=2)
    assert [next(stream) for _ in range(3)] == [0, 1, 2]
    stream.close()  # a consumer that breaks out of its loop
    assert len(produced) <= 3 + 2 + 1  # consumed + queue depth + the one being prepared
    assert not [t for t in threading.enumerate() if t.name == "seq2seq-prefetch"]
    with pytest.raises(ValueError, match="depth"):
        next(prefetch([1], lambda x: x, depth=0))


def test_stop_requests_install_nothing_in_one_process_and_agree_is_the_identity():
    before = signal.getsignal(signal.SIGINT)
    with distributed.StopRequests() as requests:
        assert signal.getsignal(signal.SIGINT) is before  # Ctrl-C still raises KeyboardInterrupt
        assert not requests.requested
    assert distributed.agree([True, False], 5.0) == ([True, False], 5.0)


def test_training_reads_the_loss_from_the_device_only_on_log_steps(tmp_path, monkeypatch):
    """``loss.item()`` per micro-batch made the host wait for the GPU at every step; the loop now
    reads the (device) loss once per logged step."""
    from seq2seq.cli import config_from_flags
    from seq2seq.training.run import train as train_run

    reads = []
    original = torch.Tensor.__float__
    monkeypatch.setattr(torch.Tensor, "__float__", lambda t: reads.append(t.shape) or original(t))
    cfg = config_from_flags(["--toy-size", "200", "--vocab-size", "60", "--d-model", "16", "--heads", "2",
                             "--ff-size", "32", "--layers", "1", "--max-tokens", "300", "--max-steps", "6",
                             "--accumulate", "2", "--log-every", "3", "--eval-every", "0", "--device", "cpu",
                             "--cache-dir", str(tmp_path / "cache"), "--output-dir", str(tmp_path / "run")])
    monkeypatch.setattr("seq2seq.training.trainer.Trainer.validate",
                        lambda self: {"loss": 1.0, "ppl": 2.7, "bleu": 0.0})
    result = train_run(cfg, quiet=True)
    assert result.progress.step == 6
    assert len(reads) == 2  # steps 3 and 6


@pytest.mark.parametrize("native, expected", [(True, "bf16"), (False, "fp32")])
def test_precision_auto_picks_bf16_only_where_the_hardware_runs_it_natively(monkeypatch, native, expected):
    from seq2seq.runtime import resolve_precision

    monkeypatch.setattr("seq2seq.runtime.cpu_has_native_bf16", lambda: native)
    assert resolve_precision(torch.device("cpu"), "auto") == expected
    assert resolve_precision(torch.device("cpu"), "fp32") == "fp32"  # explicit choices stay
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0) if native else (7, 5))
    assert resolve_precision(torch.device("cuda"), "auto") == expected


def test_training_with_precision_auto_logs_its_choice(tmp_path, monkeypatch, capsys):
    from test_training import tiny_config
    from seq2seq.training.run import train as train_run

    monkeypatch.setattr("seq2seq.runtime.cpu_has_native_bf16", lambda: False)
    train_run(tiny_config(tmp_path / "run", max_steps=2, eval_every=0, precision="auto", device="cpu"))
    assert "precision=fp32" in capsys.readouterr().err
