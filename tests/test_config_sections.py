"""The config's sections by concern (issue 67): guided alignment one section, the run's options grouped as
``train`` / ``optim`` / ``schedule`` / ``eval`` / ``checkpoint``; flags unchanged; every config written in the
layout before (all under ``train``, guided alignment switched on in ``data``) still reads, to the same values;
``configs/*.yaml`` are the presets as this file writes them (``python tests/test_config_sections.py``)."""
from __future__ import annotations

import dataclasses
import re
import sys
from pathlib import Path

import pytest
import yaml

from seq2seq.cli import config_from_flags
from seq2seq.config import (
    ARCH_DEFAULTS, DEVICE_DEFAULTS, MOVED, PRESETS, RESUME_FIELDS, SECTIONS, CheckpointConfig, EvalConfig,
    GuidedConfig, OptimConfig, RunConfig, ScheduleConfig, TrainConfig, config_to_yaml, fill_defaults, flag_for,
    preset,
)
from seq2seq.errors import UserError

ROOT = Path(__file__).resolve().parents[1]
HEADER = ("# The effective config (--preset {name}, then the file and flags given); seq2seq train --config FILE\n"
          "# reads it back to the same config. Set one corpus in data (data_dir, dataset or train_file).\n"
          "# Fields set to null are chosen when training starts, for the device (DEVICE_DEFAULTS) and the "
          "architecture.")

# A run's config.yaml as seq2seq wrote it before the sections (every run option under train, guided alignment
# switched on by data.guided_alignment), with values off their defaults wherever one moved
OLD_LAYOUT = """\
model:
  arch: transformer
  vocab_size: 0
  dropout: 0.2
  d_model: 64
  heads: 2
  layers: 2
data:
  data_dir: corpus
  vocab_size: 120
  max_tokens: 800
  guided_alignment: links.talp
train:
  seed: 7
  device: cpu
  tf32: false
  precision: fp32
  optimizer: adam
  lr: 0.003
  weight_decay: 0.01
  betas: [0.9, 0.97]
  schedule: linear
  warmup_steps: 17
  plateau_patience: 4
  plateau_factor: 0.25
  label_smoothing: 0.2
  clip_norm: 2.5
  accumulate: 3
  max_steps: 900
  max_epochs: 5
  max_minutes: 12.5
  eval_every: 100
  eval_every_minutes: 2.0
  eval_beam_size: 4
  eval_max_sentences: 50
  patience: 6
  log_every: 10
  save_every: 30
  save_every_minutes: 1.5
  keep_best: 2
  keep_last: 3
  tensorboard: null
  guided_alignment_weight: 0.5
  guided_layer: -1
  guided_heads: [1, 0]
  full_context_alignment: true
  guided_unaligned: eos
  self_guidance_warmup: 40
  compile: false
  threads: 1
output_dir: runs/old
"""

EXPECTED = RunConfig(
    train=TrainConfig(seed=7, device="cpu", tf32=False, precision="fp32", max_steps=900, max_epochs=5,
                      max_minutes=12.5, log_every=10, compile=False, threads=1),
    optim=OptimConfig(kind="adam", lr=0.003, weight_decay=0.01, betas=(0.9, 0.97), clip_norm=2.5, accumulate=3,
                      label_smoothing=0.2),
    schedule=ScheduleConfig(kind="linear", warmup_steps=17, plateau_patience=4, plateau_factor=0.25),
    eval=EvalConfig(every=100, every_minutes=2.0, beam_size=4, max_sentences=50, patience=6),
    checkpoint=CheckpointConfig(save_every=30, save_every_minutes=1.5, keep_best=2, keep_last=3),
    guided=GuidedConfig(links="links.talp", weight=0.5, layer=-1, heads=[1, 0], full_context=True, unaligned="eos",
                        self_warmup=40),
    output_dir="runs/old")


def test_a_config_yaml_of_the_old_layout_reads_to_the_same_values(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text(OLD_LAYOUT, encoding="utf-8")
    cfg = config_from_flags(["--config", str(path)])
    expected = dataclasses.replace(EXPECTED, model=dataclasses.replace(cfg.model), data=dataclasses.replace(cfg.data))
    assert cfg == expected.resolved("cpu")
    assert (cfg.model.d_model, cfg.model.dropout, cfg.data.max_tokens, cfg.data.data_dir) == (64, 0.2, 800, "corpus")
    assert cfg.guided.alignment_lines == "links.talp" and cfg.guided.supervised_attention() == (-1, [1, 0])
    assert cfg.guided.full_context_layer(cfg.model) == 1  # --guided-layer -1 of 2
    old = yaml.safe_load(OLD_LAYOUT)
    assert RunConfig.from_dict(old).resolved("cpu") == cfg  # a checkpoint's dict alike
    written = tmp_path / "new.yaml"  # written back in today's layout, read back to the same config
    written.write_text(config_to_yaml(cfg), encoding="utf-8")
    assert set(yaml.safe_load(written.read_text())) == {*SECTIONS, "output_dir"}
    assert config_from_flags(["--config", str(written)]) == cfg


def test_a_checkpoint_of_the_old_layout_resumes_with_its_own_values(tmp_path, capsys):
    """tests/data/pre-tiers/rnn.pt was written before the sections (train.lr, train.schedule, ...)."""
    import shutil

    from seq2seq.cli.train import parse_args, resumed_config

    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(ROOT / "tests" / "data" / "pre-tiers" / "rnn.pt", run / "last.pt")
    cfg = resumed_config(parse_args(["--output-dir", str(run), "--resume", "--max-steps", "300", "--eval-every",
                                     "50", "--lr", "0.5"]))
    assert (cfg.train.max_steps, cfg.eval.every) == (300, 50)  # what a resume may change
    assert (cfg.optim.lr, cfg.optim.betas, cfg.optim.clip_norm) == (0.003, (0.9, 0.999), 5.0)  # the run's own
    assert (cfg.schedule.kind, cfg.schedule.warmup_steps, cfg.eval.max_sentences, cfg.train.seed) == \
        ("plateau", 5, 10, 3)
    err = capsys.readouterr().err
    assert "resume eval_every=100->50" in err and "ignored: --lr" in err


def test_python_arguments_of_the_old_layout_are_read_too():
    cfg = RunConfig.from_preset("transformer", train={"lr": 0.01, "eval_every": 9, "max_steps": 5},
                                data={"guided_alignment": "self"})
    assert (cfg.optim.lr, cfg.eval.every, cfg.train.max_steps, cfg.guided.links) == (0.01, 9, 5, "self")
    assert cfg.schedule.warmup_steps == 200  # the preset's, in today's layout, under the arguments


def test_every_key_that_moved_lands_in_its_section_under_its_new_name():
    for (old_section, old_key), (section, key) in MOVED.items():
        assert key in {f.name for f in dataclasses.fields(SECTIONS[section])}
        assert old_key in yaml.safe_load(OLD_LAYOUT)[old_section]  # the old layout above covers every move
    assert len(set(MOVED.values())) == len(MOVED)


def test_the_new_layout_round_trips_through_yaml(tmp_path):
    cfg = config_from_flags(["--preset", "transformer-align", "--data-dir", "d", "--guided-heads", "0", "2",
                             "--eval-every", "7", "--keep-best", "2", "--betas", "0.8", "0.9", "--max-steps", "9"])
    text = config_to_yaml(cfg)
    assert "guided:\n  links: eflomal\n" in text and "eval:\n  every: 7\n" in text and "optim:\n  kind: adamw\n" in text
    assert "guided_alignment" not in text and "eval_every" not in text
    path = tmp_path / "config.yaml"
    path.write_text(text, encoding="utf-8")
    assert config_from_flags(["--config", str(path)]) == cfg
    assert RunConfig.from_dict(cfg.to_dict()) == cfg


@pytest.mark.parametrize("text, named", [
    ("optim:\n  learning_rate: 1\n", r"unknown key optim\.learning_rate; valid keys are: kind, lr, weight_decay"),
    ("guided:\n  guided_layer: 1\n", r"unknown key guided\.guided_layer \(train\.guided_layer is guided\.layer now\); "
                                     r"valid keys are: links, weight, layer"),
    ("eval:\n  eval_every: 5\n", r"unknown key eval\.eval_every \(train\.eval_every is eval\.every now\)"),
    ("checkpoint:\n  keep: 1\n", r"unknown key checkpoint\.keep; valid keys are: save_every, save_every_minutes"),
    ("schedul:\n  kind: linear\n", r"unknown key schedul; valid keys are: model, data, train, optim, schedule"),
    ("train:\n  lr: 0.1\noptim:\n  lr: 0.2\n", r"train\.lr \(0\.1\) and optim\.lr \(0\.2\) are one option"),
    ("schedule:\n  kind: slow\n", r"bad\.yaml: schedule\.kind: .*'inverse-sqrt'.*'slow'"),
])
def test_an_unknown_key_in_a_section_is_named_with_the_valid_ones(tmp_path, text, named):
    bad = tmp_path / "bad.yaml"
    bad.write_text(text, encoding="utf-8")
    with pytest.raises(UserError, match=named):
        config_from_flags(["--config", str(bad)])


def test_the_flags_keep_their_names_and_land_in_their_sections():
    cfg = config_from_flags(["--guided-alignment", "self", "--guided-layer", "-1", "--lr", "3e-3", "--eval-every",
                             "100", "--optimizer", "adam", "--schedule", "constant", "--guided-alignment-weight", "0.3",
                             "--full-context-alignment", "--guided-unaligned", "eos", "--self-guidance-warmup", "9",
                             "--guided-heads", "1", "--eval-every-minutes", "3", "--eval-beam-size", "2",
                             "--eval-max-sentences", "8", "--patience", "4", "--save-every", "5", "--keep-last", "1",
                             "--warmup-steps", "11", "--label-smoothing", "0", "--accumulate", "2", "--max-steps", "3"])
    assert cfg.guided == GuidedConfig(links="self", weight=0.3, layer=-1, heads=[1], full_context=True,
                                      unaligned="eos", self_warmup=9)
    assert (cfg.optim.lr, cfg.optim.kind, cfg.optim.label_smoothing, cfg.optim.accumulate) == (3e-3, "adam", 0.0, 2)
    assert (cfg.schedule.kind, cfg.schedule.warmup_steps) == ("constant", 11)
    assert cfg.eval == EvalConfig(every=100, every_minutes=3.0, beam_size=2, max_sentences=8, patience=4)
    assert (cfg.checkpoint.save_every, cfg.checkpoint.keep_last, cfg.train.max_steps) == (5, 1, 3)
    assert [flag_for(key) for key in RESUME_FIELDS] == [
        "--max-steps", "--max-epochs", "--max-minutes", "--patience", "--eval-every", "--eval-every-minutes",
        "--device", "--threads", "--tf32", "--compile"]


def test_help_lists_the_flags_in_one_group_per_section(capsys):
    from seq2seq.cli import main

    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = capsys.readouterr().out
    groups = {title: body for title, body in re.findall(r"^(\w+) options:\n(.*?)(?=^\w+ options:|\Z)", text,
                                                       re.M | re.S)}
    assert list(groups) == list(SECTIONS)
    for section, flags in {"optim": ["--lr", "--optimizer", "--betas"], "schedule": ["--schedule", "--warmup-steps"],
                           "eval": ["--eval-every", "--patience"], "checkpoint": ["--keep-best", "--save-every"],
                           "guided": ["--guided-alignment", "--guided-layer", "--full-context-alignment"],
                           "train": ["--max-steps", "--seed", "--device"]}.items():
        assert all(re.search(rf"^  {flag}[ ,\n]", groups[section], re.M) for flag in flags), section
    assert "--guided-layer GUIDED_LAYER" in text and "(default: [0])" in groups["guided"]


def test_resolving_runs_once_on_the_way_to_the_trainer(monkeypatch):
    """A config that ``resolved`` returned comes back from it as an equal copy without resolving again (the
    command, ``train()`` and the ``Trainer`` each ask), unless something it resolves changed since."""
    import seq2seq.config as config

    cfg = RunConfig.from_preset("toy").resolved("cpu")
    real, calls = config.validate, []
    monkeypatch.setattr(config, "validate", lambda *args: calls.append(args) or real(*args))
    again = cfg.resolved("cpu")
    assert again == cfg and again is not cfg and calls == []
    cfg.model.vocab_size, cfg.output_dir = 120, "runs/x"  # set after resolving (from the tokenizer, by the command)
    assert cfg.resolved("cpu") == cfg and calls == []
    cfg.resolved("cuda")  # for another device: resolved anew
    assert len(calls) == 1
    cfg.optim.lr = 0.5  # changed since: resolved anew (values set in Python are checked)
    cfg.resolved("cpu")
    assert len(calls) == 2


def test_presets_and_architecture_and_device_defaults_name_fields_of_their_sections():
    for name, layers in [*PRESETS.items(), *ARCH_DEFAULTS.items(), *DEVICE_DEFAULTS.items()]:
        for section, values in layers.items():
            assert set(values) <= {f.name for f in dataclasses.fields(SECTIONS[section])}, (name, section)


def preset_file(name: str) -> str:
    """``configs/NAME.yaml``: the preset with the architecture's defaults filled in and those that depend on the
    device left null (chosen when training starts), listing only the model options the architecture reads."""
    cfg = RunConfig.from_layers([(None, preset(name))])
    on_device = {(section, key) for defaults in DEVICE_DEFAULTS.values() for section, keys in defaults.items()
                 for key in keys}
    for section, defaults in ARCH_DEFAULTS[cfg.model.arch].items():
        chosen = {key: value for key, value in defaults.items() if (section, key) not in on_device}
        setattr(cfg, section, fill_defaults(getattr(cfg, section), chosen, cfg.model.arch))
    cfg.model = cfg.model.only_read_options()
    return config_to_yaml(cfg, header=HEADER.format(name=name))


@pytest.mark.parametrize("name", list(PRESETS))
def test_the_preset_files_are_the_presets_as_written_here(name):
    committed = (ROOT / "configs" / f"{name}.yaml").read_text(encoding="utf-8")
    assert committed == preset_file(name), f"configs/{name}.yaml is stale: python tests/test_config_sections.py"


if __name__ == "__main__":  # rewrite configs/*.yaml from the presets
    for preset_name in PRESETS:
        (ROOT / "configs" / f"{preset_name}.yaml").write_text(preset_file(preset_name), encoding="utf-8")
        print(f"configs/{preset_name}.yaml", file=sys.stderr)
