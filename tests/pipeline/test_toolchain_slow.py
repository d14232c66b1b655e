"""The downloaded toolchains really build manylinux_2_28 code (network on first run)."""

from __future__ import annotations

import re
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


def test_cuda12_from_pypi_is_a_clear_error():
    """PyPI's 12.x nvcc wheels hold only ptxas: why the 12.8 rows use Debian's toolkit."""
    packages = ["nvidia-cuda-nvcc-cu12==12.8.93", "nvidia-cuda-runtime-cu12==12.8.90"]
    with pytest.raises(toolchain.ToolkitError, match=r"ship no bin/nvcc .*HOTLOOP_CUDA_HOME_12_8"):
        toolchain.ensure_pypi_toolkit("12.8", "12.8", packages)


def gencode_flags(arch_list: str) -> list[str]:
    """nvcc flags for ``TORCH_CUDA_ARCH_LIST`` syntax, as torch's cpp_extension makes them."""
    flags = []
    for target in matrix.archs_from_list(arch_list):
        kind, number = target.split("_")
        flags.append(f"-gencode=arch=compute_{number},code={kind}_{number}")
    return flags


# Device code using CCCL (cub, <nv/target>) and the runtime, linked against libcudart.
CCCL_KERNEL = """
#include <cuda_runtime.h>
#include <cub/block/block_reduce.cuh>
#include <nv/target>
__global__ void sum(const float* x, float* out) {
  using Reduce = cub::BlockReduce<float, 128>;
  __shared__ typename Reduce::TempStorage tmp;
  float v = Reduce(tmp).Sum(x[threadIdx.x]);
  NV_IF_TARGET(NV_PROVIDES_SM_80, (if (threadIdx.x == 0) *out = v;))
}
int launch(const float* x, float* out) { sum<<<1, 128>>>(x, out); return (int)cudaGetLastError(); }
"""


@pytest.mark.parametrize("std", ["c++17", "c++20"])
def test_debian_cuda12_builds_the_rows_archs(tmp_path, monkeypatch, std):
    """Fetched from Debian (cold: about 1 GB), the 12.4 toolkit builds every arch of the row."""
    row = next(r for r in matrix.load_rows() if r.cuda.startswith("12."))
    monkeypatch.delenv(toolchain.override_env_var(row.cuda), raising=False)
    home = toolchain.ensure_cuda_toolkit(row.cuda, row.toolkit)
    sysroot = toolchain.ensure_sysroot()
    src = tmp_path / "sum.cu"
    src.write_text(CCCL_KERNEL)
    lib = tmp_path / "libsum.so"
    subprocess.run(
        [
            home / "bin" / "nvcc",
            "-shared",
            f"-std={std}",
            *gencode_flags(row.arch_list),
            "-Xcompiler=-fPIC",
            f"-Xcompiler=--sysroot={sysroot}",
            f"-Xlinker=--sysroot={sysroot}",
            "-lcudart",
            "-o",
            lib,
            src,
        ],
        check=True,
    )
    listed = subprocess.run(
        [home / "bin" / "cuobjdump", "--list-elf", "--list-ptx", lib],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    elf = sorted(set(re.findall(r"\.(sm_\d+)\.cubin", listed)))
    ptx = sorted(set(re.findall(r"\.(sm_\d+)\.ptx", listed)))
    assert elf == [a for a in row.archs if a.startswith("sm_")], listed
    assert ptx == [a.replace("compute_", "sm_") for a in row.archs if a.startswith("compute_")]
    # torch's libcudart.so.12 (12.8) satisfies it at run time; glibc stays within torch's.
    assert "libcudart.so.12" in dt_needed(lib), dt_needed(lib)
    found = audit.max_versions(audit.elf_version_needs(lib.read_bytes()))
    assert found["GLIBC"] <= audit.MAX_SYMBOL_VERSIONS["GLIBC"], found


def dt_needed(lib: Path) -> list[str]:
    from elftools.elf.dynamic import DynamicSection
    from elftools.elf.elffile import ELFFile

    with lib.open("rb") as fh:
        return [
            tag.needed
            for section in ELFFile(fh).iter_sections()
            if isinstance(section, DynamicSection)
            for tag in section.iter_tags()
            if tag.entry.d_tag == "DT_NEEDED"
        ]


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
