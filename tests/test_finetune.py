"""Fine-tuning (``seq2seq train --init-from RUN``): a new run starts from a trained model's weights,
tokenizer and model config; options that would change the architecture are named errors; the run
records where it started and resumes without its starting point."""
from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest
import torch

from seq2seq.checkpoint.file import load_checkpoint
from seq2seq.cli import main
from seq2seq.config import RunConfig
from seq2seq.errors import UserError
from seq2seq.tokenizer import Tokenizer
from seq2seq.training.run import train

COMMON = ["--device", "cpu", "--threads", "1", "--no-final-test", "--quiet", "--eval-max-sentences", "8"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("finetune") / "trained"
    assert main(["train", *COMMON, "--toy-size", "300", "--vocab-size", "120", "--d-model", "32", "--heads", "2",
                 "--ff-size", "64", "--layers", "1", "--warmup-steps", "5", "--max-steps", "20", "--eval-every", "10",
                 "--cache-dir", str(run.parent / "cache"), "--output-dir", str(run)]) == 0
    return run


def fine_tune(trained: Path, out: Path, *flags: str) -> int:
    return main(["train", *COMMON, "--init-from", str(trained), "--toy-size", "200", "--seed", "7",
                 "--cache-dir", str(out.parent / "cache"), "--output-dir", str(out), *flags])


def test_a_fine_tuned_run_starts_from_the_trained_model(trained, tmp_path):
    run = tmp_path / "tuned"
    assert fine_tune(trained, run, "--max-steps", "2", "--eval-every", "0", "--lr", "1e-12", "--warmup-steps", "1") == 0
    start, tuned = load_checkpoint(trained / "best.pt"), load_checkpoint(run / "last.pt")
    assert tuned["config"]["model"] == start["config"]["model"]  # the toy preset's own model did not apply
    assert tuned["config"]["train"]["init_from"] == str(trained)  # the run records where it started
    assert "init_from: " + str(trained) in (run / "config.yaml").read_text()
    assert Tokenizer.load(run / "spm.model").sha256() == Tokenizer.load(trained / "spm.model").sha256()
    for name, weight in start["model"].items():  # two steps at lr 1e-12 move no weight measurably
        torch.testing.assert_close(tuned["model"][name], weight, rtol=0, atol=1e-6, msg=name)
    assert tuned["progress"]["step"] == 2  # a new run: its own steps, optimizer and schedule


def test_options_that_change_the_architecture_are_named_errors(trained, tmp_path, capsys):
    assert fine_tune(trained, tmp_path / "wider", "--d-model", "64") == 2
    err = capsys.readouterr().err
    assert f"--d-model 64: --init-from {trained} trained d_model 32" in err and "Traceback" not in err
    assert not (tmp_path / "wider").exists()
    assert fine_tune(trained, tmp_path / "drop", "--dropout", "0.3", "--max-steps", "1", "--eval-every", "0") == 0
    assert load_checkpoint(tmp_path / "drop" / "last.pt")["config"]["model"]["dropout"] == 0.3  # dropout may change
    if importlib.util.find_spec("entmax") is not None:  # so may the attention normalizer (no parameters)
        assert fine_tune(trained, tmp_path / "sparse", "--attention-normalizer", "entmax15", "--max-steps", "1",
                         "--eval-every", "0") == 0
        assert load_checkpoint(tmp_path / "sparse" / "last.pt")["config"]["model"]["attention_normalizer"] == "entmax15"
    cfg = RunConfig.from_dict({"train": {"init_from": str(trained), "device": "cpu", "max_steps": 1},
                               "data": {"toy_size": 200, "cache_dir": str(tmp_path / "cache")}})
    cfg.output_dir = str(tmp_path / "api")
    with pytest.raises(UserError, match="fine-tuning keeps the trained model's architecture and size"):
        train(cfg, quiet=True)  # the Python API checks too: the default model is not the trained one


def test_a_fine_tuned_run_resumes_without_its_starting_point(trained, tmp_path):
    start = tmp_path / "start"
    shutil.copytree(trained, start)
    run = tmp_path / "tuned"
    assert fine_tune(start, run, "--max-steps", "3", "--eval-every", "0") == 0
    shutil.rmtree(start)  # the trained run is gone: the resumed run needs only its own directory
    assert main(["train", "--output-dir", str(run), "--resume", "--max-steps", "5", "--quiet"]) == 0
    assert load_checkpoint(run / "last.pt")["progress"]["step"] == 5
