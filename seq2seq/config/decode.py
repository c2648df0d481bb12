"""How to decode: ``DecodeConfig`` (search, lengths, batches, sampling) and its checks, shared by
``translate``, ``serve``, the Python API and validation during training."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ..errors import UserError
from .fields import STRICT, option

#: The beam size when none is given (``DecodeConfig.beam_size`` None): beam search, or 1 with sampling.
DEFAULT_BEAM_SIZE = 5
#: Decoder rows (sentences x beams) per batch when no batch size is given (``DecodeConfig.batch``):
#: greedy batches of 320 sentences, beam-5 batches of 64. Every decoding step reads all decoder weights
#: however few rows it has, so greedy decoding gains from wide batches; beam search is flat across
#: widths (docs/performance.md).
DECODER_ROWS = 320


@dataclass
class DecodeConfig:
    """How ``seq2seq translate``, ``serve`` and ``Translator.translate`` search or sample (the same
    defaults for all three). Checked where it is built (``check_decoding``: named errors before any
    work), so a ``DecodeConfig`` in hand is one that runs; ``dataclasses.replace`` checks again."""

    __pydantic_config__ = STRICT

    beam_size: int | None = option(None, "beam size (1 = greedy; --sample needs 1)", lone_help="beam size; 1 = greedy")
    length_penalty: float = option(1.0, "GNMT length penalty alpha (0 = none)")
    n_best: int = option(1, "hypotheses per input (with --sample: independent samples per input)",
                         lone_help="hypotheses per sentence, at most the beam size")
    beam_stop: Literal["exact", "likely"] = option(
        "exact", "when a sentence's beam search stops: exact = once no live hypothesis can end above its n-best "
                 "finished ones, up to the length bound (the outputs of searching on); likely = once none would at "
                 "its current length (Hugging Face's early_stopping=False: faster with --length-penalty > 0, "
                 "rarely another output)")
    batch_size: int | None = option(None, "sentences decoded together (None: 320 / beam size; sampling: 320 / "
                                          "n-best)")
    max_output_ratio: float = option(1.5, "outputs stop at this ratio x source subwords + --max-output-offset",
                                     lone_help="outputs stop at this ratio x source subwords + {max_output_offset}")
    max_output_offset: int = option(10, "outputs stop at --max-output-ratio x source subwords + this many")
    max_input_tokens: int = option(250, "longer inputs are cut to this many subwords, with a warning")
    sample: bool = option(False, "sample every output token from the model's distribution (shaped by "
                                 "--temperature, --top-k, --top-p) instead of searching for the most "
                                 "probable output: back-translation, diversity")
    top_k: int = option(0, "with --sample: draw from the k most probable tokens only (0 = no limit)")
    top_p: float = option(1.0, "with --sample: nucleus sampling: draw from the smallest set of most probable "
                               "tokens whose probability reaches p, in (0, 1] (1 = no limit)")
    temperature: float = option(1.0, "with --sample: divide the logits by T (< 1 sharper, > 1 flatter; "
                                     "0 = always the most probable token, i.e. greedy)")
    seed: int | None = option(None, "with --sample: random seed; the same seed gives the same samples "
                                    "(None: different samples every run)")
    ordered_constraints: bool = option(False, "with --constraints: each output contains the phrases in the order "
                                              "given")

    def __post_init__(self) -> None:
        check_decoding(self.beam_size, self.n_best, self.sample, self.top_k, self.top_p, self.temperature, self.seed)
        if self.batch_size is not None and self.batch_size < 1:
            raise UserError(f"--batch-size must be positive, got {self.batch_size}")
        if not 0 < self.max_output_ratio < float("inf"):
            raise UserError(f"--max-output-ratio must be a finite number > 0, got {self.max_output_ratio}")
        if self.max_output_offset < 0:
            raise UserError(f"--max-output-offset must be >= 0, got {self.max_output_offset}")
        if self.max_input_tokens < 1:
            raise UserError(f"--max-input-tokens must be positive, got {self.max_input_tokens}")

    @property
    def beam(self) -> int:
        """The beam that runs: ``beam_size``, or when None ``DEFAULT_BEAM_SIZE`` (1 with ``sample``)."""
        return (1 if self.sample else DEFAULT_BEAM_SIZE) if self.beam_size is None else self.beam_size

    @property
    def batch(self) -> int:
        """Sentences decoded together: ``batch_size``, or ``DECODER_ROWS`` / the decoder rows one
        sentence takes (its beam; with ``sample``, its ``n_best`` samples)."""
        if self.batch_size is not None:
            return self.batch_size
        return max(1, DECODER_ROWS // (self.n_best if self.sample else self.beam))


def check_decoding(beam_size: int | None, n_best: int, sample: bool = False, top_k: int = 0,
                   top_p: float = 1.0, temperature: float = 1.0, seed: int | None = None) -> int:
    """Named errors for bad search / sampling options (before any work); returns the beam size
    that runs: ``beam_size``, or when None ``DEFAULT_BEAM_SIZE`` (search) / 1 (``sample``).

    Sampling draws ``n_best`` independent samples per input and has no beam: an explicit beam size
    above 1 with ``sample`` is an error, and so are the sampling options without ``sample``."""
    if not sample:
        given = [flag for flag, value, default in (("--top-k", top_k, 0), ("--top-p", top_p, 1.0),
                                                   ("--temperature", temperature, 1.0), ("--seed", seed, None))
                 if value != default]
        if given:
            raise UserError(f"{', '.join(given)}: sampling option(s), used only with --sample (sample=True)")
        beam = DEFAULT_BEAM_SIZE if beam_size is None else beam_size
        if beam < 1 or not 1 <= n_best <= beam:
            raise UserError(f"need 1 <= --n-best ({n_best}) <= --beam-size ({beam})")
        return beam
    if beam_size is not None and beam_size != 1:
        raise UserError(f"--sample draws every token at random and has no beam: --beam-size must be 1 or "
                        f"unset, got {beam_size} (--n-best N draws N independent samples per input)")
    if n_best < 1:
        raise UserError(f"--n-best (samples per input) must be >= 1, got {n_best}")
    if top_k < 0:
        raise UserError(f"--top-k must be >= 0 (0 = no limit), got {top_k}")
    if not 0.0 < top_p <= 1.0:
        raise UserError(f"--top-p must be in (0, 1] (1 = no limit), got {top_p}")
    if not 0.0 <= temperature < float("inf"):
        raise UserError(f"--temperature must be a finite number >= 0 (0 = greedy), got {temperature}")
    return 1
