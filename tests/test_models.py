"""Models: each decoder learns a tiny task; incremental decoding equals teacher forcing; no state."""
import pytest
import torch
import torch.nn.functional as F

from seq2seq.config import ModelConfig
from seq2seq.errors import UserError
from seq2seq.models import build_model
from seq2seq.decoding.generator import SearchBatch
from seq2seq.decoding.search import greedy_search

PAD, BOS, EOS = 0, 2, 3
VOCAB = 12  # 4 specials + 8 symbols



RNN = dict(arch="rnn", embed_dim=32, hidden_size=32, decoder_hidden_size=64)
TRANSFORMER = dict(arch="transformer", d_model=32, heads=4, ff_size=64, layers=2)
VARIANTS = {
    "bahdanau": dict(RNN, attention="bahdanau"),
    "luong-dot": dict(RNN, attention="luong-dot"),
    "luong-general": dict(RNN, attention="luong-general"),
    "luong-concat": dict(RNN, attention="luong-concat"),
    "transformer-pre": dict(TRANSFORMER, norm_first=True),
    "transformer-post": dict(TRANSFORMER, norm_first=False),
    "transformer-learned": dict(TRANSFORMER, positional="learned", max_positions=16),
}
EXTRA = {  # only for the exactness tests
    "bahdanau-lstm-2layer": dict(RNN, attention="bahdanau", rnn_cell="lstm", decoder_layers=2, encoder_layers=2),
    "luong-no-feeding": dict(RNN, attention="luong-general", input_feeding=False),
    "luong-dot-lstm-no-feeding": dict(RNN, attention="luong-dot", rnn_cell="lstm", input_feeding=False,
                                      hidden_size=16, decoder_hidden_size=24),
    "luong-untied": dict(RNN, attention="luong-concat", tie_embeddings=False, decoder_layers=2),
    "transformer-untied": dict(TRANSFORMER, tie_embeddings=False),
    # clip 2 < the test sentences' lengths: decoding steps past the clipping distance are covered
    "transformer-relative": dict(TRANSFORMER, positional="relative", relative_clip=2),
    "transformer-relative-values": dict(TRANSFORMER, positional="relative", relative_clip=2, relative_values=True,
                                        norm_first=False),
    "transformer-rope": dict(TRANSFORMER, positional="rope"),
    # sparse attention (--attention-normalizer): the RNN's attention, the Transformer's cross-attention
    "bahdanau-sparsemax": dict(RNN, attention="bahdanau", attention_normalizer="sparsemax"),
    "luong-entmax15": dict(RNN, attention="luong-general", attention_normalizer="entmax15"),
    "transformer-sparsemax": dict(TRANSFORMER, attention_normalizer="sparsemax"),
    "transformer-entmax15": dict(TRANSFORMER, attention_normalizer="entmax15", norm_first=False),
}


def make_model(variant: str, dropout: float = 0.0, seed: int = 0, **overrides):
    """The ``variant``'s model (``VARIANTS``, ``EXTRA``), its options changed by ``overrides``."""
    torch.manual_seed(seed)
    options = {**VARIANTS, **EXTRA}[variant]
    return build_model(ModelConfig(vocab_size=VOCAB, dropout=dropout, **{**options, **overrides}))


def reverse_batch(n: int, generator: torch.Generator, min_len: int = 3, max_len: int = 6):
    """Source: symbols + EOS, right-padded; target: the symbols reversed. Returns src, mask, tgt_in, tgt_out."""
    lengths = torch.randint(min_len, max_len + 1, (n, 1), generator=generator)  # (n, 1)
    words = torch.randint(4, VOCAB, (n, max_len + 1), generator=generator)  # (n, max_len + 1)
    position = torch.arange(max_len + 1).unsqueeze(0)  # (1, max_len + 1)
    reversed_words = words.gather(1, (lengths - 1 - position).clamp(min=0))
    src = words.masked_fill(position >= lengths, PAD).masked_fill(position == lengths, EOS)
    tgt_out = reversed_words.masked_fill(position >= lengths, PAD).masked_fill(position == lengths, EOS)
    shifted = torch.cat([torch.full((n, 1), BOS), tgt_out[:, :-1]], 1)  # BOS + y (+ pad)
    tgt_in = shifted.masked_fill(shifted == EOS, PAD)
    return src, src != PAD, tgt_in, tgt_out


def single(src, mask, i):
    """Sentence ``i`` of a padded batch alone, without its padding: (1, len) ids and mask."""
    length = int(mask[i].sum())
    return src[i : i + 1, :length], mask[i : i + 1, :length]


def train(model, steps: int, lr: float, batch: int = 128, seed: int = 0):
    """Adam with a short linear warmup and a linear decay to 0 (stable last steps)."""
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    warmup = max(1, steps // 10)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min((step + 1) / warmup, (steps - step) / (steps - warmup)))
    model.train()
    for _ in range(steps):
        src, mask, tgt_in, tgt_out = reverse_batch(batch, generator)
        logits, _ = model(src, mask, tgt_in)
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), tgt_out.reshape(-1), ignore_index=PAD)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
    return model.eval()


def trained_once(variant: str, steps: int, lr: float, batch: int = 128, seed: int = 0):
    """``train(make_model(variant), ...)``, trained once per test run and shared by every file and
    worker (tests/run_shared.py): a fresh model in eval mode with those weights."""
    import run_shared

    def build(directory):
        torch.save(train(make_model(variant), steps, lr, batch, seed).state_dict(), directory / "model.pt")

    built = run_shared.built_once(f"reverse-{variant}-{steps}-{lr}-{batch}-{seed}", build)
    model = make_model(variant)
    model.load_state_dict(torch.load(built / "model.pt", weights_only=True))
    return model.eval()


def sequence_accuracy(model, n: int = 200) -> float:
    src, mask, _, tgt_out = reverse_batch(n, torch.Generator().manual_seed(1234))
    hyps = greedy_search(model, SearchBatch(src, mask), need_attention=False)
    correct = 0
    for i, (hyp,) in enumerate(hyps):
        length = int(mask[i].sum()) - 1
        correct += hyp.tokens == tgt_out[i, :length].tolist()
    return correct / n


LEARNING = {  # steps, peak learning rate (batch 128); all reach >= 0.95 over seeds 0-2
    "bahdanau": (100, 1e-2), "luong-dot": (100, 1e-2), "luong-general": (100, 1e-2),
    "luong-concat": (100, 1e-2), "transformer-pre": (150, 1e-2), "transformer-post": (150, 1e-2),
    "transformer-learned": (200, 1e-2),
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_learns_to_reverse(variant):
    steps, lr = LEARNING[variant]
    model = trained_once(variant, steps, lr)
    assert sequence_accuracy(model) >= 0.9


def _batch(seed: int = 0):
    src, mask, tgt_in, _ = reverse_batch(4, torch.Generator().manual_seed(seed), 1, 6)
    return src, mask, tgt_in


@pytest.mark.parametrize("variant", list(VARIANTS) + list(EXTRA))
def test_incremental_decoding_equals_teacher_forcing(variant):
    model = make_model(variant, dropout=0.3).eval()  # eval: dropout off
    src, mask, tgt_in = _batch()
    with torch.no_grad():
        logits, attention = model(src, mask, tgt_in, need_attention=True)
        fast_logits, none = model(src, mask, tgt_in)
        memory = model.encode(src, mask)
        state = model.init_state(memory)
        steps, weights = [], []
        for t in range(tgt_in.size(1)):
            step_logits, state, step_attention = model.decode_step(memory, state, tgt_in[:, t])
            steps.append(step_logits), weights.append(step_attention)
    layers, heads = model.attention_layers, model.attention_heads
    assert logits.shape == (4, tgt_in.size(1), VOCAB) and none is None
    assert attention.shape == (4, layers, heads, tgt_in.size(1), src.size(1))
    torch.testing.assert_close(fast_logits, logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(torch.stack(steps, 1), logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(torch.stack(weights, 3), attention, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(attention.sum(-1), torch.ones(attention.shape[:-1]))
    assert (attention.masked_select(~mask[:, None, None, None, :]) == 0).all()


@pytest.mark.parametrize("variant", list(VARIANTS) + list(EXTRA))
def test_a_memory_per_sentence_serves_k_rows_each_like_an_expanded_one(variant):
    """Beam search keeps one memory row per sentence for its k beams (base.py): decoding k rows
    per sentence from it equals decoding from the memory repeated k times, weights included."""
    model, k = make_model(variant).eval(), 3
    src, mask, tgt_in = _batch(3)
    expand = torch.arange(src.size(0)).repeat_interleave(k)
    from seq2seq.models.base import select_batch

    with torch.no_grad():
        memory = model.encode(src, mask)
        expanded = select_batch(memory, expand)
        state = select_batch(model.init_state(memory), expand)
        shared_state, rows = state, tgt_in[expand]
        for t in range(tgt_in.size(1)):
            logits, state, weights = model.decode_step(expanded, state, rows[:, t])
            shared_logits, shared_state, shared_weights = model.decode_step(memory, shared_state, rows[:, t])
            torch.testing.assert_close(shared_logits, logits, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(shared_weights, weights, atol=1e-5, rtol=1e-5)
        fast, _, none = model.decode_step(memory, shared_state, rows[:, -1], need_attention=False)
    assert none is None
    torch.testing.assert_close(fast, model.decode_step(expanded, state, rows[:, -1])[0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("variant", ["bahdanau", "luong-no-feeding", "transformer-pre"])
def test_modules_keep_no_state(variant):
    model = make_model(variant).eval()
    a, b = _batch(1), _batch(2)
    with torch.no_grad():
        first = model(*a, need_attention=True)
        model(*b, need_attention=True)
        memory = model.encode(*b[:2])
        model.decode_step(memory, model.init_state(memory), b[2][:, 0])
        again = model(*a, need_attention=True)
    torch.testing.assert_close(first[0], again[0])
    torch.testing.assert_close(first[1], again[1])


def test_training_mode_dropout_and_gradients():
    for variant in ("bahdanau", "transformer-pre"):
        model = make_model(variant, dropout=0.3).train()
        src, mask, tgt_in = _batch()
        logits, _ = model(src, mask, tgt_in)
        logits.logsumexp(-1).mean().backward()
        assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


def test_tied_embeddings_are_shared():
    for variant in ("bahdanau", "transformer-pre"):
        model = make_model(variant)
        shared = [p for p in model.parameters() if p.shape == (VOCAB, 32)]
        assert len(shared) == 1 and (shared[0][PAD] == 0).all()
        assert model.generator.weight is shared[0]
    untied = make_model("transformer-untied")
    assert sum(p.shape == (VOCAB, 32) for p in untied.parameters()) == 3


@pytest.mark.parametrize("base", [RNN, TRANSFORMER], ids=["rnn", "transformer"])
def test_source_embeddings_can_be_separate_from_tied_target_ones(base):
    """--no-share-source-embeddings: target in/out stay tied, the source gets its own table
    (the peers' configuration); the source table learns only from source tokens."""
    torch.manual_seed(0)
    model = build_model(ModelConfig(vocab_size=VOCAB, dropout=0.0, **base, share_source_embeddings=False))
    tables = [m for m in model.modules() if isinstance(m, torch.nn.Embedding)]
    assert len({id(t.weight) for t in tables}) == 2
    target = model.generator.weight
    source = next(t.weight for t in tables if t.weight is not target)
    shared = build_model(ModelConfig(vocab_size=VOCAB, dropout=0.0, **base))
    assert model.num_parameters() == shared.num_parameters() + VOCAB * source.size(1)
    src, mask, tgt_in = _batch()
    logits, _ = model(src, mask, tgt_in)
    logits.sum().backward()
    in_source = sorted(set(src[mask].tolist()))
    not_in_source = sorted(set(range(VOCAB)) - set(in_source))
    assert (source.grad[in_source].abs().sum(-1) > 0).all()  # source tokens learn in the source table
    assert (source.grad[not_in_source] == 0).all()  # no gradient from the output layer or target inputs
    assert (target.grad[not_in_source].abs().sum(-1) > 0).all()  # the output layer trains every row


@pytest.mark.parametrize("tie, share", [(True, True), (True, False), (False, False), (False, True)])
def test_rnn_init_scales_follow_the_role_of_each_table(tie, share):
    """The table that is W_out starts at N(0, 1/E), an untied W_out at N(0, 1/out_dim), a table
    that is only an input at N(0, 1) (the untied RNN learned 4x slower in perplexity with Xavier
    W_out and N(0, 1/E) inputs). Pad rows are zero."""
    torch.manual_seed(0)
    embed = 256
    model = build_model(ModelConfig(arch="rnn", vocab_size=4000, embed_dim=embed, hidden_size=32,
                                    decoder_hidden_size=64, tie_embeddings=tie, share_source_embeddings=share))
    for table in {model.embed_src, model.embed_tgt}:
        expected = embed ** -0.5 if table.weight is model.generator.weight else 1.0
        assert table.weight[1:].std().item() == pytest.approx(expected, rel=0.02)
        assert (table.weight[PAD] == 0).all()
    out_dim = model.generator.weight.size(1)  # E when tied, the decoder size (64) when not
    assert model.generator.weight.std().item() == pytest.approx(out_dim ** -0.5, rel=0.02)


@pytest.mark.parametrize("tie", [True, False], ids=["tied", "untied"])
def test_transformer_output_layer_starts_like_a_tied_one(tie):
    """W_out ~ N(0, 1/d_model) whether or not it is the embedding table (untied Xavier over
    d_model + V would be 4x smaller at V = 8k and learned slower)."""
    torch.manual_seed(0)
    model = build_model(ModelConfig(arch="transformer", vocab_size=4000, d_model=64, heads=4, ff_size=64,
                                    layers=1, tie_embeddings=tie))
    assert (model.generator.weight is model.tgt_embed.tokens.weight) == tie
    assert model.generator.weight[1:].std().item() == pytest.approx(64 ** -0.5, rel=0.02)


def test_share_source_embeddings_defaults_to_tie_embeddings():
    assert ModelConfig().shares_source_embeddings
    assert not ModelConfig(tie_embeddings=False).shares_source_embeddings  # checkpoints before the flag
    assert ModelConfig(tie_embeddings=False, share_source_embeddings=True).shares_source_embeddings


def test_learned_positions_reject_long_inputs():
    model = make_model("transformer-learned").eval()
    src = torch.full((1, 20), 5)
    with pytest.raises(UserError, match="max-positions"):
        model.encode(src, src != PAD)


def test_bad_config_fails_loudly():
    with pytest.raises(UserError):
        build_model(ModelConfig(arch="rnn", attention="luong", vocab_size=VOCAB))
    with pytest.raises(UserError):
        build_model(ModelConfig(arch="transformer", d_model=30, heads=4, vocab_size=VOCAB))
    with pytest.raises(UserError):
        build_model(ModelConfig(arch="transformer", vocab_size=0))


@pytest.mark.parametrize("flags, shared", [([], True), (["--no-share-source-embeddings"], False),
                                           (["--no-tie-embeddings"], False),
                                           (["--no-tie-embeddings", "--share-source-embeddings"], True)])
def test_embedding_sharing_flags(flags, shared):
    from seq2seq.cli import config_from_flags

    assert config_from_flags(flags).model.shares_source_embeddings is shared


def test_fused_recurrence_leaves_autocast_where_cudnn_would_run_fp16(monkeypatch):
    """Under bf16 autocast on CUDA, cuDNN's RNN wrapper would run the GRU/LSTM in fp16 without loss
    scaling; the encoder and the fused decoder RNN then run in fp32 outside autocast. Simulated on
    CPU by making the check true: the recurrent calls see autocast off and fp32 inputs."""
    from seq2seq.models import rnn as rnn_module

    model = make_model("luong-no-feeding").eval()
    seen = []
    for module in (model.encoder.rnn, model.decoder.rnn.rnn):
        module.register_forward_pre_hook(lambda m, args: seen.append(
            (torch.is_autocast_enabled("cpu"), (args[0].data if hasattr(args[0], "batch_sizes") else args[0]).dtype)))
    src, mask, tgt_in, _ = reverse_batch(4, torch.Generator().manual_seed(1))
    assert not rnn_module.cudnn_would_run_fp16(torch.zeros(1))  # a CPU tensor: nothing to avoid
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        model(src, mask, tgt_in)
        assert seen == [(True, torch.float32)] * 2  # CPU autocast keeps fused RNNs in fp32 by itself
        seen.clear()
        monkeypatch.setattr(rnn_module, "cudnn_would_run_fp16", lambda x: True)
        logits, _ = model(src, mask, tgt_in)
    assert seen == [(False, torch.float32)] * 2 and torch.isfinite(logits).all()
