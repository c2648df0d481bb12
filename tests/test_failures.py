"""What a user meets when the machine says no: a full disk, a read-only folder, a path that is a file, a
run that fails before it starts, and ``--resume`` that keeps the run's own limits. Every case is one
message naming the path and what survived, exit status 1 (a failure) or 2 (a usage error), no
traceback, nothing half-written and no leftover run directory."""
from __future__ import annotations

import errno
import json
import tempfile
from contextlib import contextmanager
from pathlib import Path

import pytest
from conftest import interrupt_at

import seq2seq.checkpoint.file as checkpoint_file
from seq2seq.checkpoint.file import load_checkpoint
from seq2seq.cli import main
from seq2seq.errors import OutputError
from seq2seq.io_utils import atomic_directory, atomic_output

TINY = ["--toy-size", "300", "--vocab-size", "120", "--d-model", "32", "--heads", "2", "--ff-size", "64",
        "--layers", "1", "--warmup-steps", "5", "--eval-max-sentences", "8", "--device", "cpu", "--threads", "1",
        "--no-final-test", "--quiet"]


def tiny_train(tmp_path: Path, *flags: str) -> list[str]:
    return ["train", *TINY, "--cache-dir", str(tmp_path / "cache"), *flags]


def no_space(*_args) -> None:
    raise OSError(errno.ENOSPC, "No space left on device")


def fill_disk_when(monkeypatch, condition) -> None:
    """Checkpoints are written through ``atomic_output``: a checkpoint write for which ``condition(name,
    names written so far)`` holds writes half its data, then finds the disk full."""
    real, writes = checkpoint_file.atomic_output, []

    @contextmanager
    def filling(path, mode="w"):
        with real(path, mode) as handle:
            writes.append(Path(path).name)
            if condition(Path(path).name, writes):
                handle.write(b"half a checkpoint")
                no_space()
            yield handle

    monkeypatch.setattr(checkpoint_file, "atomic_output", filling)


# ----------------------------------------------------------------------------- the writers


def test_a_full_disk_is_named_and_the_earlier_file_is_intact(tmp_path):
    target = tmp_path / "out.txt"
    target.write_text("earlier\n")
    with pytest.raises(OutputError) as info:
        with atomic_output(target) as handle:
            handle.write("half a translation")
            no_space()
    assert str(info.value) == f"no space left on device writing {target}; nothing was written; the earlier " \
                              f"{target} is intact"
    assert target.read_text() == "earlier\n"
    assert sorted(tmp_path.iterdir()) == [target]  # the temp file is gone


def test_an_error_about_another_file_is_not_relabelled(tmp_path):
    with pytest.raises(FileNotFoundError):
        with atomic_output(tmp_path / "out.txt"):
            open(tmp_path / "missing-input.txt")  # reading inside the block: not a failure to write out.txt
    assert list(tmp_path.iterdir()) == []


def test_a_directory_write_that_fails_leaves_nothing(tmp_path):
    with pytest.raises(OutputError, match=f"no space left on device writing {tmp_path / 'export'}; nothing was "):
        with atomic_directory(tmp_path / "export") as staged:
            (staged / "model.bin").write_bytes(b"x")
            no_space()
    assert list(tmp_path.iterdir()) == []


# ----------------------------------------------------------------------------- the commands


def test_translate_into_a_path_whose_folder_is_a_file(tmp_path, capsys):
    (tmp_path / "in.txt").write_text("one\n")
    (tmp_path / "afile").write_text("not a folder")
    code = main(["translate", "--checkpoint", str(Path(__file__).parent / "data/pre-tiers/rnn.pt"),
                 "--input", str(tmp_path / "in.txt"), "--output", str(tmp_path / "afile" / "out.txt")])
    err = capsys.readouterr().err
    assert code == 1
    assert f"error: a part of the path is a file, not a directory writing {tmp_path / 'afile' / 'out.txt'}" in err
    assert (tmp_path / "afile").read_text() == "not a folder"


def test_translate_into_a_read_only_folder(tmp_path, monkeypatch, capsys):
    def read_only(*_args, **_kwargs):
        raise OSError(errno.EROFS, "Read-only file system", str(tmp_path / "ro"))

    (tmp_path / "in.txt").write_text("one\n")
    (tmp_path / "ro").mkdir()
    monkeypatch.setattr(tempfile, "mkstemp", read_only)  # root ignores permission bits: the refusal is simulated
    code = main(["translate", "--checkpoint", str(Path(__file__).parent / "data/pre-tiers/rnn.pt"),
                 "--input", str(tmp_path / "in.txt"), "--output", str(tmp_path / "ro" / "x.txt")])
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err
    assert f"error: read-only file system writing {tmp_path / 'ro' / 'x.txt'}; nothing was written to" in err


def test_train_into_a_read_only_folder(tmp_path, monkeypatch, capsys):
    original = Path.mkdir

    def mkdir(self, *args, **kwargs):
        if self.parent == tmp_path / "ro":
            raise OSError(errno.EROFS, "Read-only file system", str(self))
        return original(self, *args, **kwargs)

    (tmp_path / "ro").mkdir()
    monkeypatch.setattr(Path, "mkdir", mkdir)
    code = main(tiny_train(tmp_path, "--max-steps", "2", "--output-dir", str(tmp_path / "ro" / "run")))
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err
    assert (f"error: read-only file system creating the run directory {tmp_path / 'ro' / 'run'}; choose "
            "another --output-dir") in err


def test_a_full_disk_while_training_names_what_survived(tmp_path, monkeypatch, capsys):
    """The second write of last.pt fails partway; best.pt and the first last.pt are intact and the
    message says how to go on."""
    fill_disk_when(monkeypatch, lambda name, writes: name == "last.pt" and writes.count("last.pt") == 2)
    run = tmp_path / "run"
    code = main(tiny_train(tmp_path, "--max-steps", "60", "--eval-every", "20", "--output-dir", str(run)))
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err
    best = load_checkpoint(run / "best.pt")["progress"]["step"]
    assert f"error: no space left on device writing {run / 'last.pt'}; nothing was written; the earlier " \
           f"{run / 'last.pt'} is intact; {run / 'best.pt'} (step {best}) is intact; fix that and continue with " \
           f"seq2seq train --output-dir {run} --resume" in err
    assert load_checkpoint(run / "last.pt")["progress"]["step"] == 20
    assert not [p for p in run.iterdir() if p.name.endswith(".tmp")]


def test_a_full_disk_at_the_first_last_pt_keeps_best_pt_and_says_so_truthfully(tmp_path, monkeypatch, capsys):
    """Issue 49: validation writes best.pt, then the first last.pt fills the disk. The run directory and
    best.pt stay (the clean-up of a failed start once removed them both, after the message had called
    best.pt intact), the message says there is nothing to resume from, and a new run into the same
    directory is refused rather than overwriting best.pt."""
    real = checkpoint_file.atomic_output
    fill_disk_when(monkeypatch, lambda name, writes: name == "last.pt")
    run = tmp_path / "run"
    code = main(tiny_train(tmp_path, "--max-steps", "60", "--eval-every", "20", "--output-dir", str(run)))
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err
    assert load_checkpoint(run / "best.pt")["progress"]["step"] == 20
    assert f"error: no space left on device writing {run / 'last.pt'}; nothing was written to {run / 'last.pt'}; " \
           f"{run / 'best.pt'} (step 20) is intact; there is no last.pt to resume from" in err
    assert not (run / "last.pt").exists() and not [p for p in run.iterdir() if p.name.endswith(".tmp")]
    monkeypatch.setattr(checkpoint_file, "atomic_output", real)
    assert main(tiny_train(tmp_path, "--max-steps", "2", "--output-dir", str(run))) == 2
    assert "holds checkpoints of an earlier run" in capsys.readouterr().err
    assert load_checkpoint(run / "best.pt")["progress"]["step"] == 20


def test_a_message_calls_intact_only_what_loads(tmp_path, monkeypatch, capsys):
    """A best.pt that no longer loads (truncated behind the run's back) is not called intact."""
    run = tmp_path / "run"

    def second_last_pt_after_truncating_best(name: str, writes: list[str]) -> bool:
        if name == "last.pt" and (run / "last.pt").exists():
            (run / "best.pt").write_bytes(b"truncated")
            return True
        return False

    fill_disk_when(monkeypatch, second_last_pt_after_truncating_best)
    code = main(tiny_train(tmp_path, "--max-steps", "60", "--eval-every", "20", "--output-dir", str(run)))
    err = capsys.readouterr().err
    assert code == 1 and f"the earlier {run / 'last.pt'} is intact" in err and "best.pt (step" not in err
    assert f"continue with seq2seq train --output-dir {run} --resume" in err


# ----------------------------------------------------------------------------- a run that fails before it starts


def mismatched_data(tmp_path: Path) -> Path:
    data = tmp_path / "data"
    data.mkdir()
    for split in ("train", "val", "test_2016_flickr"):
        (data / f"{split}.de").write_text("ein Hund\n" * 50)
        (data / f"{split}.en").write_text("a dog\n" * (49 if split == "train" else 50))
    return data


def test_a_run_that_fails_before_it_starts_leaves_no_run_directory(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    data = mismatched_data(tmp_path)
    code = main(["train", "--data-dir", str(data), "--src", "de", "--tgt", "en", "--cache-dir", "cache", "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert "train.de" in err and "train.en" in err and "tokenizer: training" not in err
    assert not (tmp_path / "checkpoints").exists() or list((tmp_path / "checkpoints").iterdir()) == []
    mine = tmp_path / "mine"  # a directory the user made stays, even empty
    mine.mkdir()
    assert main(["train", "--data-dir", str(data), "--src", "de", "--tgt", "en", "--output-dir", str(mine)]) == 2
    assert mine.is_dir() and list(mine.iterdir()) == []


# ----------------------------------------------------------------------------- --resume keeps the run's limits


def steps_validated(run: Path) -> list[int]:
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r["step"] for r in records if r["kind"] == "valid"]


def test_resume_keeps_the_run_limits_and_logs_what_a_flag_changes(tmp_path, monkeypatch, capsys):
    run = tmp_path / "run"
    interrupt_at(monkeypatch, 7)
    main(tiny_train(tmp_path, "--max-steps", "12", "--eval-every", "4", "--max-minutes", "0",
                    "--output-dir", str(run)))
    assert load_checkpoint(run / "last.pt")["progress"]["step"] == 6
    monkeypatch.undo()
    capsys.readouterr()
    # the bare resume of the README: the toy preset's time limit and validation interval do not replace the run's
    assert main(["train", "--output-dir", str(run), "--resume", "--quiet"]) == 0
    assert load_checkpoint(run / "last.pt")["progress"]["step"] == 12
    assert steps_validated(run) == [4, 8, 12]
    assert "resume max_steps" not in capsys.readouterr().err
    assert main(["train", "--output-dir", str(run), "--resume", "--max-steps", "16", "--lr", "0.5"]) == 0
    err = capsys.readouterr().err
    assert "resume max_steps=12->16" in err
    assert "ignored: --lr" in err
    assert load_checkpoint(run / "last.pt")["progress"]["step"] == 16
    assert load_checkpoint(run / "last.pt")["config"]["optim"]["lr"] != 0.5


def test_resume_without_a_run_says_so(tmp_path, capsys):
    assert main(["train", "--output-dir", str(tmp_path / "none"), "--resume"]) == 2
    assert f"--resume: {tmp_path / 'none' / 'last.pt'} does not exist" in capsys.readouterr().err
