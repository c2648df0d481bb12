"""The link classifier (issue 66, ``--guided-loss binary``): the full-context layer's scores read as one sigmoid per
(target, source) pair, trained by binary cross-entropy against the links, read out as probabilities (zero, one or
several links per word)."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from conftest import run_main
from test_guided_alignment import COMMON, SMALL_TRANSFORMER, monotone_links, random_batch, toy_alignment_file

from seq2seq.alignment.links import extract_links
from seq2seq.checkpoint.file import load_checkpoint
from seq2seq.config import GuidedConfig, ModelConfig, RunConfig
from seq2seq.decoding.translator import Translator
from seq2seq.errors import UserError
from seq2seq.models import build_model
from seq2seq.nn.alignment_loss import binary_link_loss
from seq2seq.toy import toy_corpus
from seq2seq.training.guided import GuidedTraining


def transformer(link_classifier: bool, layers: int = 2) -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = ModelConfig(arch="transformer", vocab_size=30, d_model=16, heads=2, ff_size=32, layers=layers,
                      dropout=0.0).with_arch_defaults()
    return build_model(cfg, layers - 2, link_classifier).eval()


def test_the_loss_counts_every_supervised_pair_and_skips_pairs_without_links():
    """By hand: p = 0.8 on the one link of row 0, 0.2 elsewhere; a row without links is all negatives; masked
    rows and columns and a pair without gold add nothing."""
    p = torch.full((2, 1, 3, 3), 0.2)
    p[0, 0, 0, 1] = 0.8
    gold = torch.zeros(2, 3, 3)
    gold[0, 0, 1] = 1.0  # pair 0: target 0 - source 1; target 1 unlinked; pair 1: no gold at all
    rows = torch.tensor([[True, True, False], [True, True, True]])  # target 2 of pair 0: its EOS
    columns = torch.tensor([[True, True, False], [True, True, True]])  # source 2 of pair 0: padding
    expected = -(math.log(0.8) + 3 * math.log(0.8))  # the link, then three non-links at 1 - 0.2
    torch.testing.assert_close(binary_link_loss(p, gold, rows, columns), torch.tensor(expected))
    perfect = torch.zeros(2, 1, 3, 3)
    perfect[0, 0, 0, 1] = 1.0
    assert binary_link_loss(perfect, gold, rows, columns).item() == 0.0  # exact 0 and 1: finite, zero


def test_link_probabilities_are_the_sigmoids_of_the_scores_a_softmax_normalizes():
    """The same weights with and without the classifier: the classifier's probabilities are sigmoid(s) of the
    scores whose softmax over the real source positions is the full-context attention; padding gets 0."""
    src, mask, tgt_in, _ = random_batch(batch=2, src_len=5, tgt_len=4)
    links, attention = transformer(True), transformer(False)
    _, p = links(src, mask, tgt_in, attention_layer=0)
    _, a = attention(src, mask, tgt_in, attention_layer=0)
    assert p.shape == a.shape == (2, 1, 2, 4, 5)
    assert (p[0, ..., -2:] == 0).all() and ((p[1] > 0) & (p[1] < 1)).all()
    scores = torch.logit(p[1].double())  # the real columns of sentence 1 (sentence 0 has two padded)
    torch.testing.assert_close(torch.softmax(scores, dim=-1).float(), a[1], atol=1e-5, rtol=1e-4)
    assert (p[1].sum(-1) - 1).abs().amax() > 1e-2  # rows are not distributions


def test_the_classifier_learns_zero_one_or_several_links_per_word():
    """Trained on one batch by the binary loss alone, the probabilities read out at 0.5 give back the gold: a
    row with two links, a row with none, rows with one (what no softmax row read by argmax can give)."""
    model = transformer(True).train()
    src, mask, tgt_in, _ = random_batch(batch=2, src_len=5, tgt_len=4)
    mask[:] = True
    gold = torch.zeros(2, 4, 5)
    gold[:, 0, 0] = 1.0
    gold[:, 1, [1, 3]] = 0.5  # two links
    gold[:, 3, 4] = 1.0  # row 2: no link at all
    tgt_out = torch.cat([tgt_in[:, 1:], torch.full((2, 1), 5)], 1)  # no EOS id (3): every row supervised
    guided = GuidedTraining(layer=0, heads=[0, 1], weight=1.0, binary=True)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(150):
        optimizer.zero_grad()
        _, p = model(src, mask, tgt_in, attention_layer=0)
        guided.loss(p, gold, tgt_out, mask).backward()
        optimizer.step()
    _, p = model.eval()(src, mask, tgt_in, attention_layer=0)
    for b in range(2):
        learned = extract_links(p[b, 0].mean(0).detach().numpy(), "probability")
        assert learned == {(0, 0), (1, 1), (3, 1), (4, 3)}


@pytest.mark.parametrize("guided, arch, message", [
    ({"links": "links.talp", "loss": "binary"}, "transformer", "give --full-context-alignment"),
    ({"links": "self", "loss": "binary", "full_context": True}, "transformer", "with --guided-alignment self"),
    ({"links": "links.talp", "loss": "binary", "full_context": True}, "rnn", "needs --arch transformer"),
])
def test_bad_combinations_are_named_errors(guided, arch, message):
    raw = RunConfig(model=ModelConfig(arch=arch, layers=3), guided=GuidedConfig(**guided)).to_dict()
    with pytest.raises(UserError, match=message):
        RunConfig.from_dict(raw).resolved("cpu")
    with pytest.raises(UserError, match="give --full-context-alignment too"):
        build_model(ModelConfig(arch="transformer", vocab_size=30, layers=2).with_arch_defaults(), None, True)


def test_a_binary_run_trains_and_aligns_with_probabilities_end_to_end(tmp_path):
    path = toy_alignment_file(tmp_path / "toy.talp", 200)
    code, _, err = run_main(["train", *COMMON, *SMALL_TRANSFORMER, "--toy-size", "200", "--max-steps", "12",
                             "--cache-dir", str(tmp_path / "cache"), "--output-dir", str(tmp_path / "run"),
                             "--guided-alignment", str(path), "--full-context-alignment", "--guided-loss", "binary"])
    assert code == 0, err
    config = RunConfig.from_dict(load_checkpoint(tmp_path / "run" / "best.pt")["config"])
    assert config.guided.link_classifier(config.model)
    train = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert all(r["guided_loss"] > 0 for r in train if r["kind"] == "train")
    assert Translator.from_checkpoint(tmp_path / "run", device="cpu").model.link_classifier

    test = toy_corpus(n_train=200, n_valid=20, n_test=20)["test"]
    (tmp_path / "test.en").write_text("\n".join(test["src"][:5]) + "\n", encoding="utf-8")
    (tmp_path / "test.de").write_text("\n".join(test["tgt"][:5]) + "\n", encoding="utf-8")
    (tmp_path / "gold.talp").write_text("".join(monotone_links(s, t) + "\n" for s, t in
                                                zip(test["src"][:5], test["tgt"][:5])), encoding="utf-8")
    code, out, err = run_main(["align", "--checkpoint", str(tmp_path / "run"), "--source", str(tmp_path / "test.en"),
                               "--target", str(tmp_path / "test.de"), "--gold", str(tmp_path / "gold.talp"),
                               "--align-method", "probability", "--output", str(tmp_path / "links.talp"),
                               "--json", "--device", "cpu"])
    assert code == 0, err
    assert 0.0 <= json.loads(out.strip().splitlines()[-1])["forward"]["aer"] <= 1.0
    assert len((tmp_path / "links.talp").read_text(encoding="utf-8").splitlines()) == 5
    code, _, err = run_main(["align", "--checkpoint", str(tmp_path / "run"), "--source", str(tmp_path / "test.en"),
                             "--target", str(tmp_path / "test.de"), "--align-method", "probability",
                             "--align-threshold", "1.5", "--device", "cpu"])
    assert code == 2 and "--align-threshold must be in (0, 1]" in err and "a link's probability" in err
    matrix = np.array([[0.9, 0.7, 0.1], [0.1, 0.2, 0.3]])
    assert extract_links(matrix, "probability") == {(0, 0), (1, 0)}  # two links, then none
