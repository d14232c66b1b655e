"""setup.py's own logic: the archs it records, the compilers it records, the torch it reads."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
from pathlib import Path

import pytest
import torch


def load_setup_py():
    """The repository's setup.py as a module (its main() only runs as a script)."""
    pytest.importorskip("setuptools")
    path = Path(__file__).resolve().parents[2] / "setup.py"
    if not path.is_file():
        pytest.skip("no setup.py beside these tests (an installed-wheel run)")
    spec = importlib.util.spec_from_file_location("hotloop_setup_under_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("arch_list", "expected"),
    [
        ("9.0;9.0a", ["sm_90", "sm_90a"]),
        ("10.0a", ["sm_100a"]),
        ("8.0;9.0a+PTX;12.0", ["sm_80", "compute_90a", "sm_90a", "sm_120"]),
    ],
)
def test_setup_py_records_arch_specific_targets(monkeypatch, arch_list, expected) -> None:
    """torch takes these (Hopper's wgmma needs sm_90a); the build info must list them."""
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", arch_list)
    assert load_setup_py().compiled_archs() == expected


def test_setup_py_refuses_a_torch_version_it_cannot_read(monkeypatch) -> None:
    setup = load_setup_py()
    monkeypatch.setattr(torch, "__version__", "2!2.10.0")
    monkeypatch.delenv("HOTLOOP_ABI", raising=False)
    with pytest.raises(SystemExit, match=r"build environment's torch '2!2\.10\.0' is not a"):
        setup.abi_kind()


def fake_command(folder: Path, name: str, body: str) -> Path:
    path = folder / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return path


@pytest.mark.skipif(shutil.which("g++") is None, reason="no g++")
def test_setup_py_records_the_compiler_behind_a_launcher(tmp_path, monkeypatch) -> None:
    """CXX="ccache g++" is a command line, which torch's build runs as such."""
    fake_command(tmp_path, "ccache", 'exec "$@"')
    monkeypatch.setenv("PATH", f"{tmp_path}:{__import__('os').environ['PATH']}")
    monkeypatch.setenv("CXX", "ccache g++")
    version = subprocess.run(["g++", "--version"], capture_output=True, text=True).stdout
    assert load_setup_py().build_compilers(with_cuda=False) == [["g++", version.splitlines()[0]]]


def test_setup_py_records_the_cxx_the_build_runs(tmp_path, monkeypatch) -> None:
    cxx = fake_command(tmp_path, "my-g++", "echo 'my-g++ (Example) 99.1'")
    monkeypatch.setenv("CXX", str(cxx))
    assert load_setup_py().build_compilers(with_cuda=False) == [["my-g++", "my-g++ (Example) 99.1"]]


def test_setup_py_stops_on_a_compiler_that_does_not_run(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-g++"))
    with pytest.raises(SystemExit, match=r"the build's compiler '.*no-such-g\+\+' does not run"):
        load_setup_py().build_compilers(with_cuda=False)


@pytest.mark.skipif(shutil.which("git") is None, reason="no git")
def test_setup_py_names_an_edited_tree_dirty(tmp_path, monkeypatch) -> None:
    """A plain `pip wheel .` of a checkout with changes must not record HEAD as its source."""
    setup = load_setup_py()
    monkeypatch.delenv("HOTLOOP_GIT_COMMIT", raising=False)
    monkeypatch.setattr(setup, "ROOT", tmp_path)

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()

    git("init", "-q")
    (tmp_path / "kernel.cu").write_text("// one\n")
    git("add", "kernel.cu")
    git("commit", "-q", "-m", "one")
    head = git("rev-parse", "HEAD")
    assert setup.git_commit() == head
    (tmp_path / "kernel.cu").write_text("// two\n")
    assert setup.git_commit() == f"{head}-dirty"
    git("checkout", "-q", "kernel.cu")
    (tmp_path / "new_kernel.cu").write_text("// new\n")
    assert setup.git_commit() == f"{head}-dirty"
    monkeypatch.setenv("HOTLOOP_GIT_COMMIT", "c" * 40)
    assert setup.git_commit() == "c" * 40


@pytest.mark.skipif(shutil.which("git") is None, reason="no git")
def test_setup_py_does_not_name_an_enclosing_checkouts_commit(tmp_path, monkeypatch) -> None:
    """A source tree unpacked inside another project's checkout (an sdist or a `git archive`
    under an ignored folder) is not that checkout's HEAD: its build info must not say it is."""
    setup = load_setup_py()
    monkeypatch.delenv("HOTLOOP_GIT_COMMIT", raising=False)
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / ".gitignore").write_text("/unpacked/\n")
    subprocess.run(["git", "add", ".gitignore"], cwd=tmp_path, check=True)
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "outer"],
        cwd=tmp_path,
        check=True,
    )
    unpacked = tmp_path / "unpacked"
    unpacked.mkdir()
    (unpacked / "kernel.cu").write_text("// one\n")
    monkeypatch.setattr(setup, "ROOT", unpacked)
    assert setup.git_commit() == "unknown"


@pytest.mark.skipif(shutil.which("git") is None, reason="no git")
def test_setup_py_names_the_monorepo_commit_that_tracks_it(tmp_path, monkeypatch) -> None:
    """A tree that a larger checkout tracks is that checkout's HEAD, dirty by its own files."""
    setup = load_setup_py()
    monkeypatch.delenv("HOTLOOP_GIT_COMMIT", raising=False)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q", str(tmp_path)], check=True)
    vendored = tmp_path / "third_party" / "hotloop"
    vendored.mkdir(parents=True)
    (vendored / "kernel.cu").write_text("// one\n")
    subprocess.run([*git, "add", "."], cwd=tmp_path, check=True)
    subprocess.run([*git, "commit", "-q", "-m", "monorepo"], cwd=tmp_path, check=True)
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=tmp_path, capture_output=True, text=True, check=True
    ).stdout.strip()
    monkeypatch.setattr(setup, "ROOT", vendored)
    assert setup.git_commit() == head
    (tmp_path / "elsewhere.txt").write_text("not hotloop's\n")
    assert setup.git_commit() == head
    (vendored / "kernel.cu").write_text("// two\n")
    assert setup.git_commit() == f"{head}-dirty"
