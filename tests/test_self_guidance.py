"""--guided-alignment self: the model's own links as gold rows, after a warm-up, following the model as it
trains, and resumed exactly."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import run_main

from seq2seq.alignment.guided import own_gold, piece_gold, piece_words
from seq2seq.checkpoint.file import load_checkpoint
from seq2seq.config import ModelConfig, RunConfig
from seq2seq.data.batching import pad_batch
from seq2seq.models import build_model
from seq2seq.tokenizer import EOS_ID
from seq2seq.training.guided import GuidedTraining, SelfGuidance
from test_guided_alignment import COMMON, SMALL_TRANSFORMER

STARTS = np.array([False, True, True, False, True, False, True])  # ids 0..6; 1 2 4 6 start words


def test_own_gold_links_the_merged_words_by_grow_and_spreads_them_over_the_pieces():
    src = np.array([2, 4, 5, 1, 0])  # ▁a | ▁b c | ▁d e  -> words 0 1 1 2 2
    tgt = np.array([6, 2, 3, 0])  # ▁x | ▁y z q -> words 0 1 1 1
    attention = np.zeros((5, 6))  # one more row and column (EOS): not read
    attention[0, 3:5] = 0.5  # x attends to d (both its pieces): word row [0, 0, 1]
    attention[1:4, :3] = [0.7, 0.15, 0.15]  # y's pieces attend to a and b: word row [0.7, 0.3, 0]
    attention[4] = attention[:, 5] = 1.0
    # rows: x-d, y-a; columns: a-y, b-y, d-x; grown: x-d, y-a, y-b (b holds 0.3 of y's row and all of its column)
    expected = piece_gold(np.array([[2, 0], [0, 1], [1, 1]]), piece_words(src, STARTS), piece_words(tgt, STARTS), 3, 2)
    np.testing.assert_allclose(own_gold(attention, src, tgt, STARTS, share=0.2), expected)
    strict = own_gold(attention, src, tgt, STARTS, share=0.5)  # y-b holds 0.3 of y's row: dropped
    np.testing.assert_allclose(strict[1:4], np.tile([1, 0, 0, 0, 0], (3, 1)))
    assert own_gold(attention, src[:0], tgt, STARTS, 0.2).shape == (4, 0)


@pytest.fixture(scope="module")
def guidance(tiny_tokenizer):
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=32, heads=2, ff_size=64, layers=2, dropout=0.3, vocab_size=tiny_tokenizer.vocab_size)
    model = build_model(cfg.with_arch_defaults()).train()
    run = RunConfig(model=cfg)
    run.guided.links, run.guided.self_warmup = "self", 3
    guided = GuidedTraining.for_run(run, model)
    pairs = [("three hundred and five", "drei hundert und fünf"), ("forty-two", "zwei und vierzig")]
    batch = pad_batch([tiny_tokenizer.encode(s) + [EOS_ID] for s, _ in pairs],
                      [tiny_tokenizer.encode(t) for _, t in pairs], [0, 1])
    return model, SelfGuidance.for_run(run, guided, tiny_tokenizer), batch


def test_self_guidance_waits_for_its_warm_up_then_reads_the_model_without_dropout(guidance):
    model, self_guidance, batch = guidance
    assert self_guidance.gold(model, batch, step=2) is None
    gold = self_guidance.gold(model, batch, step=3)
    assert model.training  # the teacher pass left the model as it found it
    assert torch.equal(gold, self_guidance.gold(model, batch, step=50))  # no dropout: the same weights, the same gold
    assert gold.shape == (2, *batch.tgt_in.shape[1:], batch.src.shape[1])
    for b in range(2):
        n_tgt, n_src = int(batch.tgt_mask[b].sum()) - 1, int(batch.src_mask[b].sum()) - 1  # without the EOS
        assert gold[b, n_tgt:].sum() == 0 and gold[b, :, n_src:].sum() == 0  # EOS and padding never gold
        sums = gold[b, :n_tgt].sum(dim=1)
        assert torch.all(((sums - 1).abs() < 1e-5) | (sums == 0)) and sums.sum() > 0


def test_self_guidance_follows_the_model_as_it_trains(guidance):
    model, self_guidance, batch = guidance
    before = self_guidance.gold(model, batch, step=10)
    optimizer = torch.optim.SGD(model.parameters(), lr=5.0)
    for _ in range(5):  # move the supervised head's attention elsewhere: towards the source's last piece
        _, weights = model(batch.src, batch.src_mask, batch.tgt_in, False, attention_layer=self_guidance.guided.layer)
        (-weights[:, 0, 0, :, 0].log().sum()).backward()
        optimizer.step()
        optimizer.zero_grad()
    assert not torch.equal(self_guidance.gold(model, batch, step=10), before)


def test_self_guidance_is_named_in_a_run_and_resumes_exactly(tmp_path):
    flags = [*SMALL_TRANSFORMER, "--toy-size", "200", "--cache-dir", str(tmp_path / "cache"), "--guided-alignment",
             "self", "--self-guidance-warmup", "3", "--guided-alignment-weight", "0.5"]
    code, _, err = run_main(["train", *COMMON, *flags, "--max-steps", "6", "--output-dir", str(tmp_path / "a")])
    assert code == 0, err
    code, _, err = run_main(["train", *COMMON, *flags, "--max-steps", "3", "--output-dir", str(tmp_path / "b")])
    assert code == 0, err
    code, _, err = run_main(["train", "--resume", "--output-dir", str(tmp_path / "b"), "--max-steps", "6",
                             "--quiet", "--no-final-test"])
    assert code == 0, err
    whole, resumed = load_checkpoint(tmp_path / "a" / "last.pt"), load_checkpoint(tmp_path / "b" / "last.pt")
    for name, tensor in whole["model"].items():  # the model's own gold is part of the exact resume
        torch.testing.assert_close(resumed["model"][name], tensor, rtol=0, atol=0)
    logged = {r["step"]: r["guided_loss"] for r in map(json.loads, (tmp_path / "a" / "metrics.jsonl").open())
              if "guided_loss" in r}
    assert logged[2] == 0 and logged[4] > 0 and logged[6] > 0  # steps 0-2 warm up (step 3 is the fourth)
    assert whole["config"]["guided"]["links"] == "self"


def test_the_alignment_lines_come_from_a_file_or_eflomal_never_from_self():
    cfg = RunConfig()
    assert cfg.guided.alignment_lines is None
    for value, lines in (("self", None), ("links.talp", "links.talp"), ("eflomal", "eflomal")):
        cfg.guided.links = value
        assert cfg.guided.alignment_lines == lines
