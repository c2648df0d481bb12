"""What ``seq2seq translate`` writes for each input line: the text (one line, or ``--n-best`` rows) or one
JSON object (``--output-format jsonl``), with ``--markup`` the translations with the source's tags."""
from __future__ import annotations

import json

from ..decoding.translation import Translation


def write_text(out, results: list[Translation], offset: int, n_best: int,
               marked: list[list[str]] | None = None) -> None:
    """One line per input, or with ``--n-best`` ``index ||| text ||| score`` per hypothesis; ``marked``
    (``--markup``): each hypothesis's text with the source's tags carried across, in its place."""
    for i, result in enumerate(results):
        hypotheses = result.alternatives or [result]
        texts = [h.text for h in hypotheses] if marked is None else marked[i]
        if n_best == 1:
            out.write(texts[0] + "\n")
        else:
            for alt, text in zip(hypotheses, texts):
                out.write(f"{offset + i} ||| {text} ||| {alt.score:.4f}\n")
    out.flush()


def write_jsonl(out, results: list[Translation], offset: int, marked: list[list[str]] | None = None,
                lines: list[str] | None = None) -> None:
    """``--output-format jsonl``: per input line one object: its index, source, best translation with
    score, log_prob and per-token / per-word confidence (``Translation.confidence``), and with
    ``--n-best`` the whole list best first (docs/formats.md). With ``marked`` (``--markup``) the source is
    the input ``lines`` as given, and each hypothesis has its ``markup``: the translation with the tags."""
    def hypothesis(t: Translation, i: int, rank: int) -> dict:
        return {"translation": t.text, **({} if marked is None else {"markup": marked[i][rank]}),
                "score": t.score, "log_prob": t.log_prob, **(t.confidence() or {"tokens": [], "words": []})}

    for i, result in enumerate(results):
        source = result.source if marked is None or lines is None else lines[i]
        record = {"index": offset + i, "source": source, **hypothesis(result, i, 0)}
        if len(result.alternatives) > 1:
            record["n_best"] = [hypothesis(t, i, rank) for rank, t in enumerate(result.alternatives)]
        out.write(json.dumps(record, ensure_ascii=False) + "\n")
    out.flush()
