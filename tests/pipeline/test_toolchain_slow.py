"""The downloaded toolchain really produces manylinux_2_28 code (network on first run)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from scripts import audit, matrix, toolchain

pytestmark = pytest.mark.slow

# Code that, built against the host's glibc 2.36, needs GLIBC_2.32/2.34 (docs/toolchain.md).
PROBE_CPP = """
#include <pthread.h>
#include <string>
#include <thread>
static pthread_key_t key;
int make_key() { return pthread_key_create(&key, nullptr); }
std::string hello(int n) { std::thread t([] {}); t.join(); return std::string(n, 'x'); }
"""


def sysroot_link_flags(sysroot: Path) -> list[str]:
    # The same flags setup.py adds for HOTLOOP_SYSROOT.
    return [
        f"--sysroot={sysroot}",
        f"-L{sysroot}/usr/lib/x86_64-linux-gnu",
        f"-L{sysroot}/lib/x86_64-linux-gnu",
    ]


def test_sysroot_keeps_symbol_versions_within_torch(tmp_path):
    sysroot = toolchain.ensure_sysroot()
    src = tmp_path / "probe.cpp"
    src.write_text(PROBE_CPP)
    out = tmp_path / "probe.so"
    subprocess.run(
        [
            "g++",
            "-std=c++20",
            "-O2",
            "-shared",
            "-fPIC",
            *sysroot_link_flags(sysroot),
            "-o",
            out,
            src,
        ],
        check=True,
    )
    found = audit.max_versions(audit.elf_version_needs(out.read_bytes()))
    assert found["GLIBC"] <= audit.MAX_SYMBOL_VERSIONS["GLIBC"], found
    assert found.get("GLIBCXX", ()) <= audit.MAX_SYMBOL_VERSIONS["GLIBCXX"], found


def test_cuda12_from_pypi_is_a_clear_error(monkeypatch):
    row = next(r for r in matrix.load_rows() if r.cuda.startswith("12."))
    monkeypatch.delenv(toolchain.override_env_var(row.cuda), raising=False)
    with pytest.raises(toolchain.ToolkitError, match=r"ship no bin/nvcc .*HOTLOOP_CUDA_HOME_12_8"):
        toolchain.ensure_cuda_toolkit(row.cuda, row.toolkit)


@pytest.mark.parametrize("cuda", sorted({r.cuda for r in matrix.load_rows() if r.cuda >= "13"}))
def test_pypi_toolkit_compiles_for_the_newest_arch(tmp_path, cuda):
    row = next(r for r in matrix.load_rows() if r.cuda == cuda)
    home = toolchain.ensure_cuda_toolkit(cuda, row.toolkit)
    src = tmp_path / "k.cu"
    src.write_text(
        "#include <cuda_runtime.h>\n__global__ void k(float* x) { x[threadIdx.x] *= 2.f; }\n"
        "int launch(float* x) { k<<<1, 32>>>(x); return (int)cudaGetLastError(); }\n"
    )
    sysroot = toolchain.ensure_sysroot()
    subprocess.run(
        [
            home / "bin" / "nvcc",
            "-c",
            "-std=c++20",
            "-gencode=arch=compute_120,code=sm_120",
            f"-Xcompiler=--sysroot={sysroot}",
            "-o",
            tmp_path / "k.o",
            src,
        ],
        check=True,
    )
    assert (tmp_path / "k.o").stat().st_size > 0
