"""Adapting a trained model to the pairs it aligns (``seq2seq.training.adapt``): it learns the pairs, leaves
the model it came from untouched, is reproducible, and decodes through freshly packed layers."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from seq2seq import UserError, adapt
from seq2seq.decoding.scoring import teacher_force
from seq2seq.decoding.translator import Translator
from seq2seq.nn.packed import PackedLinear
from seq2seq.tokenizer import EOS_ID
from test_align_cli import checkpoint  # noqa: F401  (the shared tiny Transformer)

SOURCES = ["twenty-one", "three hundred and five", "seven", ""]
TARGETS = ["ein und zwanzig", "drei hundert fünf", "sieben", "null"]


def log_likelihood(translator: Translator) -> float:
    """Teacher-forced log p of every target (EOS included) given its source."""
    tok = translator.tokenizer
    scores, _ = teacher_force(translator.model, [tok.encode(s) + [EOS_ID] for s in SOURCES],
                              [tok.encode(t) for t in TARGETS])
    return float(sum(s.sum() for s in scores))


def test_an_adapted_model_learns_the_pairs_and_the_given_one_stays(checkpoint):  # noqa: F811
    translator = Translator.from_checkpoint(checkpoint, device="cpu")
    before = {k: v.clone() for k, v in translator.model.state_dict().items()}
    adapted = adapt(translator, SOURCES, TARGETS, steps=12, lr=3e-3)
    assert adapted.model is not translator.model and adapted.supervised_attention == translator.supervised_attention
    assert log_likelihood(adapted) > log_likelihood(translator) + 1.0  # nats over ~20 tokens
    after = translator.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    again = adapt(translator, SOURCES, TARGETS, steps=12, lr=3e-3)  # the same seed: the same copy
    assert all(torch.equal(v, again.model.state_dict()[k]) for k, v in adapted.model.state_dict().items())
    other = adapt(translator, SOURCES, TARGETS, steps=12, lr=3e-3, seed=2)
    assert not all(torch.equal(v, other.model.state_dict()[k]) for k, v in adapted.model.state_dict().items())
    assert adapt(translator, SOURCES, TARGETS, steps=0) is translator


def test_an_adapted_model_decodes_through_its_own_weights(checkpoint):  # noqa: F811
    """The packed copies of the linear layers are made from the adapted weights, not the old ones."""
    translator = Translator.from_checkpoint(checkpoint, device="cpu")
    adapted = adapt(translator, SOURCES, TARGETS, steps=4, lr=3e-3)
    packed = [m for m in adapted.model.modules() if isinstance(m, PackedLinear)]
    if not any(isinstance(m, PackedLinear) for m in translator.model.modules()):
        pytest.skip("this PyTorch decodes without packed layers")
    assert packed
    with torch.inference_mode():
        for layer in packed:
            x = torch.randn(3, layer.in_features)
            torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias), atol=1e-5, rtol=1e-5)
    texts = [t.text for t in adapted.translate(SOURCES[:3], beam_size=2)]
    assert len(texts) == 3 and np.isfinite(log_likelihood(adapted))


@pytest.mark.parametrize("kwargs, message", [({"steps": -1}, "steps >= 0"), ({"steps": 2, "lr": 0.0}, "learning rate")])
def test_bad_adaptation_settings_are_named(checkpoint, kwargs, message):  # noqa: F811
    translator = Translator.from_checkpoint(checkpoint, device="cpu")
    with pytest.raises(UserError, match=message):
        adapt(translator, SOURCES, TARGETS, **kwargs)
    with pytest.raises(UserError, match="1 source, 2 targets"):
        adapt(translator, SOURCES[:1], TARGETS[:2], steps=1)
    half = Translator.from_checkpoint(checkpoint, device="cpu", precision="bf16")
    with pytest.raises(UserError, match="fp32"):
        adapt(half, SOURCES, TARGETS, steps=1)


def test_an_rnn_adapts_too(tiny_tokenizer):
    """The RNN (packed sequences, host-side source lengths) learns the pairs the same way."""
    from seq2seq.config import ModelConfig
    from seq2seq.models import build_model

    torch.manual_seed(0)
    model = build_model(ModelConfig(arch="rnn", vocab_size=tiny_tokenizer.vocab_size, embed_dim=32, hidden_size=32,
                                    decoder_hidden_size=32, dropout=0.1))
    translator = Translator(model, tiny_tokenizer)
    adapted = adapt(translator, SOURCES, TARGETS, steps=12, lr=3e-3)
    assert log_likelihood(adapted) > log_likelihood(translator) + 1.0


def test_adapting_makes_its_adam_with_the_training_loops_builder(checkpoint, monkeypatch):  # noqa: F811
    """adapt's optimizer comes from ``training.optim.build_optimizer`` (one optimizer builder), with adapt's own
    numbers written out: Adam (no decoupled decay), the given learning rate, betas (0.9, 0.98), eps 1e-9, no weight
    decay (catches the builder's or PyTorch's defaults, betas (0.9, 0.999) or eps 1e-8, taking their place)."""
    import seq2seq.training.adapt as adapt_module
    from seq2seq.training import optim as optim_module

    built = []

    def spy(model, settings):
        built.append(optim_module.build_optimizer(model, settings))
        return built[-1]

    monkeypatch.setattr(adapt_module, "build_optimizer", spy)
    translator = Translator.from_checkpoint(checkpoint, device="cpu")
    adapt(translator, SOURCES, TARGETS, steps=1, lr=2e-3)
    (optimizer,) = built
    assert type(optimizer) is torch.optim.Adam
    (group,) = optimizer.param_groups
    assert (group["lr"], tuple(group["betas"]), group["eps"], group["weight_decay"]) == (2e-3, (0.9, 0.98), 1e-9, 0.0)
