"""Toolchain helpers that need no network: apt source parsing, symlink fixing, CUDA tree merge."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from scripts import toolchain

DEB822 = """\
Types: deb
# http://snapshot.debian.org/archive/debian/20250520T000000Z
URIs: http://mirror.example/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://mirror.example/debian-security
Suites: bookworm-security
Components: main
"""


def test_deb822_mirror_becomes_bullseye():
    mirror = toolchain.debian_mirror(toolchain.parse_deb822(DEB822))
    assert mirror.uri == "http://mirror.example/debian"
    assert toolchain.bullseye_sources_line(mirror) == (
        "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] "
        "http://mirror.example/debian bullseye main\n"
    )


def test_one_line_sources():
    text = (
        "# comment\ndeb-src http://x/debian bookworm main\n"
        "deb [arch=amd64] http://x/debian/ bookworm main contrib\n"
    )
    (src,) = toolchain.parse_one_line(text)
    assert (src.uri, src.suites, src.components) == (
        "http://x/debian",
        ("bookworm",),
        ("main", "contrib"),
    )


def test_no_mirror_is_a_clear_error():
    with pytest.raises(RuntimeError, match="no Debian archive"):
        toolchain.debian_mirror(toolchain.parse_deb822(DEB822.split("\n\n")[1]))


def test_system_sources_parse(tmp_path):
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list.d" / "debian.sources").write_text(DEB822)
    assert (
        toolchain.debian_mirror(toolchain.system_apt_sources(tmp_path)).uri
        == "http://mirror.example/debian"
    )


def test_relativize_symlinks(tmp_path):
    (tmp_path / "lib/x86_64-linux-gnu").mkdir(parents=True)
    (tmp_path / "lib/x86_64-linux-gnu/libm.so.6").write_text("")
    (tmp_path / "usr/lib/x86_64-linux-gnu").mkdir(parents=True)
    link = tmp_path / "usr/lib/x86_64-linux-gnu/libm.so"
    link.symlink_to("/lib/x86_64-linux-gnu/libm.so.6")
    assert toolchain.relativize_symlinks(tmp_path) == 1
    assert os.readlink(link) == "../../../lib/x86_64-linux-gnu/libm.so.6"
    assert link.resolve() == (tmp_path / "lib/x86_64-linux-gnu/libm.so.6").resolve()


def test_merge_split_cuda12_components(tmp_path):
    site = tmp_path / "site"
    for rel in (
        "nvidia/cuda_nvcc/bin/nvcc",
        "nvidia/cuda_runtime/include/cuda_runtime.h",
        "nvidia/cuda_runtime/lib/libcudart.so.12",
        "nvidia/cuda_cccl/include/cub/cub.cuh",
    ):
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_text(rel)
    home = tmp_path / "home"
    for component in toolchain.component_roots(site):
        toolchain._merge_tree(component, home)
    assert sorted(str(p.relative_to(home)) for p in home.rglob("*") if p.is_file()) == [
        "bin/nvcc", "include/cub/cub.cuh", "include/cuda_runtime.h", "lib/libcudart.so.12",
    ]  # fmt: skip


def test_torch_cuda_include_dirs(tmp_path):
    for rel in ("nvidia/cu13/include", "nvidia/cudnn/include", "nvidia/cu13/lib"):
        (tmp_path / rel).mkdir(parents=True)
    assert toolchain.torch_cuda_include_dirs(tmp_path) == [
        tmp_path / "nvidia/cu13/include",
        tmp_path / "nvidia/cudnn/include",
    ]


def test_cache_dir_honours_env(tmp_path, monkeypatch):
    monkeypatch.setenv("HOTLOOP_CACHE_DIR", str(tmp_path / "c"))
    assert toolchain.cache_dir() == tmp_path / "c"
    assert (tmp_path / "c").is_dir()


def test_compiler_wrappers(tmp_path, monkeypatch):
    monkeypatch.setenv("HOTLOOP_CACHE_DIR", str(tmp_path))
    env = toolchain.compiler_wrappers(tmp_path / "ccbin", tmp_path / "cuda")
    assert {Path(v).name for v in env.values()} == {"gcc", "g++", "nvcc"}
    assert str(tmp_path / "cuda/bin/nvcc") in Path(env["PYTORCH_NVCC"]).read_text()
