"""Subword regularization (``--subword-alpha``): each epoch trains on a sampled segmentation of the
training split, seeded by the run's seed and the epoch; the text is unchanged, evaluation keeps the
best segmentation, and a resumed run is still exact."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from seq2seq.checkpoint.file import load_checkpoint
from seq2seq.config import RunConfig
from seq2seq.errors import UserError
from seq2seq.tokenizer import Tokenizer
from seq2seq.training.corpus import prepare_run_corpus
from seq2seq.training.run import train

SPM = Path(__file__).parent / "data" / "pre-tiers" / "transformer-export" / "spm.model"
TEXTS = ["vier hundert zwei und zwanzig tausend", "sieben und neunzig", "drei hundert acht und vierzig"] * 4


def tiny(out: Path, **data) -> RunConfig:
    cfg = RunConfig.from_dict({
        "model": {"arch": "transformer", "d_model": 32, "heads": 2, "ff_size": 64, "layers": 1},
        "data": {"toy_size": 200, "vocab_size": 120, "max_tokens": 400, "cache_dir": str(out.parent / "cache"),
                 "subword_alpha": 0.2, **data},
        "train": {"max_steps": 12, "eval_every": 0, "warmup_steps": 4, "seed": 3, "device": "cpu", "threads": 1},
    })
    cfg.output_dir = str(out)
    return cfg.resolved()


def test_sampled_segmentations_spell_the_same_text_and_follow_the_seed():
    tokenizer = Tokenizer.load(SPM)
    first, again, other = (tokenizer.encode_sampled(TEXTS, 0.1, seed) for seed in (1, 1, 2))
    assert first == again and first != other  # seeded; another seed, another segmentation
    assert first != tokenizer.encode_batch(TEXTS)  # not the best segmentation
    assert [tokenizer.decode(ids) for ids in first] == TEXTS == [tokenizer.decode(ids) for ids in other]


def test_each_epoch_has_its_own_segmentation_and_evaluation_keeps_the_best(tmp_path):
    cfg = tiny(tmp_path / "run")
    (tmp_path / "run").mkdir()
    corpus = prepare_run_corpus(cfg, tmp_path / "run", quiet=True)
    zero, one = corpus.epoch_columns(0)[0], corpus.epoch_columns(1)[0]
    assert corpus.epoch_columns(1)[0] is one  # built once per epoch
    rows = range(len(zero))
    assert any(zero.batch([i]).src.tolist() != one.batch([i]).src.tolist() for i in rows)
    best = corpus.columns["train"]
    assert any(zero.batch([i]).tgt_out.tolist() != best.batch([i]).tgt_out.tolist() for i in rows)
    assert corpus.eval_batches("validation")  # validation reads the cached best segmentation
    for i in range(5):  # the sampled ids spell the training text
        ids = [t for t in zero.batch([i]).tgt_out[0].tolist() if t > 3]
        assert corpus.tokenizer.decode(ids) == corpus.splits["train"]["tgt"][i]


def test_a_resumed_run_with_sampled_segmentations_is_exact(tmp_path):
    train(tiny(tmp_path / "whole"), quiet=True)
    cut = tiny(tmp_path / "cut")
    cut.train.max_steps = 5
    train(cut, quiet=True)
    train(tiny(tmp_path / "cut"), resume=True, quiet=True)
    whole, resumed = load_checkpoint(tmp_path / "whole" / "last.pt"), load_checkpoint(tmp_path / "cut" / "last.pt")
    assert resumed["progress"]["step"] == 12 and resumed["progress"]["epoch"] == whole["progress"]["epoch"]
    for name, weight in whole["model"].items():
        torch.testing.assert_close(resumed["model"][name], weight, rtol=0, atol=0, msg=name)


def test_streaming_cannot_sample_segmentations(tmp_path):
    cfg = tiny(tmp_path / "run", streaming=True)
    with pytest.raises(UserError, match="--subword-alpha .* needs a prepared corpus, not --streaming"):
        train(cfg, quiet=True)
