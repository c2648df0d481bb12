"""The HTTP API's JSON, as pydantic models (they are the OpenAPI description at ``/openapi.json``),
and the conversion of a ``Translation`` into it.

Alignments are the ones ``seq2seq translate --alignments`` exports (``Translation.alignment_record``:
word merge, Pharaoh links, read as the server's ``--align-*`` flags say); attention is the raw
``(layers, heads, target pieces + EOS, source pieces + EOS)`` array (docs/formats.md)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    from ..config import DecodeConfig
    from ..decoding.translator import Translation
    from .settings import ServeSettings


class TranslateRequest(BaseModel):
    """Sentences to translate and, optionally, how: unset options take the server's defaults."""

    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra={"examples": [
        {"sentences": ["Ein Hund rennt über die Wiese."], "beam_size": 5, "n_best": 2, "alignments": True}]})

    sentences: list[str] = Field(min_length=1, description="one sentence per string (at most the server's "
                                                           "--max-request-sentences, each --max-sentence-chars)")
    beam_size: int | None = Field(None, ge=1, description="beam size; 1 = greedy (default: the server's --beam-size)")
    n_best: int | None = Field(None, ge=1, description="hypotheses per sentence, at most beam_size")
    length_penalty: float | None = Field(None, allow_inf_nan=False, description="GNMT length penalty alpha (0 = none)")
    alignments: bool = Field(False, description="add word alignments (Pharaoh links, word-level matrix)")
    attention: bool = Field(False, description="add the raw attention array (layers, heads, target, source)")
    confidence: bool = Field(False, description="add each target piece's and word's log-probability and the "
                                                "entropy of the model's distribution there")
    prefixes: list[str] | None = Field(None, description="one target prefix per sentence (\"\" = none): each "
                                                         "translation starts with it; one not ending in a space "
                                                         "may end inside a word, which the search completes")
    constraints: list[list[str]] | None = Field(None, description="per sentence, the target phrases its "
                                                "translation must contain verbatim ([] = none; terminology; "
                                                "constrained beam search with dynamic beam allocation)")
    ordered_constraints: bool = Field(False, description="the constraint phrases must appear in the order given")
    markup: Literal["xml", "html"] | None = Field(None, description="the sentences carry inline tags: translated "
                                                  "without them, each result's 'markup' has them carried across by "
                                                  "the word alignments (seq2seq translate --markup)")
    model: str | None = Field(None, description="the served model to translate with, by name (GET /models); "
                                                "default: the first")


class Alignment(BaseModel):
    """One hypothesis's attention read as an alignment (the JSONL record of ``seq2seq translate --alignments``)."""

    src_pieces: list[str]
    tgt_pieces: list[str]
    src_words: list[str]
    tgt_words: list[str]
    word_matrix: list[list[float]] = Field(description="(target words, source words) attention, rows sum to ~1")
    pharaoh_word: str = Field(description="hard links 'i-j' (source word i, target word j), 0-based; with a "
                                          "backward model (--backward-checkpoint) the symmetrized ones")
    pharaoh_subword: str
    layer_used: int | str
    heads: str | list[int]
    method: str
    symmetrize: str | None = Field(None, description="with --backward-checkpoint: how the two directions were combined")
    forward_pharaoh_word: str | None = Field(None, description="with --backward-checkpoint: this model's links")
    backward_pharaoh_word: str | None = Field(None, description="with --backward-checkpoint: the backward model's "
                                                                "links, in (source, target) order")


class Attention(BaseModel):
    """The raw attention weights, padding trimmed; rows end with the target EOS, columns with the source EOS."""

    shape: list[int] = Field(description="[layers, heads, len(tgt_pieces), len(src_pieces)]")
    src_pieces: list[str]
    tgt_pieces: list[str]
    weights: list = Field(description="nested lists of that shape, rounded to 4 decimals")


class TokenConfidence(BaseModel):
    piece: str
    log_prob: float = Field(description="log p of this piece given the source and the pieces before it")
    entropy: float = Field(description="entropy (nats) of the model's distribution at this step")


class WordConfidence(BaseModel):
    word: str
    log_prob: float = Field(description="the sum of its pieces' log p: the log-probability of the word")
    entropy: float = Field(description="the mean of its pieces' entropies")


class Confidence(BaseModel):
    """How sure the model was, piece by piece and word by word (the target's EOS last)."""

    tokens: list[TokenConfidence]
    words: list[WordConfidence]


class Hypothesis(BaseModel):
    translation: str
    markup: str | None = Field(None, description="with a request's markup: this translation with the source's tags "
                                                 "(well formed; 'translation' is the text without them)")
    score: float = Field(description="length-penalised log-probability (the ranking score)")
    log_prob: float
    confidence: Confidence | None = Field(None, description="when asked for")
    alignment: Alignment | None = Field(None, description="when asked for (null for an empty input)")
    attention: Attention | None = Field(None, description="when asked for (null for an empty input)")


class SentenceResult(Hypothesis):
    source: str
    alternatives: list[Hypothesis] = Field(description="the rest of the n-best list, next best first")


class TranslateResponse(BaseModel):
    translations: list[SentenceResult] = Field(description="one per input sentence, in input order")


class ModelSummary(BaseModel):
    name: str = Field(description="what requests call it (\"model\": NAME)")
    arch: str
    model: list[str] = Field(description="the checkpoint(s); several: an ensemble")
    engine: str
    compiled: str


class Health(BaseModel):
    status: str = Field(description="'ok', or 'stopping' during shutdown")
    model: list[str] = Field(description="the checkpoint(s); several: an ensemble")
    arch: str
    engine: str = Field(description="who runs the search: 'seq2seq' (ours) or 'ctranslate2' (seq2seq serve --engine)")
    compiled: str = Field(description="compiled decoding of lone sentences: 'off', 'compiling' (answered uncompiled "
                                      "meanwhile), 'ready' (live) or 'failed' (uncompiled; the log says why)")
    device: str
    precision: str
    queue_requests: int
    queue_sentences: int
    in_flight_sentences: int = Field(description="sentences in the model call under way")
    model_calls: int
    sentences_translated: int
    requests_translated: int
    requests_dropped: int = Field(description="cancelled (timed out or disconnected) before being translated")
    largest_batch: int
    requests_unauthorized: int = Field(description="refused (401) for want of the API key")
    api_key: bool = Field(description="whether /translate needs an API key (seq2seq serve --api-key)")
    limits: dict[str, int | float] = Field(description="the server's batching and limit flags")
    models: list[ModelSummary] = Field(description="every served model (seq2seq serve --model), the first answering "
                                                   "requests that name none; the fields above are the first's")


class ErrorBody(BaseModel):
    error: str = Field(description="what went wrong and how to fix it")
    status: int
    details: list[dict[str, Any]] | None = Field(None, description="validation errors: location, message, type")


@dataclass(frozen=True)
class DecodeOptions:
    """What a model call needs; requests are batched together only when these are equal."""

    decode: DecodeConfig  # checked (``checks.checked_decode``)
    need_attention: bool
    need_confidence: bool = False
    model: str | None = None  # the served model's name (None: the first)


# ----------------------------------------------------------------------------- the page's endpoints


class AttributionMethod(BaseModel):
    method: str
    cost: str = Field(description="what it costs per sentence, in model passes")
    slow: bool = Field(description="its cost grows with a setting: the page runs it on request only")
    contrast: bool = Field(description="it answers \"why this word rather than that one\" (POST /attribution's "
                                       "contrast)")


class ModelInfo(BaseModel):
    name: str = Field(description="what requests call it (\"model\": NAME)")
    arch: str
    checkpoints: list[str]
    engine: str
    device: str
    layers: int = Field(description="decoder layers with attention (an RNN: 1)")
    heads: int = Field(description="attention heads per layer (an RNN: 1)")
    languages: list[str] | None = Field(None, description="source and target language, where the checkpoint says")
    attribution: list[AttributionMethod] = Field(description="the methods POST /attribution runs for it")


class ModelsResponse(BaseModel):
    models: list[ModelInfo] = Field(description="the served models; the first answers requests that name none")
    markup: str | None = Field(None, description="the page's input carries tags of this kind (seq2seq serve --markup)")
    api_key: bool = Field(description="whether requests need the API key (a header, never in the URL)")
    limits: dict[str, int | float]
    decode: dict[str, int | float] = Field(description="the defaults of requests that set none: beam_size, n_best, "
                                                       "length_penalty")


class AlignmentsRequest(BaseModel):
    """Sentences to translate with one model, answered with everything the page shows of them."""

    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra={"examples": [
        {"sentences": ["Ein Hund rennt über die Wiese."], "model": "transformer", "n_best": 3}]})

    sentences: list[str] = Field(min_length=1, description="one sentence per string (the limits of /translate)")
    model: str | None = Field(None, description="the served model, by name (GET /models); default: the first")
    beam_size: int | None = Field(None, ge=1, description="as for /translate")
    n_best: int | None = Field(None, ge=1, description="as for /translate")
    length_penalty: float | None = Field(None, allow_inf_nan=False, description="as for /translate")
    markup: Literal["xml", "html"] | None = Field(None, description="as for /translate: tags carried across")


class Timings(BaseModel):
    queue_ms: float = Field(description="from the request's arrival to the start of its model call")
    model_ms: float = Field(description="the model call (with the other requests batched with it)")
    total_ms: float = Field(description="from the request's arrival to its answer being built")


class Candidate(BaseModel):
    translation: str
    markup: str | None = Field(None, description="with markup: this translation with the source's tags")
    score: float
    log_prob: float


class SentenceView(Candidate):
    source: str = Field(description="as sent (with its tags, with markup)")
    alternatives: list[Candidate] = Field(description="the rest of the n-best list, next best first")
    view: dict[str, Any] | None = Field(description=(
        "the best translation as one sentence of the alignment viewer's data (seq2seq/alignment/viewer.py): "
        "levels (word / subword labels), views.attention (every layer and head and their means, weights x "
        "scale as integers), confidence, links (the hard links, [[source i, target j], ...] per level); null "
        "for an empty input"))


class AlignmentsResponse(BaseModel):
    model: str
    arch: str
    scale: int = Field(description="weights in 'view' are round(weight x scale)")
    timings: Timings
    sentences: list[SentenceView] = Field(description="one per input sentence, in input order")


class AttributionRequest(BaseModel):
    """A sentence and its translation, explained by one attribution method (teacher-forced)."""

    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra={"examples": [
        {"source": "Ein Hund rennt.", "target": "A dog runs.", "method": "gradient"}]})

    source: str = Field(description="the sentence (at most --max-sentence-chars)")
    target: str = Field(description="its translation, as the model gave it (or any other)")
    method: str = Field(description="one of the model's attribution methods (GET /models)")
    model: str | None = Field(None, description="the served model, by name; default: the first")
    contrast: str | None = Field(None, description="an alternative translation: explain the target against it, "
                                                   "\"why this rather than that\" (methods with contrast: true)")


class AttributionResponse(BaseModel):
    model: str
    method: str
    contrast: str | None
    scale: int = Field(description="weights in 'view' are round(weight x scale)")
    view: dict[str, Any] = Field(description="one view of the alignment viewer's data, with its own 'levels'")
    timings: Timings


def hypothesis_json(translation: Translation, index: int, settings: ServeSettings, alignments: bool,
                    attention: bool, confidence: bool = False) -> dict[str, Any]:
    """One hypothesis as a ``Hypothesis`` dict (built in the worker thread, off the event loop)."""
    out: dict[str, Any] = {"translation": translation.text, "score": translation.score,
                           "log_prob": translation.log_prob}
    if confidence:
        out["confidence"] = translation.confidence() or {"tokens": [], "words": []}
    has_attention = translation.attention is not None
    if alignments:
        out["alignment"] = _alignment(translation, index, settings) if has_attention else None
    if attention:
        out["attention"] = _attention(translation) if has_attention else None
    return out


def sentence_json(translation: Translation, index: int, settings: ServeSettings, alignments: bool,
                  attention: bool, confidence: bool = False, markup: list[str] | None = None) -> dict[str, Any]:
    """One input's ``SentenceResult`` dict: the best hypothesis and the rest of the n-best list; ``markup``:
    each hypothesis's translation with the source's tags, best first."""
    def marked(rank: int) -> dict[str, str]:
        return {} if markup is None else {"markup": markup[rank]}

    rest = translation.alternatives[1:]
    return {"source": translation.source, **marked(0),
            **hypothesis_json(translation, index, settings, alignments, attention, confidence),
            "alternatives": [{**marked(rank), **hypothesis_json(t, index, settings, alignments, attention, confidence)}
                             for rank, t in enumerate(rest, start=1)]}


def _alignment(translation: Translation, index: int, settings: ServeSettings) -> dict[str, Any]:
    record = translation.alignment_record(index, settings.align.layer, settings.align.heads,
                                          **settings.align.link_options()).to_json()
    keys = ("src_pieces", "tgt_pieces", "src_words", "tgt_words", "word_matrix", "pharaoh_word", "pharaoh_subword",
            "heads", "method")
    layer = record["layer_used"]
    return {**{key: record[key] for key in keys}, "layer_used": layer if isinstance(layer, str) else int(layer)}


def _attention(translation: Translation) -> dict[str, Any]:
    from ..alignment.records import rounded

    weights = translation.attention  # (layers, heads, tgt pieces + EOS, src pieces + EOS)
    return {"shape": list(weights.shape), "src_pieces": translation.src_pieces, "tgt_pieces": translation.tgt_pieces,
            "weights": rounded(weights)}
