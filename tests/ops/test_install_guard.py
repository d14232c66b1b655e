"""The import-time guard and `python -m hotloop`, against the installed build info."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import hotloop
from hotloop import _guard
from hotloop.__main__ import kernel_for_capability

BUILD = {
    "version": "0.1.0+pt211cu130",
    "torch_version": "2.11.0+cu130",
    "torch_minor": "2.11",
    "cuda_version": "13.0",
}


@pytest.mark.parametrize(
    ("torch_version", "torch_cuda", "expected"),
    [
        ("2.11.0+cu130", "13.0", None),
        ("2.11.1", "13.2", None),  # same minor, same CUDA major: compatible
        ("2.12.1", "13.0", "minor"),
        ("2.11.0+cpu", None, "CPU-only"),
        ("2.11.0+cu128", "12.8", "CUDA major"),
    ],
)
def test_find_mismatch(torch_version: str, torch_cuda: str | None, expected: str | None) -> None:
    mismatch = _guard.find_mismatch(BUILD, torch_version, torch_cuda)
    if expected is None:
        assert mismatch is None
    else:
        assert expected in mismatch
        assert torch_version in mismatch
        assert BUILD["torch_version"] in mismatch


def test_a_cpu_build_loads_into_a_cuda_torch() -> None:
    cpu_build = {**BUILD, "version": "0.1.0+pt211cpu", "cuda_version": None}
    assert _guard.find_mismatch(cpu_build, "2.11.0+cu130", "13.0") is None


def test_install_hint_names_the_matching_variant() -> None:
    hint = _guard.install_hint(BUILD, "2.12.1+cu128", "12.8")
    assert '"hotloop==0.1.0+pt212cu128"' in hint
    assert '"torch==2.11.*"' in hint


def run_import_with_torch_version(version: str, cuda: str | None) -> subprocess.CompletedProcess:
    # The real guard, in a fresh interpreter whose torch claims another version.
    code = (
        "import torch\n"
        f"torch.__version__ = {version!r}\n"
        f"torch.version.cuda = {cuda!r}\n"
        "import hotloop\n"
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)


def test_import_with_another_torch_minor_raises_import_error() -> None:
    result = run_import_with_torch_version("2.99.0", torch.version.cuda)
    assert result.returncode != 0
    assert "ImportError" in result.stderr
    assert "2.99.0" in result.stderr
    assert hotloop.BUILD_INFO["torch_version"] in result.stderr
    assert "pip install" in result.stderr
    assert "undefined symbol" not in result.stderr


@pytest.mark.skipif(hotloop.BUILD_INFO["cuda_version"] is None, reason="a CPU build loads anywhere")
def test_cuda_build_with_cpu_torch_raises_import_error() -> None:
    result = run_import_with_torch_version(torch.__version__.split("+")[0] + "+cpu", None)
    assert "CPU-only" in result.stderr


@pytest.mark.parametrize(
    ("capability", "expected"),
    [
        ((8, 0), "sm_80"),
        ((8, 6), "sm_86"),
        ((8, 7), "sm_86"),  # Orin: runs the sm_86 cubin
        ((9, 0), "sm_90"),
        ((12, 1), "sm_120"),
        ((13, 0), "compute_120"),  # a future GPU: PTX only
        ((7, 5), None),
    ],
)
def test_kernel_for_capability(capability: tuple[int, int], expected: str | None) -> None:
    archs = ["sm_80", "sm_86", "sm_89", "sm_90", "sm_100", "sm_120", "compute_120"]
    assert kernel_for_capability(archs, capability) == expected


def test_python_m_hotloop_reports_ok() -> None:
    result = subprocess.run([sys.executable, "-m", "hotloop"], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert hotloop.BUILD_INFO["version"] in result.stdout
    assert "verdict      OK" in result.stdout
