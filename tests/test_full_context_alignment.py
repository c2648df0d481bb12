"""Full-context alignment (issue 45, part 1; Garg et al. 2019): the supervised layer's cross-attention
computed with the whole target visible, trained by the guided loss and read wherever alignments are read."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import run_main
from test_guided_alignment import COMMON, SMALL_TRANSFORMER, random_batch, toy_alignment_file

from seq2seq.checkpoint.file import load_checkpoint
from seq2seq.config import GuidedConfig, ModelConfig, RunConfig
from seq2seq.decoding.scoring import teacher_force
from seq2seq.decoding.translator import Translator
from seq2seq.errors import UserError
from seq2seq.models import build_model
from seq2seq.training.guided import GuidedTraining


def transformer(full_context_layer: int | None, layers: int = 3, tie: bool = True) -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = ModelConfig(arch="transformer", vocab_size=30, d_model=16, heads=2, ff_size=32, layers=layers,
                      dropout=0.0, tie_embeddings=tie).with_arch_defaults()
    return build_model(cfg, full_context_layer).eval()


def test_at_the_first_layer_full_context_equals_causal_at_the_last_position_only():
    """The last target position sees every position either way; the earlier ones see later words only
    with full context. Above layer 0 the last position differs too (it reads lower layers' earlier
    positions, which saw the future). The translation (logits) and the other layers stay causal."""
    src, mask, tgt_in, _ = random_batch(batch=2, src_len=5, tgt_len=6)
    mask[:] = True
    full, causal = transformer(0), transformer(None)
    logits_full, every_full = full(src, mask, tgt_in, need_attention=True)
    logits_causal, every_causal = causal(src, mask, tgt_in, need_attention=True)
    torch.testing.assert_close(logits_full, logits_causal, rtol=0, atol=0)
    torch.testing.assert_close(every_full[:, 1:], every_causal[:, 1:], rtol=0, atol=0)
    torch.testing.assert_close(every_full[:, 0, :, -1], every_causal[:, 0, :, -1])
    assert (every_full[:, 0, :, :-1] - every_causal[:, 0, :, :-1]).abs().amax(-1).gt(1e-3).all()
    _, alone = full(src, mask, tgt_in, attention_layer=0)  # the training read-out: the same attention
    torch.testing.assert_close(alone, every_full[:, :1], rtol=0, atol=0)
    one = tgt_in[:, :1]  # one target position: nothing later to see, at any layer
    torch.testing.assert_close(transformer(1)(src, mask, one, need_attention=True)[1],
                               causal(src, mask, one, need_attention=True)[1])


def test_target_padding_is_never_attended():
    """A sentence padded in a batch aligns as it does alone (the full-context self-attention masks the
    target padding that the causal mask used to hide)."""
    model = transformer(1)
    src, mask, tgt_in, _ = random_batch(batch=2, src_len=5, tgt_len=6)
    short = tgt_in.clone()
    short[0, 4:] = 0  # sentence 0 has 4 target positions, then padding
    _, batch = model(src, mask, short, attention_layer=1)
    _, alone = model(src[:1], mask[:1], short[:1, :4], attention_layer=1)
    torch.testing.assert_close(batch[:1, :, :, :4], alone)


def test_the_alignment_loss_trains_the_layers_up_to_the_supervised_one_only():
    model = transformer(1, tie=False).train()
    src, mask, tgt_in, gold = random_batch(batch=3, src_len=5, tgt_len=4)
    guided = GuidedTraining(layer=1, heads=[0], weight=1.0)
    _, attention = model(src, mask, tgt_in, attention_layer=1)
    guided.loss(attention, gold).backward()

    def touched(module: torch.nn.Module) -> bool:
        return any(p.grad is not None and p.grad.abs().sum() > 0 for p in module.parameters())

    assert touched(model.decoder[0]) and touched(model.decoder[1].cross_attn) and touched(model.encoder)
    assert touched(model.tgt_embed) and touched(model.decoder[0].self_attn)
    assert not touched(model.decoder[2]) and not touched(model.generator) and not touched(model.dec_norm)
    assert not touched(model.decoder[1].ff)  # after the supervised attention in its own layer


@pytest.mark.parametrize("change, message", [
    ({"model": {"arch": "rnn"}}, "needs --arch transformer"),
    ({"guided": {"links": None}}, "give --guided-alignment"),
    ({"guided": {"layer": 5}}, "--guided-layer 5: alignment layer 5 does not exist"),
])
def test_bad_combinations_are_named_errors(change, message):
    raw = RunConfig(model=ModelConfig(layers=3), guided=GuidedConfig(links="links.talp", full_context=True)).to_dict()
    for section, values in change.items():
        raw[section].update(values)
    with pytest.raises(UserError, match=message):
        RunConfig.from_dict(raw).resolved("cpu")
    with pytest.raises(UserError, match="needs a Transformer"):
        build_model(ModelConfig(arch="rnn", vocab_size=30).with_arch_defaults(), 0)


def test_the_layer_is_the_guided_one_and_off_by_default():
    guided, model = GuidedConfig(links="links.talp", full_context=True), ModelConfig(layers=3)
    assert guided.full_context_layer(model) == 1  # --guided-layer -2 of 3
    guided.layer = 0
    assert guided.full_context_layer(model) == 0
    model.layers, guided.layer = 1, -2
    assert guided.full_context_layer(model) == 0  # a one-layer decoder's only layer, as alignments read it
    model.layers = 3
    guided.full_context = False
    assert guided.full_context_layer(model) is None


def test_a_full_context_run_records_it_and_its_alignments_are_read_with_full_context(tmp_path):
    path = toy_alignment_file(tmp_path / "toy.talp", 200)
    code, _, err = run_main(["train", *COMMON, *SMALL_TRANSFORMER, "--toy-size", "200", "--max-steps", "12",
                             "--cache-dir", str(tmp_path / "cache"), "--output-dir", str(tmp_path / "run"),
                             "--guided-alignment", str(path), "--guided-alignment-weight", "0.5",
                             "--full-context-alignment"])
    assert code == 0, err
    config = RunConfig.from_dict(load_checkpoint(tmp_path / "run" / "best.pt")["config"])
    assert config.guided.full_context and config.guided.full_context_layer(config.model) == 0
    train = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert all(r["guided_loss"] > 0 for r in train if r["kind"] == "train")

    translator = Translator.from_checkpoint(tmp_path / "run", device="cpu")
    assert translator.model.full_context_layer == 0
    (tmp_path / "in.txt").write_text("one two three\nfour five\n", encoding="utf-8")
    code, _, err = run_main(["translate", "--checkpoint", str(tmp_path / "run"), "--input", str(tmp_path / "in.txt"),
                             "--output", str(tmp_path / "hyp"), "--alignments", str(tmp_path / "a.jsonl"),
                             "--device", "cpu", "--beam-size", "1"])
    assert code == 0, err
    record = json.loads((tmp_path / "a.jsonl").read_text().splitlines()[0])
    translation = translator.translate(["one two three"], beam_size=1, need_attention=True)[0]
    src = translator.tokenizer.encode("one two three") + [3]
    tgt = translator.tokenizer.encode(translation.text)
    _, (full,) = teacher_force(translator.model, [src], [tgt], need_attention=True)
    translator.model.full_context_layer = None
    _, (causal,) = teacher_force(translator.model, [src], [tgt], need_attention=True)
    assert Path(tmp_path / "hyp").read_text().splitlines()[0] == translation.text
    assert (record["layer_used"], record["heads"]) == (0, [0])  # the supervised head
    exported = np.array(record["subword_matrix"])  # (T, S) without the EOS row and column
    rows, columns = exported.shape
    np.testing.assert_allclose(exported, full[0, 0, :rows, :columns], atol=1e-4)
    assert abs(exported - causal[0, 0, :rows, :columns]).max() > 1e-3
