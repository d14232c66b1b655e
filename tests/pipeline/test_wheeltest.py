"""scripts.wheeltest: the venv each installed-wheel cell runs in."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from scripts import build, wheeltest


def test_cells_run_in_a_venv_seeded_like_python_m_venv(monkeypatch, tmp_path) -> None:
    """torch declares setuptools only for Python >= 3.12, yet Inductor's CPU backend imports
    it on every Python (torch.utils.cpp_extension): an unseeded uv venv on 3.10/3.11 fails
    torch.compile where a user's ``python -m venv`` works. The cells use a seeded venv."""
    seen: dict = {}

    def fake_create_venv(path, interp, packages, seed=False):
        seen["seed"] = seed
        return tmp_path / "venv" / "bin" / "python"

    monkeypatch.setattr(wheeltest, "create_venv", fake_create_venv)
    monkeypatch.setattr(
        wheeltest.subprocess,
        "run",
        lambda cmd, **kw: subprocess.CompletedProcess(cmd, 0, "1 passed\n", ""),
    )
    interp = wheeltest.Interpreter("3.10", Path("/usr/bin/python3.10"), "test")
    res = wheeltest.run_op_tests_in_venv("torch==2.10.0", tmp_path / "x.whl", interp, tmp_path)
    assert res.status == "passed"
    assert seen["seed"] is True
    assert res.source == "host (test)"  # where the interpreter came from, for the report


def test_a_host_cell_has_its_own_temporary_folders_and_removes_them(monkeypatch, tmp_path) -> None:
    """pytest's basetemps (``$TMPDIR/pytest-of-<user>``, three kept per user) and Inductor's
    cache (``$TMPDIR/torchinductor_<user>``) are shared by every run on the host: another run
    pruning or clearing them failed 2.11.0 / 3.11 (a precompiled header and fixtures' tmp_path
    gone). Each host cell gets a private TMPDIR and Inductor cache, made before the suite and
    removed after it, as a root cell gets its own /tmp."""
    seen: dict = {}
    monkeypatch.setenv("TMPDIR", "/tmp")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/tmp/torchinductor_shared")
    monkeypatch.setattr(
        wheeltest, "create_venv", lambda *a, **kw: tmp_path / "venv" / "bin" / "python"
    )

    def fake_run(cmd, env, **kw):
        seen.update(env)
        inductor = Path(env["TORCHINDUCTOR_CACHE_DIR"])
        seen["existed"] = Path(env["TMPDIR"]).is_dir() and inductor.is_dir()
        if seen["existed"]:
            (inductor / "pch").write_text("what the suite leaves")
        return subprocess.CompletedProcess(cmd, 0, "1 passed\n", "")

    monkeypatch.setattr(wheeltest.subprocess, "run", fake_run)
    interp = wheeltest.Interpreter("3.11", Path("/usr/bin/python3.11"), "test")
    cells = tmp_path / "cells"
    res = wheeltest.run_op_tests_in_venv("torch==2.11.0", tmp_path / "x.whl", interp, cells)
    assert res.status == "passed"
    tmp, inductor = Path(seen["TMPDIR"]), Path(seen["TORCHINDUCTOR_CACHE_DIR"])
    assert tmp.is_relative_to(cells / "py3.11")
    assert inductor.is_relative_to(tmp)
    assert seen["existed"]
    assert not tmp.exists()  # removed with what the suite wrote there


def test_an_extension_imported_before_torch_is_explained() -> None:
    """causal-conv1d's wheel was fine; the first test-command imported its top-level
    extension before torch."""
    output = (
        'Traceback (most recent call last):\n  File "<string>", line 1, in <module>\n'
        "ImportError: libc10.so: cannot open shared object file: No such file or directory\n"
    )
    summary = wheeltest.last_summary_line(output)
    assert summary.startswith("ImportError: libc10.so: cannot open shared object file")
    assert summary.endswith("let test-command import the package as its users do, torch first")


def test_a_plain_summary_gets_no_hint() -> None:
    output = "collected 3 items\n...\n============ 3 passed in 1.2s ============\n"
    assert wheeltest.last_summary_line(output) == "3 passed in 1.2s"


def test_a_passed_commands_summary_is_its_own_output_not_a_warning() -> None:
    """flash-attention's rotary test-command printed what it imported; torch's import warned on
    stderr (no NumPy), and the table showed the warning's source line as the result."""
    stdout = "imported /venv/rotary_emb.cpython-312-x86_64-linux-gnu.so apply_rotary(...)\n"
    stderr = (
        "/venv/torch/_subclasses/functional_tensor.py:279: UserWarning: Failed to initialize "
        "NumPy: No module named 'numpy'\n"
        '  cpu = _conversion_method_template(device=torch.device("cpu"))\n'
    )
    assert wheeltest.run_summary(0, stdout, stderr).startswith("imported /venv/rotary_emb")
    failed = wheeltest.run_summary(1, stdout, "Traceback ...\nImportError: no rotary_emb\n")
    assert failed == "ImportError: no rotary_emb"


@pytest.mark.parametrize(("returncode", "kept"), [(0, False), (1, True)], ids=["passed", "failed"])
def test_a_passed_cells_venv_is_removed_a_failed_ones_kept(
    monkeypatch, tmp_path, returncode, kept
) -> None:
    """A cell's venv holds a whole CUDA torch (4 to 5 GB when uv cannot hardlink it): a
    project's table of 8 rows x 4 Pythons filled this machine's disk. A passed cell removes
    its venv; a failed one keeps it to look into."""

    def fake_create_venv(path, interp, packages, seed=False):
        (path / "bin").mkdir(parents=True)
        return path / "bin" / "python"

    monkeypatch.setattr(wheeltest, "create_venv", fake_create_venv)
    monkeypatch.setattr(
        wheeltest.subprocess,
        "run",
        lambda cmd, **kw: subprocess.CompletedProcess(cmd, returncode, "1 passed\n", ""),
    )
    interp = wheeltest.Interpreter("3.12", Path("/usr/bin/python3.12"), "test")
    res = wheeltest.run_op_tests_in_venv("torch==2.11.0", tmp_path / "x.whl", interp, tmp_path)
    assert res.status == ("failed" if kept else "passed")
    assert (tmp_path / "py3.12" / "venv").exists() == kept
    assert (tmp_path / "py3.12.log").exists()


STRICT_MARKERS = "[tool.pytest.ini_options]\naddopts = ['--strict-markers']\n"
A_MARKED_TEST = "import pytest\n\n\n@pytest.mark.theirs\ndef test_marked():\n    pass\n"


def test_a_wheels_tests_see_no_configuration_of_the_folders_around_them(tmp_path) -> None:
    """The test cells live in the cache, by default inside this repository: a test command
    that runs pytest on the installed package (no path of the checkout) took this repository's
    pytest configuration (its strict markers, and its root on sys.path), and a marker of the
    project's own failed collection. Nor does git there find this repository."""
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "pyproject.toml").write_text(STRICT_MARKERS)
    cell = repo / "cache" / "py3.12"
    run = wheeltest.run_folder(cell)
    (run / "test_theirs.py").write_text(A_MARKED_TEST)
    pytest_run = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_theirs.py"]
    ran = subprocess.run(pytest_run, cwd=run, capture_output=True, text=True)
    assert ran.returncode == 0, ran.stdout
    # the same test, with the repository's configuration in reach, fails collection
    (cell / "pytest.ini").unlink()
    ran = subprocess.run(pytest_run, cwd=run, capture_output=True, text=True)
    assert "'theirs' not found in `markers`" in ran.stdout
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    env = {**os.environ, **build.no_repository_around(cell)}
    toplevel = subprocess.run(
        ["git", "rev-parse", "--show-toplevel"], cwd=run, env=env, capture_output=True, text=True
    )
    assert "not a git repository" in toplevel.stderr
