"""``--tensorboard DIR``: scalars and attention heatmaps a TensorBoard reader finds; bad directories
and a missing package are named errors before any work."""
from __future__ import annotations

import sys

import pytest

from seq2seq.errors import UserError
from seq2seq.training.run import train
from test_training import tiny_config


def test_training_writes_scalars_and_attention_images_tensorboard_reads(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logs = tmp_path / "tb"
    train(tiny_config(tmp_path / "run", max_steps=8, eval_every=4, log_every=2, tensorboard=str(logs)), quiet=True)
    events = EventAccumulator(str(logs), size_guidance={"images": 0, "scalars": 0})
    events.Reload()
    tags = events.Tags()
    assert {"train/loss", "train/lr", "train/tokens_per_s", "valid/loss", "valid/bleu", "valid/chrf"} <= set(
        tags["scalars"])
    assert [e.step for e in events.Scalars("train/loss")] == [2, 4, 6, 8]
    assert [e.step for e in events.Scalars("valid/bleu")] == [4, 8]
    assert {"attention/0", "attention/1", "attention/2"} <= set(tags["images"])
    image = events.Images("attention/0")
    assert [e.step for e in image] == [4, 8] and image[0].encoded_image_string[:4] == b"\x89PNG"


def test_an_unwritable_tensorboard_directory_is_an_error_before_any_work(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with pytest.raises(UserError, match=r"--tensorboard .*a-file/tb: cannot write there"):
        train(tiny_config(tmp_path / "run", tensorboard=str(blocker / "tb")), quiet=True)
    assert not (tmp_path / "run").exists()  # nothing started, nothing half-written


def test_tensorboard_missing_is_a_named_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import fails as if not installed
    with pytest.raises(UserError, match=r"--tensorboard needs the tensorboard package: pip install"):
        train(tiny_config(tmp_path / "run", tensorboard=str(tmp_path / "tb")), quiet=True)
