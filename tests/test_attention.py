"""Numerical identities of the attention building blocks."""
import pytest
import torch

from seq2seq.nn.attention import (
    SCORES, MultiHeadAttention, RecurrentAttention, build_score, causal_mask, masked_softmax, padding_mask,
    scaled_dot_product,
)
from seq2seq.errors import UserError




def _mask(lengths, width):
    return torch.arange(width)[None] < torch.tensor(lengths)[:, None]  # (B, width)


def test_padding_and_causal_masks():
    assert padding_mask(torch.tensor([2, 0, 3])).tolist() == [[True, True, False], [False] * 3, [True] * 3]
    ids = torch.tensor([[5, 3, 0], [4, 6, 3]])
    assert padding_mask(ids).tolist() == [[True, True, False], [True, True, True]]
    assert padding_mask(torch.tensor([1]), max_len=3).tolist() == [[True, False, False]]
    causal = causal_mask(3)
    assert causal.tolist() == [[True, False, False], [True, True, False], [True, True, True]]


def test_scaled_dot_product_identities():
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 3, 4, 8), torch.randn(2, 3, 5, 8), torch.randn(2, 3, 5, 6)
    mask = _mask([5, 2], 5)[:, None, None, :]  # (B, 1, 1, S) broadcast over heads and queries
    context, weights = scaled_dot_product(q, k, v, mask)
    assert weights.shape == (2, 3, 4, 5) and context.shape == (2, 3, 4, 6)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 3, 4))
    assert (weights[1, ..., 2:] == 0).all()
    torch.testing.assert_close(context, weights @ v)
    expected = torch.softmax(q[0] @ k[0].transpose(-1, -2) / 8 ** 0.5, -1)
    torch.testing.assert_close(weights[0], expected)


def test_fully_masked_row_gives_zeros_not_nan():
    scores = torch.randn(2, 4, requires_grad=True)
    mask = torch.tensor([[True, False, True, False], [False] * 4])
    weights = masked_softmax(scores, mask)
    assert torch.isfinite(weights).all() and (weights[1] == 0).all()
    weights.sum().backward()
    assert torch.isfinite(scores.grad).all()
    context, w = scaled_dot_product(torch.randn(1, 2, 4), torch.randn(1, 3, 4), torch.randn(1, 3, 5),
                                    torch.zeros(1, 2, 3, dtype=torch.bool))
    assert (context == 0).all() and (w == 0).all()


@pytest.mark.parametrize("name", SCORES)
def test_recurrent_scores_shape_mask_and_precomputed_keys(name):
    torch.manual_seed(0)
    attention = RecurrentAttention(build_score(name, query_dim=6, key_dim=10, hidden=7))
    query, keys, mask = torch.randn(3, 6), torch.randn(3, 5, 10), _mask([5, 3, 1], 5)
    scores = attention.scorer.score(query, keys)
    assert scores.shape == (3, 5)
    context, weights = attention(query, keys, mask)
    assert context.shape == (3, 10) and weights.shape == (3, 5)
    torch.testing.assert_close(weights.sum(-1), torch.ones(3))
    assert (weights[~mask] == 0).all() and (weights[2, 0] == 1).all()
    torch.testing.assert_close(context, torch.einsum("bs,bsd->bd", weights, keys))
    projected = attention.project_keys(keys)  # computed once per sentence
    context2, weights2 = attention(query, keys, mask, projected_keys=projected)
    torch.testing.assert_close(weights2, weights)
    torch.testing.assert_close(context2, context)
    # all target steps at once equals step by step
    queries = torch.randn(3, 4, 6)
    ctx_all, w_all = attention(queries, keys, mask, projected)
    for t in range(4):
        ctx_t, w_t = attention(queries[:, t], keys, mask, projected)
        torch.testing.assert_close(w_all[:, t], w_t)
        torch.testing.assert_close(ctx_all[:, t], ctx_t)


def test_score_formulas():
    torch.manual_seed(0)
    s, h = torch.randn(2, 4), torch.randn(2, 3, 4)
    torch.testing.assert_close(build_score("luong-dot", 4, 4).score(s, h), torch.einsum("bd,bsd->bs", s, h))
    torch.testing.assert_close(build_score("scaled-dot", 4, 4).score(s, h), torch.einsum("bd,bsd->bs", s, h) / 2)
    general = build_score("luong-general", 4, 4)
    torch.testing.assert_close(general.score(s, h), torch.einsum("bd,bsd->bs", s, general.key_proj(h)))
    cosine = build_score("cosine", 4, 4)
    expected = cosine.gain * torch.cosine_similarity(s[:, None], h, dim=-1)
    torch.testing.assert_close(cosine.score(s, h), expected)
    additive = build_score("bahdanau", 4, 4, hidden=5)
    energy = torch.tanh(additive.query_proj(s)[:, None] + additive.key_proj(h))
    torch.testing.assert_close(additive.score(s, h), additive.v(energy).squeeze(-1))
    with pytest.raises(UserError):
        build_score("nope", 4, 4)


def test_additive_score_gradients_equal_the_tanh_formula():
    """The score is evaluated through sigmoid (tanh x = 2 sigmoid(2x) - 1, in place): its gradients
    with respect to the query, the keys and every weight must be those of v^T tanh(W s + U h)."""
    torch.manual_seed(0)
    additive = build_score("bahdanau", 6, 8, hidden=7)
    s, h = torch.randn(3, 2, 6, requires_grad=True), torch.randn(3, 5, 8, requires_grad=True)
    weight = torch.randn(3, 2, 5)
    fast = torch.autograd.grad((additive.score(s, h) * weight).sum(), [s, h, *additive.parameters()])
    energy = torch.tanh(additive.query_proj(s).unsqueeze(2) + additive.key_proj(h).unsqueeze(1))
    slow = torch.autograd.grad((additive.v(energy).squeeze(-1) * weight).sum(), [s, h, *additive.parameters()])
    for a, b in zip(fast, slow):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_multi_head_weights_path_equals_fused_path(monkeypatch):
    from seq2seq.nn import attention

    monkeypatch.setattr(attention, "fused_kernel_pays", lambda device: True)  # the fused kernel on CPU too
    torch.manual_seed(0)
    mha = MultiHeadAttention(d_model=16, heads=4, dropout=0.3).eval()
    x, memory = torch.randn(2, 5, 16), torch.randn(2, 7, 16)
    mask = _mask([7, 3], 7)[:, None, None, :]
    fused, none = mha(x, memory, memory, mask)
    explicit, weights = mha(x, memory, memory, mask, need_weights=True)
    assert none is None and weights.shape == (2, 4, 5, 7)
    # two kernels (PyTorch's fused attention vs softmax(QK^T)V): equal within fp32 rounding, with a
    # margin (1e-5 on values of order 1) far above the differences any kernel set gives
    torch.testing.assert_close(fused, explicit, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 4, 5))
    assert (weights[1, ..., 3:] == 0).all()
    # causal self-attention: fused kernel's causal flag == explicit causal mask
    fused, _ = mha(x, x, x, is_causal=True)
    explicit, weights = mha(x, x, x, need_weights=True, is_causal=True)
    torch.testing.assert_close(fused, explicit, rtol=1e-5, atol=1e-5)
    assert (weights.triu(1) == 0).all()
    # precomputed keys/values give the same result as projecting them in the call
    cached, _ = mha(x, mask=mask, kv_cache=mha.project_kv(memory))
    torch.testing.assert_close(cached, mha(x, memory, memory, mask)[0])


def test_multi_head_keeps_no_state():
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 4).eval()
    a, b = torch.randn(1, 3, 16), torch.randn(2, 4, 16)
    first = mha(a, a, a, need_weights=True)
    mha(b, b, b, need_weights=True)
    again = mha(a, a, a, need_weights=True)
    torch.testing.assert_close(first[0], again[0])
    torch.testing.assert_close(first[1], again[1])
