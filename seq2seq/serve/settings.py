"""What ``seq2seq serve`` is configured with: the batching and limit options (each a flag, generated
from ``Limits`` like the training flags), the decoding defaults for requests that set none, and how
attention becomes alignments. One place for the server's defaults (docs/guides/serving.md)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from ..config import AlignConfig, DecodeConfig, option
from ..errors import UserError


@dataclass
class Limits:
    """Dynamic batching and the limits that keep one client from starving the others; every field
    is a ``seq2seq serve`` flag (``max_wait_ms`` -> ``--max-wait-ms``)."""

    max_batch_sentences: int = option(64, "sentences translated together in one model call, taken from "
                                          "several requests (1 = no batching across requests)")
    max_wait_ms: float = option(10.0, "how long the oldest queued request waits for more to fill a batch "
                                      "(0 = translate whatever is queued at once)")
    max_request_sentences: int = option(128, "sentences per request; more is answered 413")
    max_sentence_chars: int = option(2000, "characters per sentence; longer is answered 413")
    max_body_bytes: int = option(1 << 20, "bytes per request body, checked before it is read; more is answered 413")
    max_queue_sentences: int = option(1024, "sentences waiting to be translated; a request that would exceed it is "
                                            "answered 429 with Retry-After")
    request_timeout: float = option(60.0, "seconds a request may wait in the queue and be translated; later is "
                                          "answered 504")
    max_beam_size: int = option(16, "largest beam_size a request may ask for (422 above)")

    def validate(self) -> None:
        """Named errors for values no server can run with (flags are named as the user typed them)."""
        for f in dataclasses.fields(self):
            value, flag = getattr(self, f.name), "--" + f.name.replace("_", "-")
            if f.name == "request_timeout":
                ok, rule = 0 < value < float("inf"), "a finite number of seconds > 0"
            elif f.name == "max_wait_ms":
                ok, rule = 0 <= value < float("inf"), "a finite number >= 0"
            else:
                ok, rule = value >= 1, "a positive integer"
            if not ok:
                raise UserError(f"{flag} must be {rule}, got {value}")
        if self.max_request_sentences > self.max_queue_sentences:
            raise UserError(f"--max-request-sentences ({self.max_request_sentences}) must not exceed "
                            f"--max-queue-sentences ({self.max_queue_sentences}): such a request could never be queued")

    def allowed(self, decode: DecodeConfig) -> DecodeConfig:
        """``decode`` (the server's default, or a request's over it) where its beam is within ``max_beam_size``;
        a UserError naming ``--beam-size`` otherwise (the one check of the beam limit)."""
        if decode.beam > self.max_beam_size:
            raise UserError(f"--beam-size {decode.beam} is above this server's limit of {self.max_beam_size} "
                            "(--max-beam-size); ask for a smaller beam")
        return decode


@dataclass
class ServeSettings:
    """Everything ``create_app`` needs besides the translator. ``decode``: how requests that set no
    option of their own are decoded (default ``DecodeConfig()``, the same as ``seq2seq translate``);
    ``align`` is read as ``seq2seq translate --align-*`` is (``AlignConfig``,
    ``Translation.alignment_record``; a server of several models reads it per model, ``ServedModel.align``)."""

    limits: Limits = field(default_factory=Limits)
    decode: DecodeConfig = field(default_factory=DecodeConfig)  # requests override beam_size, n_best, length_penalty
    align: AlignConfig = field(default_factory=AlignConfig)
    precision: str = "fp32"  # shown by GET /health
    #: requests to /translate must carry it (``http.ApiKey``); None: anyone may use the server. Never shown.
    api_key: str | None = field(default=None, repr=False)
    ui: bool = True  # the page at / (seq2seq serve --no-ui: the JSON API alone)
    markup: str | None = None  # "xml" / "html": the page's input carries inline tags of that kind (--markup)
    #: attribution for POST /attribution and the page: ``seq2seq.attribution.explain.Explainer`` (its ``methods(model)``
    #: and its call), given by the command, as serve does not import attribution (docs/design.md); None: none
    explain: Any = field(default=None, repr=False, compare=False)
