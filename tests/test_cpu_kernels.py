"""The precision-sensitive tests again under each other ATen CPU kernel set this CPU can run.

PyTorch picks its vectorized CPU kernels (softmax, reductions, elementwise ops, the fused attention
kernel) once per process from ``ATEN_CPU_CAPABILITY`` (default: the best the CPU has). Running the
tests that compare two computations (int8 vs fp32, bf16 vs fp32, fused vs explicit attention,
shortlist vs full vocabulary, batched vs one-by-one search) under every other setting shows on one
machine what would otherwise only show on another CPU family.

Not covered by this switch: matrix products (oneDNN / MKL / OpenBLAS) and the int8 kernels (FBGEMM,
or oneDNN on CPUs with VNNI, through PyTorch's 'x86' quantized engine) pick their code paths
themselves from the CPU; the tests that involve them compare with margins derived from the
arithmetic (see test_quantize.py), never with exact equality across kernels.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.slow  # re-runs five test files in child processes

TESTS = Path(__file__).parent
PRECISION_SENSITIVE = ["test_quantize.py", "test_loss.py", "test_attention.py", "test_shortlist.py",
                       "test_search.py"]
AVX512_FLAGS = {"avx512f", "avx512bw", "avx512vl", "avx512dq"}  # what ATen's AVX512 kernels need


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    line = next((line for line in text.splitlines() if line.startswith("flags")), "")
    return set(line.partition(":")[2].split())


def _runnable_capabilities() -> list[str]:
    """Kernel sets this CPU can execute, other than the one this process uses. (PyTorch accepts
    ATEN_CPU_CAPABILITY=avx512 even where the CPU lacks it, so the flags are checked here.)"""
    flags = _cpu_flags()
    runnable = ["default"]
    if {"avx2", "fma"} <= flags:
        runnable.append("avx2")
    if AVX512_FLAGS <= flags:
        runnable.append("avx512")
    current = torch.backends.cpu.get_cpu_capability().lower()
    return [name for name in runnable if name != current]


@pytest.mark.parametrize("capability", _runnable_capabilities() or [None])
def test_precision_sensitive_tests_pass_under_other_cpu_kernels(capability):
    if capability is None:
        pytest.skip("this CPU runs only the kernel set the suite already used")
    env = {**os.environ, "ATEN_CPU_CAPABILITY": capability}
    probe = subprocess.run([sys.executable, "-c", "import torch; print(torch.backends.cpu.get_cpu_capability())"],
                           env=env, capture_output=True, text=True, check=True)
    assert probe.stdout.strip().lower() == capability  # the switch took effect
    files = [str(TESTS / name) for name in PRECISION_SENSITIVE]
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *files],
                          env=env, capture_output=True, text=True, cwd=TESTS.parent)
    assert proc.returncode == 0, f"ATEN_CPU_CAPABILITY={capability}:\n{proc.stdout[-4000:]}\n{proc.stderr[-2000:]}"
