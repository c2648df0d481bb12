"""Position encodings of the Transformer: the identities of relative (Shaw et al. 2018) and rotary
(Su et al. 2021) positions, fused == explicit attention with them, absolute-position checkpoints
unchanged, the config options. Incremental == teacher-forced decoding for every position encoding
is in test_models.py (its EXTRA variants)."""
import math
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from seq2seq.config import ModelConfig, RunConfig
from seq2seq.errors import UserError
from seq2seq.models import build_model
from seq2seq.nn import attention
from seq2seq.nn.attention import MultiHeadAttention, RelativePositions, rotate
from test_models import PAD, TRANSFORMER, VOCAB, reverse_batch


def _mask(lengths, width):
    return torch.arange(width)[None] < torch.tensor(lengths)[:, None]  # (B, width)


def _relative_mha(values: bool, clip: int = 2, seed: int = 0) -> MultiHeadAttention:
    torch.manual_seed(seed)
    mha = MultiHeadAttention(16, 4, dropout=0.3, relative=RelativePositions(4, clip, values)).eval()
    for table in (mha.relative.keys, mha.relative.values):
        if table is not None:
            torch.nn.init.normal_(table.weight)  # large enough to matter
    return mha


# ------------------------------------------------------------------------------------- relative


def test_relative_distances_are_clipped_and_offset_by_the_cache_length():
    relative = RelativePositions(d_k=4, clip=2)
    rows = relative.distances(5, 5, "cpu")  # row r + k of distance r = clip(j - i, -2, 2)
    assert rows.tolist() == [[2, 3, 4, 4, 4], [1, 2, 3, 4, 4], [0, 1, 2, 3, 4], [0, 0, 1, 2, 3], [0, 0, 0, 1, 2]]
    for t in range(5):  # decoding step t: one query at position t, keys 0 .. t
        assert relative.distances(1, t + 1, "cpu").tolist() == [rows[t, : t + 1].tolist()]


def test_relative_terms_equal_their_definition_with_materialised_embeddings():
    """q_i . a^K_ij and sum_j w_ij a^V_ij computed per distance equal the (Tq, Tk, d_k) formulas."""
    torch.manual_seed(0)
    relative = RelativePositions(d_k=4, clip=3, values=True)
    q, weights = torch.randn(2, 3, 6, 4), torch.randn(2, 3, 6, 9).softmax(-1)
    rows = relative.distances(6, 9, "cpu")  # queries at positions 3 .. 8
    a_k, a_v = relative.keys.weight[rows], relative.values.weight[rows]  # (Tq, Tk, d_k)
    torch.testing.assert_close(relative.key_logits(q, rows), torch.einsum("bhtd,tsd->bhts", q, a_k))
    torch.testing.assert_close(relative.value_context(weights, rows), torch.einsum("bhts,tsd->bhtd", weights, a_v))


def test_relative_distances_beyond_the_clip_share_the_embedding_of_the_clip():
    k = 3
    relative = RelativePositions(d_k=4, clip=k)
    torch.nn.init.normal_(relative.keys.weight)
    length = k + 4
    logits = relative.key_logits(torch.randn(1, 2, length, 4), relative.distances(length, length, "cpu"))
    first, last = logits[..., 0, :], logits[..., -1, :]  # query at 0 (j - i >= 0), at length - 1 (<= 0)
    torch.testing.assert_close(first[..., k + 3], first[..., k])  # distance k + 3 == k
    torch.testing.assert_close(last[..., length - 1 - k - 3], last[..., length - 1 - k])  # -(k + 3) == -k
    assert not torch.allclose(first[..., k - 1], first[..., k])  # within the clip distances differ


@pytest.mark.parametrize("values", [False, True], ids=["keys", "keys-values"])
def test_relative_self_attention_is_shaws_formula(values):
    """logit_ij = q_i . (k_j + a^K_ij) / sqrt(d_k), z_i = sum_j w_ij (v_j + a^V_ij), heads sharing a."""
    mha = _relative_mha(values)
    x, mask = torch.randn(2, 5, 16), _mask([5, 3], 5)[:, None, None, :]
    out, weights = mha(x, x, x, mask, need_weights=True)
    q = mha._split(mha.q_proj(x))
    k, v = mha.project_kv(x)
    rows = mha.relative.distances(5, 5, "cpu")
    a_k = mha.relative.keys.weight[rows]  # (Tq, Tk, d_k)
    a_v = mha.relative.values.weight[rows] if values else torch.zeros_like(a_k)
    logits = torch.einsum("bhid,bhijd->bhij", q, k[:, :, None] + a_k) / math.sqrt(4)
    expected_weights = logits.masked_fill(~mask, float("-inf")).softmax(-1)
    context = torch.einsum("bhij,bhijd->bhid", expected_weights, v[:, :, None] + a_v)
    expected = mha.out_proj(context.transpose(1, 2).reshape(2, 5, 16))
    torch.testing.assert_close(weights, expected_weights)
    torch.testing.assert_close(out, expected)


@pytest.fixture
def fused_on_cpu(monkeypatch):
    """Make MultiHeadAttention take its F.scaled_dot_product_attention path on CPU; counts the calls."""
    calls = []
    kernel = F.scaled_dot_product_attention

    def counted(*args, **kwargs):
        calls.append(kwargs.get("attn_mask"))
        return kernel(*args, **kwargs)

    monkeypatch.setattr(attention, "fused_kernel_pays", lambda device: True)
    monkeypatch.setattr(attention.F, "scaled_dot_product_attention", counted)
    return calls


def test_relative_keys_in_the_fused_kernel_equal_the_explicit_path(fused_on_cpu):
    """The relative logits go to the fused kernel as its additive float mask (with the padding or
    causal mask folded in): the same output as the explicit weights, padding and causal."""
    mha = _relative_mha(values=False)
    x = torch.randn(2, 6, 16)
    mask = _mask([6, 4], 6)[:, None, None, :]
    for kwargs in (dict(mask=mask), dict(is_causal=True), dict()):
        fused, none = mha(x, x, x, **kwargs)
        explicit, weights = mha(x, x, x, need_weights=True, **kwargs)
        assert none is None and weights.shape == (2, 4, 6, 6)
        torch.testing.assert_close(fused, explicit, rtol=1e-5, atol=1e-5)
    assert len(fused_on_cpu) == 3 and all(m.dtype == torch.float32 for m in fused_on_cpu)
    # incremental decoding: the last query against cached keys
    fused, _ = mha(x[:, -1:], kv_cache=mha.project_kv(x))
    torch.testing.assert_close(fused, mha(x, x, x, is_causal=True)[0][:, -1:], rtol=1e-5, atol=1e-5)


def test_relative_values_take_the_explicit_path(fused_on_cpu):
    mha = _relative_mha(values=True)
    x = torch.randn(2, 6, 16)
    out, _ = mha(x, x, x, is_causal=True)
    assert fused_on_cpu == []  # the value term needs the weights
    torch.testing.assert_close(out, mha(x, x, x, need_weights=True, is_causal=True)[0])


# ------------------------------------------------------------------------------------------ rope


def test_rotary_logits_depend_only_on_the_distance():
    """(R_i q) . (R_j k) = q . R_{j - i} k: shifting both positions by the same amount leaves every
    logit unchanged; rotation keeps norms; different distances give different logits."""
    torch.manual_seed(0)
    q, k = torch.randn(2, 3, 5, 8, dtype=torch.float64), torch.randn(2, 3, 5, 8, dtype=torch.float64)
    logits = rotate(q) @ rotate(k).transpose(-1, -2)  # positions 0 .. 4
    for shift in (1, 7, 1000):
        shifted = rotate(q, shift) @ rotate(k, shift).transpose(-1, -2)  # positions shift .. shift + 4
        torch.testing.assert_close(shifted, logits)
    one_q, one_k = q[0, 0, 0], k[0, 0, 0]

    def logit(i, j):
        return rotate(one_q[None], i)[0] @ rotate(one_k[None], j)[0]

    torch.testing.assert_close(logit(3, 5), logit(10, 12))
    torch.testing.assert_close(logit(5, 3), logit(42, 40))
    assert not torch.isclose(logit(3, 5), logit(3, 6))
    torch.testing.assert_close(rotate(q, 3).norm(dim=-1), q.norm(dim=-1))
    torch.testing.assert_close(rotate(q, 0)[..., 0, :], q[..., 0, :])  # position 0: no rotation


def test_rotary_self_attention_rotates_queries_at_the_cache_length(fused_on_cpu):
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 4, rotary=True).eval()
    x = torch.randn(2, 6, 16)
    full, _ = mha(x, x, x, is_causal=True)  # fused kernel (patched in)
    explicit, _ = mha(x, x, x, is_causal=True, need_weights=True)
    torch.testing.assert_close(full, explicit, rtol=1e-5, atol=1e-5)
    cache = mha.project_kv(x[:, :4])
    for t in (4, 5):  # the key of position t rotated at t, the query at the cache length t
        k, v = mha.project_kv(x[:, t : t + 1], start=t)
        cache = (torch.cat([cache[0], k], 2), torch.cat([cache[1], v], 2))
        step, _ = mha(x[:, t : t + 1], kv_cache=cache)
        torch.testing.assert_close(step, full[:, t : t + 1], rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------------------- models


def _model(seed: int = 0, **options):
    torch.manual_seed(seed)
    return build_model(ModelConfig(vocab_size=VOCAB, **{**TRANSFORMER, "dropout": 0.0, **options}))


@pytest.mark.parametrize("positional", ["sinusoidal", "learned"])
def test_absolute_position_models_keep_their_state_dict_keys(positional):
    """Checkpoints of sinusoidal / learned models load unchanged: no new parameter or buffer."""
    model = _model(positional=positional, layers=1)
    per_attention = {f"{name}.{kind}" for name in ("q_proj", "kv_proj", "out_proj") for kind in ("weight", "bias")}
    per_norm = {"norm.weight", "norm.bias"}
    ff = {f"ff.{i}.{kind}" for i in (0, 3) for kind in ("weight", "bias")}
    expected = (
        {f"encoder.0.self_attn.{key}" for key in per_attention}
        | {f"encoder.0.{res}.{key}" for res in ("res_attn", "res_ff") for key in per_norm}
        | {f"encoder.0.{key}" for key in ff}
        | {f"decoder.0.{attn}.{key}" for attn in ("self_attn", "cross_attn") for key in per_attention}
        | {f"decoder.0.{res}.{key}" for res in ("res_self", "res_cross", "res_ff") for key in per_norm}
        | {f"decoder.0.{key}" for key in ff}
        | {"enc_norm.weight", "enc_norm.bias", "dec_norm.weight", "dec_norm.bias", "generator.weight",
           "src_embed.tokens.weight", "tgt_embed.tokens.weight"}
        | ({"src_embed.positions.weight", "tgt_embed.positions.weight"} if positional == "learned" else set())
    )
    assert set(model.state_dict()) == expected


@pytest.mark.parametrize("values", [False, True])
def test_relative_tables_one_per_self_attention_layer(values):
    model = _model(positional="relative", relative_clip=5, relative_values=values)
    tables = {name: p.shape for name, p in model.named_parameters() if ".relative." in name}
    layers, d_k = TRANSFORMER["layers"], TRANSFORMER["d_model"] // TRANSFORMER["heads"]
    assert len(tables) == 2 * layers * (2 if values else 1)
    assert all("self_attn" in name for name in tables) and set(tables.values()) == {(11, d_k)}
    absolute = _model()
    assert model.num_parameters() == absolute.num_parameters() + sum(shape.numel() for shape in tables.values())


@pytest.mark.parametrize("positional", ["relative", "rope"])
def test_no_absolute_positions_in_the_embeddings(positional):
    model = _model(positional=positional).eval()
    ids = torch.tensor([[5, 6, 7, 8]])
    embedded = model.src_embed.tokens(ids) * math.sqrt(TRANSFORMER["d_model"])
    torch.testing.assert_close(model.src_embed(ids), embedded)
    torch.testing.assert_close(model.tgt_embed(ids[:, :1], start=3), embedded[:, :1])
    assert model.max_positions is None  # no length limit in search


@pytest.mark.parametrize("options", [dict(positional="relative", relative_clip=2),
                                     dict(positional="relative", relative_clip=2, relative_values=True),
                                     dict(positional="rope")], ids=["relative", "relative-values", "rope"])
def test_a_tiny_model_learns(options):
    """What this guards, and what it does not.

    Catches: a relative table cut off from the gradient (``self.keys.weight.detach()`` in
    ``key_logits``, ``self.values.weight.detach()`` in ``value_context``, the key term multiplied by
    0): the tables must get a non-zero gradient, every one of them (2 self-attentions per layer, x2
    with values). This is the only test of the gradient of the tables; the other tests here check
    forward values only. The loss check is a smoke test: training in train mode (dropout on the
    explicit path, relative values through the dropped weights) stays finite and the loss falls.

    The loss check does NOT catch wrong positions: with ``rotate`` replaced by the identity, or the
    relative key logits multiplied by 0, the loss after 30 steps is the same within noise (measured:
    the reversal task is not learned this early). The identity rotation is caught by
    test_rotary_logits_depend_only_on_the_distance; the zeroed key term by the gradient check here
    and by test_relative_self_attention_is_shaws_formula."""
    model = _model(dropout=0.1, **options).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    generator = torch.Generator().manual_seed(0)
    per_layer = 0 if options["positional"] == "rope" else 2 if options.get("relative_values") else 1
    tables = 2 * TRANSFORMER["layers"] * per_layer  # encoder and decoder self-attention, A^K (and A^V)
    losses = []
    for step in range(30):
        src, mask, tgt_in, tgt_out = reverse_batch(32, generator)
        logits, _ = model(src, mask, tgt_in)
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), tgt_out.reshape(-1), ignore_index=PAD)
        optimizer.zero_grad()
        loss.backward()
        if step == 0:
            relative = {name: p for name, p in model.named_parameters() if ".relative." in name}
            assert len(relative) == tables  # not vacuous: every table is looked at
            # catches a .detach() (grad None or 0) or a zeroed term (grad 0) on A^K or A^V
            assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in relative.values()), \
                [name for name, p in relative.items() if p.grad is None or not p.grad.abs().sum() > 0]
        optimizer.step()
        losses.append(loss.item())
    assert all(math.isfinite(loss) for loss in losses)
    assert sum(losses[-5:]) / 5 < 0.8 * sum(losses[:5]) / 5  # smoke: about 2.65 -> 1.8 here


# ----------------------------------------------------------------------------------------- config


def test_bad_position_options_are_named_errors_before_any_work():
    with pytest.raises(UserError, match=r"--relative-clip must be a positive integer, got 0"):
        build_model(ModelConfig(vocab_size=VOCAB, positional="relative", relative_clip=0))
    with pytest.raises(UserError, match=r"--relative-clip must be a positive integer, got -1"):
        RunConfig(model=ModelConfig(positional="relative", relative_clip=-1)).resolved()
    with pytest.raises(UserError, match=r"--positional rope .* head size .* must be even"):
        build_model(ModelConfig(vocab_size=VOCAB, positional="rope", d_model=12, heads=4))
    with pytest.raises(UserError, match=r"model\.positional"):
        RunConfig.from_dict({"model": {"positional": "alibi"}})


def test_position_flags_and_print_config():
    from seq2seq.cli import config_from_flags

    cfg = config_from_flags(["--positional", "relative", "--relative-clip", "8", "--relative-values"])
    assert (cfg.model.positional, cfg.model.relative_clip, cfg.model.relative_values) == ("relative", 8, True)
    with pytest.raises(UserError, match="--relative-clip"):
        config_from_flags(["--positional", "relative", "--relative-clip", "0"])
    proc = subprocess.run([sys.executable, "-m", "seq2seq", "train", "--preset", "toy", "--positional", "relative",
                           "--print-config"], capture_output=True, text=True, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    assert "  positional: relative\n" in proc.stdout and "  relative_clip: 16\n" in proc.stdout
    assert "  relative_values: false\n" in proc.stdout
