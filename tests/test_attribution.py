"""Attribution: layout, gradient x input against finite differences, integrated-gradients
completeness, an ignored token gets exactly zero, eval mode / autograd from inference code,
gradient-weighted attention against a step-by-step hand computation, the hand-written gradient
methods against Captum. LIME and KernelSHAP: tests/test_perturbation.py."""
from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch
from torch import nn

from seq2seq.alignment.matrices import merge_to_words
from seq2seq.attribution.base import METHODS, Attribution
from seq2seq.attribution.attribute import attribute
from seq2seq.attribution.gradients import grad_weighted_attention, gradient_x_input, integrated_gradients
from seq2seq.attribution.perturbation import occlusion
from seq2seq.decoding.scoring import eval_mode, teacher_force
from seq2seq.config import AlignConfig, AttributionConfig, ModelConfig
from seq2seq.errors import UserError
from seq2seq.models import build_model
from seq2seq.nn.attention import RecurrentAttention

PAD, BOS, EOS = 0, 2, 3
CAPTUM = importlib.util.find_spec("captum") is not None  # LIME and KernelSHAP need it (the explain extra)
SRC = [5, 6, 7, 8, 9, EOS]  # S = 5 tokens + EOS
TGT = [4, 10, 11, 6]  # T = 4 tokens (+ EOS row)
ARCHS = {
    "bahdanau": dict(arch="rnn", attention="bahdanau", embed_dim=16, hidden_size=16, decoder_hidden_size=24),
    "luong": dict(arch="rnn", attention="luong-general", embed_dim=16, hidden_size=16, decoder_hidden_size=24),
    "transformer": dict(arch="transformer", d_model=32, heads=2, ff_size=64, layers=2),
}




def make(arch: str, dropout: float = 0.0, **extra) -> nn.Module:
    torch.manual_seed(0)
    return build_model(ModelConfig(vocab_size=12, dropout=dropout, **ARCHS[arch], **extra)).eval()


def log_prob(model, src_ids, t: int, edit=None) -> float:
    """f_t = log p(y_t | y_<t, x) by a plain forward pass; ``edit`` changes the source embedding
    output (B, S, D) in place (found by the input tensor's identity, as the module under test does)."""
    src = torch.tensor([src_ids])
    hooks = []
    if edit is not None:
        def hook(module, args, output):
            if args[0] is src:
                output = output.clone()
                edit(output)
                return output
            return None
        hooks = [m.register_forward_hook(hook) for m in model.modules() if isinstance(m, nn.Embedding)]
    try:
        with torch.no_grad():
            logits, _ = model(src, src != PAD, torch.tensor([[BOS, *TGT]]))
    finally:
        for h in hooks:
            h.remove()
    return float(logits.double().log_softmax(-1)[0, t, (TGT + [EOS])[t]])


@pytest.mark.parametrize("arch", list(ARCHS))
def test_layout_matches_attention_and_rows_normalize(arch):
    model = make(arch)
    for method in METHODS if CAPTUM else [m for m in METHODS if m not in ("lime", "kernel-shap")]:
        a = attribute(model, SRC, TGT, method, AttributionConfig(ig_steps=4, samples=24))
        assert a.raw.shape == a.scores.shape == (len(TGT) + 1, len(SRC))  # (T+1, S+1) like attention
        assert (a.scores >= 0).all() and np.isfinite(a.raw).all()
        sums = a.matrix.sum(-1)  # 1, or 0 where no column has a positive score (LIME can say that)
        assert np.allclose(sums, 1.0, rtol=1e-6) if method in ("gradient", "integrated-gradients") else \
            np.all(np.isclose(sums, 1.0, rtol=1e-6) | (sums == 0)), (method, sums)
    occ = occlusion(model, SRC, TGT)
    assert (occ.raw[:, -1] == 0).all()  # EOS is never removed
    np.testing.assert_array_equal(occ.scores, np.maximum(occ.raw, 0))
    pieces = ["▁a", "b", "▁c", "▁d", "e"]  # 3 words: rows still sum to 1 after the word merge
    words = merge_to_words(occ.matrix, pieces + ["</s>"], ["▁x", "y", "▁z", "▁w", "</s>"])
    np.testing.assert_allclose(words.sum(-1), 1.0, rtol=1e-6)


@pytest.mark.parametrize("arch", list(ARCHS))
def test_gradient_x_input_is_the_derivative_along_the_embedding(arch):
    """raw[t, s] = sum_d g_{s,d} e_{s,d} = d/d eps f_t(e_s -> (1 + eps) e_s): central differences,
    in float64, for every entry of the matrix."""
    model = make(arch).double()
    raw = gradient_x_input(model, SRC, TGT).raw
    eps = 1e-5
    for t in range(len(TGT) + 1):
        for s in range(len(SRC)):
            def scale(factor):
                return lambda out: out[:, s].mul_(factor)
            fd = (log_prob(model, SRC, t, scale(1 + eps)) - log_prob(model, SRC, t, scale(1 - eps))) / (2 * eps)
            assert raw[t, s] == pytest.approx(fd, rel=1e-5, abs=1e-8), (t, s)
    assert np.abs(raw).max() > 1e-3  # the check is not vacuous


def test_integrated_gradients_completeness():
    """sum_s IG[t, s] = f_t(x) - f_t(zero source embeddings) up to the midpoint rule's error, which
    for a smooth model (GRU, tanh) shrinks as 1/steps^2: a quarter per doubling."""
    model = make("bahdanau").double()
    gaps = np.array([log_prob(model, SRC, t) - log_prob(model, SRC, t, lambda out: out.zero_())
                     for t in range(len(TGT) + 1)])
    errors = [np.abs(integrated_gradients(model, SRC, TGT, steps=m).raw.sum(-1) - gaps).max() for m in (8, 16)]
    assert np.abs(gaps).max() > 1e-3
    assert errors[1] < 1e-5 and errors[1] < errors[0] / 3


def test_a_token_the_model_provably_ignores_gets_exactly_zero():
    """Source positions carry no position information (learned positions set to 0) and the token
    at position 2 is masked out of every attention (PAD id, but with a non-zero embedding): it has
    no path to the output, so deleting it changes nothing (up to rounding) and its gradient is exactly 0. The same
    token unmasked does matter (so the assertions can fail)."""
    model = make("transformer", positional="learned", max_positions=16)
    with torch.no_grad():
        model.src_embed.positions.weight.zero_()
        model.src_embed.tokens.weight[PAD].normal_()
    ignored = [5, 6, PAD, 7, EOS]
    occ, grad = occlusion(model, ignored, TGT), gradient_x_input(model, ignored, TGT)
    # exact for the gradient; occlusion compares two forward passes over sources of different
    # lengths, whose float rounding differs by kernel (seen: 2e-6 with AVX2, 0 with AVX-512)
    assert (grad.raw[:, 2] == 0).all() and np.abs(occ.raw[:, 2]).max() < 1e-5
    assert np.abs(occ.raw[:, [0, 1, 3]]).min() > 1e-4 and np.abs(grad.raw[:, [0, 1, 3]]).min() > 0
    seen = [5, 6, 9, 7, EOS]
    assert np.abs(occlusion(model, seen, TGT).raw[:, 2]).max() > 1e-3
    assert np.abs(gradient_x_input(model, seen, TGT).raw[:, 2]).max() > 1e-3


@pytest.mark.parametrize("arch", ["bahdanau", "transformer"])
def test_occlusion_is_the_log_prob_drop_of_deleting_the_token(arch):
    model = make(arch)
    raw = occlusion(model, SRC, TGT).raw
    for s in (0, 3):
        deleted = SRC[:s] + SRC[s + 1:]
        for t in range(len(TGT) + 1):
            expected = log_prob(model, SRC, t) - log_prob(model, deleted, t)
            assert raw[t, s] == pytest.approx(expected, abs=1e-5)


def test_teacher_force_batches_like_single_sentences():
    model = make("transformer")
    sources, targets = [SRC, [7, 8, EOS], [5, EOS]], [TGT, [9], []]
    batched, attention = teacher_force(model, sources, targets, need_attention=True, batch_size=2)
    for src, tgt, lp, attn in zip(sources, targets, batched, attention):
        assert lp.shape == (len(tgt) + 1,) and attn.shape == (2, 2, len(tgt) + 1, len(src))
        np.testing.assert_allclose(attn.sum(-1), 1.0, rtol=1e-5)
        [single], _ = teacher_force(model, [src], [tgt])
        np.testing.assert_allclose(lp, single, atol=1e-5)


def test_runs_from_inference_code_in_eval_mode_and_restores_training():
    model = make("luong", dropout=0.5).train()
    with torch.inference_mode():
        first = gradient_x_input(model, SRC, TGT).raw
        second = gradient_x_input(model, SRC, TGT).raw
        occ = occlusion(model, SRC, TGT).raw
    np.testing.assert_array_equal(first, second)  # no dropout: eval mode inside
    np.testing.assert_array_equal(occ, occlusion(model, SRC, TGT).raw)
    assert model.training  # the caller's mode is restored
    assert all(p.grad is None for p in model.parameters())  # no gradients left on the weights


def test_record_and_json_entry():
    model = make("transformer")
    a = attribute(model, SRC, TGT, "occlusion")
    src_pieces, tgt_pieces = ["▁a", "b", "▁c", "▁d", "▁e"], ["▁x", "y", "▁z", "▁w"]
    record = a.record(0, "ab c d e", "xy z w", src_pieces, tgt_pieces)
    assert record.words.shape == (3, 4) and record.subword.shape == (4, 5)  # EOS dropped
    entry = a.to_json(record)
    assert entry["raw_shape"] == [5, 6] and entry["method"] == "occlusion"
    assert {"word_matrix", "subword_matrix", "pharaoh_word", "raw_matrix"} <= entry.keys()
    with pytest.raises(UserError, match="unknown attribution method 'saliency'; choose from") as error:
        attribute(model, SRC, TGT, "saliency")
    assert all(method in str(error.value) for method in METHODS)
    assert isinstance(a, Attribution)
    grad = attribute(model, SRC, TGT, "grad-attention", align=AlignConfig(layer="all", heads=[1]))
    entry = grad.to_json(grad.record(0, "ab c d e", "xy z w", src_pieces, tgt_pieces))
    assert (entry["layer"], entry["heads"], entry["normalization"]) == ("all", [1], "rows of raw")


def test_translate_offers_every_method():
    """translate.py spells the method names out (parsing flags imports no torch): the same list."""
    from seq2seq.cli.translate import ATTRIBUTION_METHODS, parse_args

    assert ATTRIBUTION_METHODS == METHODS
    args = parse_args(["--checkpoint", "C", "--attribution", *METHODS])
    assert args.attribution == list(METHODS) and args.attribution_samples >= 2 * (len(SRC) + 1)


def test_int8_models_get_occlusion_and_a_clear_error_for_gradients():
    """An int8 model (translate.py --precision int8) has no gradients: occlusion still works, the
    gradient methods say so instead of failing inside autograd."""
    from seq2seq.nn.quantize import quantize_for_decoding

    model = make("transformer")
    int8 = quantize_for_decoding(model)
    reference, quantized = occlusion(model, SRC, TGT).raw, occlusion(int8, SRC, TGT).raw
    assert quantized.shape == reference.shape and np.corrcoef(quantized.ravel(), reference.ravel())[0, 1] > 0.95
    for method in ("gradient", "integrated-gradients", "grad-attention"):
        with pytest.raises(UserError, match=f"'{method}' differentiates the model.*occlusion"):
            attribute(int8, SRC, TGT, method)


# ----------------------------------------------------------------------------- gradient-weighted attention


def hand_grad_attention(model, src_ids, t: int) -> np.ndarray:
    """(L, H, S) max(0, A * df_t/dA) of step t, from one unbatched forward pass: the attention
    modules' weights caught by hooks (the RNN's one per step), f_t differentiated alone."""
    src = torch.tensor([src_ids])
    caught = []
    if hasattr(model, "decoder") and isinstance(getattr(model.decoder, "attention", None), RecurrentAttention):
        modules = [model.decoder.attention]
    else:
        modules = [layer.cross_attn for layer in model.decoder]
    handles = [m.register_forward_hook(lambda mod, args, out: caught.append(out[1])) for m in modules]
    try:
        with eval_mode(model, grad=True):
            logits, _ = model(src, src != PAD, torch.tensor([[BOS, *TGT]]), need_attention=True)
            f = logits.log_softmax(-1)[0, t, (TGT + [EOS])[t]]
            grads = torch.autograd.grad(f, caught)
    finally:
        for h in handles:
            h.remove()
    if caught[0].dim() == 2:  # RNN, one call per step: step t's weights (1, S)
        return (caught[t] * grads[t]).clamp(min=0)[0][None, None].detach().numpy()
    if caught[0].dim() == 3:  # RNN, all steps at once (1, T, S)
        return (caught[0] * grads[0]).clamp(min=0)[0, t][None, None].detach().numpy()
    return torch.stack([(a * g).clamp(min=0)[0, :, t] for a, g in zip(caught, grads)]).detach().numpy()  # (L, H, S)


@pytest.mark.parametrize("arch, extra", [("bahdanau", {}), ("luong", {"input_feeding": False}),
                                         ("transformer", {})])
def test_grad_attention_is_attention_times_its_gradient(arch, extra):
    """Row t = mean over heads of max(0, A * df_t/dA) at step t, per layer and for 'all', equal
    to the hand computation above (unbatched, one target token at a time)."""
    model = make(arch, **extra)
    hand = np.stack([hand_grad_attention(model, SRC, t) for t in range(len(TGT) + 1)], axis=2)  # (L, H, T+1, S)
    assert hand.max() > 1e-4  # not vacuous
    for layer in range(hand.shape[0]):
        got = grad_weighted_attention(model, SRC, TGT, layer=layer).raw
        np.testing.assert_allclose(got, hand[layer].mean(0), rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(grad_weighted_attention(model, SRC, TGT, layer="all").raw, hand.mean((0, 1)),
                               rtol=1e-4, atol=1e-7)
    if hand.shape[1] > 1:
        np.testing.assert_allclose(grad_weighted_attention(model, SRC, TGT, layer=0, heads=[1]).raw, hand[0, 1],
                                   rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("arch", ["bahdanau", "transformer"])
def test_grad_attention_is_non_negative_and_zero_where_attention_is_zero(arch):
    """A masked source position (PAD id inside the sentence) gets attention exactly 0 in every
    layer and head, so its gradient-weighted attention is exactly 0 too."""
    model = make(arch)
    masked = [5, 6, PAD, 7, EOS]
    a = grad_weighted_attention(model, masked, TGT, layer="all")
    src = torch.tensor([masked])
    with torch.no_grad():
        _, attention = model(src, src != PAD, torch.tensor([[BOS, *TGT]]), need_attention=True)  # (1, L, H, T+1, S+1)
    assert (attention[..., 2] == 0).all() and (a.raw[:, 2] == 0).all()
    assert (a.raw >= 0).all() and a.raw[:, [0, 1, 3]].max() > 0
    np.testing.assert_array_equal(a.scores, a.raw)


# ----------------------------------------------------------------------------- Captum cross-check


@pytest.mark.parametrize("arch", ["bahdanau", "transformer"])
def test_hand_written_gradients_equal_captums(arch):
    """Integrated gradients = Captum's LayerIntegratedGradients on the source embedding (midpoint
    rule, baseline: PAD ids, whose embedding row is zero) and gradient x input = Captum's
    InputXGradient on the source embedding output. LayerIntegratedGradients hooks a module, so the
    model gets a source embedding of its own (a shared table would scale the target side too)."""
    captum = pytest.importorskip("captum.attr")
    from seq2seq.attribution.gradients import _replace_source_embedding
    from seq2seq.decoding.scoring import pad_ids, target_tensors

    model = make(arch, share_source_embeddings=False)
    embedding = model.embed_src if arch != "transformer" else model.src_embed.tokens
    rows = len(TGT) + 1
    src = pad_ids([SRC] * rows)  # copy t explains target position t (target=list(range(rows)))
    tgt_in, tgt_out = target_tensors([TGT] * rows, "cpu")

    def log_probs(src_ids, tgt_in, tgt_out):  # (B, T+1): f_t of every target position
        logits, _ = model(src_ids, src_ids != PAD, tgt_in)
        return logits.log_softmax(-1).gather(2, tgt_out.unsqueeze(2)).squeeze(2)

    def with_embedding(e, src_ids, tgt_in, tgt_out):
        with _replace_source_embedding(model, src_ids, lambda out: e):
            return log_probs(src_ids, tgt_in, tgt_out)

    with eval_mode(model, grad=True):
        ig = captum.LayerIntegratedGradients(log_probs, embedding).attribute(
            src, baselines=torch.full_like(src, PAD), target=list(range(rows)),
            additional_forward_args=(tgt_in, tgt_out), n_steps=8, method="riemann_middle")
        e = embedding(src).detach().requires_grad_(True)
        gxi = captum.InputXGradient(with_embedding).attribute(e, target=list(range(rows)),
                                                              additional_forward_args=(src, tgt_in, tgt_out))
    ours_ig, ours_gxi = integrated_gradients(model, SRC, TGT, steps=8).raw, gradient_x_input(model, SRC, TGT).raw
    np.testing.assert_allclose(ours_ig, ig.detach().sum(-1).double().numpy(), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(ours_gxi, gxi.detach().sum(-1).double().numpy(), rtol=1e-4, atol=1e-6)
    assert np.abs(ours_ig).max() > 1e-3
