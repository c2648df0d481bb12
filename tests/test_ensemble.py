"""Ensembles: one EncoderDecoder whose next-token distribution is the mean of its members'."""
import math

import pytest
import torch

from seq2seq.config import DecodeConfig, ModelConfig, RunConfig
from seq2seq.decoding.ensemble import EnsembleModel
from seq2seq.decoding.generator import SearchBatch
from seq2seq.decoding.search import translate_batch
from seq2seq.errors import UserError
from seq2seq.models import build_model
from seq2seq.tokenizer import Tokenizer
from seq2seq.checkpoint.file import save_checkpoint
from seq2seq.checkpoint.parts import bytes_to_tensor
from test_models import BOS, EOS, make_model, trained_once, single


@pytest.fixture(scope="module")
def rnn():
    return trained_once("bahdanau", 25, 1e-2)


@pytest.fixture(scope="module")
def transformer():
    return trained_once("transformer-pre", 40, 1e-2)


def _mixture_log_prob(members, src, mask, tokens):
    """sum_t log(1/M sum_m p_m(y_t | y_<t, x)) by teacher forcing each member separately."""
    with torch.no_grad():
        per_member = torch.stack([m.eval()(src, mask, torch.tensor([[BOS] + tokens]))[0][0].log_softmax(-1)
                                  for m in members])  # (M, T+1, V)
    mixture = per_member.exp().mean(0).log()
    return mixture.gather(1, torch.tensor([tokens + [EOS]]).T).sum().item()


def _searches():
    return {
        name: lambda model, src, mask, decode=decode: translate_batch(model, SearchBatch(src, mask), decode)
        for name, decode in (("greedy", DecodeConfig(beam_size=1)), ("beam", DecodeConfig(beam_size=3, n_best=3)),
                             ("sample", DecodeConfig(sample=True, temperature=2.0, seed=4, n_best=2)))
    }


@pytest.mark.parametrize("search", ["greedy", "beam", "sample"])
@pytest.mark.parametrize("arch", ["rnn", "transformer"])
def test_an_ensemble_of_one_model_is_that_model_exactly(rnn, transformer, batch, search, arch):
    model = {"rnn": rnn, "transformer": transformer}[arch]
    decode = _searches()[search]
    alone, ensembled = decode(model, *batch), decode(EnsembleModel([model]), *batch)
    for hyps, same in zip(alone, ensembled):
        assert [h.tokens for h in hyps] == [h.tokens for h in same]
        assert [h.score for h in hyps] == [h.score for h in same]  # bit for bit
        assert [h.log_prob for h in hyps] == [h.log_prob for h in same]
        for h, s in zip(hyps, same):
            torch.testing.assert_close(h.attention, s.attention, rtol=0, atol=0)


@pytest.mark.parametrize("search", ["greedy", "beam", "sample"])
def test_an_ensemble_of_a_model_with_itself_is_the_model(transformer, batch, search):
    decode = _searches()[search]
    alone, twice = decode(transformer, *batch), decode(EnsembleModel([transformer, transformer]), *batch)
    for hyps, same in zip(alone, twice):
        assert [h.tokens for h in hyps] == [h.tokens for h in same]
        assert [h.score for h in hyps] == pytest.approx([h.score for h in same], abs=1e-5)
        for h, s in zip(hyps, same):
            torch.testing.assert_close(h.attention, s.attention)


def test_rnn_plus_transformer_first_step_is_the_mean_of_the_members_probabilities(rnn, transformer, batch):
    """log p_ens = log(1/2 (p_rnn + p_transformer)), checked on decode_step (whole vocabulary and a
    shortlist, each member with its own output rows) and on teacher-forced forward."""
    src, mask = batch
    ensemble = EnsembleModel([rnn, transformer]).eval()
    subset = torch.tensor([EOS, 4, 5, 7, 11])
    with torch.no_grad():
        bos = torch.full((src.size(0),), BOS)
        members = []
        for member in (rnn, transformer):
            memory = member.encode(src, mask)
            members.append(member.decode_step(memory, member.init_state(memory), bos, need_attention=False,
                                              output_weight=None)[0])
        memory = ensemble.encode(src, mask)
        logits, _, _ = ensemble.decode_step(memory, ensemble.init_state(memory), bos, need_attention=False)
        expected = (members[0].softmax(-1) + members[1].softmax(-1)).div(2).log()
        torch.testing.assert_close(logits.log_softmax(-1), expected, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(logits, expected, atol=1e-5, rtol=1e-5)  # already normalised

        rows = ensemble.output_rows(subset)  # one tensor per member
        restricted, _, _ = ensemble.decode_step(memory, ensemble.init_state(memory), bos, need_attention=False,
                                                output_weight=rows)
        expected = (members[0][:, subset].softmax(-1) + members[1][:, subset].softmax(-1)).div(2).log()
        torch.testing.assert_close(restricted.log_softmax(-1), expected, atol=1e-5, rtol=1e-5)

        tgt_in = torch.tensor([[BOS, 4, 5, 6]] * src.size(0))
        forced, attention = ensemble(src, mask, tgt_in, need_attention=True)
        expected = sum(m(src, mask, tgt_in)[0].softmax(-1) for m in (rnn, transformer)).div(2).log()
        torch.testing.assert_close(forced, expected, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(attention, rnn(src, mask, tgt_in, need_attention=True)[1])  # member 0's


@pytest.mark.parametrize("search", ["greedy", "beam", "sample"])
def test_mixed_ensemble_hypotheses_score_their_mixture_log_probability(rnn, transformer, batch, search):
    """Through state reordering (beam) and dropping finished rows, every hypothesis's log_prob is
    the teacher-forced log-probability of the mixture, and a sentence decodes as it does alone."""
    src, mask = batch
    ensemble = EnsembleModel([rnn, transformer])
    decode = _searches()[search]
    together = decode(ensemble, src, mask)
    assert ensemble.attention_layers == 1 and ensemble.attention_heads == 1  # member 0, the RNN
    for i, hyps in enumerate(together):
        for h in hyps:
            expected = _mixture_log_prob([rnn, transformer], *single(src, mask, i), h.tokens)
            assert h.log_prob == pytest.approx(expected, abs=1e-4)
            assert h.attention.shape == (1, 1, len(h.tokens) + 1, int(mask[i].sum()))
        if search != "sample":
            alone = decode(ensemble, *single(src, mask, i))[0]
            assert [h.tokens for h in alone] == [h.tokens for h in hyps]


def test_member_attention_and_position_limit(rnn, batch):
    src, mask = batch
    learned = make_model("transformer-learned").eval()  # max_positions 16
    ensemble = EnsembleModel([rnn, learned])
    assert ensemble.max_positions == 16 and EnsembleModel([rnn]).max_positions is None
    hyps = translate_batch(ensemble, SearchBatch(src, mask), DecodeConfig(beam_size=2, n_best=2), need_attention=False)
    members = ensemble.attach_member_attention(src, src_mask=mask, hyps=hyps)
    for i, (sentence, per_hyp) in enumerate(zip(hyps, members)):
        for h, (first, second) in zip(sentence, per_hyp):
            n, s = len(h.tokens) + 1, int(mask[i].sum())
            assert first.shape == (1, 1, n, s) and second.shape == (2, 4, n, s)
            assert h.attention is first
            torch.testing.assert_close(second.sum(-1), torch.ones(2, 4, n))


# ----------------------------------------------------------------------------- from checkpoints


def _save(path, tokenizer: Tokenizer, seed: int, **options):
    config = RunConfig(model=ModelConfig(vocab_size=tokenizer.vocab_size, **options)).resolved()
    torch.manual_seed(seed)
    model = build_model(config.model)
    save_checkpoint(path, {"config": config.to_dict(), "tokenizer": bytes_to_tensor(tokenizer.to_bytes()),
                           "model": model.state_dict()})
    return path


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, tiny_tokenizer):
    root = tmp_path_factory.mktemp("ensemble")
    other = Tokenizer.train(["ein zwei drei vier fünf", "one two three four five"] * 5, vocab_size=30)
    return {
        "rnn": _save(root / "rnn.pt", tiny_tokenizer, 1, arch="rnn", embed_dim=16, hidden_size=16,
                     decoder_hidden_size=32),
        "transformer": _save(root / "transformer.pt", tiny_tokenizer, 2, arch="transformer", d_model=16, heads=2,
                             ff_size=32, layers=2),
        "other": _save(root / "other.pt", other, 3, arch="transformer", d_model=16, heads=2, ff_size=32, layers=1),
    }


def test_translator_from_checkpoints(checkpoints):
    from seq2seq.decoding.translator import Translator

    sentences = ["twenty-one", "", "three hundred and five"]
    single = Translator.from_checkpoints([checkpoints["rnn"]], device="cpu")
    assert not isinstance(single.model, EnsembleModel)
    both = Translator.from_checkpoint([checkpoints["rnn"], checkpoints["transformer"]], device="cpu")
    assert isinstance(both.model, EnsembleModel) and both.checkpoints == [str(checkpoints["rnn"]),
                                                                           str(checkpoints["transformer"])]
    for beam_size in (1, 2):
        results = both.translate(sentences, beam_size=beam_size, n_best=beam_size, max_output_ratio=0.5)
        assert results[1].text == "" and results[1].member_attention is None
        for result in (results[0], results[2]):
            assert len(result.alternatives) == beam_size
            for alt in result.alternatives:
                rows, cols = len(alt.tgt_pieces), len(alt.src_pieces)
                first, second = alt.member_attention
                assert first.shape == (1, 1, rows, cols) and second.shape == (2, 2, rows, cols)
                assert (alt.attention == first).all()
    samples = both.translate(sentences, sample=True, n_best=3, seed=5, need_attention=False, max_output_ratio=0.5)
    again = both.translate(sentences, sample=True, n_best=3, seed=5, need_attention=False, max_output_ratio=0.5,
                           batch_size=1)
    assert [[a.text for a in r.alternatives] for r in samples] == [[a.text for a in r.alternatives] for r in again]
    assert all(math.isfinite(a.log_prob) for r in samples for a in r.alternatives)


def test_members_with_different_tokenizers_are_a_named_error(checkpoints):
    from seq2seq.decoding.translator import Translator

    with pytest.raises(UserError) as caught:
        Translator.from_checkpoints([checkpoints["rnn"], checkpoints["transformer"], checkpoints["other"]],
                                    device="cpu")
    message = str(caught.value)
    assert str(checkpoints["rnn"]) in message and str(checkpoints["other"]) in message
    assert "SentencePiece" in message
