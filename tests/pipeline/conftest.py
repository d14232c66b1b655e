"""Helpers for the pipeline tests: synthetic wheels and tiny ELF libraries built on the fly."""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import struct
import subprocess
import zipfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from urllib.parse import quote

import pytest

from scripts import sbom
from scripts.matrix import Row, load_rows

GOOD_C = (
    "#include <string.h>\nvoid copy(char *d, const char *s, unsigned long n) { memcpy(d, s, n); }\n"
)
# Built against the host's glibc 2.36 this binds __libc_single_threaded@GLIBC_2.32.
NEW_GLIBC_C = (
    "#include <sys/single_threaded.h>\nint single(void) { return __libc_single_threaded; }\n"
)
# std::filesystem needs GLIBCXX_3.4.26, newer than torch's 3.4.22.
NEW_GLIBCXX_CPP = (
    "#include <filesystem>\n#include <string>\n"
    "std::string cwd() { return std::filesystem::current_path().string(); }\n"
)


@pytest.fixture(scope="session")
def newest_row() -> Row:
    return load_rows()[-1]


def compile_shared(tmp: Path, name: str, source: str, cpp: bool = False) -> bytes:
    """A shared library compiled by the host's gcc (no sysroot) from ``source``."""
    compiler = "g++" if cpp else "gcc"
    if shutil.which(compiler) is None:
        pytest.skip(f"{compiler} not installed")
    src = tmp / (name + (".cpp" if cpp else ".c"))
    src.write_text(source)
    out = tmp / f"{name}.so"
    flags = ["-std=c++17"] if cpp else []
    subprocess.run(
        [compiler, *flags, "-O2", "-shared", "-fPIC", "-o", str(out), str(src)], check=True
    )
    return out.read_bytes()


def fatbin_section(entries: Sequence[tuple[int, int]]) -> bytes:
    """A ``.nv_fatbin`` container with one entry per ``(kind, arch)`` (kind 1: PTX, 2: cubin),
    laid out as nvcc writes it, with a few payload bytes each."""
    body = b""
    for kind, arch in entries:
        payload = b"\0" * 16
        header = struct.pack("<HHIQ", kind, 1, 64, len(payload)).ljust(28, b"\0")
        header = (header + struct.pack("<I", arch)).ljust(64, b"\0")
        body += header + payload
    return struct.pack("<IHHQ", 0xBA55ED50, 1, 16, len(body)) + body


# What a CUDA build's ops library holds: sm_90 code and compute_90 PTX.
CUDA_TARGETS = ((2, 90), (1, 90))


@pytest.fixture(scope="session")
def with_fatbin(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., bytes]:
    """``with_fatbin(library, entries)``: ``library`` with an ``.nv_fatbin`` section holding
    ``fatbin_section(entries)`` (objcopy)."""
    if shutil.which("objcopy") is None:
        pytest.skip("objcopy not installed")
    tmp = tmp_path_factory.mktemp("fatbin")

    def add(library: bytes, entries: Sequence[tuple[int, int]] = CUDA_TARGETS) -> bytes:
        (tmp / "plain.so").write_bytes(library)
        (tmp / "fatbin.bin").write_bytes(fatbin_section(entries))
        subprocess.run(
            ["objcopy", "--add-section", ".nv_fatbin=fatbin.bin", "plain.so", "cuda.so"],
            cwd=tmp,
            check=True,
        )
        return (tmp / "cuda.so").read_bytes()

    return add


@pytest.fixture(scope="session")
def elf_libs(
    tmp_path_factory: pytest.TempPathFactory, with_fatbin: Callable[..., bytes]
) -> dict[str, bytes]:
    tmp = tmp_path_factory.mktemp("elf")
    good = compile_shared(tmp, "good", GOOD_C)
    return {
        "good": good,
        "cuda": with_fatbin(good),
        "new_glibc": compile_shared(tmp, "new_glibc", NEW_GLIBC_C),
        "new_glibcxx": compile_shared(tmp, "new_glibcxx", NEW_GLIBCXX_CPP, cpp=True),
    }


def build_info_source(row: Row, **overrides: object) -> str:
    info = {
        "version": row.version,
        "variant": row.variant,
        "torch_version": f"{row.torch}+cu{row.cuda.replace('.', '')}",
        "torch_minor": row.torch_minor,
        "cuda_version": row.cuda,
        "archs": row.archs,
        "cxx11_abi": True,
        "git_commit": "0" * 40,
        "build_time": "2026-01-01T00:00:00Z",
    }
    info.update(overrides)
    return f"BUILD_INFO = {info!r}\n"


@pytest.fixture
def build_info_for() -> Callable[..., str]:
    return build_info_source


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def sbom_source(row: Row) -> str:
    """A minimal CycloneDX SBOM that agrees with ``build_info_source(row)``'s defaults."""
    torch_version = f"{row.torch}+cu{row.cuda.replace('.', '')}"
    version = row.version
    document = {
        "bomFormat": "CycloneDX",
        "specVersion": "1.6",
        "metadata": {
            "component": {
                "name": "hotloop",
                "version": version,
                "purl": f"pkg:pypi/hotloop@{quote(version, safe='')}",
                "properties": [
                    {"name": f"hotloop:{sbom.PROP_TORCH}", "value": torch_version},
                    {"name": f"hotloop:{sbom.PROP_CUDA}", "value": row.cuda},
                ],
            }
        },
        "components": [{"type": "library", "name": "torch", "version": torch_version}],
    }
    return json.dumps(document)


def make_wheel(
    directory: Path,
    row: Row,
    files: Mapping[str, bytes | str],
    *,
    version: str | None = None,
    tag: str = "cp39-abi3-manylinux_2_28_x86_64",
    requires: tuple[str, ...] | None = None,
    with_sbom: bool = True,
) -> Path:
    """Write ``hotloop-<version>-<tag>.whl`` with ``files`` plus METADATA/WHEEL/RECORD."""
    version = version or row.version
    requires = requires if requires is not None else (row.requires_torch,)
    dist_info = f"hotloop-{version}.dist-info"
    metadata = "Metadata-Version: 2.4\nName: hotloop\nVersion: {}\n{}".format(
        version, "".join(f"Requires-Dist: {r}\n" for r in requires)
    )
    wheel_meta = f"Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: false\nTag: {tag}\n"
    contents = {
        **(
            {f"{dist_info}/{sbom.sbom_path('hotloop')}": sbom_source(row).encode()}
            if with_sbom
            else {}
        ),
        **{k: v.encode() if isinstance(v, str) else v for k, v in files.items()},
        f"{dist_info}/METADATA": metadata.encode(),
        f"{dist_info}/WHEEL": wheel_meta.encode(),
    }
    path = directory / f"hotloop-{version}-{tag}.whl"
    with zipfile.ZipFile(path, "w") as zf:
        record = []
        for name, data in contents.items():
            zf.writestr(name, data)
            record.append(_record_line(name, data))
        record.append(f"{dist_info}/RECORD,,")
        zf.writestr(f"{dist_info}/RECORD", "\n".join(record) + "\n")
    return path


@pytest.fixture
def wheel_factory(
    tmp_path: Path, newest_row: Row, elf_libs: dict[str, bytes]
) -> Callable[..., Path]:
    """``wheel_factory(**changes)``: a wheel that passes every rule unless ``changes`` break one."""

    def factory(
        *,
        extra: Mapping[str, bytes | str] | None = None,
        build_info: str | None = None,
        **kwargs: object,
    ) -> Path:
        files: dict[str, bytes | str] = {
            "hotloop/__init__.py": "",
            # device code in _C, so that tests replacing the ops library keep some
            "hotloop/_C.abi3.so": elf_libs["cuda"],
            "hotloop/libhotloop_ops.so": elf_libs["good"],
            "hotloop/_build_info.py": build_info
            if build_info is not None
            else build_info_source(newest_row),
        }
        files.update(extra or {})
        return make_wheel(tmp_path, newest_row, files, **kwargs)  # type: ignore[arg-type]

    return factory
