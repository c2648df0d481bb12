"""The fused label-smoothed cross-entropy equals F.cross_entropy, value and gradient."""
import pytest
import torch
import torch.nn.functional as F

from seq2seq.nn import loss as loss_module
from seq2seq.nn.loss import label_smoothed_cross_entropy


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_torch_cross_entropy(eps, dtype, monkeypatch):
    monkeypatch.setattr(loss_module, "CHUNK_ROWS", 7)  # several chunks, the last one partial
    torch.manual_seed(0)
    logits = (3 * torch.randn(2, 25, 50)).to(dtype).requires_grad_()
    target = torch.randint(1, 50, (2, 25))
    target[0, 20:] = 0  # padding
    expected = F.cross_entropy(logits.float().reshape(-1, 50), target.reshape(-1), ignore_index=0,
                               label_smoothing=eps, reduction="sum")
    (expected_grad,) = torch.autograd.grad(2.5 * expected, logits)
    got = label_smoothed_cross_entropy(logits, target, eps, ignore_index=0)
    (grad,) = torch.autograd.grad(2.5 * got, logits)
    assert grad.dtype == dtype and grad[0, 20:].abs().max() == 0  # pad rows get no gradient
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(got, expected, rtol=tol, atol=tol)
    torch.testing.assert_close(grad.float(), expected_grad.float(), rtol=tol, atol=tol)


def test_without_ignore_index_counts_every_row():
    logits, target = torch.randn(6, 9), torch.tensor([0, 1, 2, 3, 4, 5])
    torch.testing.assert_close(label_smoothed_cross_entropy(logits, target, 0.1),
                               F.cross_entropy(logits, target, label_smoothing=0.1, reduction="sum"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_reuse_logits_gives_the_same_gradient_in_their_memory(dtype, monkeypatch):
    """Training's mode writes the gradient over the logits; the default leaves them untouched."""
    monkeypatch.setattr(loss_module, "CHUNK_ROWS", 7)
    torch.manual_seed(1)
    features, proj = torch.randn(30, 16, requires_grad=True), torch.randn(16, 40)
    target = torch.randint(0, 40, (30,))
    grads = {}
    for reuse in (False, True):
        logits = (features @ proj).to(dtype)  # an intermediate, as in training
        before = logits.detach().clone()
        captured = []
        logits.register_hook(captured.append)
        loss = label_smoothed_cross_entropy(logits, target, 0.1, ignore_index=0, reuse_logits=reuse)
        (grads[reuse],) = torch.autograd.grad(loss, features)
        if reuse:
            assert captured[0].data_ptr() == logits.data_ptr()  # no second (N, V) tensor
        else:
            assert torch.equal(logits.detach(), before)
    torch.testing.assert_close(grads[True], grads[False], rtol=0, atol=0)
