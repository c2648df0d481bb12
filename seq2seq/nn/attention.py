"""Attention: masks, scaled dot-product, recurrent score functions, multi-head attention.

Masks are boolean with True = may attend (keep). Attention weights on masked positions are
exactly 0, and a row with nothing to attend to gives zero weights (never NaN). The weights are a
softmax of the scores, or for the RNN's attention and the Transformer's cross-attention optionally
sparsemax or 1.5-entmax (``--attention-normalizer``, :mod:`seq2seq.nn.normalizers`).

Nothing here keeps state on ``self`` between calls: projected keys and key/value caches are
returned to the caller (the model puts them in its ``memory`` / ``state`` dicts), so modules are
safe under beam reordering and concurrent use.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from .dropout import dropout as cheap_dropout
from .normalizers import get_normalizer, masked_sigmoid, masked_softmax
from ..errors import UserError
from ..tokenizer import PAD_ID


# --------------------------------------------------------------------------- masks


def padding_mask(x: torch.Tensor, max_len: int | None = None) -> torch.Tensor:
    """True on real tokens. ``x`` is either lengths (batch,) or token ids (batch, len) padded with 0."""
    if x.dim() == 2:
        return x != PAD_ID  # (batch, len)
    if x.dim() != 1:
        raise ValueError(f"padding_mask expects lengths (batch,) or ids (batch, len), got {tuple(x.shape)}")
    width = int(x.max().item()) if max_len is None else max_len
    return torch.arange(width, device=x.device).unsqueeze(0) < x.unsqueeze(1)  # (batch, len)


def causal_mask(n: int, device: torch.device | str | None = None) -> torch.Tensor:
    """(n, n) lower-triangular mask: position i may attend to positions j <= i."""
    return torch.ones(n, n, dtype=torch.bool, device=device).tril()


def attention_weights(
    query: torch.Tensor, key: torch.Tensor, mask: torch.Tensor | None = None, bias: torch.Tensor | None = None,
    normalize=masked_softmax,
) -> torch.Tensor:
    """softmax(Q K^T / sqrt(d_k) + bias) over the last dim: query (..., Tq, d_k), key (..., Tk, d_k),
    mask and bias broadcastable to (..., Tq, Tk) -> weights (..., Tq, Tk). ``bias`` is added after
    the scaling, as the float ``attn_mask`` of ``F.scaled_dot_product_attention`` is. ``normalize``
    (scores, mask) -> weights replaces the softmax (``seq2seq.nn.normalizers``)."""
    scores = query @ key.transpose(-2, -1) / math.sqrt(query.size(-1))  # (..., Tq, Tk)
    return normalize(scores if bias is None else scores + bias, mask)


def scaled_dot_product(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None = None,
                       dropout: float = 0.0, bias: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(Q K^T / sqrt(d_k) + bias) V over the last two dims, any leading (batch, head) dims.

    query (..., Tq, d_k), key (..., Tk, d_k), value (..., Tk, d_v), mask and bias broadcastable to
    (..., Tq, Tk). Returns context (..., Tq, d_v) and the weights (..., Tq, Tk); ``dropout`` is
    applied to the weights used for the context only (the returned weights are the distribution).
    """
    weights = attention_weights(query, key, mask, bias)
    dropped = cheap_dropout(weights, dropout, training=True)
    return dropped @ value, weights


# ------------------------------------------------------------- recurrent attention scores


class Score(nn.Module):
    """Score of a decoder state (query) against every encoder state (key).

    ``project_keys(keys)`` holds the query-independent part and is computed once per sentence
    (in ``encode``); ``score(query, keys, projected_keys)`` is cheap per decoder step. The query
    is (B, Dq) -> scores (B, S), or (B, T, Dq) -> (B, T, S) for all target steps at once.
    """

    def project_keys(self, keys: torch.Tensor) -> torch.Tensor:
        return keys

    def score(
        self, query: torch.Tensor, keys: torch.Tensor, projected_keys: torch.Tensor | None = None
    ) -> torch.Tensor:
        projected = self.project_keys(keys) if projected_keys is None else projected_keys
        if query.dim() == 2:
            return self._score(query.unsqueeze(1), projected).squeeze(1)  # (B, S)
        return self._score(query, projected)  # (B, T, S)

    def _score(self, query: torch.Tensor, projected: torch.Tensor) -> torch.Tensor:
        """query (B, T, Dq), projected keys (B, S, .) -> (B, T, S)."""
        raise NotImplementedError


class AdditiveScore(Score):
    """Bahdanau et al. (2015): score(s, h) = v^T tanh(W s + U h); U h is precomputed.

    Evaluated as 2 v^T sigmoid(2 (W s + U h)) - sum_i v_i, the same numbers since
    tanh(x) = 2 sigmoid(2x) - 1: PyTorch's CPU sigmoid is several times faster than its tanh, and
    this is the largest elementwise tensor of the RNN (docs/performance.md). ``project_keys``
    therefore returns 2 U h.
    """

    def __init__(self, query_dim: int, key_dim: int, hidden: int) -> None:
        super().__init__()
        self.query_proj = nn.Linear(query_dim, hidden, bias=False)  # W
        self.key_proj = nn.Linear(key_dim, hidden, bias=True)  # U (its bias is the layer's bias)
        self.v = nn.Linear(hidden, 1, bias=False)
        self.v.keep_float = True  # its weight is read directly below: not quantized (seq2seq.nn.quantize)

    def project_keys(self, keys: torch.Tensor) -> torch.Tensor:
        return 2 * self.key_proj(keys)  # (B, S, hidden): 2 U h, once per sentence

    def _score(self, query: torch.Tensor, projected: torch.Tensor) -> torch.Tensor:
        # keys first: with T = 1 (a decoding step) this order is faster on CPU, at training shapes
        # the same speed (same numbers either way; docs/performance.md)
        energy = projected.unsqueeze(1) + (2 * self.query_proj(query)).unsqueeze(2)  # (B, T, S, hidden)
        gate = energy.sigmoid_()  # in place: sigmoid's backward needs only its output
        return 2 * self.v(gate).squeeze(-1) - self.v.weight.sum()  # (B, T, S)


class ConcatScore(AdditiveScore):
    """Luong et al. (2015) concat: score(s, h) = v^T tanh(W [s; h]) = v^T tanh(W_s s + W_h h).

    W is split into its s and h halves so that W_h h is precomputed; the form is the same as
    Bahdanau's additive score (which is why it shares the implementation).
    """


class DotScore(Score):
    """Luong et al. (2015) dot: score(s, h) = s^T h.

    When the key size differs from the query size (bidirectional encoder 2H vs decoder size),
    keys are first mapped to the query size by a bias-free linear layer, once per sentence:
    score(s, h) = s^T (P h). With 2 * hidden_size == decoder_hidden_size there is no projection.
    """

    scale: bool = False

    def __init__(self, query_dim: int, key_dim: int, always_project: bool = False) -> None:
        super().__init__()
        project = always_project or key_dim != query_dim
        self.key_proj = nn.Linear(key_dim, query_dim, bias=False) if project else None

    def project_keys(self, keys: torch.Tensor) -> torch.Tensor:
        return keys if self.key_proj is None else self.key_proj(keys)  # (B, S, Dq)

    def _score(self, query: torch.Tensor, projected: torch.Tensor) -> torch.Tensor:
        scores = query @ projected.transpose(1, 2)  # (B, T, S)
        return scores / math.sqrt(query.size(-1)) if self.scale else scores


class GeneralScore(DotScore):
    """Luong et al. (2015) general: score(s, h) = s^T W h; W h is precomputed."""

    def __init__(self, query_dim: int, key_dim: int) -> None:
        super().__init__(query_dim, key_dim, always_project=True)  # key_proj is W


class ScaledDotScore(DotScore):
    """Vaswani et al. (2017) scaled dot: score(s, h) = s^T h / sqrt(d) (keys projected as for dot)."""

    scale = True


class CosineScore(DotScore):
    """Cosine similarity with a learned sharpness g (Graves et al. 2014, "key strength"):
    score(s, h) = g * s^T h / (|s| |h|). Normalised keys are precomputed; g starts at 5 so that
    the softmax over scores in [-g, g] is not nearly uniform at initialisation."""

    def __init__(self, query_dim: int, key_dim: int) -> None:
        super().__init__(query_dim, key_dim)
        self.gain = nn.Parameter(torch.tensor(5.0))

    def project_keys(self, keys: torch.Tensor) -> torch.Tensor:
        return F.normalize(super().project_keys(keys), dim=-1)  # (B, S, Dq) unit vectors

    def _score(self, query: torch.Tensor, projected: torch.Tensor) -> torch.Tensor:
        return self.gain * (F.normalize(query, dim=-1) @ projected.transpose(1, 2))  # (B, T, S)


SCORES = ("bahdanau", "luong-dot", "luong-general", "luong-concat", "scaled-dot", "cosine")


def build_score(name: str, query_dim: int, key_dim: int, hidden: int | None = None) -> Score:
    """Score module by name (one of ``SCORES``); ``hidden`` is the additive layer size."""
    hidden = hidden or query_dim
    if name == "bahdanau":
        return AdditiveScore(query_dim, key_dim, hidden)
    if name == "luong-concat":
        return ConcatScore(query_dim, key_dim, hidden)
    simple = {"luong-dot": DotScore, "luong-general": GeneralScore, "scaled-dot": ScaledDotScore,
              "cosine": CosineScore}
    if name not in simple:
        raise UserError(f"--attention must be one of {', '.join(SCORES)}, got {name!r}")
    return simple[name](query_dim, key_dim)


class RecurrentAttention(nn.Module):
    """One attention distribution per decoder state: a = softmax(score(s, h)), c = sum_j a_j h_j;
    ``normalizer`` sparsemax or entmax15 replaces the softmax (``seq2seq.nn.normalizers``)."""

    def __init__(self, score: Score, normalizer: str = "softmax") -> None:
        super().__init__()
        self.scorer = score
        self.normalizer, self.normalize = normalizer, get_normalizer(normalizer)

    def project_keys(self, keys: torch.Tensor) -> torch.Tensor:
        """Query-independent part of the score, computed once per sentence."""
        return self.scorer.project_keys(keys)

    def forward(
        self,
        query: torch.Tensor,
        values: torch.Tensor,
        mask: torch.Tensor,
        projected_keys: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """query (B, Dq) or (B, T, Dq); values = keys (B, S, Dk); mask (B, S) True = real token.

        Returns context (B, Dk) and weights (B, S) (or (B, T, Dk) and (B, T, S)).
        """
        scores = self.scorer.score(query, values, projected_keys)
        step = query.dim() == 2
        weights = self.normalize(scores, mask if step else mask.unsqueeze(1))
        if step:
            return torch.bmm(weights.unsqueeze(1), values).squeeze(1), weights  # (B, Dk), (B, S)
        return torch.bmm(weights, values), weights  # (B, T, Dk), (B, T, S)


# ------------------------------------------------------------------ positions in self-attention


class RelativePositions(nn.Module):
    """Shaw et al. (2018): learned embeddings of the clipped distance r_ij = clip(j - i, -k, k)
    between query position i and key position j, one table shared by the heads of a layer:

        logit_ij = q_i . (k_j + a^K_ij) / sqrt(d_k),   z_i = sum_j w_ij (v_j + a^V_ij)

    with a^K_ij = A^K[r_ij] and, if ``values``, a^V_ij = A^V[r_ij] (else a^V = 0). Distances past
    +-k share the embedding of +-k. Neither term builds a (Tq, Tk, d_k) tensor of embeddings: the
    2k + 1 distinct distances are scored once and gathered, and the weights are summed per distance
    before meeting A^V.
    """

    def __init__(self, d_k: int, clip: int, values: bool = False) -> None:
        super().__init__()
        self.clip = clip
        self.keys = nn.Embedding(2 * clip + 1, d_k)  # A^K, row r + k for distance r
        self.values = nn.Embedding(2 * clip + 1, d_k) if values else None  # A^V

    def distances(self, queries: int, keys: int, device: torch.device,
                  first_query: torch.Tensor | None = None) -> torch.Tensor:
        """(Tq, Tk) table rows r_ij + k, for self-attention queries at the last Tq of the key
        positions 0 .. Tk - 1 (i = Tk - Tq + t: the offset is the cache length when decoding), or at
        ``first_query`` + t (a tensor: a preallocated cache, whose later keys are masked)."""
        first = keys - queries if first_query is None else first_query
        i = (first + torch.arange(queries, device=device)).unsqueeze(1)
        j = torch.arange(keys, device=device).unsqueeze(0)
        return (j - i).clamp(-self.clip, self.clip) + self.clip

    def key_logits(self, query: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """q_i . a^K_ij: query (..., Tq, d_k), rows (Tq, Tk) -> (..., Tq, Tk), as q A^K^T (one
        logit per distance, (..., Tq, 2k + 1)) gathered at each pair's distance."""
        per_distance = query @ self.keys.weight.T  # (..., Tq, 2k + 1)
        return per_distance.gather(-1, rows.expand(*query.shape[:-1], rows.size(-1)))

    def value_context(self, weights: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """sum_j w_ij a^V_ij = sum_r (sum_{j: r_ij = r} w_ij) A^V[r]: weights (..., Tq, Tk) ->
        (..., Tq, d_k)."""
        per_distance = weights.new_zeros(*weights.shape[:-1], self.values.num_embeddings)  # (..., Tq, 2k + 1)
        per_distance = per_distance.scatter_add(-1, rows.expand_as(weights), weights)
        return per_distance @ self.values.weight


def rotate(x: torch.Tensor, start: int | torch.Tensor = 0, base: float = 10000.0) -> torch.Tensor:
    """Rotary positions (RoPE, Su et al. 2021): x (..., T, d) at positions p = start .. start + T - 1,
    each feature pair (x_m, x_{m + d/2}) rotated by the angle p theta_m, theta_m = base^(-2m / d).
    ``start`` may be a one-element tensor (a compiled decoding step reads no number on the host).

    Rotations compose, R_i^T R_j = R_{j - i}, so (R_i q) . (R_j k) = q . R_{j - i} k: the logit of a
    rotated query and key depends on their positions only through j - i. No parameters."""
    half, dtype = x.size(-1) // 2, torch.promote_types(x.dtype, torch.float32)  # angles in fp32 at least
    position = (start + torch.arange(x.size(-2), device=x.device)).to(dtype)
    theta = base ** (-2.0 * torch.arange(half, device=x.device, dtype=dtype) / x.size(-1))
    angle = position.unsqueeze(1) * theta  # (T, d/2)
    cos, sin = angle.cos().to(x.dtype), angle.sin().to(x.dtype)
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


# --------------------------------------------------------------------- multi-head attention


FUSED_BACKENDS = (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH)
"""The kernels ``F.scaled_dot_product_attention`` may pick here: every backend but cuDNN attention.
PyTorch prefers cuDNN attention for fp16/bf16 on Hopper GPUs, and it builds an execution plan for
every new (batch, heads, lengths) shape: with the lengths of NMT batches and of incremental decoding
changing all the time, that made half-precision training and beam decoding on an H100 many times
slower than under the memory-efficient kernel (docs/benchmarks.md, "On a GPU")."""


def fused_kernel_pays(device: torch.device) -> bool:
    """Whether ``MultiHeadAttention`` uses ``F.scaled_dot_product_attention`` (when it need not
    return weights): off CPU. On CPU the explicit path is the faster one at NMT sizes, in training
    (fp32 and bf16) and in incremental decoding (docs/performance.md)."""
    return device.type != "cpu"


class MultiHeadAttention(nn.Module):
    """Vaswani et al. (2017): MHA(Q, K, V) = [head_1; ...; head_h] W_O,
    head_i = softmax(Q W_Q^i (K W_K^i)^T / sqrt(d_k)) V W_V^i.

    Without ``need_weights`` the fused ``F.scaled_dot_product_attention`` kernel is used where it
    pays (``fused_kernel_pays``: off CPU), else the weights are computed explicitly (with the cheap
    dropout of :mod:`seq2seq.nn.dropout` in training). Both give the same output.

    ``normalizer`` sparsemax or entmax15 replaces the softmax (``seq2seq.nn.normalizers``; the
    Transformer uses it for cross-attention): such a module always takes the explicit path, the
    fused kernel computing a softmax only.

    Self-attention may encode positions (never cross-attention): ``relative`` adds the relative
    position logits q_i . a^K_ij / sqrt(d_k) (``RelativePositions``; the fused kernel gets them as
    its float mask) and, if the table has values, sum_j w_ij a^V_ij to the context (explicit path
    only: it needs the weights); ``rotary`` rotates queries and keys by their positions
    (``rotate``). Positions are absolute: keys are at 0 .. Tk - 1 and the queries are the last Tq
    of them (Tq = Tk in the encoder and in teacher forcing; in incremental decoding the query
    position is the cache length).
    """

    def __init__(self, d_model: int, heads: int, dropout: float = 0.0,
                 relative: RelativePositions | None = None, rotary: bool = False,
                 normalizer: str = "softmax") -> None:
        super().__init__()
        self.normalizer, self.normalize = normalizer, get_normalizer(normalizer)
        if d_model % heads:
            raise UserError(f"--d-model ({d_model}) must be divisible by --heads ({heads})")
        self.heads, self.d_k, self.dropout = heads, d_model // heads, dropout
        self.q_proj = nn.Linear(d_model, d_model)
        self.kv_proj = nn.Linear(d_model, 2 * d_model)  # fused W_K, W_V
        self.out_proj = nn.Linear(d_model, d_model)
        self.relative, self.rotary = relative, rotary  # None / False: no parameters, no state_dict keys

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, heads * d_k) -> (B, heads, T, d_k)."""
        return x.view(x.size(0), x.size(1), self.heads, self.d_k).transpose(1, 2)

    def project_kv(self, key: torch.Tensor, value: torch.Tensor | None = None,
                   start: int | torch.Tensor = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """Projected keys and values, each (B, heads, Tk, d_k); cache these to attend repeatedly.
        With rotary positions the keys come rotated, as keys at positions start .. start + Tk - 1."""
        if value is None or value is key:
            k, v = self.kv_proj(key).chunk(2, dim=-1)
        else:
            d = self.heads * self.d_k
            k = F.linear(key, self.kv_proj.weight[:d], self.kv_proj.bias[:d])
            v = F.linear(value, self.kv_proj.weight[d:], self.kv_proj.bias[d:])
        k = self._split(k)
        return (rotate(k, start) if self.rotary else k), self._split(v)

    def link_probabilities(self, query: torch.Tensor, kv_cache: tuple, mask: torch.Tensor | None) -> torch.Tensor:
        """The scores as link classifiers (``--guided-loss binary``): sigmoid(q_hi . k_hj / sqrt(d_k)), 0 where ``mask``
        hides j -> (B, heads, Tq, Tk); the key bias gives a row an offset a softmax ignores (calibration is free)."""
        return attention_weights(self._split(self.q_proj(query)), kv_cache[0], mask, normalize=masked_sigmoid)

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor | None = None,
        value: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
        need_weights: bool = False,
        kv_cache: tuple[torch.Tensor, torch.Tensor] | None = None,
        is_causal: bool = False,
        query_start: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """query (B, Tq, D); key/value (B, Tk, D), or ``kv_cache`` = already projected (k, v) from
        ``project_kv``; mask broadcastable to (B, heads, Tq, Tk), True = may attend. The queries are
        at the last Tq key positions, or from ``query_start`` (a one-element tensor: a preallocated
        cache, whose keys past the queries the mask hides) for rotary and relative positions.

        Returns output (B, Tq, D) and, if ``need_weights``, weights (B, heads, Tq, Tk).
        """
        q = self._split(self.q_proj(query))  # (B, H, Tq, d_k)
        k, v = kv_cache if kv_cache is not None else self.project_kv(key, value)  # (B, H, Tk, d_k)
        if self.rotary:
            q = rotate(q, start=k.size(2) - q.size(2) if query_start is None else query_start)
        rows = bias = None
        if self.relative is not None:
            rows = self.relative.distances(q.size(2), k.size(2), q.device, query_start)  # (Tq, Tk)
            bias = self.relative.key_logits(q, rows) / math.sqrt(self.d_k)  # (B, H, Tq, Tk)
        relative_values = self.relative is not None and self.relative.values is not None
        p = self.dropout if self.training else 0.0
        explicit = (need_weights or relative_values or self.normalizer != "softmax"
                    or not fused_kernel_pays(q.device))
        fused_causal = is_causal and mask is None and bias is None and not explicit  # the kernel builds it
        if is_causal and not fused_causal:
            causal = causal_mask(q.size(2), q.device)  # (Tq, Tk), Tq == Tk
            mask = causal if mask is None else mask & causal
        if explicit:
            weights = attention_weights(q, k, mask, bias, self.normalize)  # (B, H, Tq, Tk)
            dropped = cheap_dropout(weights, p, training=True)
            context = dropped @ v
            if relative_values:
                context = context + self.relative.value_context(dropped, rows)
            weights = weights if need_weights else None
        else:
            if bias is not None:  # the relative logits are the kernel's additive float mask
                mask = bias if mask is None else bias.masked_fill(~mask, torch.finfo(bias.dtype).min)
            with sdpa_kernel(list(FUSED_BACKENDS)):  # not cuDNN: a new plan for every shape (FUSED_BACKENDS)
                context = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p,
                                                         is_causal=fused_causal)
            weights = None
        context = context.transpose(1, 2).reshape(query.size(0), query.size(1), -1)  # (B, Tq, D)
        return self.out_proj(context), weights
