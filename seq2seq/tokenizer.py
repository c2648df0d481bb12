"""One joint SentencePiece model shared by source and target (one vocabulary, tied embeddings).

Special ids are fixed project-wide: pad 0, unk 1, bos 2, eos 3. ``encode`` never adds bos/eos
(the data pipeline does); ``decode`` drops every special id and stops at the first EOS.

Normalization is SentencePiece's default ``nmt_nfkc``: text is NFKC-normalized and runs of
whitespace are collapsed and stripped, so ``decode(encode(s)) == s`` holds for ordinary text
(letters incl. umlauts/ß, punctuation, digits, single spaces) but not for double spaces,
leading/trailing blanks or NFKC-compatibility characters (e.g. the ligature "ﬁ" becomes "fi").
Characters never seen in training become ``<unk>`` (decoded as " ⁇ ").
"""
from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import re
from pathlib import Path
from typing import Callable, Iterable, Sequence

import sentencepiece as spm

from .errors import UserError
from .io_utils import atomic_write_bytes

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3
MODEL_TYPES = ("unigram", "bpe")
NORMALIZATION = "nmt_nfkc"

log = logging.getLogger(__name__)


class Tokenizer:
    """A trained SentencePiece model; picklable (pickles as its serialized model bytes)."""

    def __init__(self, model_proto: bytes):
        self._proto = bytes(model_proto)
        self._sp = spm.SentencePieceProcessor(model_proto=self._proto)
        if (self._sp.pad_id(), self._sp.unk_id(), self._sp.bos_id(), self._sp.eos_id()) != (
            PAD_ID, UNK_ID, BOS_ID, EOS_ID
        ):
            raise UserError("SentencePiece model does not use the special ids pad 0, unk 1, bos 2, eos 3; "
                            "train it with seq2seq (Tokenizer.train) instead")

    # ---- training and (de)serialization -------------------------------------------------------
    @classmethod
    def train(
        cls,
        texts: Iterable[str],
        vocab_size: int = 8000,
        model_type: str = "unigram",
        input_sentence_size: int = 2_000_000,
    ) -> "Tokenizer":
        """Train in memory. ``vocab_size`` is an upper bound: tiny corpora give fewer pieces."""
        if model_type not in MODEL_TYPES:
            raise UserError(f"--sp-model-type must be one of {', '.join(MODEL_TYPES)}, got {model_type!r}")
        if vocab_size < 8:
            raise UserError(f"--vocab-size must be at least 8, got {vocab_size}")
        sentences = (t for t in texts if t and not t.isspace())
        buffer = io.BytesIO()
        try:
            spm.SentencePieceTrainer.train(
                sentence_iterator=sentences,
                model_writer=buffer,
                vocab_size=vocab_size,
                model_type=model_type,
                pad_id=PAD_ID, unk_id=UNK_ID, bos_id=BOS_ID, eos_id=EOS_ID,
                character_coverage=1.0,
                hard_vocab_limit=False,
                normalization_rule_name=NORMALIZATION,
                input_sentence_size=input_sentence_size,
                shuffle_input_sentence=True,
                num_threads=max(1, min(os.cpu_count() or 1, 16)),
                minloglevel=2,
            )
        except RuntimeError as exc:
            msg = str(exc)
            needed = re.search(r"smaller than required_chars\. \d+ vs (\d+)", msg)
            if needed:
                raise UserError(f"--vocab-size {vocab_size} is too small: the training texts have "
                                f"{int(needed.group(1)) - 4} distinct symbols plus 4 special tokens; "
                                f"use --vocab-size {needed.group(1)} or more") from None
            if "empty" in msg.lower() or "no sentence" in msg.lower():
                raise UserError("cannot train the tokenizer: the training texts are empty") from None
            raise UserError(f"SentencePiece training failed: {msg}") from None
        if not buffer.getvalue():
            raise UserError("cannot train the tokenizer: the training texts are empty")
        return cls(buffer.getvalue())

    def to_bytes(self) -> bytes:
        """The serialized model proto (what checkpoints store)."""
        return self._proto

    @classmethod
    def from_bytes(cls, data: bytes) -> "Tokenizer":
        try:
            return cls(data)
        except (RuntimeError, OSError, TypeError) as exc:
            raise UserError(f"invalid SentencePiece model bytes: {exc}") from None

    def save(self, path: str | Path) -> None:
        """Write the model atomically (temp file in the same directory, then rename)."""
        atomic_write_bytes(Path(path), self._proto)

    @classmethod
    def load(cls, path: str | Path) -> "Tokenizer":
        path = Path(path)
        if not path.is_file():
            raise UserError(f"tokenizer model {path}: no such file (train one, or pass the right path)")
        try:
            return cls(path.read_bytes())
        except (RuntimeError, OSError) as exc:
            raise UserError(f"tokenizer model {path} is not a valid SentencePiece model ({exc}); "
                            "delete it to retrain") from None

    def sha256(self) -> str:
        return hashlib.sha256(self._proto).hexdigest()

    def __getstate__(self) -> dict:
        return {"proto": self._proto}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["proto"])

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Tokenizer) and other._proto == self._proto

    def __hash__(self) -> int:
        return hash(self._proto)

    # ---- encoding ------------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return self._sp.get_piece_size()

    def encode(self, text: str) -> list[int]:
        """Subword ids of ``text`` without bos/eos."""
        return self._sp.encode(text, out_type=int)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return self._sp.encode(list(texts), out_type=int)

    def encode_sampled(self, texts: Sequence[str], alpha: float, seed: int) -> list[list[int]]:
        """A sampled segmentation of each text (subword regularization, Kudo 2018): for a unigram model
        a segmentation drawn from P(x) ^ alpha over all of them (``nbest_size`` -1), for BPE merges
        dropped with probability ``alpha`` (BPE-dropout). Seeded: the same (texts, alpha, seed) give the
        same ids (one thread; SentencePiece's own generator)."""
        spm.set_random_generator_seed(seed % 2**32)
        return self._sp.encode(list(texts), out_type=int, enable_sampling=True, alpha=alpha, nbest_size=-1,
                               num_threads=1)

    def decode(self, ids: Iterable[int]) -> str:
        """Text of ``ids``: stops at the first EOS and drops pad/bos (and any other special)."""
        return self._sp.decode(_content_ids(ids))

    def decode_batch(self, batch: Iterable[Iterable[int]]) -> list[str]:
        return self._sp.decode([_content_ids(ids) for ids in batch])

    def pieces(self, ids: Iterable[int]) -> list[str]:
        """The piece string of every id (specials included: <pad> <unk> <s> </s>)."""
        return [self._sp.id_to_piece(i) for i in _as_ints(ids)]

    def piece_to_id(self, piece: str) -> int:
        return self._sp.piece_to_id(piece)


def _as_ints(ids: Iterable[int]) -> list[int]:
    if hasattr(ids, "tolist"):  # torch tensor / numpy array
        ids = ids.tolist()
    return [int(i) for i in ids]


def _content_ids(ids: Iterable[int]) -> list[int]:
    out = []
    for i in _as_ints(ids):
        if i == EOS_ID:
            break
        if i not in (PAD_ID, BOS_ID):
            out.append(i)  # UNK is kept: it decodes to " ⁇ " so a reader sees the gap
    return out


def texts_fingerprint(texts: Iterable[str]) -> str:
    """sha256 of the texts in order (one line each)."""
    digest = hashlib.sha256()
    for text in texts:
        digest.update(text.encode("utf-8"))
        digest.update(b"\n")
    return digest.hexdigest()


def load_or_train_tokenizer(
    path: str | Path,
    texts_fn: Callable[[], Iterable[str]],
    vocab_size: int = 8000,
    model_type: str = "unigram",
    input_sentence_size: int = 2_000_000,
    data_fingerprint: str | None = None,
    given: Tokenizer | None = None,
) -> Tokenizer:
    """Reuse ``path`` if its sidecar ``path.with_suffix('.json')`` matches the request, else train.

    The sidecar records the settings, a fingerprint of the training data and the model's sha256.
    ``data_fingerprint`` may be given by callers that know a cheaper one (e.g. file sizes and
    mtimes); otherwise the texts are hashed (one extra pass over them). A ``given`` tokenizer (the
    one of a model being fine-tuned) is written to ``path`` and used as it is, whatever the data.
    """
    path = Path(path)
    sidecar = path.with_suffix(".json")
    if given is not None:
        given.save(path)
        record = {"given": True, "model_sha256": given.sha256(), "actual_vocab_size": given.vocab_size}
        atomic_write_bytes(sidecar, (json.dumps(record, indent=2) + "\n").encode("utf-8"))
        log.info("tokenizer: using the given model %s (vocab %d)", path, given.vocab_size)
        return given
    if data_fingerprint is None:
        data_fingerprint = texts_fingerprint(texts_fn())
    wanted = {
        "vocab_size": vocab_size,
        "model_type": model_type,
        "input_sentence_size": input_sentence_size,
        "normalization": NORMALIZATION,
        "data_fingerprint": data_fingerprint,
    }
    reason = _reuse_problem(path, sidecar, wanted)
    if reason is None:
        tokenizer = Tokenizer.load(path)
        log.info("tokenizer: reusing %s (vocab %d)", path, tokenizer.vocab_size)
        return tokenizer
    texts = texts_fn()  # may load and check the corpus: its errors come before the message below
    log.info("tokenizer: training %s (%s): %s, vocab_size=%d", path, reason, model_type, vocab_size)
    tokenizer = Tokenizer.train(texts, vocab_size, model_type, input_sentence_size)
    tokenizer.save(path)
    record = dict(wanted, model_sha256=tokenizer.sha256(), actual_vocab_size=tokenizer.vocab_size)
    atomic_write_bytes(sidecar, (json.dumps(record, indent=2) + "\n").encode("utf-8"))
    smaller = (f", fewer than the {vocab_size} asked: all this corpus supports"
               if tokenizer.vocab_size < vocab_size else "")
    log.info("tokenizer: trained %s (vocab %d%s)", path, tokenizer.vocab_size, smaller)
    return tokenizer


def _reuse_problem(path: Path, sidecar: Path, wanted: dict) -> str | None:
    """Why the model at ``path`` cannot be reused, or None if it can."""
    if not path.is_file():
        return "no model yet"
    try:
        record = json.loads(sidecar.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return f"no readable {sidecar.name}"
    changed = [key for key, value in wanted.items() if record.get(key) != value]
    if changed:
        return "changed: " + ", ".join(changed)
    if record.get("model_sha256") != hashlib.sha256(path.read_bytes()).hexdigest():
        return "model file does not match its sidecar"
    return None

