"""The import guard's source-build advice, followed to the letter: next to a torch and a hotloop
wheel that does not fit it, the advised command in a checkout replaces the wheel with a build
against that torch, and leaves torch as it was."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from index_helpers import (
    REPO,
    find_uv,
    installed_hotloop,
    isolated_env,
    make_tiny_wheel,
    run,
    torch_state,
    venv_python,
)

from scripts import wheel_sources
from scripts.matrix import load_rows

BUILD_TIMEOUT_S = 1800


def advised_command() -> str:
    """``SOURCE_BUILD`` of ``src/hotloop/_guard.py``, read without importing hotloop."""
    tree = ast.parse((REPO / "src" / "hotloop" / "_guard.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "SOURCE_BUILD" for t in node.targets
        ):
            command: str = ast.literal_eval(node.value)
            return command
    raise AssertionError("src/hotloop/_guard.py has no SOURCE_BUILD")


@pytest.mark.slow
def test_the_guards_source_build_advice_replaces_a_wheel_that_does_not_fit(tmp_path: Path) -> None:
    uv = find_uv()
    if uv is None:
        pytest.skip("uv not found")
    venv = tmp_path / "venv"
    run([uv, "venv", "-q", "--seed", "-p", sys.executable, venv])
    python = venv_python(venv)
    # What the advice says it needs, next to the newest row's torch (with its dependencies:
    # the build imports torch).
    torch = load_rows()[-1].torch
    run([uv, "pip", "install", "-q", "-p", python, f"torch=={torch}", "setuptools>=77", "ninja"])
    # The wheel the guard refused: same project, another build.
    run(
        [
            python,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            make_tiny_wheel(tmp_path, "stable.cu13"),
        ]
    )
    assert installed_hotloop(python) == "0.1.0+stable.cu13"
    checkout = tmp_path / "hotloop"
    for path in wheel_sources.build_inputs(REPO):
        target = checkout / path.relative_to(REPO)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)
    before = torch_state(python)
    env = isolated_env(
        PATH=os.pathsep.join([str(python.parent), os.environ["PATH"]]),
        VIRTUAL_ENV=str(venv),
        HOTLOOP_CUDA="0",  # no CUDA toolkit here: the CPU kernels, as the advice allows
        MAX_JOBS="2",
    )
    proc = subprocess.run(
        ["bash", "-c", advised_command()],
        cwd=checkout,
        env=env,
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT_S,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert installed_hotloop(python) == "0.1.0+stable.cpu"
    assert torch_state(python) == before
    doctor = run([python, "-m", "hotloop"], check=False)
    assert "verdict      OK" in doctor.stdout, doctor.stdout + doctor.stderr
