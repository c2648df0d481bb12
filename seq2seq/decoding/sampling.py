"""How sampling draws each token (``Sampling``): temperature, top-k, top-p, and one seeded random
stream per sample, so samples do not depend on the batching."""
from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from typing import Sequence

import torch

from ..config import check_decoding


@dataclass(frozen=True)
class Sampling:
    """How ``sample_search`` draws each token from the model's next-token distribution p = softmax(z):

    1. temperature T: q ∝ exp(log p / T) = softmax(z / T) (T = 0: the argmax, exactly as greedy search);
    2. top-k (k > 0): q is cut to the k most probable tokens (exactly k; ties broken by ``topk``);
    3. top-p (p < 1): q (renormalised) is cut to the smallest set of most probable tokens whose
       probability reaches p (a token stays iff the mass of the tokens before it is < p);
    4. renormalise and draw by inverse CDF (over the columns in order: token ids, or a sorted
       shortlist's, so a shortlist listing every token draws exactly as none) with one uniform
       number per sample and step.

    Tokens the search bans (PAD, BOS; all but EOS at the length bound) have q = 0 and are never
    drawn. ``seed`` None: a fresh random seed per call (from the OS, not torch's global RNG).

    Reproducibility: every sample has its own stream of uniform numbers, from a dedicated CPU
    ``torch.Generator`` seeded with a hash of (seed, sentence id, sample number) and copied to the
    device once per batch. The same seed therefore gives the same samples for the same sentence id
    (``Translator`` uses the input position), whatever the batch size, the other sentences in the
    batch, or the order of the batches, and on any device, up to floating-point rounding: batching
    or another device can change a probability in its last bits, which changes a draw only when its
    uniform number falls within that rounding of a cumulative-probability boundary (as greedy search
    can change its choice between two tokens whose log-probabilities tie to rounding)."""

    top_k: int = 0
    top_p: float = 1.0
    temperature: float = 1.0
    seed: int | None = None

    def __post_init__(self) -> None:
        check_decoding(None, 1, True, self.top_k, self.top_p, self.temperature, self.seed)

    def choose(self, log_p: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
        """log p (rows, V) (banned tokens at -inf), uniform (rows,) in [0, 1) -> columns (rows, 1)."""
        if self.temperature == 0:
            return log_p.max(-1, keepdim=True).indices  # the same reduction as greedy search
        scores = log_p.double() / self.temperature  # log q + const
        vocab = scores.size(-1)
        if 0 < self.top_k < vocab:
            kept = scores.topk(self.top_k, -1).indices  # (rows, k)
            scores = torch.full_like(scores, float("-inf")).scatter(1, kept, scores.gather(1, kept))
        q = scores.softmax(-1)  # (rows, V)
        if self.top_p < 1.0:
            ordered, order = q.sort(dim=-1, descending=True, stable=True)
            ordered = ordered.masked_fill(ordered.cumsum(-1) - ordered >= self.top_p, 0.0)  # mass before >= p
            q = torch.zeros_like(q).scatter(1, order, ordered)
        cumulative = q.cumsum(-1)  # (rows, V), unnormalised after top-p: scaled below
        target = uniform.to(cumulative.dtype).unsqueeze(1) * cumulative[:, -1:]  # (rows, 1)
        column = torch.searchsorted(cumulative, target, right=True)  # first column with cumulative > target
        last = (q > 0).cumsum(-1).argmax(-1, keepdim=True)  # the last token with q > 0 (rounding guard)
        return torch.minimum(column, last)

    def uniforms(self, sentence_ids: Sequence[int], copies: int, steps: Sequence[int], width: int,
                 device: torch.device) -> torch.Tensor:
        """Uniform numbers (len(sentence_ids) * copies, width) float64 on ``device``: row i * copies
        + j is sample j of sentence ``sentence_ids[i]``, ``steps[i]`` numbers from its own
        generator (the rest of the row is unused)."""
        seed = secrets.randbits(63) if self.seed is None else self.seed
        out = torch.zeros(len(sentence_ids) * copies, width, dtype=torch.float64)
        for i, (sentence, count) in enumerate(zip(sentence_ids, steps)):
            for j in range(copies):
                digest = hashlib.blake2b(f"{seed}/{sentence}/{j}".encode(), digest_size=8).digest()
                generator = torch.Generator().manual_seed(int.from_bytes(digest, "little") >> 1)
                out[i * copies + j, :count] = torch.rand(count, generator=generator, dtype=torch.float64)
        return out.to(device)
