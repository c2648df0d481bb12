"""The CPU dropout: identity in eval, drops the quantized fraction, keeps the expectation, reproducible."""
import pytest
import torch

from seq2seq.nn.dropout import Dropout, dropout, quantized_probability


def test_eval_mode_and_zero_probability_are_identity():
    x = torch.randn(4, 5)
    assert dropout(x, 0.3, training=False) is x
    assert dropout(x, 0.0, training=True) is x
    module = Dropout(0.3).eval()
    assert torch.equal(module(x), x)


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5])
def test_drops_the_quantized_fraction_and_keeps_the_mean(p):
    torch.manual_seed(0)
    x = torch.ones(200_000)
    y = dropout(x, p, training=True)
    p_q = quantized_probability(p) / 256
    assert abs(p_q - p) <= 1 / 512
    assert abs((y == 0).float().mean().item() - p_q) < 0.005
    kept = y[y != 0]
    assert torch.allclose(kept, torch.full_like(kept, 1 / (1 - p_q)))
    assert abs(y.mean().item() - 1.0) < 0.01


def test_gradient_flows_through_kept_elements_only_and_seed_reproduces():
    torch.manual_seed(1)
    x = torch.randn(3, 7, 9, requires_grad=True)
    y = dropout(x, 0.3, training=True)
    y.sum().backward()
    assert torch.equal(x.grad != 0, y != 0)
    torch.manual_seed(1)
    torch.randn(3, 7, 9)
    assert torch.equal(dropout(x.detach(), 0.3, training=True), y.detach())
