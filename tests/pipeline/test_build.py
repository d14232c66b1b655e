"""The build step's pure parts: the environment handed to setup.py, ninja timings, source copy."""

from __future__ import annotations

from pathlib import Path

import pytest

from scripts import build, ci, diskspace, matrix, toolchain, variant
from scripts.interpreters import Interpreter
from tests.pipeline.disk_helpers import fake_statvfs
from tests.pipeline.git_helpers import git_checkout_with_a_project


def test_build_env_follows_the_setup_py_contract(tmp_path, monkeypatch, newest_row):
    monkeypatch.setenv("HOTLOOP_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("CPATH", "/usr/local/cuda/include")  # never the system CUDA
    site = tmp_path / "site"
    (site / "nvidia/cu13/include").mkdir(parents=True)
    tools = toolchain.Toolchain(
        tmp_path / "cuda",
        tmp_path / "sysroot",
        toolchain.compiler_wrappers(tmp_path / "ccache", tmp_path / "cuda", source_name="hotloop"),
        toolchain.ccache_env(),
    )
    env = build.build_env(newest_row, tools, site)
    assert env["HOTLOOP_CUDA"] == "1"
    assert env["CUDA_HOME"] == str(tmp_path / "cuda")
    assert env["TORCH_CUDA_ARCH_LIST"] == "8.0;8.6;8.9;9.0;10.0;12.0+PTX"
    assert env["HOTLOOP_SYSROOT"] == str(tmp_path / "sysroot")
    assert env["CPATH"] == str(site / "nvidia/cu13/include")
    assert env["TORCH_NO_COMPILER_WRAPPER"] == "1"
    assert env["SOURCE_DATE_EPOCH"].isdigit()
    for name, tool in (("CC", "gcc"), ("CXX", "g++"), ("PYTORCH_NVCC", "nvcc")):
        assert Path(env[name]).name == tool
        assert "ccache" in Path(env[name]).read_text()
    assert env["CCACHE_DIR"] == str(tmp_path / "cache" / "ccache")


def test_compile_times_from_ninja_log(tmp_path):
    log = tmp_path / "temp.linux" / ".ninja_log"
    log.parent.mkdir()
    log.write_text(
        "# ninja log v7\n"
        "0\t1500\t1\t/x/build/temp.linux/csrc/a/a_cuda.o\tabc\n"
        "0\t900\t1\t/x/build/temp.linux/csrc/a/a_cuda.o\tabc\n"  # a rerun: the last entry wins
        "10\t30\t1\t/x/build/temp.linux/csrc/hotloop.o\tdef\n"
    )
    assert build.compile_times(tmp_path) == {"csrc/a/a_cuda.o": 0.9, "csrc/hotloop.o": 0.02}


def test_copy_sources_leaves_build_outputs_behind(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    (repo / "src/hotloop/__pycache__").mkdir(parents=True)
    (repo / "src/hotloop/__init__.py").write_text("")
    (repo / "src/hotloop/_build_info.py").write_text("stale")
    (repo / "src/hotloop/_C.abi3.so").write_text("stale")
    (repo / "csrc").mkdir()
    (repo / "csrc/x.cpp").write_text("")
    (repo / "setup.py").write_text("")
    (repo / "README.md").write_text("# r\n")
    monkeypatch.setattr(build, "REPO", repo)
    dest = tmp_path / "copy"
    build.copy_sources(dest)
    files = sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file())
    assert files == ["README.md", "csrc/x.cpp", "setup.py", "src/hotloop/__init__.py"]


def test_create_venv_seeds_only_when_asked(tmp_path, monkeypatch):
    """``seed=True`` is ``uv venv --seed``: pip, and setuptools below Python 3.12, as
    ``python -m venv`` gives (torch's Inductor imports setuptools but only requires it on
    Python >= 3.12)."""
    commands: list[list[str]] = []
    monkeypatch.setattr(build, "uv_exe", lambda: "uv")
    monkeypatch.setattr(build, "uv_cache_dir", lambda: tmp_path / "uv")
    monkeypatch.setattr(diskspace.os, "statvfs", fake_statvfs(diskspace.TORCH_BYTES))
    monkeypatch.setattr(build.subprocess, "run", lambda cmd, **kw: commands.append(cmd))
    build.create_venv(tmp_path / "plain", Path("/usr/bin/python3.10"), ["torch"])
    build.create_venv(tmp_path / "seeded", Path("/usr/bin/python3.10"), ["torch"], seed=True)
    venvs = [c for c in commands if c[:2] == ["uv", "venv"]]
    assert "--seed" not in venvs[0]
    assert "--seed" in venvs[1]


def test_a_venv_is_not_made_when_uvs_cache_has_no_room_for_torch(tmp_path, monkeypatch):
    """Every torch x Python pair adds about 0.9 GB to uv's cache (more with a new CUDA line):
    a run that would fill the disk stops before uv starts, naming the cache and the remedy."""
    commands: list[list[str]] = []
    monkeypatch.setattr(build, "uv_exe", lambda: "uv")
    monkeypatch.setattr(build, "uv_cache_dir", lambda: tmp_path / "uv")
    monkeypatch.setattr(diskspace.os, "statvfs", fake_statvfs(diskspace.GIB // 4))
    monkeypatch.setattr(build.subprocess, "run", lambda cmd, **kw: commands.append(cmd))
    with pytest.raises(diskspace.DiskSpaceError, match=r"uv\S*: 0\.2 GiB free.*uv cache prune"):
        build.create_venv(tmp_path / "venv", Path("/usr/bin/python3.12"), ["torch==2.11.0"])
    assert commands == []
    assert not (tmp_path / "venv").exists()


def test_every_build_of_a_row_runs_on_one_python(newest_row):
    # nox -s wheels and cibuildwheel built the same stable wheel on 3.13 and 3.11: the
    # limited-API module object's initial reference count (immortal from 3.12's headers on)
    # was the only difference between their wheels.
    rows = matrix.load_rows()
    for row in matrix.build_rows(rows):
        expected = row.pythons[0] if row.kind == variant.PINNED else "3.11"
        assert row.build_python == expected, row.torch
        assert ci.build_identifier(row).startswith(f"cp{expected.replace('.', '')}-")
    interp = Interpreter("3.11", Path("/opt/python3.11"), "PATH")
    found = {v: Interpreter(v, Path(f"/opt/python{v}"), "PATH") for v in newest_row.pythons}
    assert build.pick_build_python(newest_row, found) == interp


def test_missing_build_python_is_named(newest_row):
    with pytest.raises(SystemExit, match=r"built on Python 3\.11 .*pyenv install 3\.11"):
        build.pick_build_python(newest_row, {v: None for v in newest_row.pythons})


FAKE_BUILD = """#!/bin/sh
# Stands in for the build venv's python: `python -m build --wheel --no-isolation --outdir D SRC`.
echo "PATH=$PATH VIRTUAL_ENV=$VIRTUAL_ENV"
[ -n "$FAIL" ] && { echo "error: the compiler said no"; exit 3; }
mkdir -p "$6" && touch "$6/pkg-1.0-cp39-abi3-linux_x86_64.whl"
"""


def fake_venv_python(tmp_path: Path) -> Path:
    py = tmp_path / "venv" / "bin" / "python"
    py.parent.mkdir(parents=True)
    py.write_text(FAKE_BUILD)
    py.chmod(0o755)
    return py


def test_build_in_venv_puts_the_venv_first_and_returns_the_one_wheel(tmp_path):
    """The tail every build shares (hotloop's, another project's, the reproducible check's)."""
    py = fake_venv_python(tmp_path)
    work = tmp_path / "work"
    (work / "dist").mkdir(parents=True)
    (work / "dist" / "old-0.1-py3-none-any.whl").write_text("")  # a previous build's
    wheel, log_path = build.build_in_venv(py, tmp_path, work, {"PATH": "/usr/bin"}, what="t")
    assert wheel == work / "dist" / "pkg-1.0-cp39-abi3-linux_x86_64.whl"
    assert sorted(p.name for p in (work / "dist").iterdir()) == [wheel.name]
    assert log_path == work / "build.log"
    assert f"PATH={py.parent}:/usr/bin VIRTUAL_ENV={tmp_path / 'venv'}" in log_path.read_text()


def test_build_in_venv_failure_shows_the_log_tail(tmp_path):
    py = fake_venv_python(tmp_path)
    (tmp_path / "w").mkdir()
    with pytest.raises(build.BuildError, match=r"(?s)t: build failed.*the compiler said no"):
        build.build_in_venv(py, tmp_path, tmp_path / "w", {"FAIL": "1", "PATH": "/bin"}, what="t")


def test_git_commit_is_unknown_for_sources_inside_another_checkout(tmp_path, monkeypatch):
    """A hotloop tree that git does not track (an unpacked sdist, an ignored copy) inside
    another project's checkout: git answers for that checkout, whose HEAD is not this tree's
    source, and whose last commit is not this tree's time."""
    git_checkout_with_a_project(tmp_path)
    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)
    monkeypatch.setattr(build, "REPO", tmp_path / "unpacked")
    assert build.git_commit() == "unknown"
    assert build.source_date_epoch() != "1700000000"


def test_a_project_in_a_monorepo_takes_its_checkouts_commit_and_time(tmp_path, monkeypatch):
    project = git_checkout_with_a_project(tmp_path)
    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)
    head = build.git_output("rev-parse", "HEAD", cwd=tmp_path)
    assert build.checkout_commit(project) == head
    assert build.source_date_epoch(project) == "1700000000"
    (tmp_path / "README.md").write_text("another project's change\n")
    assert build.checkout_commit(project) == head
    (project / "setup.py").write_text("# changed\n")
    assert build.checkout_commit(project) == f"{head}-dirty"
