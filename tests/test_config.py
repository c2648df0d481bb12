"""One source of defaults: presets equal across the command, the Python API and configs/; typed
values from files and flags; the effective config printed, saved and read back; light imports."""
from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import run_main

from seq2seq.cli import config_from_flags
from seq2seq.config import DEFAULT_BEAM_SIZE, PRESETS, DecodeConfig, ModelConfig, OptimConfig, RunConfig, config_to_yaml
from seq2seq.errors import UserError

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name", list(PRESETS))
def test_every_preset_is_the_same_from_the_command_the_api_and_configs(name):
    from_cli = config_from_flags(["--preset", name])
    assert from_cli == RunConfig.from_preset(name)
    committed = ROOT / "configs" / f"{name}.yaml"
    assert config_from_flags(["--config", str(committed)]) == from_cli  # the committed file is the preset
    assert None not in (from_cli.model.dropout, from_cli.optim.betas, from_cli.schedule.warmup_steps,
                        from_cli.optim.clip_norm, from_cli.schedule.kind, from_cli.data.max_tokens)


@pytest.mark.parametrize("name", list(PRESETS))
def test_a_preset_file_and_print_config_list_only_what_the_architecture_reads(name, capsys):
    """configs/NAME.yaml and ``--print-config`` hold no option of the other architecture (a Transformer's
    no rnn_cell, an RNN's no heads), and a file that lists them all (as config.yaml files written before
    did) still reads back to the same config."""
    import yaml

    from seq2seq.cli import main
    from seq2seq.config import ARCH_OPTIONS

    committed = yaml.safe_load((ROOT / "configs" / f"{name}.yaml").read_text(encoding="utf-8"))
    assert main(["train", "--preset", name, "--print-config"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    arch = committed["model"]["arch"]
    assert printed["model"]["arch"] == arch
    other = {key for a, keys in ARCH_OPTIONS.items() if a != arch for key in keys}
    assert not other & set(committed["model"]) and not other & set(printed["model"])
    assert set(ARCH_OPTIONS[arch]) <= set(printed["model"])
    full = RunConfig.from_preset(name).to_dict()  # every option, the other architecture's at their defaults
    assert RunConfig.from_dict(full) == RunConfig.from_preset(name)


def test_api_and_command_resolve_architecture_defaults_alike():
    """RunConfig(model=ModelConfig(arch="rnn")) trains with what `seq2seq train --arch rnn` trains with."""
    api = RunConfig(model=ModelConfig(arch="rnn")).resolved()
    cli = config_from_flags(["--arch", "rnn", "--data-dir", "somewhere"])
    api.data.data_dir = "somewhere"
    assert api == cli
    assert (cli.model.dropout, cli.optim.clip_norm, cli.optim.betas, cli.schedule.kind) == \
        (0.3, 5.0, (0.9, 0.999), "plateau")
    transformer = RunConfig().resolved()
    assert (transformer.model.dropout, transformer.schedule.warmup_steps, transformer.optim.betas) == \
        (0.1, 400, (0.9, 0.98))
    assert RunConfig(model=ModelConfig(arch="rnn", dropout=0.25)).resolved().model.dropout == 0.25  # set = kept


def test_bare_command_is_the_toy_preset_and_a_corpus_is_not():
    assert config_from_flags([]) == RunConfig.from_preset("toy")
    real = config_from_flags(["--data-dir", "d", "--src", "de", "--tgt", "en"])
    assert real.data.toy_size == 0 and real.data.vocab_size == 8000 and real.model.d_model == 256


def test_yaml_numbers_written_as_strings_are_converted_and_bad_values_are_named(tmp_path):
    good = tmp_path / "run.yaml"
    good.write_text("model:\n  arch: rnn\noptim:\n  lr: 1e-3\n  betas: [0.9, 0.98]\ntrain:\n  max_steps: '3'\n")
    cfg = config_from_flags(["--config", str(good)])
    assert cfg.optim.lr == 0.001 and cfg.optim.betas == (0.9, 0.98) and cfg.train.max_steps == 3
    for text, named in [("optim:\n  lr: abc\n", r"bad\.yaml: optim\.lr: .*valid number.*'abc'"),
                        ("model:\n  arch: gru\n", r"model\.arch: .*'rnn' or 'transformer'.*'gru'"),
                        ("model:\n  layers: 2.5\n", r"model\.layers: .*integer.*2\.5"),
                        ("train:\n  lerning_rate: 1\n", r"unknown key train\.lerning_rate; valid keys are: seed"),
                        ("model: 3\n", r"model"),
                        ("- a\n- b\n", r"expected a mapping")]:
        bad = tmp_path / "bad.yaml"
        bad.write_text(text)
        with pytest.raises(UserError, match=named):
            config_from_flags(["--config", str(bad)])


def test_values_set_in_python_are_checked_too():
    with pytest.raises(UserError, match=r"optim\.lr: .*valid number"):
        RunConfig(optim=OptimConfig(lr="fast")).resolved()
    with pytest.raises(UserError, match=r"--d-model \(30\) must be divisible by --heads \(4\)"):
        RunConfig(model=ModelConfig(d_model=30)).resolved()


def test_yaml_round_trip_is_exact(tmp_path):
    cfg = config_from_flags(["--preset", "rnn-luong", "--data-dir", "d", "--src", "de", "--tgt", "en",
                             "--lr", "3e-4", "--no-tie-embeddings", "--output-dir", "runs/x"])
    path = tmp_path / "config.yaml"
    path.write_text(config_to_yaml(cfg))
    assert config_from_flags(["--config", str(path)]) == cfg


def test_print_config_prints_what_would_run_and_exits(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "seq2seq", "train", "--preset", "rnn-bahdanau", "--data-dir", "d",
                           "--dropout", "0.2", "--print-config"], capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    printed = tmp_path / "printed.yaml"
    printed.write_text(proc.stdout)
    cfg = config_from_flags(["--config", str(printed)])
    assert cfg.model.arch == "rnn" and cfg.model.dropout == 0.2 and cfg.data.data_dir == "d"
    assert not (tmp_path / "checkpoints").exists()  # nothing trained


def test_help_shows_the_defaults_that_run():
    proc = subprocess.run([sys.executable, "-m", "seq2seq", "train", "--help"], capture_output=True, text=True)
    text = " ".join(proc.stdout.split())
    assert "dropout probability (default: 0.3 for rnn, 0.1 for transformer; toy: 0.1)" in text
    assert "steps of linear warmup (default: 0 for rnn, 400 for transformer; toy: 300)" in text
    assert "--lr LR peak learning rate (default: 0.001)" in text
    translate = " ".join(subprocess.run([sys.executable, "-m", "seq2seq", "translate", "--help"],
                                        capture_output=True, text=True).stdout.split())
    assert f"beam size (1 = greedy; --sample needs 1) (default: {DEFAULT_BEAM_SIZE}; 1 with --sample)" in translate


def test_translate_takes_one_decoding_config_checked_where_it_is_built():
    """The command and the API share DecodeConfig: translate takes it whole (or its fields as keywords),
    besides the per-sentence inputs at most 6 parameters; a bad value fails when the config is built."""
    import dataclasses
    import inspect

    from seq2seq.decoding.setup import decode_config as _decode_config
    from seq2seq.decoding.translator import Translator

    parameters = inspect.signature(Translator.translate).parameters
    per_sentence = {"self", "sentences", "prefix", "constraints", "options"}
    assert len(set(parameters) - per_sentence) <= 6 and parameters["decode"].default is None
    assert _decode_config(None, {}) == DecodeConfig()
    assert _decode_config(DecodeConfig(beam_size=2), {"n_best": 2}) == DecodeConfig(beam_size=2, n_best=2)
    with pytest.raises(UserError, match="unknown option.*beam; the decoding options are DecodeConfig.s fields"):
        _decode_config(None, {"beam": 3})
    for bad, message in (({"batch_size": 0}, "--batch-size must be positive"),
                         ({"max_output_ratio": 0.0}, "--max-output-ratio must be a finite number > 0"),
                         ({"beam_size": 2, "n_best": 3}, "need 1 <= --n-best (3) <= --beam-size (2)")):
        with pytest.raises(UserError, match=re.escape(message)):
            DecodeConfig(**bad)
        with pytest.raises(UserError, match=re.escape(message)):
            dataclasses.replace(DecodeConfig(), **bad)
    assert (DecodeConfig().beam, DecodeConfig(sample=True).beam, DecodeConfig(beam_size=3).beam) == (5, 1, 3)


def test_importing_the_package_or_the_translator_loads_neither_datasets_nor_training():
    code = ("import sys, seq2seq; from seq2seq import Translator, RunConfig; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'datasets' or m == 'seq2seq.training.trainer'))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert proc.stdout.strip() == "[]"


@pytest.mark.parametrize("argv, message", [
    (["nonsense"], "unknown command 'nonsense'"),
    (["train", "--lr", "abc"], "argument --lr: invalid float value: 'abc'"),
    (["train", "--arch", "gru"], "argument --arch: invalid choice: 'gru'"),
    (["train", "--preset", "big"], "argument --preset: invalid choice: 'big'"),
    (["translate"], "the following arguments are required: --checkpoint"),
    (["translate", "--checkpoint", "absent.pt"], "checkpoint absent.pt: no such file"),
    (["shortlist", "--checkpoint", "x.pt", "--source", "a"], "required: --target"),
    (["align", "--checkpoint", "x", "--source", "a", "--target", "b", "--gold", "g", "--align-threshold", "2",
      "--align-method", "threshold"], "--align-threshold must be in (0, 1]"),
    (["compare", "run"], "required: --output"),
    (["train", "--arch", "rnn", "--heads", "8"], "--heads 8 is an option of a Transformer"),
])
def test_every_subcommand_names_a_bad_flag_or_file_without_a_traceback(tmp_path, monkeypatch, argv, message):
    monkeypatch.chdir(tmp_path)
    code, _, err = run_main(argv)  # in process: the start-up is not the point (one real run below)
    assert code == 2, err
    assert message in err and "Traceback" not in err


def test_a_bad_command_as_a_user_meets_it(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "seq2seq", "train", "--lr", "abc"], capture_output=True, text=True,
                          cwd=tmp_path, stdin=subprocess.DEVNULL)
    assert proc.returncode == 2 and "argument --lr: invalid float value: 'abc'" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_old_flag_names_still_work_with_a_warning(tmp_path):
    from seq2seq.cli.translate import parse_args

    args = parse_args(["--checkpoint", "x", "--max-len-ratio", "2.0", "--layer", "0", "--heads", "1,2"])
    assert (args.max_output_ratio, args.align_layer, args.align_heads) == (2.0, "0", "1,2")
    proc = subprocess.run([sys.executable, "-m", "seq2seq", "translate", "--checkpoint", str(tmp_path / "none.pt"),
                           "--layer", "0"], capture_output=True, text=True, stdin=subprocess.DEVNULL)
    assert "--layer is deprecated and will be removed; use --align-layer" in proc.stderr


def test_translate_takes_a_list_not_a_string(tmp_path):
    from seq2seq.decoding.translator import Translator

    with pytest.raises(UserError, match=r"takes a list of sentences.*translate\(\[text\]\)"):
        Translator.translate(object.__new__(Translator), "Ein Hund rennt.")


def test_the_public_api_lists_what_it_exports():
    import seq2seq

    assert sorted(seq2seq.__all__) == sorted(seq2seq._EXPORTS)
    assert all(getattr(seq2seq, name) is not None for name in seq2seq.__all__)


@pytest.mark.parametrize("flags, message", [
    (["--arch", "rnn", "--heads", "8"], "--heads 8 is an option of a Transformer, but the model is --arch rnn, which "
                                        "would ignore it: drop it, or train --arch transformer"),
    (["--arch", "rnn", "--positional", "rope"], "--positional rope is an option of a Transformer"),
    (["--attention", "luong-dot"], "--attention luong-dot is an option of an RNN, but the model is --arch transformer"),
    (["--preset", "transformer", "--hidden-size", "64"], "--hidden-size 64 is an option of an RNN"),
])
def test_an_option_of_the_other_architecture_is_a_named_error(flags, message):
    with pytest.raises(UserError, match=re.escape(message)):
        config_from_flags(flags)


def test_an_option_of_the_other_architecture_in_a_file_or_from_python_names_where(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("model:\n  arch: rnn\n  layers: 6\n", encoding="utf-8")
    with pytest.raises(UserError, match=re.escape(f"--config {path}: model.layers 6 is an option of a Transformer")):
        config_from_flags(["--config", str(path)])
    with pytest.raises(UserError, match=re.escape("arguments: model.embed_dim 64 is an option of an RNN")):
        RunConfig.from_preset("transformer", model={"embed_dim": 64})


def test_the_other_architectures_defaults_and_presets_sized_for_both_pass(tmp_path):
    """Its default value is no request (a whole effective config reads back); a preset may size both (the
    toy one does), and the resolved config keeps only what the model reads, so an RNN's effective config,
    written and read back, is the same config."""
    assert config_from_flags(["--arch", "rnn", "--heads", "4"]).model.arch == "rnn"
    rnn = config_from_flags(["--preset", "toy", "--arch", "rnn"])
    assert rnn.model.embed_dim == 128 and rnn.model.d_model == ModelConfig.d_model  # the toy's RNN sizes only
    path = tmp_path / "rnn.yaml"
    path.write_text(config_to_yaml(rnn), encoding="utf-8")
    assert config_from_flags(["--config", str(path)]) == rnn
    trained = dataclasses.replace(rnn.model, d_model=128)  # an RNN trained before: its unread options differ
    assert rnn.model.differences(trained) == []
    assert rnn.model.differences(dataclasses.replace(trained, hidden_size=64)) == [("hidden_size", 128, 64)]


def test_benchmarks_size_every_run_with_one_set_of_flags_for_its_own_architecture():
    """A benchmark's extra flags (``-- --d-model 32 --embed-dim 32``) size runs of both architectures:
    ``common.for_arch`` leaves out the options of the other one, which ``seq2seq train`` would reject."""
    from common import for_arch

    tiny = ["--d-model", "32", "--no-norm-first", "--embed-dim", "32", "--input-feeding", "--hidden-size=8"]
    rnn = for_arch(["--preset", "rnn-luong", *tiny, "--max-steps", "3"])
    assert rnn == ["--preset", "rnn-luong", "--embed-dim", "32", "--input-feeding", "--hidden-size=8", "--max-steps",
                   "3"]
    assert config_from_flags(rnn).model.embed_dim == 32
    transformer = for_arch(["--preset", "rnn-luong", "--arch", "transformer", *tiny])  # --arch wins over the preset
    assert transformer == ["--preset", "rnn-luong", "--arch", "transformer", "--d-model", "32", "--no-norm-first"]
    assert for_arch(tiny) == ["--d-model", "32", "--no-norm-first"]  # the default architecture
