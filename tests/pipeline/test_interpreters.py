"""Interpreter discovery: pyenv install folders, newest patch release, shims skipped."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from scripts import interpreters


def fake_python(path: Path, version: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\necho {version}\n")
    path.chmod(0o755)
    return path


def refusing_shim(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\necho 'pyenv: python3.12: command not found' >&2\nexit 127\n")
    path.chmod(0o755)
    return path


@pytest.fixture
def pyenv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "pyenv"
    fake_python(root / "versions/3.12.1/bin/python3.12", "3.12")
    fake_python(root / "versions/3.12.10/bin/python3.12", "3.12")
    fake_python(root / "versions/3.12-dev/bin/python3.12", "3.12")
    fake_python(root / "versions/3.11.7/bin/python3.11", "3.11")
    shims = refusing_shim(tmp_path / "shims" / "python3.12").parent
    monkeypatch.setenv("PYENV_ROOT", str(root))
    monkeypatch.setenv("PATH", str(shims))  # no real pythonX.Y on PATH
    monkeypatch.setattr(interpreters, "_from_uv", lambda version: None)
    return root


def test_newest_patch_release_first(pyenv):
    found = interpreters.pyenv_candidates("3.12", pyenv)
    assert [p.parts[-3] for p in found] == ["3.12.10", "3.12.1"]


def test_refusing_shim_is_skipped(pyenv):
    interp = interpreters.find_interpreter("3.12")
    assert interp is not None
    assert interp.source == "pyenv"
    assert interp.path == pyenv / "versions/3.12.10/bin/python3.12"


def test_virtualenv_python_on_path_is_skipped(pyenv, tmp_path, monkeypatch):
    venv = tmp_path / "venv"
    fake_python(venv / "bin" / "python3.12", "3.12")
    (venv / "pyvenv.cfg").write_text("home = /somewhere\n")
    monkeypatch.setenv("PATH", str(venv / "bin"))
    interp = interpreters.find_interpreter("3.12")
    assert interp is not None
    assert interp.source == "pyenv"


def test_missing_version(pyenv):
    assert interpreters.find_interpreters(["3.11", "3.13"]) == {
        "3.11": interpreters.Interpreter("3.11", pyenv / "versions/3.11.7/bin/python3.11", "pyenv"),
        "3.13": None,
    }


def test_put_on_path(pyenv, monkeypatch):
    monkeypatch.delenv("UV_PYTHON_DOWNLOADS", raising=False)
    interpreters.put_on_path(["3.12", "3.11"])
    path = os.environ["PATH"].split(os.pathsep)
    assert path[:2] == [str(pyenv / "versions/3.12.10/bin"), str(pyenv / "versions/3.11.7/bin")]
    assert os.environ["UV_PYTHON_DOWNLOADS"] == "never"


def test_real_interpreter_reports_its_version():
    import sys

    assert interpreters.interpreter_version(sys.executable) == "{}.{}".format(*sys.version_info[:2])
