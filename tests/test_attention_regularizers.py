"""Attention regularizers (issue 36, part 3): sparse normalizers (sparsemax, 1.5-entmax) for the RNN's
attention and the Transformer's cross-attention, and the cross-attention entropy penalty."""
from __future__ import annotations

import copy
import json
import math
import sys
from pathlib import Path

import pytest
import torch

import seq2seq.nn.attention as attention_module
from seq2seq.config import ModelConfig, RunConfig
from seq2seq.errors import UserError
from seq2seq.models import build_model
from seq2seq.nn.normalizers import NORMALIZERS, masked_entmax15, masked_softmax, masked_sparsemax
from seq2seq.tokenizer import PAD_ID
from seq2seq.training.attention_entropy import EntropyPenalty, attention_entropy, entropy_sum

from test_models import RNN, TRANSFORMER, VOCAB, _batch, reverse_batch

pytest.importorskip("entmax", reason="the sparse normalizers need entmax (pip install 'seq2seq[sparse]')")

SPARSE = {"sparsemax": masked_sparsemax, "entmax15": masked_entmax15}


# ----------------------------------------------------------------------------- the normalizers


def test_sparse_normalizers_match_their_closed_forms():
    """z = (1, 0.5, -1). Sparsemax: the support is the k largest with 1 + k z_(k) > sum_{j<=k} z_(j):
    k = 2 (1 + 2 * 0.5 = 2 > 1.5; 1 - 3 = -2 < 0.5), tau = (1 + 0.5 - 1) / 2 = 0.25, a = (0.75, 0.25, 0).
    1.5-entmax: a_j = (z_j / 2 - tau)^2 on the support {0, 1}: (0.5 - tau)^2 + (0.25 - tau)^2 = 1,
    2 tau^2 - 1.5 tau - 0.6875 = 0, tau = (1.5 - sqrt(7.75)) / 4 (the root below 0.25); z_2 / 2 =
    -0.5 < tau, so a_2 = 0."""
    z = torch.tensor([[1.0, 0.5, -1.0]])
    torch.testing.assert_close(masked_sparsemax(z, None), torch.tensor([[0.75, 0.25, 0.0]]))
    tau = (1.5 - math.sqrt(7.75)) / 4
    expected = torch.tensor([[(0.5 - tau) ** 2, (0.25 - tau) ** 2, 0.0]])
    torch.testing.assert_close(masked_entmax15(z, None), expected)
    assert masked_sparsemax(z, None)[0, 2] == 0 and masked_entmax15(z, None)[0, 2] == 0  # exact zeros


@pytest.mark.parametrize("name", list(SPARSE))
def test_rows_sum_to_one_with_exact_zeros_and_masked_positions_get_nothing(name):
    normalize = SPARSE[name]
    torch.manual_seed(0)
    scores = 4 * torch.randn(2, 3, 5, 9)  # spread scores: some keys fall below the threshold
    lengths = torch.tensor([9, 4])
    mask = (torch.arange(9) < lengths[:, None])[:, None, None, :]  # (2, 1, 1, 9), padding after 4 in row 1
    weights = normalize(scores, mask)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 3, 5))
    assert (weights >= 0).all()
    assert (weights[1, ..., 4:] == 0).all()  # padding: exactly 0
    assert (weights[..., :4] == 0).any()  # sparse among the real positions too: exact zeros
    # masking is exact: the real positions get what normalizing them alone gives, however high the
    # masked scores are (catches masking only by zeroing after the normalizer, which renormalizes nothing)
    poisoned = scores.clone()
    poisoned[1, ..., 4:] = 1e4
    alone = normalize(scores[1, ..., :4], None)
    torch.testing.assert_close(normalize(poisoned, mask)[1, ..., :4], alone)
    assert (normalize(poisoned, mask)[1, ..., 4:] == 0).all()


@pytest.mark.parametrize("name", NORMALIZERS)
def test_one_real_position_gets_everything_and_none_gives_zeros(name):
    normalize = {"softmax": masked_softmax, **SPARSE}[name]
    scores = torch.tensor([[0.3, 5.0, -2.0], [1.0, 2.0, 3.0]], requires_grad=True)
    mask = torch.tensor([[False, False, True], [False, False, False]])
    weights = normalize(scores, mask)
    assert weights.tolist() == [[0.0, 0.0, 1.0], [0.0, 0.0, 0.0]]
    (weights * torch.tensor([1.0, 2.0, 3.0])).sum().backward()
    assert torch.isfinite(scores.grad).all() and (scores.grad[~mask] == 0).all()


@pytest.mark.parametrize("name", list(SPARSE))
def test_half_precision_scores_are_solved_in_fp32_and_returned_as_given(name):
    torch.manual_seed(1)
    scores = torch.randn(4, 7)
    mask = torch.ones(4, 7, dtype=torch.bool)
    mask[0, 5:] = False
    half = SPARSE[name](scores.bfloat16(), mask)
    assert half.dtype == torch.bfloat16
    torch.testing.assert_close(half.float(), SPARSE[name](scores.bfloat16().float(), mask), atol=4e-3, rtol=0)


def test_a_missing_entmax_package_is_a_named_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "entmax", None)  # `import entmax` now raises ImportError
    for name, normalize in SPARSE.items():
        with pytest.raises(UserError, match=r"--attention-normalizer .*pip install 'seq2seq\[sparse\]'"):
            normalize(torch.zeros(1, 2), None)
        with pytest.raises(UserError, match=r"pip install 'seq2seq\[sparse\]'"):  # before any work
            RunConfig.from_dict({"model": {"attention_normalizer": name}}).resolved()
        with pytest.raises(UserError, match=r"pip install 'seq2seq\[sparse\]'"):
            build_model(ModelConfig(vocab_size=VOCAB, attention_normalizer=name, **TRANSFORMER))
    build_model(ModelConfig(vocab_size=VOCAB, **TRANSFORMER))  # softmax needs nothing


def test_the_flag_is_checked_and_recorded_in_the_config():
    from seq2seq.cli import config_from_flags

    cfg = config_from_flags(["--arch", "rnn", "--attention-normalizer", "entmax15", "--data-dir", "d"])
    assert cfg.model.attention_normalizer == "entmax15"
    assert config_from_flags(["--data-dir", "d"]).model.attention_normalizer == "softmax"
    with pytest.raises(SystemExit):  # argparse choices
        config_from_flags(["--attention-normalizer", "sparse", "--data-dir", "d"])
    with pytest.raises(UserError, match="attention_normalizer"):  # a config file's typo
        RunConfig.from_dict({"model": {"attention_normalizer": "sparse"}})


# ----------------------------------------------------------------------------- the models


def _model(base: dict, normalizer: str, seed: int = 0, sharpen: float = 1.0):
    """A model in eval mode; ``sharpen`` scales its (cross-)attention scores, which are nearly equal at
    initialisation, so that sparse normalizers find keys below their threshold."""
    torch.manual_seed(seed)
    model = build_model(ModelConfig(vocab_size=VOCAB, dropout=0.0, attention_normalizer=normalizer, **base))
    with torch.no_grad():
        if base["arch"] == "rnn":
            model.decoder.attention.scorer.v.weight.mul_(sharpen)  # Bahdanau: v^T tanh(...)
        else:
            for layer in model.decoder:
                layer.cross_attn.q_proj.weight.mul_(sharpen)
    return model.eval()


@pytest.mark.parametrize("normalizer", list(SPARSE))
@pytest.mark.parametrize("base", [RNN, TRANSFORMER], ids=["rnn", "transformer"])
def test_models_attend_sparsely_and_decoding_equals_teacher_forcing(base, normalizer):
    """(test_models.test_incremental_decoding_equals_teacher_forcing covers more variants.) The
    sparse normalizer runs in teacher forcing and in decode_step with caches alike, and gives zeros."""
    model = _model(base, normalizer, sharpen=10.0)
    src, mask, tgt_in = _batch(5)
    with torch.no_grad():
        logits, attention = model(src, mask, tgt_in, need_attention=True)
        memory = model.encode(src, mask)
        state, steps, weights = model.init_state(memory), [], []
        for t in range(tgt_in.size(1)):
            step_logits, state, step_attention = model.decode_step(memory, state, tgt_in[:, t])
            steps.append(step_logits), weights.append(step_attention)
    torch.testing.assert_close(torch.stack(steps, 1), logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(torch.stack(weights, 3), attention, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(attention.sum(-1), torch.ones(attention.shape[:-1]))
    padding = ~mask[:, None, None, None, :].expand_as(attention)
    assert (attention[padding] == 0).all()
    assert (attention[~padding] == 0).any()  # real source positions with exactly zero weight
    softmax = _model(base, "softmax", sharpen=10.0)  # the same weights, dense attention
    assert (softmax(src, mask, tgt_in, need_attention=True)[1][~padding] > 0).all()


def test_only_the_transformers_cross_attention_is_sparse():
    model = _model(TRANSFORMER, "sparsemax")
    for layer in model.decoder:
        assert layer.cross_attn.normalizer == "sparsemax" and layer.self_attn.normalizer == "softmax"
    assert all(layer.self_attn.normalizer == "softmax" for layer in model.encoder)


def test_sparse_cross_attention_never_takes_the_fused_kernel(monkeypatch):
    """Off CPU, attention without weights runs F.scaled_dot_product_attention, a softmax. With the
    fused path forced on here: a softmax model runs every attention through it and computes the
    same as the explicit path; a sparse model runs only self-attention through it (catches a sparse
    cross-attention silently computed as a softmax by the kernel)."""
    calls = []
    fused = torch.nn.functional.scaled_dot_product_attention

    def counting(q, k, v, **kwargs):
        calls.append(q.size(2))
        return fused(q, k, v, **kwargs)

    src, mask, tgt_in = _batch(2)
    for normalizer, expected_calls in (("softmax", 2 * 2 + 2), ("sparsemax", 2 * 2)):  # 2 layers
        model = _model(TRANSFORMER, normalizer)
        with torch.no_grad():
            explicit, _ = model(src, mask, tgt_in)
            monkeypatch.setattr(attention_module, "fused_kernel_pays", lambda device: True)
            monkeypatch.setattr(attention_module.F, "scaled_dot_product_attention", counting)
            calls.clear()
            kernel, _ = model(src, mask, tgt_in)
            monkeypatch.undo()
        assert len(calls) == expected_calls  # encoder self, decoder self (and cross for softmax) per layer
        torch.testing.assert_close(kernel, explicit, atol=1e-5, rtol=1e-5)


def test_fine_tuning_may_change_the_normalizer_and_ctranslate2_refuses_a_sparse_model():
    from seq2seq.checkpoint.ctranslate2 import check_convertible

    softmax = ModelConfig(**TRANSFORMER)
    sparse = ModelConfig(attention_normalizer="entmax15", **TRANSFORMER)
    assert sparse.differences(softmax) == []  # no parameters: the weights load either way
    check_convertible(softmax, "model")
    with pytest.raises(UserError, match="--attention-normalizer"):
        check_convertible(sparse, "model")


# ----------------------------------------------------------------------------- the entropy penalty


def test_entropy_is_the_hand_computed_one():
    a = torch.tensor([[0.5, 0.5, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0], [0.25, 0.25, 0.25, 0.25], [0.7, 0.2, 0.1, 0.0]])
    expected = [math.log(2), 0.0, math.log(4), -(0.7 * math.log(0.7) + 0.2 * math.log(0.2) + 0.1 * math.log(0.1))]
    torch.testing.assert_close(attention_entropy(a), torch.tensor(expected))


def test_entropy_sum_counts_real_target_positions_and_the_chosen_layer():
    """attention (B=1, L=2, H=2, T=3, S=2); target position 2 is padding. Layer 0 (= -2, the
    penultimate) has heads with H = log 2 (uniform) and 0 (one-hot) at every position: mean log 2 / 2,
    times 2 real positions = log 2. Layer 1 is one-hot everywhere (H = 0): 'all' averages to log 2 / 2."""
    uniform, onehot = torch.tensor([0.5, 0.5]), torch.tensor([1.0, 0.0])
    attention = torch.stack([
        torch.stack([uniform.expand(3, 2), onehot.expand(3, 2)]),  # layer 0: (H, T, S)
        torch.stack([onehot.expand(3, 2), onehot.expand(3, 2)]),  # layer 1
    ])[None]  # (1, 2, 2, 3, 2)
    target = torch.tensor([[7, 3, PAD_ID]])
    torch.testing.assert_close(entropy_sum(attention, target, -2), torch.tensor(math.log(2)))
    torch.testing.assert_close(entropy_sum(attention, target, 0), torch.tensor(math.log(2)))
    torch.testing.assert_close(entropy_sum(attention, target, -1), torch.tensor(0.0))
    torch.testing.assert_close(entropy_sum(attention, target, "all"), torch.tensor(math.log(2) / 2))
    # one layer: -2 clamps to it, like --align-layer
    torch.testing.assert_close(entropy_sum(attention[:, :1], target, -2), torch.tensor(math.log(2)))


def test_entropy_penalty_options_are_checked():
    from seq2seq.cli import config_from_flags

    cfg = config_from_flags(["--attention-entropy-weight", "0.3", "--attention-entropy-layer", "all",
                             "--data-dir", "d"])
    assert (cfg.train.attention_entropy_weight, cfg.train.attention_entropy_layer) == (0.3, "all")
    assert config_from_flags(["--attention-entropy-layer", "-1", "--data-dir", "d"]).train.attention_entropy_layer == -1
    assert config_from_flags(["--data-dir", "d"]).train.attention_entropy_layer == -2
    with pytest.raises(UserError, match="attention_entropy_weight"):
        RunConfig.from_dict({"train": {"attention_entropy_weight": -1.0}})
    with pytest.raises(UserError, match="--attention-entropy-layer 3: .*has 2 decoder layer"):
        EntropyPenalty(0.5, 3, num_layers=2)
    assert not EntropyPenalty(0.0, -2, 1).active and EntropyPenalty(0.1, -2, 1).active


def test_the_penalty_gradient_sharpens_attention():
    """One gradient step on the penalty alone lowers the entropy of a dense distribution (the sign)."""
    scores = torch.tensor([[0.3, 0.1, -0.2, 0.0]], requires_grad=True)
    before = attention_entropy(scores.softmax(-1))
    before.sum().backward()
    after = attention_entropy((scores - 0.5 * scores.grad).softmax(-1))
    assert after < before


# ----------------------------------------------------------------------------- training


def tiny_config(out: Path, arch: str, normalizer: str = "softmax", steps: int = 4, **train) -> RunConfig:
    cfg = RunConfig.from_dict({
        "model": {"arch": arch, "d_model": 32, "heads": 2, "ff_size": 64, "layers": 1, "embed_dim": 32,
                  "hidden_size": 32, "decoder_hidden_size": 48, "dropout": 0.1, "attention_normalizer": normalizer},
        "data": {"toy_size": 300, "vocab_size": 120, "max_tokens": 400, "cache_dir": str(out.parent / "cache")},
        "train": {"max_steps": steps, "eval_every": 0, "warmup_steps": 5, "lr": 3e-3, "log_every": 2,
                  "eval_max_sentences": 10, "seed": 3, "device": "cpu", **train},
    })
    cfg.output_dir = str(out)
    return cfg


@pytest.mark.parametrize("normalizer", list(SPARSE))
@pytest.mark.parametrize("arch", ["rnn", "transformer"])
def test_training_and_decoding_with_a_sparse_normalizer(tmp_path_factory, arch, normalizer):
    from seq2seq.decoding.translator import Translator
    from seq2seq.training.run import train

    root = tmp_path_factory.getbasetemp() / "regularizers"
    out = root / f"{arch}-{normalizer}"
    result = train(tiny_config(out, arch, normalizer, attention_entropy_weight=0.1), quiet=True)
    assert result.progress.step == 4
    translator = Translator.from_checkpoint(result.best_checkpoint, device="cpu")
    assert translator.model.cfg.attention_normalizer == normalizer  # the checkpoint's config says so
    hyps = translator.translate(["three hundred and twelve", "forty-seven thousand"], beam_size=2)
    for hyp in hyps:
        assert hyp.attention is not None
        assert abs(hyp.attention.sum(-1) - 1).max() < 1e-5
        assert hyp.alignment is not None
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    entropies = [r["attention_entropy"] for r in records if r["kind"] == "train"]
    assert len(entropies) == 2 and all(0 <= h < math.log(60) for h in entropies)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    from seq2seq.training.corpus import prepare_run_corpus

    out = tmp_path_factory.mktemp("penalty") / "run"
    cfg = tiny_config(out, "transformer").resolved()
    prepared = prepare_run_corpus(cfg, out, quiet=True)
    return out, prepared


def _trainer(corpus, weight: float, **model):
    from seq2seq.runtime import seed_everything
    from seq2seq.training.trainer import Trainer

    out, prepared = corpus
    cfg = tiny_config(out, "transformer", attention_entropy_weight=weight, attention_entropy_layer="all").resolved()
    cfg.model.dropout, cfg.model.layers, cfg.model.vocab_size = 0.0, 2, prepared.tokenizer.vocab_size
    seed_everything(cfg.train.seed)
    return Trainer(cfg, prepared, quiet=True)


def _batches(prepared, n: int):
    batches = list(prepared.train_batches(0))
    return [batches[i % len(batches)] for i in range(n)]


def test_zero_weight_trains_as_before_and_a_positive_one_adds_exactly_the_penalty(corpus, monkeypatch):
    """w = 0: the model is not asked for attention and the step's loss is the plain cross-entropy.
    w > 0: the same cross-entropy is reported (the penalty is logged apart), the entropy reported is
    entropy_sum / tokens on the model before the step, and the update differs."""
    from seq2seq.training.optim import sequence_loss

    [batch] = _batches(corpus[1], 1)
    asked = []
    plain, penalized = _trainer(corpus, 0.0), _trainer(corpus, 0.5)
    before = copy.deepcopy(plain.model)
    forward = plain.objective.forward
    monkeypatch.setattr(plain.objective, "forward",
                        lambda *args, **kwargs: asked.append(args[3:]) or forward(*args, **kwargs))
    loss, tokens = plain.train_step([batch])
    assert asked == [(False,)] and plain.attention_entropy is None
    with torch.no_grad():
        logits, attention = before(batch.src, batch.src_mask, batch.tgt_in, need_attention=True)
        expected = sequence_loss(logits, batch.tgt_out, 0.1) / tokens
        entropy = entropy_sum(attention, batch.tgt_out, "all") / tokens
    torch.testing.assert_close(loss, expected)
    penalized_loss, _ = penalized.train_step([batch])
    torch.testing.assert_close(penalized_loss, expected)
    torch.testing.assert_close(penalized.attention_entropy, entropy)
    moved = [(a - b).abs().max() for a, b in zip(plain.model.parameters(), penalized.model.parameters())]
    assert max(moved) > 0


def test_a_positive_weight_lowers_the_attention_entropy(corpus):
    """The same seeded 2-layer Transformer trained 25 steps with w = 0 and w = 1 ('all' layers):
    the penalized model's teacher-forced cross-attention entropy on training batches is lower."""
    batches = _batches(corpus[1], 25)
    entropies = {}
    for weight in (0.0, 1.0):
        trainer = _trainer(corpus, weight)
        for batch in batches:
            trainer.train_step([batch])
        model = trainer.model.eval()
        total, tokens = 0.0, 0
        with torch.no_grad():
            for batch in batches[:5]:
                _, attention = model(batch.src, batch.src_mask, batch.tgt_in, need_attention=True)
                total += float(entropy_sum(attention, batch.tgt_out, "all"))
                tokens += batch.num_tgt_tokens
        entropies[weight] = total / tokens
    assert entropies[1.0] < 0.8 * entropies[0.0], entropies


def test_the_reverse_task_learns_with_sparse_attention():
    """A Bahdanau RNN with sparsemax still learns to reverse (test_models' task), attending sparsely."""
    from test_models import sequence_accuracy, train as train_reverse

    model = train_reverse(_model(RNN | {"attention": "bahdanau"}, "sparsemax").train(), 100, 1e-2)
    assert sequence_accuracy(model) >= 0.9
    src, mask, tgt_in, _ = reverse_batch(8, torch.Generator().manual_seed(5))
    with torch.no_grad():
        _, attention = model(src, mask, tgt_in, need_attention=True)
    real = (tgt_in != PAD_ID)[:, :, None] & mask[:, None, :]  # (B, T, S): real target and source positions
    assert (attention[:, 0, 0][real] == 0).float().mean() > 0.3  # many real positions get exactly nothing


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_sparse_cross_attention_on_cuda_matches_cpu(precision):
    """On a GPU self-attention takes the fused kernel and sparse cross-attention the explicit path
    (in fp32 even under bf16 autocast): the logits match the CPU's, padding gets exactly 0."""
    if precision == "bf16" and not torch.cuda.is_bf16_supported():
        pytest.skip("no bf16 on this GPU")
    model = _model(TRANSFORMER, "entmax15", sharpen=10.0)
    src, mask, tgt_in = _batch(5)
    with torch.no_grad():
        expected, _ = model(src, mask, tgt_in)
        gpu = copy.deepcopy(model).cuda()
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=precision == "bf16"):
            logits, _ = gpu(src.cuda(), mask.cuda(), tgt_in.cuda())
            _, attention = gpu(src.cuda(), mask.cuda(), tgt_in.cuda(), need_attention=True)
    tolerance = 1e-4 if precision == "fp32" else 0.1
    torch.testing.assert_close(logits.float().cpu(), expected, atol=tolerance, rtol=tolerance)
    attention = attention.float().cpu()
    padding = ~mask[:, None, None, None, :].expand_as(attention)
    assert (attention[padding] == 0).all() and (attention[~padding] == 0).any()
    torch.testing.assert_close(attention.sum(-1), torch.ones(attention.shape[:-1]), atol=1e-2, rtol=0)
