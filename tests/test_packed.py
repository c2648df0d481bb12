"""Linear layers on oneDNN-packed weights (``seq2seq.nn.packed``): the same products to rounding, autograd
and compilation fall back to ``F.linear``, and a packed model decodes like the unpacked one."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from seq2seq.config import DecodeConfig
from seq2seq.decoding.generator import SearchBatch
from seq2seq.decoding.search import translate_batch
from seq2seq.nn.packed import PackedLinear, pack_for_decoding, packing_available, unpacked_copy
from test_models import reverse_batch, trained_once

pytestmark = pytest.mark.skipif(not packing_available(), reason="this PyTorch has no oneDNN packed linear")


@pytest.mark.parametrize("shape", [(7, 24), (3, 5, 24), (2, 3, 4, 24), (1, 24)])
def test_a_packed_layer_computes_the_same_product(shape):
    torch.manual_seed(0)
    layer, plain = nn.Linear(24, 40), nn.Linear(24, 40, bias=False)
    reference = [layer(torch.ones(1, 24)), plain(torch.ones(1, 24))]
    assert pack_for_decoding(nn.Sequential(layer, plain)) == 2 and isinstance(layer, PackedLinear)
    x = torch.randn(*shape)
    with torch.inference_mode():
        torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(plain(x), F.linear(x, plain.weight), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(layer(torch.ones(1, 24)), reference[0].detach(), atol=1e-5, rtol=1e-5)
    assert layer.state_dict().keys() == {"weight", "bias"}  # the packed copy is not part of the model


def test_autograd_goes_through_the_plain_product():
    torch.manual_seed(0)
    layer = nn.Linear(6, 3)
    pack_for_decoding(layer)
    x = torch.randn(4, 6, requires_grad=True)
    layer(x).sum().backward()
    torch.testing.assert_close(x.grad, layer.weight.sum(0).expand(4, 6))
    assert layer.weight.grad is not None


def test_a_packed_model_decodes_like_the_plain_one():
    model = trained_once("transformer-pre", 150, 1e-2)
    src, mask, _, _ = reverse_batch(8, torch.Generator().manual_seed(3))
    searches = [DecodeConfig(beam_size=1), DecodeConfig(beam_size=3, n_best=3)]
    want = [translate_batch(model, SearchBatch(src, mask), decode) for decode in searches]
    assert pack_for_decoding(model) > 0
    got = [translate_batch(model, SearchBatch(src, mask), decode) for decode in searches]
    for search, reference in zip(got, want):
        for hyps, expected in zip(search, reference):
            assert [h.tokens for h in hyps] == [h.tokens for h in expected]
            for h, e in zip(hyps, expected):
                assert abs(h.score - e.score) < 1e-4
                torch.testing.assert_close(h.attention, e.attention, atol=1e-5, rtol=1e-4)


def test_an_unpacked_copy_trains_and_leaves_the_packed_model_as_it_was():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 3))
    pack_for_decoding(model)
    x = torch.randn(4, 6)
    with torch.inference_mode():
        before = model(x)
    copied = unpacked_copy(model)
    assert all(type(m) is nn.Linear and not hasattr(m, "packed_weight") for m in (copied[0], copied[2]))
    assert isinstance(model[0], PackedLinear) and hasattr(model[0], "packed_weight")
    copied(x).sum().backward()
    with torch.no_grad():
        for p in copied.parameters():
            p.sub_(p.grad)  # a training step of the copy
    with torch.inference_mode():
        torch.testing.assert_close(model(x), before, atol=0, rtol=0)  # the original: not a weight moved
        assert not torch.allclose(copied(x), before)
    assert pack_for_decoding(copied) == 2  # and it packs again for decoding
    with torch.inference_mode():
        torch.testing.assert_close(copied(x), F.linear(F.relu(F.linear(x, copied[0].weight, copied[0].bias)),
                                                       copied[2].weight, copied[2].bias), atol=1e-5, rtol=1e-5)
