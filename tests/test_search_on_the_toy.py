"""Beam search on a converged toy model, as the quickstart's user meets it: beam k is never worse than
greedy search by the model's own score, beam 5's test BLEU is at least greedy's, and CTranslate2's
search (which searches on) chooses the same outputs as ours.

The model is the suite's shared converged toy Transformer (``converged_toy``): 240k parameters,
400 steps on the embedded toy corpus, greedy test BLEU ~99.9. On it, beam search that stopped once
k hypotheses had finished (the rule before issue 64) scored beam 5 below greedy (99.67 vs 99.92 BLEU,
3 sentences below greedy's score; beam 2: 98.24, 22 sentences) on an AVX-512 EPYC.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import sacrebleu

import run_shared
from seq2seq.config import RunConfig
from seq2seq.decoding.translator import Translator
from seq2seq.toy import toy_corpus
from seq2seq.training.run import train

pytestmark = pytest.mark.slow  # ~1 minute of training, once per run: scheduled first under -n


def _train(directory: Path) -> None:
    cfg = RunConfig.from_dict({
        "model": {"arch": "transformer", "d_model": 64, "heads": 4, "ff_size": 256, "layers": 2, "dropout": 0.1},
        "data": {"toy_size": 20000, "vocab_size": 400, "max_tokens": 3000, "cache_dir": str(directory / "cache")},
        "train": {"max_steps": 400, "eval_every": 0, "warmup_steps": 100, "lr": 3e-3, "seed": 1, "threads": 1,
                  "device": "cpu"},
    })
    cfg.output_dir = str(directory / "run")
    train(cfg, quiet=True)


@pytest.fixture(scope="module")
def converged_toy() -> Path:
    return run_shared.built_once("converged-toy-transformer", _train) / "run" / "last.pt"


@pytest.fixture(scope="module")
def test_set() -> tuple[list[str], list[str]]:
    test = toy_corpus()["test"]  # the quickstart's test split (seed 1), 500 pairs
    return list(test["src"]), list(test["tgt"])


def _gnmt(length: int, alpha: float) -> float:
    return ((5 + length) / 6) ** alpha


def test_beam_is_never_worse_than_greedy_by_the_models_score(converged_toy, test_set):
    sources, references = test_set
    translator = Translator.from_checkpoint(converged_toy, device="cpu")
    greedy = translator.translate(sources, beam_size=1, need_attention=False)
    bleu = {1: sacrebleu.corpus_bleu([t.text for t in greedy], [references]).score}
    assert bleu[1] > 95, "the shared toy model is meant to be converged"
    for k, tolerated, stop in ((2, 2, "exact"), (5, 0, "exact"), (5, 0, "likely")):
        beam = translator.translate(sources, beam_size=k, length_penalty=1.0, beam_stop=stop, need_attention=False)
        bleu[k, stop] = sacrebleu.corpus_bleu([t.text for t in beam], [references]).score
        # greedy's output scored as the beam scores it: log P / GNMT lp, |Y| counting EOS
        below = [(s, g.text, b.text) for s, g, b in zip(sources, greedy, beam)
                 if b.score < g.log_prob / _gnmt(len(g.tokens) + 1, 1.0) - 1e-4]
        # beam search is not exact (greedy's path can leave a narrow beam), so beam 2 may lose a rare
        # sentence; the old stopping rule lost 22 (beam 2) and 3 (beam 5) of these 500
        assert len(below) <= tolerated, (k, below[:3])
    assert bleu[5, "exact"] >= bleu[1] and bleu[5, "likely"] >= bleu[1], bleu


def test_ctranslate2_chooses_our_outputs_on_the_toy_test_set(converged_toy, tmp_path, test_set):
    """fp32, the defaults (beam 5, GNMT alpha 1): CTranslate2's beam, re-ranked by our length penalty,
    and ours give the same translation of every test sentence."""
    pytest.importorskip("ctranslate2")
    import shutil

    run = Path(shutil.copytree(converged_toy.parent, tmp_path / "run", ignore=shutil.ignore_patterns("cache")))
    sources, _ = test_set
    ours = Translator.from_checkpoint(run / "last.pt", device="cpu").translate(sources, need_attention=False)
    theirs = Translator.from_checkpoint(run / "last.pt", device="cpu", engine="ctranslate2").translate(
        sources, need_attention=False)
    differ = [(s, a.text, b.text) for s, a, b in zip(sources, ours, theirs) if a.text != b.text]
    assert not differ, differ[:5]
