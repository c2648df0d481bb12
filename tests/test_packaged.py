"""Decoding steps and encoders compiled ahead of time into AOTInductor packages (``seq2seq.models.packaged``):
the same outputs as eager, kept on disk for the next model, built in a child process while a model decodes."""
import subprocess
import time
import warnings
from pathlib import Path

import pytest
import torch

from seq2seq.config import DecodeConfig
from seq2seq.decoding.beam import beam_search
from seq2seq.decoding.generator import SearchBatch
from seq2seq.decoding.search import greedy_search
from seq2seq.models import compiled, packaged
from seq2seq.models.compiled import compile_decoding
from seq2seq.models.fused import static_choice
from seq2seq.nn.packed import PackedLinear, pack_for_decoding
from test_models import make_model, reverse_batch, single, trained_once
from test_static_step import _assert_same, _sentence


@pytest.fixture(scope="module")
def trained():
    """test_static_step's Transformer that reverses sequences (trained once per test run): two layers, so the
    packages' per-layer caches are covered (one layer saved no measurable time in the background test)."""
    return trained_once("transformer-pre", 150, 1e-2)


def _greedy(model, sentences):
    return [greedy_search(model, SearchBatch(*s), need_attention=False) for s in sentences]


@pytest.mark.slow  # three packages compiled
def test_packages_built_in_the_background_decode_like_eager_and_a_second_model_loads_them(trained, monkeypatch,
                                                                                         tmp_path):
    """``BackgroundCompile`` with a package directory (``serve``'s and ``translate --compile``'s compile) builds each
    package in a child process: this thread decodes eagerly all the while, every output the eager one (an export in
    this process traced this thread's decoding too, ``torch.export`` patching every module call of its process, and
    failed). Then greedy and beam search through the packages (the encoder, each search's step with its choice,
    ``models.fused``) give the eager outputs, also where beams swap rows; a second model with the same weights loads
    the package without compiling; one with other weights gets another file; a damaged package is compiled again
    (here by a stand-in compiler that writes the good bytes back). Without Inductor's options (they choose kernels,
    not results; benchmarks/bench_aoti_step.py measures them). Skipped where nothing compiles (no C++ compiler)."""
    monkeypatch.setattr(compiled, "INDUCTOR_OPTIONS", {})
    model = make_model("transformer-pre").eval()
    model.load_state_dict(trained.state_dict())
    pack_for_decoding(model)  # as Translator decodes: the child gets a plain copy
    src, mask, _, _ = reverse_batch(3, torch.Generator().manual_seed(7))
    sentences = [single(src, mask, i) for i in range(3)]
    want = _greedy(model, sentences)
    beam = DecodeConfig(beam_size=2, n_best=2)
    want_beam = beam_search(model, SearchBatch(*sentences[1]), beam, need_attention=False)
    threads = torch.get_num_threads()
    job = compiled.BackgroundCompile(model, lambda view: _greedy(view, sentences[:1]), threads=threads,
                                     packages=str(tmp_path)).start()
    passes = 0
    while job.status == "compiling":
        for got, expected in zip(_greedy(model, sentences), want):
            _assert_same(got, expected)
        passes += 1
        time.sleep(0.5)  # as a server between requests: the child compiles on the core this thread leaves
    if job.status == "failed" and "compiler" in (job.error or "").lower():
        pytest.skip(f"AOTInductor unavailable here: {job.error}")
    assert job.wait(60) == "ready", job.error
    assert passes >= 3  # decoded while the packages were built
    assert isinstance(model.compiled_encode, packaged.PackagedEncoder)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = _greedy(model, sentences)
    assert not caught, [str(w.message) for w in caught]
    assert model.compiled_step.graphs == {("greedy", 1, True, threads)}  # the step with greedy search's choice
    assert model.compiled_encode.graphs == {("encode", threads)} and model.compiled_encode.failure is None
    for greedy, greedy_want in zip(got, want):
        _assert_same(greedy, greedy_want)
    _assert_same(beam_search(model, SearchBatch(*sentences[1]), beam, need_attention=False), want_beam)
    assert ("beam", 2, True, threads) in model.compiled_step.graphs  # the step with beam search's choice
    _assert_swapping_beams_step_like_eager(model, sentences[1])
    assert len(list(tmp_path.glob("encode-*.pt2"))) == 1
    package = model.compiled_step.path(("greedy", 1, True, threads))  # the greedy step's
    assert package.is_file() and len(list(tmp_path.glob("step-*.pt2"))) == 2
    assert not list(tmp_path.glob(".*"))  # no partial file left
    good = package.read_bytes()

    def no_compiling(*args, **kwargs):
        raise AssertionError("compiled although the package was there")

    def rewrite(exported, package_path, inductor_configs):  # a stand-in compiler: the same package again
        Path(package_path).write_bytes(good)
        return package_path

    for compiler, damage in ((no_compiling, False), (rewrite, True)):
        if damage:
            package.write_bytes(b"not a package")  # damaged: compiled again (in this process), the outputs unchanged
        again = make_model("transformer-pre").eval()
        again.load_state_dict(trained.state_dict())
        pack_for_decoding(again)  # as the first: the same structure, so the same package
        with monkeypatch.context() as patched:
            patched.setattr(torch._inductor, "aoti_compile_and_package", compiler)
            compile_decoding(again, packages=str(tmp_path))
            _assert_same(greedy_search(again, SearchBatch(*sentences[0]), need_attention=False), want[0])
        assert again.compiled_step is not None and again.compiled_step.failure is None
    assert package.read_bytes() == good
    other = make_model("transformer-pre", seed=1).eval()  # other weights: another package
    assert packaged.PackagedStep(other, tmp_path, {}, lambda: None).path(("greedy", 1, True, threads)) != package


def _assert_swapping_beams_step_like_eager(model, sentence):
    """The packaged beam step (2 beams) gives ``static_choice``'s outputs where the beams swap rows (row 0 continues
    beam 1 and row 1 beam 0: the case an in-place reorder got wrong inside the package, ``models.fused``), on random
    caches, the beams' scores chosen so that they swap."""
    src, mask = sentence
    generator = torch.Generator().manual_seed(3)
    with torch.inference_mode():
        memory = model.encode(src, mask)
        caches = [tuple(torch.randn(2, *t.shape[1:], generator=generator) for t in kv)
                  for kv in model.init_state(memory, 12)["self_kv"]]
        position, tokens, limit = torch.tensor([4]), torch.tensor([5, 6]), torch.tensor([10])
        for offset in torch.linspace(-4, 4, 33).tolist():
            scores = torch.tensor([[0.0, offset]])
            want = static_choice(model, "beam", memory, [(k.clone(), v.clone()) for k, v in caches], position, tokens,
                                 limit, scores)
            if want[2][-4:-2].tolist() == [1.0, 0.0]:  # the live beams' origins (``static_beam_step``'s ``chosen``)
                break
        else:
            pytest.fail("no scores made the two beams swap")
        got = model.compiled_step.choose("beam", memory, [(k.clone(), v.clone()) for k, v in caches], position,
                                         tokens, limit, scores)
    assert model.compiled_step.failure is None and len(got) == len(want)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)


@pytest.mark.slow  # one encoder package compiled per position encoding
@pytest.mark.parametrize("variant", ["transformer-learned", "transformer-relative", "transformer-rope"])
def test_a_packaged_encoder_encodes_like_the_eager_one_for_every_position_encoding(variant, tmp_path):
    """``PackagedEncoder``: one package for every source length (learned positions up to what they can encode)
    gives the eager encoder's keys and values; without Inductor's options (they choose kernels, not results)."""
    model = make_model(variant, layers=1).eval()  # a second layer only adds C++ to compile
    encoder = packaged.PackagedEncoder(model, tmp_path, {}, lambda: None)
    with torch.inference_mode(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for length in (6, 3):
            src, mask, _ = _sentence(seed=length, length=length)
            got, want = encoder(src, mask), model.encode_eager(src, mask)
            if encoder.failure is not None and "compiler" in encoder.failure.lower():
                pytest.skip(f"AOTInductor unavailable here: {encoder.failure}")
            for (k, v), (k_want, v_want) in zip(got["cross_kv"], want["cross_kv"]):
                torch.testing.assert_close(k, k_want, atol=1e-5, rtol=1e-5)
                torch.testing.assert_close(v, v_want, atol=1e-5, rtol=1e-5)
    assert encoder.failure is None and not caught and encoder.graphs == {("encode", torch.get_num_threads())}
    assert len(list(tmp_path.glob("encode-*.pt2"))) == 1


def test_a_package_that_fails_in_its_child_process_leaves_the_model_eager_and_says_why(trained, monkeypatch,
                                                                                       tmp_path):
    """The child's last line of errors is the background compile's error; the model decodes eagerly as before."""
    def failing(command, **kwargs):
        return subprocess.CompletedProcess(command, 1, "", "Traceback ...\nCppCompileError: no C++ compiler found\n")

    monkeypatch.setattr(packaged.subprocess, "run", failing)
    model = make_model("transformer-pre").eval()
    model.load_state_dict(trained.state_dict())
    sentence = single(*reverse_batch(1, torch.Generator().manual_seed(7))[:2], 0)
    want = _greedy(model, [sentence])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # compile_failed's warning
        job = compiled.BackgroundCompile(model, lambda view: _greedy(view, [sentence]), threads=1,
                                         packages=str(tmp_path)).start()
        assert job.wait(60) == "failed"
    assert "in a child process failed: CppCompileError: no C++ compiler found" in job.error
    assert model.compiled_step is None and not model.static_cache and not list(tmp_path.iterdir())
    _assert_same(_greedy(model, [sentence])[0], want[0])


def test_a_plain_copy_has_plain_layers_and_no_compiled_parts(trained, tmp_path):
    """``plain_copy``: what a child process is given (picklable) and what adapting trains: the packed layers plain
    again, the compiled parts gone, the same outputs eagerly; the model itself unchanged."""
    model = make_model("transformer-pre").eval()
    model.load_state_dict(trained.state_dict())
    packed = pack_for_decoding(model)
    compile_decoding(model, packages=str(tmp_path))  # nothing built until a sentence decodes
    copied = packaged.plain_copy(model)
    assert packed and not any(isinstance(m, PackedLinear) for m in copied.modules())
    assert copied.compiled_step is None and copied.compiled_encode is None and not copied.static_cache
    assert isinstance(model.compiled_step, packaged.PackagedStep) and model.static_cache  # the model as it was
    assert any(isinstance(m, PackedLinear) for m in model.modules())
    torch.save(copied, tmp_path / "copy.pt")  # picklable
    sentence = single(*reverse_batch(1, torch.Generator().manual_seed(7))[:2], 0)
    for name, tensor in copied.state_dict().items():
        torch.testing.assert_close(tensor, model.state_dict()[name])
    _assert_same(_greedy(copied, [sentence])[0], _greedy(trained, [sentence])[0])
