"""Guided alignment training (issue 36, part 2): the loss (zero at the gold, gradient only into the
supervised head), word links -> subword pieces, alignment lines through cleaning, named errors for
bad files, and end-to-end runs whose checkpoints make the alignment commands read the supervised head."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import run_main

from seq2seq.alignment.guided import GuidedAlignments, piece_gold, piece_words, word_start_table
from seq2seq.alignment.matrices import aggregate, word_spans
from seq2seq.checkpoint.file import load_checkpoint
from seq2seq.config import AlignConfig, GuidedConfig, ModelConfig, RunConfig
from seq2seq.data.cleaning import clean_corpus
from seq2seq.data.corpus import toy_eval_size
from seq2seq.data.guided import attach_alignment_lines
from seq2seq.data.prepare import encode_corpus
from seq2seq.decoding.translator import Translator
from seq2seq.errors import UserError
from seq2seq.jobs.compare.stats import forced_attentions
from seq2seq.models import build_model
from seq2seq.nn.alignment_loss import guided_alignment_loss
from seq2seq.toy import toy_corpus
from seq2seq.training.guided import GuidedTraining

COMMON = ["--device", "cpu", "--threads", "1", "--no-final-test", "--quiet", "--eval-max-sentences", "8",
          "--vocab-size", "120", "--warmup-steps", "5", "--eval-every", "10", "--log-every", "2"]
SMALL_TRANSFORMER = ["--d-model", "32", "--heads", "2", "--ff-size", "64", "--layers", "2"]


def monotone_links(src: str, tgt: str) -> str:
    """A Pharaoh line linking target word j to source word round(j (m - 1) / (n - 1)): a made-up but valid
    alignment of every pair (the toy corpus is number words, mostly monotone)."""
    m, n = len(src.split()), len(tgt.split())
    return " ".join(f"{round(j * (m - 1) / max(n - 1, 1))}-{j}" for j in range(n))


def toy_alignment_file(path: Path, size: int) -> Path:
    """One line per training pair of ``--toy-size size`` (the corpus the run will read, before cleaning)."""
    train = toy_corpus(n_train=size, n_valid=toy_eval_size(size), n_test=toy_eval_size(size))["train"]
    path.write_text("".join(monotone_links(s, t) + "\n" for s, t in zip(train["src"], train["tgt"])), encoding="utf-8")
    return path


# ----------------------------------------------------------------------------- the loss


def test_the_loss_is_zero_when_attention_equals_the_gold_and_positive_otherwise():
    gold = torch.zeros(2, 3, 4)
    gold[0, 0, 1] = 1.0
    gold[0, 1, :2] = 0.5  # a target piece linked to two source pieces
    gold[1, 0, 3] = 1.0  # row (0, 2) and rows (1, 1..2): no links, not supervised
    attention = torch.softmax(torch.randn(2, 1, 3, 4), -1)
    for b, t in ((0, 0), (0, 1), (1, 0)):
        attention[b, 0, t] = gold[b, t]
    assert guided_alignment_loss(attention, gold).item() == 0.0  # unsupervised rows do not count
    other = torch.softmax(torch.randn(2, 1, 3, 4), -1)
    expected = sum(float((gold[b, t] * (torch.log(gold[b, t].clamp_min(1e-30)) - torch.log(other[b, 0, t])))
                         .masked_fill(gold[b, t] == 0, 0).sum()) for b, t in ((0, 0), (0, 1), (1, 0)))
    assert guided_alignment_loss(other, gold).item() == pytest.approx(expected, rel=1e-5)  # KL, written out
    assert expected > 0
    # the mean of the supervised heads is compared: two heads averaging to the gold cost nothing
    two = torch.stack([gold, gold], 1)  # (B, heads, T, S)
    two[0, 0, 1] = torch.tensor([0.0, 1.0, 0.0, 0.0])
    two[0, 1, 1] = torch.tensor([1.0, 0.0, 0.0, 0.0])  # row (0, 1): mean of the heads = gold 0.5, 0.5
    assert guided_alignment_loss(two, gold).item() == pytest.approx(0.0, abs=1e-6)


def tiny_transformer(layers: int = 2, heads: int = 4) -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = ModelConfig(arch="transformer", vocab_size=30, d_model=16, heads=heads, ff_size=32, layers=layers,
                      dropout=0.0).with_arch_defaults()
    return build_model(cfg)


def random_batch(batch: int = 3, src_len: int = 5, tgt_len: int = 4):
    g = torch.Generator().manual_seed(1)
    src = torch.randint(4, 30, (batch, src_len), generator=g)
    tgt_in = torch.randint(4, 30, (batch, tgt_len), generator=g)
    mask = torch.ones(batch, src_len, dtype=torch.bool)
    mask[0, -2:] = False
    gold = torch.zeros(batch, tgt_len, src_len)
    gold[:, :, 0] = 0.5
    gold[:, :, 2] = 0.5
    gold[:, -1] = 0  # the EOS row: not supervised
    return src, mask, tgt_in, gold


def test_the_guided_gradient_flows_only_into_the_supervised_head():
    """Mutation caught: supervising the layer's mean of all heads, or another layer."""
    model = tiny_transformer(layers=2, heads=4)
    cfg = RunConfig(model=model.cfg, guided=GuidedConfig(links="links.talp", layer=-2, heads=[1]))
    guided = GuidedTraining.for_run(cfg, model)
    assert (guided.layer, guided.heads) == (0, [1])
    src, mask, tgt_in, gold = random_batch()
    _, attention = model(src, mask, tgt_in, attention_layer=guided.layer)
    assert attention.shape == (3, 1, 4, 4, 5)
    guided.loss(attention, gold).backward()
    d_k = 16 // 4
    cross = model.decoder[0].cross_attn
    q_rows = cross.q_proj.weight.grad.abs().sum(1).view(4, d_k).sum(1)  # per head
    k_rows = cross.kv_proj.weight.grad[:16].abs().sum(1).view(4, d_k).sum(1)
    assert q_rows[1] > 0 and k_rows[1] > 0
    assert q_rows[[0, 2, 3]].eq(0).all() and k_rows[[0, 2, 3]].eq(0).all()
    assert cross.kv_proj.weight.grad[16:].eq(0).all()  # values do not shape the weights
    assert cross.out_proj.weight.grad is None or cross.out_proj.weight.grad.eq(0).all()
    for parameter in model.decoder[1].parameters():  # the layer above: untouched
        assert parameter.grad is None or parameter.grad.eq(0).all()


def test_the_layer_asked_for_is_the_one_every_layer_returns():
    model = tiny_transformer(layers=3).eval()
    src, mask, tgt_in, _ = random_batch()
    _, every = model(src, mask, tgt_in, need_attention=True)
    for layer in range(3):
        _, one = model(src, mask, tgt_in, attention_layer=layer)
        torch.testing.assert_close(one, every[:, layer : layer + 1])
    rnn = build_model(ModelConfig(arch="rnn", vocab_size=30, embed_dim=8, hidden_size=8, decoder_hidden_size=8,
                                  dropout=0.0).with_arch_defaults()).eval()
    _, weights = rnn(src, mask, tgt_in, attention_layer=0)
    assert weights.shape == (3, 1, 1, 4, 5)


def test_the_supervised_heads_must_exist():
    model = tiny_transformer(layers=2, heads=4)
    cfg = RunConfig(model=model.cfg, guided=GuidedConfig(links="links.talp", heads=[4]))
    with pytest.raises(UserError, match=r"--guided-heads 4: .*4 head"):
        GuidedTraining.for_run(cfg, model)
    cfg.guided.links = None
    assert GuidedTraining.for_run(cfg, model) is None


# ----------------------------------------------------------------------------- words -> pieces


def test_word_links_become_uniform_rows_over_the_linked_words_pieces():
    # source "zwei hund ert" as pieces ▁zwei | ▁hund ert -> words 0, 1, 1 (and "▁ 7" = one word of two pieces)
    starts = np.array([False, True, True, False, True, False, True])  # ids 0..6; 1 2 4 6 start words
    src = np.array([2, 4, 5, 1, 0])  # ▁a | ▁b c | ▁d e  -> words 0 1 1 2 2
    tgt = np.array([6, 2, 3, 0])  # ▁x | ▁y z q -> words 0 1 1 1
    assert piece_words(src, starts).tolist() == [0, 1, 1, 2, 2]
    assert piece_words(tgt, starts).tolist() == [0, 1, 1, 1]
    links = np.array([[2, 0], [0, 1], [1, 1]])  # (source word, target word): x-d, y-a, y-b
    gold = piece_gold(links, piece_words(src, starts), piece_words(tgt, starts), n_src=3, n_tgt=2)
    expected = np.zeros((4, 5), np.float32)
    expected[0, 3:5] = 0.5  # x -> both pieces of d
    expected[1:4, 0:3] = 1 / 3  # every piece of y -> a and the two pieces of b
    np.testing.assert_allclose(gold, expected)
    no_link = piece_gold(np.array([[0, 1]]), piece_words(src, starts), piece_words(tgt, starts), 3, 2)
    assert no_link[0].sum() == 0 and np.allclose(no_link[1:].sum(1), 1)  # unlinked word: excluded row
    assert piece_gold(links, piece_words(src, starts), piece_words(tgt, starts), 4, 2) is None  # 3 != 4 words


def test_the_word_start_table_agrees_with_the_piece_to_word_merge(tiny_tokenizer):
    starts = word_start_table(tiny_tokenizer)
    for text in ["Ein Mädchen (7 Jahre alt) läuft über die Straße!", "three hundred and forty-five thousand",
                 "drei hundert fünf und vierzig tausend", "Der Preis beträgt 12,50 Euro – oder 15 Dollar?"]:
        ids = tiny_tokenizer.encode(text)
        owner = [w for w, (a, b) in enumerate(word_spans(tiny_tokenizer.pieces(ids))) for _ in range(a, b)]
        assert piece_words(np.array(ids), starts).tolist() == owner


def encoded_train(tokenizer, tmp_path: Path, pairs: list[tuple[str, str]], lines: list[str], max_len: int = 0):
    from datasets import Dataset, DatasetDict

    path = tmp_path / "train.talp"
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    raw = Dataset.from_dict({"src": [s for s, _ in pairs], "tgt": [t for _, t in pairs]})
    dd = DatasetDict({"train": attach_alignment_lines(raw, path)})
    cleaned, _ = clean_corpus(dd, max_len=max_len)
    return encode_corpus(cleaned, tokenizer)["train"], path


def test_a_batch_gold_maps_links_to_pieces_and_leaves_eos_and_padding_out(tiny_tokenizer, tmp_path):
    pairs = [("three hundred", "drei hundert"), ("forty-five", "fünf und vierzig")]
    train, path = encoded_train(tiny_tokenizer, tmp_path, pairs, ["0-0 1-1", "0-0 0-2"])
    guided = GuidedAlignments.from_split(train, tiny_tokenizer, str(path))
    src, tgt = [np.array(x) for x in train["src_ids"]], [np.array(x) for x in train["tgt_ids"]]
    shape = (max(map(len, tgt)) + 1, max(map(len, src)))  # tgt_in has BOS; sources end in EOS
    gold = guided.gold([0, 1], src, tgt, shape).numpy()
    assert gold.shape == (2, *shape)
    for b in range(2):
        t_words = piece_words(tgt[b], guided.starts)
        s_words = piece_words(src[b][:-1], guided.starts)
        assert gold[b, len(tgt[b]):].sum() == 0  # the EOS row and padding
        assert gold[b, :, len(src[b]) - 1:].sum() == 0  # the source EOS column and padding
        for t, word in enumerate(t_words):
            linked = {0: [0], 1: [1]}[word] if b == 0 else {0: [0], 1: [], 2: [0]}[word]
            expected = np.isin(s_words, linked) / max(np.isin(s_words, linked).sum(), 1)
            np.testing.assert_allclose(gold[b, t, : len(s_words)], expected, rtol=1e-6)


def test_with_null_a_linked_pairs_unlinked_words_attend_to_the_source_eos(tiny_tokenizer, tmp_path):
    """--guided-unaligned eos: the pieces of a target word without a link get their whole row on the source
    EOS (NULL); linked words keep their rows; a pair without any link stays unsupervised."""
    pairs = [("forty-five", "fünf und vierzig"), ("three hundred", "drei hundert")]
    train, path = encoded_train(tiny_tokenizer, tmp_path, pairs, ["0-0 0-2", ""])
    src, tgt = [np.array(x) for x in train["src_ids"]], [np.array(x) for x in train["tgt_ids"]]
    shape = (max(map(len, tgt)) + 1, max(map(len, src)))
    skip = GuidedAlignments.from_split(train, tiny_tokenizer, str(path)).gold([0, 1], src, tgt, shape).numpy()
    null = GuidedAlignments.from_split(train, tiny_tokenizer, str(path), null=True).gold([0, 1], src, tgt,
                                                                                        shape).numpy()
    eos = len(src[0]) - 1
    unlinked = piece_words(tgt[0], word_start_table(tiny_tokenizer)) == 1  # "und"
    assert unlinked.any() and (~unlinked).any()
    np.testing.assert_array_equal(null[0, : len(tgt[0]), eos], unlinked.astype(np.float32))
    np.testing.assert_array_equal(null[0, : len(tgt[0]), :eos], skip[0, : len(tgt[0]), :eos])
    np.testing.assert_allclose(null[0, : len(tgt[0])].sum(axis=1), 1.0)  # every row supervised
    assert null[0, len(tgt[0]):].sum() == 0 and null[1].sum() == 0  # the EOS row, padding; the pair without links


# ----------------------------------------------------------------------------- the file


def test_cleaning_drops_a_pairs_line_with_it(tiny_tokenizer, tmp_path):
    pairs = [("one", "eins"), ("one two three four five", "a b c d e"), ("", "leer"), ("two", "zwei"),
             ("six", "sechs")]
    lines = ["0-0", "0-0 4-4", "", "0-0", "0-0"]
    train, _ = encoded_train(tiny_tokenizer, tmp_path, pairs, lines, max_len=3)
    assert train["src"] == ["one", "two", "six"]
    assert train["align_line"] == [1, 4, 5]  # each kept pair keeps its own line and its number
    assert [lines[n - 1] for n in train["align_line"]] == train["align"]


@pytest.mark.parametrize("lines, message", [
    (["0-0", "0-0"], r"train\.talp has 2 lines but the training data has 3 sentence pairs"),
    (["0-0", "0-0", "0-0", "0-0"], r"has 4 lines but the training data has 3"),
    (["0-0", "0-0", "0-0 1:1"], r"train\.talp, line 3: bad alignment token '1:1'"),
    (["0-0", "0-1", "0-0"], r"train\.talp, line 2: link 0-1 is outside its sentence pair \(1 source x 1 target"),
    (["0-0", "0-0", "2?0"], r"train\.talp, line 3: link 2-0 is outside"),
])
def test_bad_alignment_files_are_named_errors(tiny_tokenizer, tmp_path, lines, message):
    pairs = [("one", "eins"), ("two", "zwei"), ("twenty one", "ein und zwanzig")]
    with pytest.raises(UserError, match=message):
        train, path = encoded_train(tiny_tokenizer, tmp_path, pairs, lines)
        GuidedAlignments.from_split(train, tiny_tokenizer, str(path))


def test_a_missing_file_and_streaming_are_named_errors(tmp_path):
    code, _, err = run_main(["train", *COMMON, "--toy-size", "50", "--cache-dir", str(tmp_path / "cache"),
                             "--output-dir", str(tmp_path / "run"), "--guided-alignment", str(tmp_path / "no.talp")])
    assert code == 2 and "--guided-alignment" in err and "no.talp: no such file" in err
    path = toy_alignment_file(tmp_path / "toy.talp", 50)
    code, _, err = run_main(["train", *COMMON, "--toy-size", "50", "--cache-dir", str(tmp_path / "cache"),
                             "--output-dir", str(tmp_path / "run"), "--guided-alignment", str(path), "--streaming"])
    assert code == 2 and "not --streaming" in err


@pytest.mark.parametrize("unaligned", ["skip", "eos"])
def test_the_training_batches_carry_the_null_rows_the_flag_asks_for(tmp_path, unaligned):
    """--guided-unaligned reaches the batches: with links only for each pair's first target word, the other
    words' rows sit on the source EOS with eos and are empty with skip."""
    from seq2seq.cli import config_from_flags
    from seq2seq.tokenizer import EOS_ID, PAD_ID
    from seq2seq.training.corpus import prepare_run_corpus

    train = toy_corpus(n_train=40, n_valid=toy_eval_size(40), n_test=toy_eval_size(40))["train"]
    path = tmp_path / "first.talp"
    path.write_text("0-0\n" * len(train), encoding="utf-8")
    cfg = config_from_flags(["--toy-size", "40", "--vocab-size", "120", "--cache-dir", str(tmp_path / "cache"),
                             "--output-dir", str(tmp_path / "run"), "--guided-alignment", str(path),
                             "--guided-unaligned", unaligned, "--device", "cpu"]).resolved()
    batch = next(prepare_run_corpus(cfg, tmp_path / "run", quiet=True).train_batches(0))
    on_eos = (batch.guide * (batch.src == EOS_ID)[:, None, :]).sum(dim=-1)  # (B, T) mass on each row's EOS
    supervised = batch.guide.sum(dim=-1) > 0
    words = int((batch.tgt_out != PAD_ID).sum()) - len(batch.tgt_out)  # target pieces, without the EOS rows
    if unaligned == "skip":
        assert on_eos.sum() == 0 and 0 < supervised.sum() < words
    else:  # every piece's row is supervised, an unlinked word's wholly on the EOS
        assert supervised.sum() == words and set(on_eos[supervised].tolist()) == {0.0, 1.0}
        assert torch.allclose(batch.guide.sum(dim=-1)[supervised], torch.ones(words))


# ----------------------------------------------------------------------------- end to end


@pytest.fixture(scope="module")
def guided_run(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("guided")
    path = toy_alignment_file(work / "toy.talp", 300)
    code, _, err = run_main(["train", *COMMON, *SMALL_TRANSFORMER, "--toy-size", "300", "--max-steps", "20",
                             "--cache-dir", str(work / "cache"), "--output-dir", str(work / "run"),
                             "--guided-alignment", str(path), "--guided-heads", "1", "--guided-alignment-weight",
                             "0.5"])
    assert code == 0, err
    return work / "run"


def test_a_guided_run_logs_its_alignment_loss_and_records_the_head(guided_run):
    records = [json.loads(line) for line in (guided_run / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["kind"] == "train"]
    assert len(train) == 10 and all(r["guided_loss"] > 0 for r in train)
    assert all("guided_loss" not in r for r in records if r["kind"] == "valid")
    config = RunConfig.from_dict(load_checkpoint(guided_run / "best.pt")["config"])
    assert config.guided.supervised_attention() == (-2, [1])
    assert config.guided.links.endswith("toy.talp")


def test_the_alignment_commands_default_to_the_supervised_head(guided_run, tmp_path):
    test = toy_corpus(n_train=300, n_valid=30, n_test=30)["test"]
    (tmp_path / "test.en").write_text("\n".join(test["src"][:6]) + "\n", encoding="utf-8")
    (tmp_path / "test.de").write_text("\n".join(test["tgt"][:6]) + "\n", encoding="utf-8")
    (tmp_path / "gold.talp").write_text("".join(monotone_links(s, t) + "\n" for s, t in
                                                zip(test["src"][:6], test["tgt"][:6])), encoding="utf-8")
    common = ["align", "--checkpoint", str(guided_run), "--source", str(tmp_path / "test.en"), "--target",
              str(tmp_path / "test.de"), "--gold", str(tmp_path / "gold.talp"), "--json", "--device", "cpu"]
    scores = {}
    for name, flags in (("default", []), ("head 1", ["--align-layer", "-2", "--align-heads", "1"]),
                        ("head 0", ["--align-layer", "-2", "--align-heads", "0"])):
        code, out, err = run_main(common + flags)
        assert code == 0, err
        scores[name] = json.loads(out.strip().splitlines()[-1])["forward"]
    assert scores["default"] == scores["head 1"]
    # seq2seq wordalign --method model aligns through the same path, so with the same head (it used to read layer
    # -2's mean of heads: AlignConfig() followed no model)
    links = {}
    for name, command in (("align", common[:7] + ["--align-heads", "1"]), ("mean", common[:7] + ["--align-heads",
                                                                                                  "mean"]),
                          ("wordalign", ["wordalign", "--method", "model", "--checkpoint", str(guided_run),
                                         "--source", str(tmp_path / "test.en"), "--target", str(tmp_path / "test.de"),
                                         "--device", "cpu"])):
        code, _, err = run_main(command + ["--output", str(tmp_path / f"{name}.talp")])
        assert code == 0, err
        links[name] = (tmp_path / f"{name}.talp").read_text(encoding="utf-8")
    assert links["wordalign"] == links["align"] != links["mean"]
    # ... and the Python API's translations, the comparison report's forced attention, attribution
    translator = Translator.from_checkpoint(guided_run, device="cpu")
    translation = translator.translate(test["src"][:1], beam_size=1, need_attention=True)[0]
    assert translation.supervised_attention == (-2, [1])
    assert translation.alignment_record(0).heads == [1]
    assert translation.alignment_record(0, heads="mean").heads == "mean"  # chosen: kept
    np.testing.assert_array_equal(translation.alignment, aggregate(translation.attention, -2, [1]))
    assert forced_attentions(translator, test["src"][:1], [translation.text])[0].heads == [1]
    code, _, err = run_main(["translate", "--checkpoint", str(guided_run), "--input", str(tmp_path / "test.en"),
                             "--output", str(tmp_path / "hyp"), "--alignments", str(tmp_path / "align.jsonl"),
                             "--device", "cpu", "--beam-size", "1"])
    assert code == 0, err
    record = json.loads((tmp_path / "align.jsonl").read_text().splitlines()[0])
    assert (record["layer"], record["layer_used"], record["heads"]) == (-2, 0, [1])


def test_align_config_follows_the_model_only_when_not_chosen():
    assert AlignConfig(model_default=True).for_model((-2, [3])).heads == [3]
    assert AlignConfig(model_default=True).for_model(None) == AlignConfig(model_default=True)
    assert AlignConfig().for_model((-2, [3])) == AlignConfig(heads=[3], model_default=False)  # the default follows
    assert AlignConfig(model_default=False).for_model((-2, [3])) == AlignConfig(model_default=False)
    assert AlignConfig(layer=1).for_model((-2, [3])) == AlignConfig(layer=1)  # a layer given in code is kept
    assert AlignConfig(heads=[0]).for_model((-2, [3])) == AlignConfig(heads=[0])
    chosen = AlignConfig.from_flags("-1", "mean")
    assert chosen.for_model((-2, [3])) == chosen


def test_a_guided_rnn_run_and_its_resume(tmp_path):
    path = toy_alignment_file(tmp_path / "toy.talp", 200)
    rnn = ["--arch", "rnn", "--embed-dim", "16", "--hidden-size", "16", "--decoder-hidden-size", "32",
           "--toy-size", "200", "--cache-dir", str(tmp_path / "cache"), "--guided-alignment", str(path)]
    code, _, err = run_main(["train", *COMMON, *rnn, "--max-steps", "6", "--output-dir", str(tmp_path / "a")])
    assert code == 0, err
    code, _, err = run_main(["train", *COMMON, *rnn, "--max-steps", "3", "--output-dir", str(tmp_path / "b")])
    assert code == 0, err
    code, _, err = run_main(["train", "--resume", "--output-dir", str(tmp_path / "b"), "--max-steps", "6",
                             "--quiet", "--no-final-test"])
    assert code == 0, err
    whole, resumed = load_checkpoint(tmp_path / "a" / "last.pt"), load_checkpoint(tmp_path / "b" / "last.pt")
    for name, tensor in whole["model"].items():  # the guided term is part of the exact resume
        torch.testing.assert_close(resumed["model"][name], tensor, rtol=0, atol=0)
    metrics = [json.loads(line) for line in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in metrics if "guided_loss" in r] == [2, 4, 6]


def test_eflomal_alignments_are_computed_once_and_cached(tmp_path):
    pytest.importorskip("eflomal")
    run = ["train", *COMMON, *SMALL_TRANSFORMER, "--toy-size", "200", "--max-steps", "2", "--cache-dir",
           str(tmp_path / "cache"), "--guided-alignment", "eflomal"]
    code, _, err = run_main(run + ["--output-dir", str(tmp_path / "a")])
    assert code == 0, err
    [links] = (tmp_path / "cache").glob("guided-eflomal-*.talp")
    assert len(links.read_text(encoding="utf-8").splitlines()) == 200  # a line per raw training pair
    written = links.stat().st_mtime_ns
    code, _, err = run_main(run + ["--output-dir", str(tmp_path / "b")])
    assert code == 0, err
    assert links.stat().st_mtime_ns == written  # reused, not recomputed
    saved = load_checkpoint(tmp_path / "b" / "last.pt")["config"]
    assert saved["guided"]["links"] == "eflomal" and saved["guided"]["heads"] == [0]
    links.write_text("".join(links.read_text(encoding="utf-8").splitlines(keepends=True)[:120]), encoding="utf-8")
    code, _, err = run_main(run + ["--output-dir", str(tmp_path / "c")])  # a truncated cache heals
    assert code == 0, err
    assert "cached eflomal alignments are damaged (120 lines for 200 training pairs)" in err
    assert len(links.read_text(encoding="utf-8").splitlines()) == 200


def test_the_rnn_align_preset_trains_its_attention_on_eflomal_links(tmp_path):
    """``--preset rnn-align``: the RNN's one attention guided by eflomal's links (computed at the start, weight 0.2,
    unlinked words on the source EOS), with nothing but the preset and a corpus."""
    pytest.importorskip("eflomal")
    code, _, err = run_main(["train", "--preset", "rnn-align", *COMMON, "--embed-dim", "16", "--hidden-size", "16",
                             "--decoder-hidden-size", "32", "--toy-size", "200", "--max-steps", "4", "--cache-dir",
                             str(tmp_path / "cache"), "--output-dir", str(tmp_path / "run")])
    assert code == 0, err
    assert len(list((tmp_path / "cache").glob("guided-eflomal-*.talp"))) == 1
    saved = load_checkpoint(tmp_path / "run" / "last.pt")["config"]
    assert (saved["model"]["arch"], saved["model"]["attention"]) == ("rnn", "bahdanau")
    assert {key: saved["guided"][key] for key in ("links", "weight", "unaligned")} == {
        "links": "eflomal", "weight": 0.2, "unaligned": "eos"}
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["guided_loss"] > 0 for r in metrics if "guided_loss" in r] == [True, True]


@pytest.mark.slow  # torchrun: two training processes
@pytest.mark.serial
def test_two_guided_processes_match_one_accumulating_process(tmp_path):
    """The guided term is normalised like the translation loss: DDP = accumulation over the same batches."""
    from test_distributed import ROOT, TINY, config_from_flags, torchrun

    from seq2seq.training.run import train

    path = toy_alignment_file(tmp_path / "toy.talp", 300)
    guided = [*TINY, "--guided-alignment", str(path), "--guided-alignment-weight", "1", "--cache-dir",
              str(tmp_path / "cache")]
    torchrun(str(ROOT / "train.py"), *guided, "--max-steps", "6", "--output-dir", str(tmp_path / "ddp"))
    threads = torch.get_num_threads()
    try:
        train(config_from_flags([*guided, "--accumulate", "2", "--max-steps", "6", "--output-dir",
                                 str(tmp_path / "single")]), quiet=True)
    finally:
        torch.set_num_threads(threads)
    ddp, single = (load_checkpoint(tmp_path / name / "last.pt")["model"] for name in ("ddp", "single"))
    for key, value in single.items():
        torch.testing.assert_close(ddp[key], value, rtol=1e-5, atol=1e-6, msg=key)
    logged = [json.loads(line) for line in (tmp_path / "ddp" / "metrics.jsonl").read_text().splitlines()]
    single_logged = [json.loads(line) for line in (tmp_path / "single" / "metrics.jsonl").read_text().splitlines()]
    assert [r["guided_loss"] for r in logged if r["kind"] == "train"] == pytest.approx(
        [r["guided_loss"] for r in single_logged if r["kind"] == "train"], rel=1e-5)


def test_guided_alignment_and_the_entropy_penalty_train_together(tmp_path):
    """Both attention terms in one step: the penalty reads every layer, guided slices its own layer; the
    guided loss is the one the guided-only run computes at the first step (same weights, same batch)."""
    path = toy_alignment_file(tmp_path / "toy.talp", 200)
    common = [*COMMON, *SMALL_TRANSFORMER, "--toy-size", "200", "--cache-dir", str(tmp_path / "cache"),
              "--guided-alignment", str(path), "--guided-heads", "1", "--max-steps", "2", "--log-every", "1"]
    first = {}
    for name, extra in (("guided", []), ("both", ["--attention-entropy-weight", "0.5"])):
        code, _, err = run_main(["train", *common, *extra, "--output-dir", str(tmp_path / name)])
        assert code == 0, err
        records = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
        first[name] = [r for r in records if r["kind"] == "train"][0]
    assert "attention_entropy" in first["both"] and "attention_entropy" not in first["guided"]
    assert first["both"]["guided_loss"] == pytest.approx(first["guided"]["guided_loss"], rel=1e-5)
    assert first["both"]["loss"] == pytest.approx(first["guided"]["loss"], rel=1e-5)  # loss stays the CE
