"""Run a project's tests against its installed wheel, in a fresh venv per Python.

The tests run from an empty working directory so the source tree is never on ``sys.path``;
what they run, with which extras and environment, is the project table's ``test-command``,
``test-extras`` and ``test-env`` (this repository's table sets a variable that makes
tests/ops/conftest.py assert that the wheel is what it imports).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from scripts.basics import REPO
from scripts.build import create_venv, no_repository_around
from scripts.interpreters import Interpreter
from scripts.project import Project, own_project

PARALLEL_CELLS = 2  # two Python cells at a time: 2 cores, torch import is heavy


@dataclass
class PythonTestResult:
    python: str
    status: str  # "passed", "failed", "missing" (no interpreter), "skipped"
    interpreter: str = ""
    source: str = ""  # where the interpreter comes from (Interpreter.origin): host or container
    summary: str = ""
    seconds: float = 0.0
    log: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def pytest_command(python: Path, repo: Path = REPO, extra: Sequence[str] = ()) -> list[str]:
    """This repository's test command (its project table's ``test-command``) for ``python``,
    with ``repo`` as the checkout."""
    return [*own_project().test_arguments(str(python), str(repo)), *extra]


# Failures whose cause lies in how the test imports the wheel, not in the wheel: what the
# output says, and what to change in the table.
FAILURE_HINTS = {
    "libc10.so: cannot open shared object file": (
        "an extension module was imported before torch, and it finds libc10 only through the "
        "torch already loaded: let test-command import the package as its users do, torch first"
    ),
}


def last_summary_line(output: str) -> str:
    """pytest's summary line (or the last line), with the hint for a known cause."""
    lines = output.strip().splitlines()
    summary = next(
        (
            line.strip("= ").strip()
            for line in reversed(lines)
            if line.startswith("=") or " passed" in line or " failed" in line or "error" in line
        ),
        lines[-1] if lines else "",
    )
    hints = [hint for seen, hint in FAILURE_HINTS.items() if seen in output]
    return "; ".join([summary, *hints])


def run_summary(returncode: int, stdout: str, stderr: str) -> str:
    """A test command's result in a line: a passed command's own output (stderr carries
    warnings, such as torch's about a missing NumPy), a failed one's whole output, whose
    traceback ends on stderr."""
    if returncode == 0 and stdout.strip():
        return last_summary_line(stdout)
    return last_summary_line(stdout + stderr)


def installed_requirement(project: Project, wheel: Path) -> str:
    """``name[extras] @ file:///...``: the wheel, with the table's test extras."""
    extras = f"[{','.join(project.test_extras)}]" if project.test_extras else ""
    return f"{project.distribution}{extras} @ {wheel.resolve().as_uri()}"


def private_tmp(cell: Path) -> Path:
    """A fresh temporary folder (with an Inductor cache folder) inside ``cell``; one left by an
    interrupted run of the same cell is this cell's own and is replaced."""
    tmp = cell / "tmp"
    if tmp.exists():
        shutil.rmtree(tmp)
    (tmp / "torchinductor").mkdir(parents=True)
    return tmp


# Written at the top of a test cell: pytest looks for its configuration from the folder it runs
# in upwards, and the cells live in the cache, by default inside this repository, whose own
# configuration (strict markers, its root on sys.path) is no project's.
CELL_PYTEST_INI = """\
# Written by the wheel tests: a test command run here sees no pytest configuration of the
# folders around this one, as in a fresh folder of the user's.
[pytest]
"""


def run_folder(cell: Path) -> Path:
    """The empty folder a cell's test command runs in (``cell/run``), with a ``pytest.ini``
    of no settings at the top of the cell."""
    run = cell / "run"
    run.mkdir(parents=True, exist_ok=True)
    (cell / "pytest.ini").write_text(CELL_PYTEST_INI)
    return run


def cell_paths(workdir: Path, interp: Interpreter) -> tuple[Path, Path]:
    """A Python's cell folder in ``workdir`` (its venv and temporary files) and its log
    (named whole, not with_suffix: "py3.10")."""
    return workdir / f"py{interp.version}", workdir / f"py{interp.version}.log"


def run_in_fresh_venv(
    packages: Sequence[str],
    interp: Interpreter,
    workdir: Path,
    command: Callable[[Path], list[str]],
    env_extra: Mapping[str, str],
    reads: Sequence[Path],
) -> PythonTestResult:
    """Install ``packages`` into a fresh venv of ``interp`` and run ``command(venv python)``
    there, from an empty folder (so that no source tree is imported). ``reads``: the host
    folders that the packages and the command name (the wheel's, the checkout), which a Python
    of the Debian root sees only when they are bound into it."""
    if interp.root is not None:  # a Python of the Debian root: the venv lives in there
        from scripts import interpreter_root  # it imports this module

        result = interpreter_root.run_in_root(packages, interp, workdir, command, env_extra, reads)
    else:
        result = run_in_host_venv(packages, interp, workdir, command, env_extra)
    if result.status == "passed":
        # A whole CUDA torch, 4 to 5 GB where uv cannot hardlink it from its cache: a
        # table's cells would fill the disk. A failed cell keeps its venv to look into.
        shutil.rmtree(cell_paths(workdir, interp)[0] / "venv", ignore_errors=True)
    return result


def run_in_host_venv(
    packages: Sequence[str],
    interp: Interpreter,
    workdir: Path,
    command: Callable[[Path], list[str]],
    env_extra: Mapping[str, str],
) -> PythonTestResult:
    """run_in_fresh_venv for a Python of this host."""
    start = time.monotonic()
    cell, log_path = cell_paths(workdir, interp)
    try:
        # Seeded like a user's `python -m venv`: torch requires setuptools only on Python
        # >= 3.12, yet torch.compile's CPU backend imports it on every Python.
        py = create_venv(cell / "venv", interp.path, packages, seed=True)
    except subprocess.CalledProcessError as exc:
        return PythonTestResult(
            interp.version,
            "failed",
            str(interp.path),
            interp.origin,
            f"venv/install failed: {exc}",
            time.monotonic() - start,
            str(log_path),
        )
    run_dir = run_folder(cell)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update({"PYTHONDONTWRITEBYTECODE": "1", **no_repository_around(cell), **env_extra})
    env["PATH"] = os.pathsep.join([str(py.parent), env.get("PATH", "")])
    # The host's /tmp is shared: pytest keeps three basetemps per user there and Inductor its
    # cache, so another run's pruning or clearing fails this cell's fixtures and compiles. The
    # cell gets its own, as a root cell gets its own /tmp.
    tmp = private_tmp(cell)
    env.update({"TMPDIR": str(tmp), "TORCHINDUCTOR_CACHE_DIR": str(tmp / "torchinductor")})
    try:
        proc = subprocess.run(command(py), cwd=run_dir, env=env, capture_output=True, text=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    output = proc.stdout + proc.stderr
    log_path.write_text(output)
    return PythonTestResult(
        interp.version,
        "passed" if proc.returncode == 0 else "failed",
        str(interp.path),
        interp.origin,
        run_summary(proc.returncode, proc.stdout, proc.stderr),
        time.monotonic() - start,
        str(log_path),
    )


def run_op_tests_in_venv(
    torch_spec: str, wheel: Path, interp: Interpreter, workdir: Path
) -> PythonTestResult:
    """This repository's op tests against ``wheel`` installed with ``torch_spec``."""
    table = own_project()
    return run_in_fresh_venv(
        [torch_spec, installed_requirement(table, wheel)],
        interp,
        workdir,
        pytest_command,
        table.test_env,
        reads=(REPO, wheel.resolve().parent),
    )


def run_in_venvs(
    interpreters: Mapping[str, Interpreter | None],
    workdir: Path,
    run_one: Callable[[Interpreter], PythonTestResult],
    parallel: int = PARALLEL_CELLS,
) -> list[PythonTestResult]:
    """``run_one`` for each interpreter, ``parallel`` at a time; a missing one is reported."""
    workdir.mkdir(parents=True, exist_ok=True)
    results: dict[str, PythonTestResult] = {}
    todo = []
    from scripts.interpreter_root import PYTHONS as ROOT_PYTHONS  # it imports this module

    for version, interp in interpreters.items():
        if interp is None and version in ROOT_PYTHONS:
            results[version] = PythonTestResult(
                version,
                "skipped",
                summary=f"no Python {version} on this host; `nox -s matrix` tests it in the "
                "Debian root (scripts/interpreter_root.py)",
            )
        elif interp is None:
            results[version] = PythonTestResult(
                version, "missing", summary=f"no Python {version} interpreter found"
            )
        else:
            todo.append(interp)
    with ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
        futures = {i.version: pool.submit(run_one, i) for i in todo}
        for version, future in futures.items():
            res = future.result()
            print(
                f"[test] Python {version} ({res.interpreter}, {res.source}): "
                f"{res.status} - {res.summary}",
                file=sys.stderr,
                flush=True,
            )
            results[version] = res
    return [results[v] for v in interpreters]


def failures(torch_version: str, tests: Sequence[PythonTestResult]) -> list[str]:
    """One line per test run that did not pass; "skipped" is a Python only the Debian root
    has (``nox -s matrix`` runs those cells)."""
    return [
        f"torch {torch_version} Python {t.python} {t.status}: {t.summary} (log {t.log})"
        for t in tests
        if t.status not in ("passed", "skipped")
    ]


def run_op_tests(
    torch_version: str,
    wheel: Path,
    interpreters: Mapping[str, Interpreter | None],
    workdir: Path,
    parallel: int = PARALLEL_CELLS,
) -> list[PythonTestResult]:
    """Install ``wheel`` and ``torch==torch_version`` in a venv per interpreter; run tests/ops."""
    return run_in_venvs(
        interpreters,
        workdir,
        lambda i: run_op_tests_in_venv(f"torch=={torch_version}", wheel, i, workdir),
        parallel,
    )
