"""Periodic saves, kept checkpoints (best N by validation BLEU, newest N) and their average."""
from __future__ import annotations

import json
import pickle

import numpy as np
import pytest
import torch
from conftest import run_main

from seq2seq.cli import main as seq2seq_main
from seq2seq.decoding.translator import Translator
from seq2seq.errors import UserError
from seq2seq.checkpoint.file import load_checkpoint, save_checkpoint
from seq2seq.checkpoint.kept import KeptCheckpoints
from seq2seq.checkpoint.average import average_checkpoints
from seq2seq.training.trainer import Trainer
from seq2seq.training.run import train
from test_training import tiny_config


def fake_payload(value: float, step: int) -> dict:
    return {"config": {"model": {"arch": "transformer", "d_model": 4}},
            "tokenizer": torch.tensor([1, 2], dtype=torch.uint8),
            "model": {"w": torch.full((2, 2), value), "count": torch.tensor(step)},
            "progress": {"step": step}, "optimizer": {"state": "not kept"}}


def test_kept_checkpoints_hold_the_newest_and_the_best_and_delete_the_rest(tmp_path):
    kept = KeptCheckpoints(tmp_path, keep_last=2, keep_best=2)
    bleus = {100: 10.0, 200: 30.0, 300: None, 400: 20.0, 500: 25.0, 600: None}
    for step, bleu in bleus.items():
        kept.add(fake_payload(step, step), step, bleu)
    steps = [e["step"] for e in kept.entries()]
    assert steps == [200, 500, 600]  # best: 200 (30), 500 (25); newest: 500, 600
    assert sorted(p.name for p in (tmp_path / "checkpoints").glob("*.pt")) == [
        "step-0000200.pt", "step-0000500.pt", "step-0000600.pt"]
    assert [p.name for p in kept.select("best", 2)] == ["step-0000200.pt", "step-0000500.pt"]
    assert [p.name for p in kept.select("last", 2)] == ["step-0000600.pt", "step-0000500.pt"]
    snapshot = load_checkpoint(tmp_path / "checkpoints" / "step-0000600.pt")
    assert "optimizer" not in snapshot and snapshot["progress"]["step"] == 600  # weights only
    with pytest.raises(UserError, match="holds 2 best checkpoint.*--keep-best 3"):
        kept.select("best", 3)
    kept.add(fake_payload(600, 600), 600, bleu=40.0)  # validation at a step already saved: one file, with BLEU
    assert [e["bleu"] for e in kept.entries() if e["step"] == 600] == [40.0]


def test_averaging_takes_the_mean_of_the_weights_and_refuses_different_models(tmp_path):
    for value, step in ((1.0, 10), (2.0, 20), (6.0, 30)):
        save_checkpoint(tmp_path / f"{step}.pt", fake_payload(value, step))
    averaged = average_checkpoints([tmp_path / "10.pt", tmp_path / "20.pt", tmp_path / "30.pt"])
    assert torch.equal(averaged["model"]["w"], torch.full((2, 2), 3.0))
    assert averaged["model"]["count"].item() == 30 and averaged["progress"]["step"] == 30  # the newest's
    itself = average_checkpoints([tmp_path / "10.pt", tmp_path / "10.pt"])
    assert torch.equal(itself["model"]["w"], load_checkpoint(tmp_path / "10.pt")["model"]["w"])

    other = fake_payload(1.0, 40)
    other["config"]["model"]["d_model"] = 8
    save_checkpoint(tmp_path / "other.pt", other)
    different = r"cannot average .*10\.pt and .*other\.pt: different models \(d_model: 4 vs 8\)"
    with pytest.raises(UserError, match=different):
        average_checkpoints([tmp_path / "10.pt", tmp_path / "other.pt"])
    foreign = fake_payload(1.0, 50)
    foreign["tokenizer"] = torch.tensor([9], dtype=torch.uint8)
    save_checkpoint(tmp_path / "foreign.pt", foreign)
    with pytest.raises(UserError, match="different tokenizers"):
        average_checkpoints([tmp_path / "10.pt", tmp_path / "foreign.pt"])
    with pytest.raises(UserError, match="at least two"):
        average_checkpoints([tmp_path / "10.pt"])


def test_periodic_saves_bound_what_a_killed_run_loses(tmp_path, monkeypatch):
    """A run killed at step 8 with validation never reached still has last.pt of step 6 (--save-every 3)."""
    original = Trainer.train_step

    def killed_at_step_8(self, group):
        if self.progress.step == 7:
            raise SystemExit("killed")  # no Ctrl-C handler runs: only what was already written survives
        return original(self, group)

    monkeypatch.setattr(Trainer, "train_step", killed_at_step_8)
    for name, flags in (("periodic", {"save_every": 3}), ("clock", {"save_every_minutes": 1e-9}), ("none", {})):
        with pytest.raises(SystemExit):
            train(tiny_config(tmp_path / name, max_steps=20, eval_every=0, **flags), quiet=True)
        saved = tmp_path / name / "last.pt"
        if name == "none":
            assert not saved.exists()
        else:
            assert load_checkpoint(saved)["progress"]["step"] == {"periodic": 6, "clock": 7}[name]
    monkeypatch.setattr(Trainer, "train_step", original)
    resumed = train(tiny_config(tmp_path / "periodic", max_steps=9, eval_every=0, save_every=3), resume=True,
                    quiet=True)
    assert resumed.progress.step == 9


def test_a_run_keeps_its_best_and_newest_checkpoints_and_seq2seq_average_combines_them(tmp_path, capsys):
    run = tmp_path / "run"
    train(tiny_config(run, max_steps=16, eval_every=4, save_every=2, keep_best=2, keep_last=2), quiet=True)
    index = json.loads((run / "checkpoints" / "index.json").read_text())
    validated = [e for e in index if e["bleu"] is not None]
    assert {e["step"] for e in index} >= {14, 16} and len(validated) >= 2
    assert len(index) <= 4 and all((run / "checkpoints" / e["file"]).is_file() for e in index)

    output = tmp_path / "average.pt"
    assert seq2seq_main(["average", "--checkpoint", str(run), "--best", "2", "--output", str(output)]) == 0
    best = [load_checkpoint(p)["model"] for p in KeptCheckpoints(run).select("best", 2)]
    averaged = load_checkpoint(output)["model"]
    for key, value in averaged.items():
        if value.is_floating_point():
            torch.testing.assert_close(value, (best[0][key] + best[1][key]) / 2)
    [out] = Translator.from_checkpoint(output, device="cpu").translate(["twenty-one"], beam_size=2)
    assert isinstance(out.text, str)

    assert seq2seq_main(["average", "--checkpoint", str(run), "--last", "9", "--output", str(tmp_path / "x.pt")]) == 2
    assert f"holds {len(index)} last checkpoint(s), 9 asked" in capsys.readouterr().err
    assert not (tmp_path / "x.pt").exists()
    assert seq2seq_main(["average", "--checkpoint", str(run), "--output", str(tmp_path / "x.pt")]) == 2
    assert "choose --best N or --last N" in capsys.readouterr().err
    rnn = tmp_path / "rnn"
    train(tiny_config(rnn, "rnn", max_steps=2, eval_every=0), quiet=True)
    assert seq2seq_main(["average", "--checkpoint", str(run / "best.pt"), str(rnn / "last.pt"),
                         "--output", str(tmp_path / "x.pt")]) == 2
    assert "different models (arch: 'transformer' vs 'rnn'" in capsys.readouterr().err
    assert not (tmp_path / "x.pt").exists()


# ----------------------------------------------------------------------------- what is not a checkpoint


def _not_checkpoints(directory, tokenizer) -> dict:
    """Files a user may pass as --checkpoint by mistake, in a run directory that has a checkpoint."""
    run = directory / "run"
    run.mkdir()
    save_checkpoint(run / "best.pt", fake_payload(1.0, 5))
    tokenizer.save(run / "spm.model")
    (directory / "text.txt").write_text("eins\nzwei\n", encoding="utf-8")
    whole = (run / "best.pt").read_bytes()
    (directory / "truncated.pt").write_bytes(whole[: len(whole) // 2])
    torch.save({"weights": np.zeros(3)}, directory / "foreign.pt")  # weights_only refuses numpy arrays
    with open(directory / "pickled.pt", "wb") as handle:
        pickle.dump({"weights": [1.0]}, handle)  # plain pickle: torch's message advises weights_only=False
    (directory / "empty.pt").write_bytes(b"")
    return {"spm": run / "spm.model", "text": directory / "text.txt", "truncated": directory / "truncated.pt",
            "foreign": directory / "foreign.pt", "pickled": directory / "pickled.pt", "empty": directory / "empty.pt"}


@pytest.mark.parametrize("kind", ["spm", "text", "truncated", "foreign", "pickled", "empty"])
def test_a_file_that_is_no_checkpoint_says_what_was_expected_never_to_unpickle(tmp_path, tiny_tokenizer, kind):
    path = _not_checkpoints(tmp_path, tiny_tokenizer)[kind]
    code, out, err = run_main(["translate", "--checkpoint", str(path)], stdin="eins\n")
    assert code == 2 and out == "" and "Traceback" not in err
    assert err.startswith(f"error: checkpoint {path}: ") and err.count("\n") == 1
    assert "expected a .pt checkpoint written by seq2seq train, a run directory" in err
    assert "model directory written by seq2seq export" in err
    for advice in ("weights_only", "Weights only", "can still be loaded", "trust the source"):  # torch's
        assert advice not in err
    if kind == "spm":  # the run directory it lies in is what to pass
        assert f"pass the run directory {path.parent}" in err


def test_a_run_directory_before_its_first_checkpoint_says_so_and_what_was_looked_for(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("model:\n  arch: rnn\n", encoding="utf-8")  # what train writes first
    for argv in (["translate", "--checkpoint", str(run)],
                 ["export", "--format", "safetensors", str(run), str(tmp_path / "out")]):
        code, _, err = run_main(argv, stdin="eins\n")
        assert code == 2 and "Traceback" not in err
        assert f"checkpoint {run}: the run directory holds no checkpoint yet" in err
        assert f"looked for {run / 'best.pt'} and {run / 'last.pt'}" in err and "--save-every" in err
    assert not (tmp_path / "out").exists()
    other = tmp_path / "other"  # neither a run directory nor an exported model
    other.mkdir()
    with pytest.raises(UserError, match=r"a directory without a checkpoint \(looked for .*best.pt and .*last.pt, "
                                        r"and for an exported model .*model.safetensors\); expected"):
        load_checkpoint(other)
