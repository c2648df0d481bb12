"""int8 decoding (seq2seq.nn.quantize): split RNN cells are the fused cells, quantized models stay close
to fp32 and decode end to end (search, shortlists, attention export)."""
import pytest
import torch

from seq2seq.models.rnn import StackedRNN
from seq2seq.nn.quantize import quantize_for_decoding
from seq2seq.decoding.search import beam_search, greedy_search
from test_models import make_model, reverse_batch, train

ARCHS = ["bahdanau", "luong-general", "transformer-pre"]


@pytest.mark.parametrize("cell", ["gru", "lstm"])
def test_split_cells_compute_the_fused_cells(cell):
    torch.manual_seed(0)
    rnn = StackedRNN(cell, 6, 5, layers=2, dropout=0.0).eval()
    x, seq = torch.randn(3, 6), torch.randn(3, 4, 6)
    hidden = [(torch.randn(3, 5), torch.randn(3, 5)) if cell == "lstm" else torch.randn(3, 5) for _ in range(2)]
    with torch.no_grad():
        fused_step, fused_hidden = rnn.step(x, hidden)
        fused_seq = rnn(seq, hidden)
        rnn.split_cells()
        split_step, split_hidden = rnn.step(x, hidden)
        split_seq = rnn(seq, hidden)  # step by step now
    torch.testing.assert_close(split_step, fused_step)
    torch.testing.assert_close(split_hidden, fused_hidden)
    torch.testing.assert_close(split_seq, fused_seq)


@pytest.fixture(scope="module", params=ARCHS)
def trained(request):
    steps = {"bahdanau": 25, "luong-general": 25, "transformer-pre": 40}[request.param]
    return train(make_model(request.param), steps, 1e-2)


def test_int8_logits_close_to_fp32_and_original_untouched(trained):
    src, mask, tgt_in, _ = reverse_batch(16, torch.Generator().manual_seed(3))
    before = {name: p.clone() for name, p in trained.state_dict().items()}
    int8 = quantize_for_decoding(trained)
    assert any(type(m).__module__.startswith("torch.ao.nn.quantized") for m in int8.modules())
    with torch.no_grad():
        reference, _ = trained.eval()(src, mask, tgt_in)
        quantized, _ = int8(src, mask, tgt_in)
    error = (quantized - reference).abs().max() / reference.abs().max()
    assert 0 < error < 0.05  # int8 rounding: different, but by a few percent of the logit range at most
    assert all(torch.equal(before[name], p) for name, p in trained.state_dict().items())


def test_int8_searches_agree_with_fp32(trained):
    src, mask, _, _ = reverse_batch(24, torch.Generator().manual_seed(5))
    int8 = quantize_for_decoding(trained)
    for search in (greedy_search, lambda *a, **k: beam_search(*a, beam_size=3, **k)):
        fp32 = [h.tokens for h, *_ in search(trained, src, mask, need_attention=False)]
        hyps = search(int8, src, mask)  # attention attached by a teacher-forced int8 pass
        same = sum(h.tokens == ref for (h, *_), ref in zip(hyps, fp32))
        # int8 and fp32 are different kernels, and these briefly trained models have near-ties: a
        # share of equal outputs, not equality (20-24 of 24 where measured; a broken path gives ~0)
        assert same >= 2 / 3 * len(fp32)
        for i, (h, *_) in enumerate(hyps):
            assert h.attention.shape[-2:] == (len(h.tokens) + 1, int(mask[i].sum()))
            torch.testing.assert_close(h.attention.sum(-1), torch.ones(h.attention.shape[:-1]))


def _output_layer_inputs(model, src, mask, tgt_in):
    """The decoder features that reach ``model.generator`` in a teacher-forced pass, (rows, D)."""
    captured = []
    hook = model.generator.register_forward_hook(lambda module, inputs, output: captured.append(inputs[0]))
    with torch.no_grad():
        model(src, mask, tgt_in)
    hook.remove()
    return captured[0].reshape(-1, captured[0].size(-1))


def test_int8_restricted_vocabulary_within_the_activation_rounding_bound(trained):
    """A shortlist over an int8 output layer multiplies fp32 features by the layer's dequantized rows;
    the full int8 layer also rounds the features to 8 bits. The guarantee (quantize.py) is agreement
    within that rounding, |z_full - z_list| <= s_x * ||w_v||_1 with s_x = range(x) / 127, not equal
    tokens: the two are different kernels (FBGEMM or oneDNN, picked by the library for the CPU), and
    a near-tie may go either way on another CPU."""
    src, mask, tgt_in, _ = reverse_batch(16, torch.Generator().manual_seed(9))
    int8 = quantize_for_decoding(trained)
    everything = torch.arange(trained.generator.out_features)
    rows = int8.output_rows(everything)
    torch.testing.assert_close(rows, int8.generator.weight().dequantize(), rtol=0, atol=0)
    features = _output_layer_inputs(int8, src, mask, tgt_in)
    with torch.no_grad():
        full, listed = int8.generator(features), int8.logits(features, rows)
    scale = (features.max().clamp(min=0) - features.min().clamp(max=0)) / 127
    bound = scale * rows.abs().sum(1) + 1e-5  # (V,): one bound per output token
    assert ((full - listed).abs() <= bound).all()
    assert (full - listed).abs().max() > 0  # two computations: the test would see a kernel mix-up
    # the same kernel on the same rows is exact: listing every token changes nothing
    with torch.no_grad():
        torch.testing.assert_close(int8.logits(features, int8.output_rows(everything)), listed, rtol=0, atol=0)
