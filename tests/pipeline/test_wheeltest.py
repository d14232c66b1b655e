"""scripts.wheeltest: the venv each installed-wheel cell runs in."""

from __future__ import annotations

import subprocess
from pathlib import Path

from scripts import wheeltest


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
