"""RNN encoder-decoder: bidirectional GRU/LSTM encoder, Bahdanau or Luong attention decoder.

Encoder: embeddings -> bidirectional multi-layer GRU/LSTM over packed sequences; its outputs
h_j = [h_j->; h_j<-] (2 * hidden_size) are the attention keys and values. The decoder's initial
state comes from the top layer's final states through a bridge s_0^l = tanh(W_l [h->; h<-] + b_l)
per decoder layer (LSTM: the same for the cell state, from the final cell states).

Decoders (one step function shared by teacher forcing and incremental decoding):

* Bahdanau et al. (2015): attention from the previous top state s_{t-1};
  s_t = RNN([E y_{t-1}; c_t], s_{t-1}); readout o_t = tanh(W_o [s_t; c_t; E y_{t-1}]) (a
  tanh layer in place of the paper's maxout, as in Nematus / Joey NMT); logits = W_out o_t.
* Luong et al. (2015), global attention: h_t = RNN([E y_{t-1}; h~_{t-1}], h_{t-1}) (input
  feeding, switchable); c_t from attention with the current top state h_t; attentional state
  h~_t = tanh(W_c [c_t; h_t]); logits = W_out h~_t. Without input feeding the decoder RNN runs
  fused over the whole target in ``forward``.

Output layer size: ``embed_dim`` when ``tie_embeddings`` (W_out is then the target embedding
matrix, no extra projection), else ``decoder_hidden_size``. With ``shares_source_embeddings`` (by
default the same as ``tie_embeddings``) source and target share one embedding table (joint vocabulary).

The attention distribution is a softmax of the scores, or sparsemax / 1.5-entmax
(``attention_normalizer``, ``seq2seq.nn.normalizers``), in training and decoding alike.
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from ..nn.attention import RecurrentAttention, build_score
from ..config import ModelConfig
from .base import EncoderDecoder
from ..nn.dropout import Dropout, dropout

Hidden = list  # per layer: h (B, H) for GRU, (h, c) for LSTM


def cudnn_would_run_fp16(x: torch.Tensor) -> bool:
    """Whether a fused GRU/LSTM call on ``x`` would silently run in fp16: PyTorch's CUDA autocast
    wrapper for cuDNN RNNs casts to fp16 whatever dtype autocast asks for, so under bf16 autocast
    (which has no gradient scaler) small gradients would underflow. (fp16 autocast is fp16 on
    purpose and scaled; CPU autocast leaves the fused RNNs in fp32.)"""
    return (x.device.type == "cuda" and torch.is_autocast_enabled("cuda")
            and torch.get_autocast_dtype("cuda") == torch.bfloat16)


def run_recurrence(rnn: nn.Module, x, *args):
    """``rnn(x, *args)`` for a fused nn.GRU / nn.LSTM, in fp32 outside autocast where cuDNN would
    otherwise run it in fp16 under bf16 autocast (``cudnn_would_run_fp16``)."""
    data = x.data if isinstance(x, torch.nn.utils.rnn.PackedSequence) else x
    if not cudnn_would_run_fp16(data):
        return rnn(x, *args)
    with torch.autocast(data.device.type, enabled=False):
        x = x.float() if isinstance(x, torch.Tensor) else x._replace(data=x.data.float())
        return rnn(x, *(tuple(t.float() for t in a) if isinstance(a, tuple) else a.float() for a in args))


class StackedRNN(nn.Module):
    """Multi-layer unidirectional GRU/LSTM, run fused over a sequence (``forward``) or one step at
    a time (``step``) with the same weights: the step calls ``torch.gru_cell`` / ``lstm_cell`` on
    the nn.GRU / nn.LSTM parameters (cheaper on CPU than nn.GRU on a length-1 sequence)."""

    def __init__(self, cell: str, input_size: int, hidden_size: int, layers: int, dropout: float) -> None:
        super().__init__()
        rnn = nn.LSTM if cell == "lstm" else nn.GRU
        self.rnn = rnn(input_size, hidden_size, layers, batch_first=True, dropout=dropout if layers > 1 else 0.0)
        self.lstm, self.layers, self.dropout = cell == "lstm", layers, dropout
        self.cells: nn.ModuleList | None = None  # per layer (W_ih, W_hh) linears, see split_cells

    def split_cells(self) -> None:
        """Step through one explicit (W_ih x + b_ih, W_hh h + b_hh) pair of nn.Linear per layer
        instead of the fused cell kernels, so that they can be quantized (``seq2seq.nn.quantize``)."""
        cells = nn.ModuleList()
        for w_ih, w_hh, b_ih, b_hh in self.rnn.all_weights:
            pair = nn.ModuleList([nn.Linear(w_ih.size(1), w_ih.size(0)), nn.Linear(w_hh.size(1), w_hh.size(0))])
            with torch.no_grad():
                for linear, weight, bias in zip(pair, (w_ih, w_hh), (b_ih, b_hh)):
                    linear.weight.copy_(weight), linear.bias.copy_(bias)
            cells.append(pair)
        self.cells = cells

    def _cell(self, layer: int, x: torch.Tensor, hidden):
        """One layer's step through the split linears (PyTorch's gate order and formulas):
        GRU r, z = sigmoid(i_r + h_r), sigmoid(i_z + h_z); n = tanh(i_n + r * h_n); h' = n + z (h - n).
        LSTM i, f, o = sigmoid(.), g = tanh(.) of i_x + h_x; c' = f c + i g; h' = o tanh(c')."""
        w_ih, w_hh = self.cells[layer]
        if self.lstm:
            h, c = hidden
            i, f, g, o = (w_ih(x) + w_hh(h)).chunk(4, -1)
            c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
            return torch.sigmoid(o) * torch.tanh(c), c
        i_r, i_z, i_n = w_ih(x).chunk(3, -1)
        h_r, h_z, h_n = w_hh(hidden).chunk(3, -1)
        n = torch.tanh(i_n + torch.sigmoid(i_r + h_r) * h_n)
        return n + torch.sigmoid(i_z + h_z) * (hidden - n)

    def step(self, x: torch.Tensor, hidden: Hidden) -> tuple[torch.Tensor, Hidden]:
        """x (B, input_size) -> top output (B, H), new hidden."""
        new = []
        for layer, weights in enumerate(self.rnn.all_weights):
            if self.cells is not None:
                out = self._cell(layer, x, hidden[layer])
                h = out[0] if self.lstm else out
            elif self.lstm:
                out = h, _ = torch.lstm_cell(x, hidden[layer], *weights)
            else:
                out = h = torch.gru_cell(x, hidden[layer], *weights)
            new.append(out)
            x = h if layer == self.layers - 1 else dropout(h, self.dropout, self.training)
        return x, new

    def forward(self, seq: torch.Tensor, hidden: Hidden) -> torch.Tensor:
        """seq (B, T, input_size) -> top outputs (B, T, H), fused over time (with split cells: step
        by step, so that teacher forcing computes what decoding does)."""
        if self.cells is not None:
            outputs = []
            for t in range(seq.size(1)):
                out, hidden = self.step(seq[:, t], hidden)
                outputs.append(out)
            return torch.stack(outputs, 1)
        if self.lstm:
            hx = (torch.stack([h for h, _ in hidden]), torch.stack([c for _, c in hidden]))  # (L, B, H)
        else:
            hx = torch.stack(hidden)  # (L, B, H)
        return run_recurrence(self.rnn, seq, hx)[0]

    def to_state(self, hidden: Hidden) -> dict:
        """Hidden -> batch-first state tensors {"h": (B, L, H)[, "c": (B, L, H)]}."""
        if self.lstm:
            return {"h": torch.stack([h for h, _ in hidden], 1), "c": torch.stack([c for _, c in hidden], 1)}
        return {"h": torch.stack(hidden, 1)}

    def from_state(self, state: dict) -> Hidden:
        if self.lstm:
            return list(zip(state["h"].unbind(1), state["c"].unbind(1)))
        return list(state["h"].unbind(1))


class RNNEncoder(nn.Module):
    """Bidirectional GRU/LSTM over packed (unsorted) sequences."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        rnn = nn.LSTM if cfg.rnn_cell == "lstm" else nn.GRU
        self.rnn = rnn(cfg.embed_dim, cfg.hidden_size, cfg.encoder_layers, batch_first=True,
                       bidirectional=True, dropout=cfg.dropout if cfg.encoder_layers > 1 else 0.0)

    def forward(self, emb: torch.Tensor, mask: torch.Tensor,
                lengths: torch.Tensor | None = None) -> tuple[torch.Tensor, dict]:
        """emb (B, S, E), mask (B, S) -> outputs (B, S, 2H) (0 on padding), final top-layer states
        {"final_h": (B, 2H)[, "final_c": (B, 2H)]}. Packing needs the lengths on the host: ``lengths``
        (B,) when the caller knows them there (training batches), else read from the mask (on a GPU,
        a device sync).

        The rows are sorted by length here, not by ``pack_padded_sequence(enforce_sorted=False)``:
        that copies its order to the GPU from pageable memory and reads the inverse order back, two
        host syncs per batch; here both orders go to the device from pinned memory, without waiting."""
        lengths = (mask.sum(1).cpu() if lengths is None else lengths).clamp(min=1)
        order = torch.argsort(lengths, descending=True, stable=True)  # host
        restore = torch.empty_like(order)
        restore[order] = torch.arange(len(order))
        sorted_lengths = lengths[order]
        order, restore = (_to_device(t, emb.device) for t in (order, restore))
        packed = pack_padded_sequence(emb.index_select(0, order), sorted_lengths, batch_first=True)
        out, final = run_recurrence(self.rnn, packed)
        out = pad_packed_sequence(out, batch_first=True, total_length=emb.size(1))[0].index_select(0, restore)
        finals = final if isinstance(final, tuple) else (final,)
        top = [f.index_select(1, restore).view(-1, 2, f.size(1), f.size(2))[-1] for f in finals]  # (2, B, H)
        states = {name: torch.cat([t[0], t[1]], dim=-1) for name, t in zip(("final_h", "final_c"), top)}
        return out, states


def _to_device(indices: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Host ``indices`` on ``device``; to a GPU through pinned memory, so the host does not wait
    (inside a compiled step a plain copy: the compiler cannot trace ``pin_memory``)."""
    if device.type != "cuda":
        return indices
    if torch.compiler.is_compiling():
        return indices.to(device)
    return indices.pin_memory().to(device, non_blocking=True)


class AttentionDecoder(nn.Module):
    """Common parts: stacked RNN, bridge from the encoder's final states, attention."""

    def __init__(self, cfg: ModelConfig, input_size: int) -> None:
        super().__init__()
        key_dim, hidden, layers = 2 * cfg.hidden_size, cfg.decoder_hidden_size, cfg.decoder_layers
        self.rnn = StackedRNN(cfg.rnn_cell, input_size, hidden, layers, cfg.dropout)
        self.bridge = nn.Linear(key_dim, layers * hidden)  # the per-layer W_l, stacked
        self.bridge_c = nn.Linear(key_dim, layers * hidden) if cfg.rnn_cell == "lstm" else None
        self.attention = RecurrentAttention(build_score(cfg.attention, hidden, key_dim), cfg.attention_normalizer)
        self.out_dim = cfg.embed_dim if cfg.tie_embeddings else hidden
        self.layers, self.hidden = layers, hidden

    def init_state(self, memory: dict, max_steps: int | None = None) -> dict:
        """s_0^l = tanh(W_l [h->; h<-] + b_l) for every decoder layer l (a state of fixed shape:
        ``max_steps`` changes nothing)."""
        batch = memory["final_h"].size(0)
        state = {"h": torch.tanh(self.bridge(memory["final_h"])).view(batch, self.layers, self.hidden)}
        if self.bridge_c is not None:
            state["c"] = torch.tanh(self.bridge_c(memory["final_c"])).view(batch, self.layers, self.hidden)
        return state

    def attend(self, memory: dict, query: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """query (B, H) -> context (B, 2H), weights (B, S). A memory of n = B / k sentences (beam
        search: k rows per sentence) is attended with each sentence's k queries as k positions."""
        sentences = memory["enc"].size(0)
        if query.dim() == 2 and query.size(0) != sentences:
            context, weights = self.attend(memory, query.view(sentences, -1, query.size(-1)))  # (n, k, .)
            return context.flatten(0, 1), weights.flatten(0, 1)
        return self.attention(query, memory["enc"], memory["src_mask"], memory.get("keys"))


class BahdanauDecoder(AttentionDecoder):
    """Attention from s_{t-1}; s_t = RNN([E y; c_t], s_{t-1}); o_t = tanh(W_o [s_t; c_t; E y])."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__(cfg, cfg.embed_dim + 2 * cfg.hidden_size)
        self.readout = nn.Linear(cfg.decoder_hidden_size + 2 * cfg.hidden_size + cfg.embed_dim, self.out_dim)

    def _step(self, memory: dict, hidden: Hidden, emb: torch.Tensor):
        top = hidden[-1][0] if self.rnn.lstm else hidden[-1]  # s_{t-1} (B, H)
        context, weights = self.attend(memory, top)  # (B, 2H), (B, S)
        s, hidden = self.rnn.step(torch.cat([emb, context], -1), hidden)
        return s, context, hidden, weights

    def _output(self, s: torch.Tensor, context: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.readout(torch.cat([s, context, emb], -1)))

    def forward(self, memory: dict, state: dict, emb: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """emb (B, T, E) -> features (B, T, out_dim), weights (B, T, S); readout after the loop."""
        hidden = self.rnn.from_state(state)
        states, contexts, weights = [], [], []
        for t in range(emb.size(1)):
            s, context, hidden, w = self._step(memory, hidden, emb[:, t])
            states.append(s), contexts.append(context), weights.append(w)
        return self._output(torch.stack(states, 1), torch.stack(contexts, 1), emb), torch.stack(weights, 1)

    def step(self, memory: dict, state: dict, emb: torch.Tensor) -> tuple[torch.Tensor, dict, torch.Tensor]:
        """emb (B, E) -> features (B, out_dim), new state, weights (B, S)."""
        s, context, hidden, weights = self._step(memory, self.rnn.from_state(state), emb)
        return self._output(s, context, emb), self.rnn.to_state(hidden), weights


class LuongDecoder(AttentionDecoder):
    """h_t = RNN([E y; h~_{t-1}], h_{t-1}); attention from h_t; h~_t = tanh(W_c [c_t; h_t])."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__(cfg, cfg.embed_dim + self._feed_size(cfg))
        self.input_feeding = cfg.input_feeding
        self.combine = nn.Linear(2 * cfg.hidden_size + cfg.decoder_hidden_size, self.out_dim, bias=False)

    @staticmethod
    def _feed_size(cfg: ModelConfig) -> int:
        if not cfg.input_feeding:
            return 0
        return cfg.embed_dim if cfg.tie_embeddings else cfg.decoder_hidden_size

    def init_state(self, memory: dict, max_steps: int | None = None) -> dict:
        state = super().init_state(memory)
        if self.input_feeding:
            state["feed"] = state["h"].new_zeros(state["h"].size(0), self.out_dim)  # h~_0 = 0
        return state

    def _attentional(self, memory: dict, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        context, weights = self.attend(memory, h)
        return torch.tanh(self.combine(torch.cat([context, h], -1))), weights

    def forward(self, memory: dict, state: dict, emb: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """emb (B, T, E) -> features h~ (B, T, out_dim), weights (B, T, S)."""
        hidden = self.rnn.from_state(state)
        if not self.input_feeding:  # no dependence on h~: run the RNN and attention over all t at once
            return self._attentional(memory, self.rnn(emb, hidden))
        feed, outputs, weights = state["feed"], [], []
        for t in range(emb.size(1)):
            h, hidden = self.rnn.step(torch.cat([emb[:, t], feed], -1), hidden)
            feed, w = self._attentional(memory, h)
            outputs.append(feed), weights.append(w)
        return torch.stack(outputs, 1), torch.stack(weights, 1)

    def step(self, memory: dict, state: dict, emb: torch.Tensor) -> tuple[torch.Tensor, dict, torch.Tensor]:
        """emb (B, E) -> features h~_t (B, out_dim), new state, weights (B, S)."""
        x = torch.cat([emb, state["feed"]], -1) if self.input_feeding else emb
        h, hidden = self.rnn.step(x, self.rnn.from_state(state))
        out, weights = self._attentional(memory, h)
        new_state = self.rnn.to_state(hidden)
        if self.input_feeding:
            new_state["feed"] = out
        return out, new_state, weights


class RNNEncoderDecoder(EncoderDecoder):
    """Bidirectional RNN encoder + Bahdanau or Luong attention decoder (see the module docstring)."""

    attention_layers = 1
    attention_heads = 1
    max_positions: int | None = None  # no length limit

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed_src = nn.Embedding(cfg.vocab_size, cfg.embed_dim, padding_idx=0)
        self.embed_tgt = (self.embed_src if cfg.shares_source_embeddings
                          else nn.Embedding(cfg.vocab_size, cfg.embed_dim, padding_idx=0))
        self.encoder = RNNEncoder(cfg)
        self.decoder = BahdanauDecoder(cfg) if cfg.attention == "bahdanau" else LuongDecoder(cfg)
        self.generator = nn.Linear(self.decoder.out_dim, cfg.vocab_size, bias=False)  # W_out
        self.dropout = Dropout(cfg.dropout)
        #: ``step_eager`` compiled for one sentence (``seq2seq.models.compiled.compile_decoding``), else None;
        #: the encoder (packed sequences, once per sentence) stays eager
        self.compiled_step = self.compiled_encode = None
        self.reset_parameters()
        if cfg.tie_embeddings:
            self.generator.weight = self.embed_tgt.weight  # out_dim == embed_dim by construction

    def reset_parameters(self) -> None:
        """Xavier-uniform linear layers with zero bias; recurrent weights keep PyTorch's
        uniform(+-1/sqrt(H)); embedding pad rows zero. The output layer starts like a tied one
        whatever the layout: a table that is W_out (tied) N(0, 1/E), an untied W_out N(0, 1/out_dim);
        an embedding table that is only an input N(0, 1).

        Why: Xavier gives an untied W_out a quarter of a tied table's scale and input-only
        embeddings a fraction of the useful one, and the untied layout then learns far more slowly
        (validation perplexities of each variant: docs/performance.md). The tied default is
        unchanged.
        """
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
        for embedding in {self.embed_src, self.embed_tgt}:
            is_output_layer = self.cfg.tie_embeddings and embedding is self.embed_tgt
            nn.init.normal_(embedding.weight, std=self.cfg.embed_dim ** -0.5 if is_output_layer else 1.0)
            with torch.no_grad():
                embedding.weight[0].zero_()
        if not self.cfg.tie_embeddings:
            nn.init.normal_(self.generator.weight, std=self.decoder.out_dim ** -0.5)

    def encode(self, src: torch.Tensor, src_mask: torch.Tensor, src_lengths: torch.Tensor | None = None) -> dict:
        enc, finals = self.encoder(self.dropout(self.embed_src(src)), src_mask, src_lengths)  # (B, S, 2H)
        memory = {"enc": enc, "src_mask": src_mask, **finals}
        keys = self.decoder.attention.project_keys(enc)  # once per sentence, not per step
        if keys is not enc:  # plain dot product: the keys are the encoder states themselves
            memory["keys"] = keys
        return memory

    def init_state(self, memory: dict, max_steps: int | None = None) -> dict:
        return self.decoder.init_state(memory)

    def decode_step(
        self, memory: dict, state: dict, tokens: torch.Tensor, need_attention: bool = True,
        output_weight: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, dict, torch.Tensor | None]:
        if self.compiled_step is not None and memory["enc"].size(0) == 1 and not torch.is_grad_enabled():
            return self.compiled_step(memory, state, tokens, need_attention, output_weight)  # one sentence
        return self.step_eager(memory, state, tokens, need_attention, output_weight)

    def step_eager(
        self, memory: dict, state: dict, tokens: torch.Tensor, need_attention: bool,
        output_weight: torch.Tensor | None,
    ) -> tuple[torch.Tensor, dict, torch.Tensor | None]:
        """``decode_step`` uncompiled: every shape fixed by the rows, the state and the source length (a
        beam's k rows attend to one sentence's memory), so ``compiled_step`` is this function compiled."""
        features, state, weights = self.decoder.step(memory, state, self.dropout(self.embed_tgt(tokens)))
        logits = self.logits(self.dropout(features), output_weight)  # (B, V) or (B, V')
        return logits, state, weights[:, None, None] if need_attention else None  # (B, 1, 1, S)

    def forward(
        self, src: torch.Tensor, src_mask: torch.Tensor, tgt_in: torch.Tensor, need_attention: bool = False,
        attention_layer: int | None = None, src_lengths: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        memory = self.encode(src, src_mask, src_lengths)
        emb = self.dropout(self.embed_tgt(tgt_in))  # (B, T, E), dropout once outside the time loop
        features, weights = self.decoder(memory, self.init_state(memory), emb)
        logits = self.generator(self.dropout(features))  # (B, T, V): one matmul for all steps
        wanted = need_attention or attention_layer is not None  # the one layer is every layer
        return logits, weights[:, None, None] if wanted else None  # (B, 1, 1, T, S)
