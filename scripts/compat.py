"""``nox -s matrix``: the version-compatibility matrix, tested, and the table it publishes.

    python -m scripts.compat [--torch 2.11 ...] [--python 3.12 ...] [--jobs 2]
                             [--wheels DIR ...] [--deadline 06:00] [--force]

For every row of ``scripts/matrix.toml`` it gets the row's wheel (reused when it was built
from the current sources, else built, repaired and audited by :func:`scripts.wheels.run_cell`)
and, for every Python of the row, installs that wheel and the row's torch from PyPI in a
fresh venv and runs the installed-wheel op suite (:mod:`scripts.wheeltest`). Negative cells
check that a wheel refuses a torch it was not built for: pip's resolver through the
``torch==A.*`` pin, the import guard after a forced ``--no-deps`` install, and (simulated:
PyPI has no CUDA 12 torch >= 2.11) a CUDA 13 wheel next to a CUDA 12 torch.

Writes ``docs/compatibility.md`` and ``docs/compatibility.json`` (generated; never edit them).

Reuse ("a rerun only redoes what changed"):

* wheels: each wheel this session builds gets ``<wheel>.sources.json`` beside it with
  :func:`source_digest` of the files that go into it; a wheel is reused only while that
  digest matches the tree. A wheel without that record (e.g. from ``nox -s wheels``) is
  adopted only if its ``_build_info.git_commit`` is a clean commit whose sources equal
  the tree's (``git diff`` empty, nothing untracked).
* cells: a passed test cell is recorded under the cache, keyed by the wheel's sha256, the
  torch version, the interpreter and a digest of ``tests/ops``; the same key is not rerun.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import heapq
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import threading
import time
import zipfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scripts import build, matrix, toolchain
from scripts.interpreters import Interpreter, find_interpreters

REPO = toolchain.REPO
ALL_PYTHONS = ("3.9", "3.10", "3.11", "3.12", "3.13")
DOCS = REPO / "docs"
MD_NAME = "compatibility.md"
JSON_NAME = "compatibility.json"

# Cell statuses in the table.
PASS = "pass"
FAIL = "fail"
UNSUPPORTED = "unsupported"
NOT_BUILT = "not built here"
NOT_RUN = "not run"
STATUSES = (PASS, FAIL, UNSUPPORTED, NOT_BUILT, NOT_RUN)

# Files whose content goes into a wheel (setup.py compiles csrc/, packages src/hotloop/).
SOURCE_FILES = ("setup.py", "pyproject.toml")
SOURCE_DIRS = ("csrc", "src/hotloop")
SOURCE_EXCLUDE = ("_build_info.py",)
SOURCE_EXCLUDE_DIRS = ("__pycache__", "build")
SOURCE_EXCLUDE_SUFFIXES = (".so", ".o", ".pyc")


def log(msg: str) -> None:
    print(f"[matrix] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- source digests


def source_paths(repo: Path = REPO) -> list[Path]:
    """The files a wheel is built from, sorted (generated and compiled files left out)."""
    paths = [repo / f for f in SOURCE_FILES if (repo / f).is_file()]
    for folder in SOURCE_DIRS:
        root = repo / folder
        if not root.is_dir():
            continue
        for path in root.rglob("*"):
            rel = path.relative_to(root)
            if (
                not path.is_file()
                or path.name in SOURCE_EXCLUDE
                or path.suffix in SOURCE_EXCLUDE_SUFFIXES
                or any(
                    part in SOURCE_EXCLUDE_DIRS or part.endswith(".egg-info") for part in rel.parts
                )
            ):
                continue
            paths.append(path)
    return sorted(paths)


def digest_files(paths: Iterable[Path], root: Path) -> str:
    """sha256 over (relative path, content) pairs: a rename changes it too."""
    h = hashlib.sha256()
    for path in paths:
        h.update(path.relative_to(root).as_posix().encode() + b"\0")
        h.update(hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()


def source_digest(repo: Path = REPO) -> str:
    return digest_files(source_paths(repo), repo)


def suite_digest(repo: Path = REPO) -> str:
    """Digest of the installed-wheel suite (tests/ops): a changed test reruns the cells."""
    root = repo / "tests" / "ops"
    files = sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)
    return digest_files(files, repo)


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# --------------------------------------------------------------------------- wheels


def sidecar(wheel: Path) -> Path:
    return wheel.with_name(wheel.name + ".sources.json")


def write_sidecar(wheel: Path, digest: str) -> Path:
    path = sidecar(wheel)
    path.write_text(
        json.dumps({"sources_sha256": digest, "wheel_sha256": file_sha256(wheel)}) + "\n"
    )
    return path


def read_build_info(wheel: Path) -> dict[str, Any]:
    """``hotloop/_build_info.py``'s ``BUILD_INFO`` from inside a wheel (without importing it)."""
    import ast

    with zipfile.ZipFile(wheel) as zf:
        text = zf.read("hotloop/_build_info.py").decode()
    tree = ast.parse(text)
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "BUILD_INFO" for t in node.targets
        ):
            return ast.literal_eval(node.value)
    raise ValueError(f"{wheel.name}: no BUILD_INFO in hotloop/_build_info.py")


def commit_matches_tree(commit: str, repo: Path = REPO) -> bool:
    """True if ``commit`` is clean and its wheel sources equal the working tree's."""
    if not re.fullmatch(r"[0-9a-f]{7,40}", commit or ""):
        return False  # "unknown" or "<sha>-dirty": built from uncommitted sources
    paths = [*SOURCE_FILES, *SOURCE_DIRS]
    try:
        diff = subprocess.run(
            ["git", "diff", "--quiet", commit, "--", *paths], cwd=repo, capture_output=True
        )
        untracked = subprocess.run(
            ["git", "ls-files", "--others", "--exclude-standard", "--", *paths],
            cwd=repo,
            capture_output=True,
            text=True,
        )
    except OSError:
        return False
    return diff.returncode == 0 and untracked.returncode == 0 and not untracked.stdout.strip()


@dataclass
class WheelChoice:
    wheel: Path | None
    why: str


def find_reusable_wheel(
    variant: str,
    dirs: Sequence[Path],
    digest: str,
    commit_ok: Callable[[str], bool] = commit_matches_tree,
) -> WheelChoice:
    """A wheel of ``variant`` in ``dirs`` built from sources with ``digest``, or why none is."""
    reasons = []
    for folder in dirs:
        for wheel in matrix.variant_wheels(folder, variant):
            record = sidecar(wheel)
            if record.is_file():
                try:
                    data = json.loads(record.read_text())
                except ValueError:
                    reasons.append(f"{wheel}: unreadable {record.name}")
                    continue
                if data.get("sources_sha256") != digest:
                    reasons.append(f"{wheel}: built from other sources")
                    continue
                if data.get("wheel_sha256") and data["wheel_sha256"] != file_sha256(wheel):
                    reasons.append(f"{wheel}: changed since it was recorded")
                    continue
                return WheelChoice(wheel, f"reused {wheel} (sources unchanged)")
            try:
                commit = str(read_build_info(wheel).get("git_commit", ""))
            except (KeyError, ValueError, zipfile.BadZipFile, SyntaxError) as exc:
                reasons.append(f"{wheel}: no build info ({exc})")
                continue
            if commit_ok(commit):
                return WheelChoice(wheel, f"reused {wheel} (built at clean commit {commit[:12]})")
            reasons.append(
                f"{wheel}: built at {commit[:12] or 'unknown commit'}, sources changed since"
            )
    return WheelChoice(None, "; ".join(reasons) or "no wheel of this variant yet")


# --------------------------------------------------------------------------- planning


@dataclass
class CellPlan:
    torch: str
    python: str
    action: str  # "test" or a final status (unsupported, not run)
    reason: str = ""


def plan_row(row: matrix.Row, pythons: Sequence[str] | None) -> list[CellPlan]:
    """One cell per Python of ALL_PYTHONS (plus any newer ones the row lists)."""
    columns = list(ALL_PYTHONS) + [p for p in row.pythons if p not in ALL_PYTHONS]
    cells = []
    for py in columns:
        if py not in row.pythons:
            cells.append(
                CellPlan(
                    row.torch, py, UNSUPPORTED, f"torch {row.torch} has no wheel for Python {py}"
                )
            )
        elif pythons and py not in pythons:
            cells.append(CellPlan(row.torch, py, NOT_RUN, "not selected (--python)"))
        else:
            cells.append(CellPlan(row.torch, py, "test"))
    return cells


def result_key(
    wheel_sha: str, torch: str, interp_path: str, python_version: str, tests: str
) -> str:
    raw = json.dumps([wheel_sha, torch, interp_path, python_version, tests])
    return hashlib.sha256(raw.encode()).hexdigest()[:24]


def read_json_or_none(path: Path) -> dict[str, Any] | None:
    """The JSON in ``path``, or None when it is missing or unreadable (a stale record)."""
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except ValueError:
        return None


class ResultCache:
    """Passed cells (and negative checks) under ``<cache>/matrix/results/<key>.json``."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def get(self, key: str) -> dict[str, Any] | None:
        return read_json_or_none(self.root / f"{key}.json")

    def put(self, key: str, value: Mapping[str, Any]) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.root / f".{key}.tmp"
        tmp.write_text(json.dumps(dict(value), indent=1) + "\n")
        tmp.replace(self.root / f"{key}.json")


# --------------------------------------------------------------------------- negative cells


@dataclass(frozen=True)
class NegativePair:
    wheel_torch: str  # row whose wheel is installed
    venv_torch: str  # row whose torch is in the venv
    simulated_cuda: str | None = None  # patch torch.version.cuda to this before import


DEFAULT_NEGATIVES = (
    NegativePair("2.11.0", "2.14.1"),
    NegativePair("2.14.1", "2.11.0"),
    NegativePair("2.14.1", "2.14.1", simulated_cuda="12.8"),
)
NEGATIVE_PYTHON = "3.12"


def clean_pip_env() -> dict[str, str]:
    """Environment for real pip that ignores this machine's pip config and PIP_* settings."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("PIP_") and k not in ("PYTHONPATH", "VIRTUAL_ENV")
    }
    env["PIP_CONFIG_FILE"] = os.devnull
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def guard_probe_code(simulated_cuda: str | None, simulated_version: str | None) -> str:
    lines = ["import torch"]
    if simulated_version is not None:
        lines.append(f"torch.__version__ = {simulated_version!r}")
    if simulated_cuda is not None:
        lines.append(f"torch.version.cuda = {simulated_cuda!r}")
    lines.append("import hotloop")
    lines.append("print('imported', hotloop.__file__)")
    return "\n".join(lines) + "\n"


def check_pip_refusal(
    output: str, returncode: int, wheel_minor: str, venv_torch: str
) -> tuple[bool, str]:
    """pip must exit non-zero and blame the torch pin against the installed torch."""
    if returncode == 0:
        return False, "pip installed the wheel"
    needed = f"torch=={wheel_minor}.*"
    missing = [s for s in (needed, venv_torch) if s not in output]
    if missing:
        return False, f"pip failed, but its message lacks {missing}"
    if "conflict" not in output.lower() and "ResolutionImpossible" not in output:
        return False, "pip failed, but not with a dependency conflict"
    return True, "pip refused: " + excerpt(output, needed)


def check_guard_error(
    output: str,
    returncode: int,
    wheel_torch: str,
    venv_torch: str,
    extra: Sequence[str] = (),
) -> tuple[bool, str]:
    """``import hotloop`` must raise the guard's ImportError naming both versions."""
    if returncode == 0:
        return False, "import hotloop succeeded"
    if "undefined symbol" in output:
        return False, "raw undefined symbol error instead of the guard's message"
    wanted = [
        "ImportError",
        f"built for torch {wheel_torch}",
        f"torch {venv_torch}",
        "pip install",
        *extra,
    ]
    missing = [s for s in wanted if s not in output]
    if missing:
        return False, f"import failed, but the message lacks {missing}"
    line = next((ln for ln in output.splitlines() if ln.startswith("ImportError")), output)
    return True, line.strip()


def excerpt(text: str, needle: str, width: int = 160) -> str:
    for line in text.splitlines():
        if needle in line:
            return line.strip()[:width]
    return text.strip().splitlines()[-1][:width] if text.strip() else ""


def run_negative(
    pair: NegativePair,
    wheel: Path,
    wheel_info: Mapping[str, Any],
    interp: Interpreter,
    workdir: Path,
) -> list[dict[str, Any]]:
    """The checks of one negative pair, in one venv: pip refusal, forced import (or CUDA)."""
    start = time.monotonic()
    venv = workdir / "venv"
    if venv.exists():
        shutil.rmtree(venv)
    workdir.mkdir(parents=True, exist_ok=True)
    uv = build.uv_exe()
    subprocess.run(
        [uv, "venv", "--quiet", "--seed", "--python", str(interp.path), str(venv)],
        check=True,
        env=build.uv_env(),
    )
    py = venv / "bin" / "python"
    subprocess.run(
        [uv, "pip", "install", "--quiet", "--python", str(py), f"torch=={pair.venv_torch}"],
        check=True,
        env=build.uv_env(),
    )
    env = clean_pip_env()
    run_dir = workdir / "run"
    run_dir.mkdir(exist_ok=True)
    base = {
        "wheel": wheel.name,
        "wheel_torch": wheel_info["torch_version"],
        "venv_torch": pair.venv_torch,
        "python": interp.version,
    }
    results = []
    wheel_minor = str(wheel_info["torch_minor"])
    pip = [str(py), "-m", "pip", "install", "--no-index", "--no-cache-dir"]
    if pair.simulated_cuda is None:
        # The venv's torch pinned as a user keeping it would; --no-index: nothing to fetch.
        keep = f"torch=={pair.venv_torch}"
        proc = subprocess.run(
            [*pip, str(wheel), keep], env=env, cwd=run_dir, capture_output=True, text=True
        )
        out = proc.stdout + proc.stderr
        (workdir / "pip.log").write_text(out)
        ok, detail = check_pip_refusal(out, proc.returncode, wheel_minor, pair.venv_torch)
        results.append(
            {
                **base,
                "check": "pip refuses the torch pin",
                "expected": f"pip: torch=={wheel_minor}.* conflicts with torch {pair.venv_torch}",
                "status": PASS if ok else FAIL,
                "detail": detail,
                "simulated": False,
            }
        )
    proc = subprocess.run(
        [*pip, "--no-deps", str(wheel)], env=env, cwd=run_dir, capture_output=True, text=True
    )
    if proc.returncode != 0:
        results.append(
            {
                **base,
                "check": "forced install",
                "expected": "pip install --no-deps succeeds",
                "status": FAIL,
                "detail": excerpt(proc.stdout + proc.stderr, "ERROR"),
                "simulated": False,
            }
        )
        return results
    if pair.simulated_cuda is None:
        code = guard_probe_code(None, None)
        expect_torch = pair.venv_torch
        extra: tuple[str, ...] = ("minor",)
        check = "import guard after --no-deps"
        expected = f"ImportError naming torch {wheel_info['torch_version']} and {pair.venv_torch}"
    else:
        # No CUDA 12 build of torch >= 2.11 exists on PyPI: claim one inside the process.
        expect_torch = f"{pair.venv_torch}+cu{pair.simulated_cuda.replace('.', '')}"
        code = guard_probe_code(pair.simulated_cuda, expect_torch)
        extra = ("CUDA major", f"CUDA {pair.simulated_cuda}", f"CUDA {wheel_info['cuda_version']}")
        check = (
            f"CUDA {wheel_info['cuda_version']} wheel, CUDA {pair.simulated_cuda} torch (simulated)"
        )
        expected = "ImportError naming both CUDA versions"
        base["venv_torch"] = f"{expect_torch} (simulated)"
    env_py = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env_py["PYTHONDONTWRITEBYTECODE"] = "1"
    proc = subprocess.run(
        [str(py), "-c", code], env=env_py, cwd=run_dir, capture_output=True, text=True
    )
    out = proc.stdout + proc.stderr
    (workdir / "import.log").write_text(out)
    ok, detail = check_guard_error(
        out, proc.returncode, wheel_info["torch_version"], expect_torch, extra
    )
    results.append(
        {
            **base,
            "check": check,
            "expected": expected,
            "status": PASS if ok else FAIL,
            "detail": detail,
            "simulated": pair.simulated_cuda is not None,
        }
    )
    seconds = round(time.monotonic() - start, 1)
    for r in results:
        r["seconds"] = seconds
    return results


# --------------------------------------------------------------------------- the run


@dataclass
class RowState:
    row: matrix.Row
    status: str = NOT_RUN  # of the wheel: built, reused, NOT_BUILT, "build failed", NOT_RUN
    wheel: Path | None = None
    wheel_sha256: str = ""
    build_info: dict[str, Any] = field(default_factory=dict)
    reason: str = ""
    build_seconds: float | None = None
    sources_sha256: str | None = None  # what the wheel was built from, when known
    cells: dict[str, dict[str, Any]] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        info = self.build_info
        return {
            "torch": self.row.torch,
            "cuda": self.row.cuda,
            "variant": self.row.variant,
            "pythons": list(self.row.pythons),
            "wheel": self.wheel.name if self.wheel else None,
            "wheel_sha256": self.wheel_sha256 or None,
            "wheel_status": self.status,
            "reason": self.reason,
            "archs": list(info.get("archs", [])),
            "archs_planned": self.row.archs,
            "build_commit": info.get("git_commit"),
            "build_seconds": self.build_seconds,
            "sources_sha256": self.sources_sha256,
            "cells": self.cells,
        }


class Deadline:
    def __init__(self, at: datetime.datetime | None) -> None:
        self.at = at

    def passed(self) -> bool:
        return self.at is not None and datetime.datetime.now(datetime.timezone.utc) >= self.at


def parse_deadline(
    text: str | None, now: datetime.datetime | None = None
) -> datetime.datetime | None:
    """``HH:MM`` (UTC, today or tomorrow) or seconds from now (``+600``)."""
    if not text:
        return None
    now = now or datetime.datetime.now(datetime.timezone.utc)
    if text.startswith("+"):
        return now + datetime.timedelta(seconds=float(text[1:]))
    hour, minute = (int(x) for x in text.split(":"))
    at = now.replace(hour=hour, minute=minute, second=0, microsecond=0)
    return at if at > now else at + datetime.timedelta(days=1)


def not_built_reason(exc: BaseException) -> str:
    msg = str(exc)
    m = re.search(r"point (HOTLOOP_CUDA_HOME_\w+) at", msg)
    if "ship no bin/nvcc" in msg and m:
        return (
            f"PyPI's CUDA toolkit packages ship no nvcc; set {m.group(1)} to a toolkit "
            "(CI builds it)"
        )
    return msg.splitlines()[0] if msg else type(exc).__name__


def newest_wheel(variant: str, dirs: Sequence[Path]) -> Path | None:
    wheels = [w for d in dirs for w in matrix.variant_wheels(d, variant)]
    return max(wheels, key=lambda w: w.stat().st_mtime) if wheels else None


def obtain_wheel(
    state: RowState,
    store: Path,
    extra_dirs: Sequence[Path],
    force: bool,
    may_build: bool = True,
    reuse_any: bool = False,
) -> None:
    """Fill ``state.wheel``: reuse one built from the current sources, else build one.

    ``may_build=False`` (past the deadline): reuse only; the row stays "not run".
    ``reuse_any``: take the newest wheel of the variant whatever sources it was built from
    (the table then names the commit it was built at); build only if there is none.
    """
    row = state.row
    digest = source_digest()
    if not force:
        choice = find_reusable_wheel(row.variant, [store, *extra_dirs], digest)
        if choice.wheel is not None:
            state.wheel, state.status, state.reason = choice.wheel, "reused", choice.why
            if sidecar(choice.wheel).is_file():
                state.sources_sha256 = digest
            log(f"{row.variant}: {choice.why}")
            return
        log(f"{row.variant}: no wheel built from the current sources ({choice.why})")
        anyway = newest_wheel(row.variant, [store, *extra_dirs]) if reuse_any else None
        if anyway is not None:
            state.wheel, state.status = anyway, "reused as is"
            state.reason = f"--reuse-any: {anyway.name}, not rebuilt from the current sources"
            if sidecar(anyway).is_file():
                state.sources_sha256 = json.loads(sidecar(anyway).read_text())["sources_sha256"]
            log(f"{row.variant}: {state.reason}")
            return
    try:
        toolchain.ensure_cuda_toolkit(row.cuda, row.toolkit)
    except toolchain.ToolkitError as exc:
        state.status, state.reason = NOT_BUILT, not_built_reason(exc)
        state.build_info = {}
        log(f"{row.variant}: not built here: {exc}")
        return
    if not may_build:
        state.status, state.reason = NOT_RUN, "time (deadline reached before the build)"
        return
    from scripts.wheels import run_cell  # its imports (audit) need the pipeline tools

    start = time.monotonic()
    cell = run_cell(row, store, None, skip_tests=True)
    state.build_seconds = round(time.monotonic() - start, 1)
    if cell.status != "passed" or not cell.wheel:
        state.status = "build failed"
        state.reason = (
            f"failed at {cell.stage}: {cell.error.strip().splitlines()[0] if cell.error else ''}"
        )
        return
    wheel = store / cell.wheel
    state.wheel, state.status, state.reason = wheel, "built", f"built in {state.build_seconds:.0f}s"
    # scripts.build copies the tree to <work>/<variant>/src before building: that copy is
    # exactly what went into the wheel, whatever happened to the tree meanwhile.
    copy = toolchain.cache_dir() / "work" / row.variant / "src"
    built_from = source_digest(copy) if copy.is_dir() else None
    if built_from:
        write_sidecar(wheel, built_from)
        state.sources_sha256 = built_from
        if built_from != source_digest():
            state.reason += " (the tree changed meanwhile)"


# Which Python of each row tests first: with a deadline, every row gets its most used Python
# before any row gets its fourth.
PYTHON_PRIORITY = ("3.12", "3.10", "3.13", "3.11", "3.9")


def cell_priority(python: str, row: matrix.Row) -> tuple:
    rank = PYTHON_PRIORITY.index(python) if python in PYTHON_PRIORITY else len(PYTHON_PRIORITY)
    return (1, rank, tuple(int(p) for p in row.torch.split(".")))


class JobQueue:
    """A thread pool that runs the best job waiting, not the first submitted.

    Each ``submit`` pushes the job on a heap and hands the pool an anonymous runner that
    pops the heap's best job when a worker takes it, so jobs submitted later (a wheel
    that finished building) can overtake ones still waiting.
    """

    def __init__(self, workers: int) -> None:
        self._pool = ThreadPoolExecutor(max_workers=workers)
        self._heap: list[tuple[tuple, int, Callable[..., Any], tuple]] = []
        self._lock = threading.Lock()
        self._futures: list[Future] = []
        self._seq = 0

    def submit(self, priority: tuple, fn: Callable[..., Any], *args: Any) -> None:
        with self._lock:
            heapq.heappush(self._heap, (priority, self._seq, fn, args))
            self._seq += 1
        self._futures.append(self._pool.submit(self._run_best))

    def _run_best(self) -> None:
        with self._lock:
            _, _, fn, args = heapq.heappop(self._heap)
        fn(*args)

    def wait(self) -> None:
        try:
            for future in self._futures:
                future.result()
        finally:
            self._pool.shutdown()


def build_order(row: matrix.Row, dirs: Sequence[Path] = ()) -> tuple[int, tuple[int, ...]]:
    """Rows with a wheel already there first (reuse is instant), then rows built before
    (warm ccache, a work folder), then oldest torch first."""
    if newest_wheel(row.variant, dirs) is not None:
        rank = 0
    elif (toolchain.cache_dir() / "work" / row.variant).is_dir():
        rank = 1
    else:
        rank = 2
    return (rank, tuple(int(p) for p in row.torch.split(".")))


def run_matrix(args: argparse.Namespace) -> dict[str, Any]:
    from scripts.wheeltest import run_op_tests_in_venv

    started = time.monotonic()
    deadline = Deadline(parse_deadline(args.deadline))
    rows = matrix.load_rows()
    selected = matrix.select_rows(rows, args.torch, all_rows=not args.torch)
    store = toolchain.cache_dir() / "matrix" / "wheels"
    store.mkdir(parents=True, exist_ok=True)
    extra_dirs = [Path(d).resolve() for d in (args.wheels or [REPO / "wheelhouse"])]
    results = ResultCache(toolchain.cache_dir() / "matrix" / "results")
    work = toolchain.cache_dir() / "matrix" / "cells"
    tdigest = suite_digest()
    interps = find_interpreters(
        sorted(
            {p for r in selected for p in r.pythons} | {NEGATIVE_PYTHON},
            key=lambda v: tuple(map(int, v.split("."))),
        )
    )
    for v, i in interps.items():
        log(f"Python {v}: " + (f"{i.path} (from {i.source})" if i else "not found"))

    states = {r.torch: RowState(r) for r in selected}
    lock = threading.Lock()
    queue = JobQueue(max(1, args.jobs))

    def test_cell(state: RowState, interp: Interpreter) -> None:
        row = state.row
        key = result_key(state.wheel_sha256, row.torch, str(interp.path), interp.version, tdigest)
        cached = None if args.force else results.get(key)
        if cached and cached.get("status") == PASS:
            with lock:
                state.cells[interp.version] = {**cached, "reused": True}
            log(f"{row.variant} Python {interp.version}: pass (recorded {cached.get('date')})")
            return
        if deadline.passed():
            with lock:
                state.cells[interp.version] = {
                    "status": NOT_RUN,
                    "reason": "time (deadline reached)",
                }
            return
        log(f"{row.variant} Python {interp.version}: testing")
        res = run_op_tests_in_venv(f"torch=={row.torch}", state.wheel, interp, work / row.variant)
        cell = {
            "status": PASS if res.status == "passed" else FAIL,
            "summary": res.summary,
            "seconds": round(res.seconds, 1),
            "interpreter": f"{interp.path} ({interp.source})",
            "date": utc_now(),
            "commit": build.git_commit(),
            "log": res.log,
        }
        log(
            f"{row.variant} Python {interp.version}: {cell['status']} "
            f"in {cell['seconds']:.0f}s - {res.summary}"
        )
        if cell["status"] == PASS:
            results.put(key, cell)
        with lock:
            state.cells[interp.version] = cell

    negatives: list[dict[str, Any]] = []
    known = {r.torch for r in rows}

    def submit_negatives(src: RowState) -> None:
        """The wrong-torch cells of ``src``'s wheel, queued as soon as the wheel exists."""
        if args.no_negatives:
            return
        for pair in DEFAULT_NEGATIVES:
            if pair.wheel_torch != src.row.torch or pair.venv_torch not in known:
                continue
            if src.wheel is None:
                negatives.append(
                    {
                        "wheel_torch": pair.wheel_torch,
                        "venv_torch": pair.venv_torch,
                        "status": NOT_RUN,
                        "detail": f"no wheel: {src.reason}",
                        "simulated": pair.simulated_cuda is not None,
                    }
                )
                continue
            queue.submit(
                (0,),  # quick, and what the table must not lack: before any test cell
                negative_cell,
                pair,
                src,
                interps.get(NEGATIVE_PYTHON),
                work,
                results,
                args.force,
                deadline,
                negatives,
                lock,
            )

    # Rows whose wheel exists or builds warm go first; their cells test while later rows build.
    dirs = [store, *extra_dirs]
    for state in sorted(states.values(), key=lambda s: build_order(s.row, dirs)):
        row = state.row
        plans = plan_row(row, args.python)
        for plan in plans:
            if plan.action != "test":
                state.cells[plan.python] = {"status": plan.action, "reason": plan.reason}
        obtain_wheel(
            state,
            store,
            extra_dirs,
            args.force_build,
            may_build=not deadline.passed(),
            reuse_any=args.reuse_any,
        )
        if state.wheel is None:
            status = state.status if state.status in (NOT_BUILT, NOT_RUN) else FAIL
            for plan in plans:
                if plan.action == "test":
                    state.cells[plan.python] = {"status": status, "reason": state.reason}
            submit_negatives(state)
            continue
        state.wheel_sha256 = file_sha256(state.wheel)
        state.build_info = read_build_info(state.wheel)
        for plan in plans:
            if plan.action != "test":
                continue
            interp = interps.get(plan.python)
            if interp is None:
                state.cells[plan.python] = {
                    "status": FAIL,
                    "reason": f"no Python {plan.python} interpreter found",
                }
                continue
            queue.submit(cell_priority(plan.python, row), test_cell, state, interp)
        submit_negatives(state)

    queue.wait()
    return {
        "generated": utc_now(),
        "commit": build.git_commit(),
        "sources_sha256": source_digest(),
        "tests_sha256": tdigest,
        "host": f"{platform.node()} {platform.machine()}, {os.cpu_count()} cores",
        "seconds": round(time.monotonic() - started, 1),
        "args": list(args.argv),
        "rows": {t: s.as_dict() for t, s in states.items()},
        "negatives": sorted(
            negatives, key=lambda n: (n["wheel_torch"], n["venv_torch"], n.get("check", ""))
        ),
    }


def negative_cell(
    pair: NegativePair,
    src: RowState,
    interp: Interpreter | None,
    work: Path,
    results: ResultCache,
    force: bool,
    deadline: Deadline,
    out: list[dict[str, Any]],
    lock: threading.Lock,
) -> None:
    base = {
        "wheel": src.wheel.name if src.wheel else None,
        "wheel_torch": pair.wheel_torch,
        "venv_torch": pair.venv_torch,
        "simulated": pair.simulated_cuda is not None,
    }
    if interp is None:
        with lock:
            out.append({**base, "status": FAIL, "detail": f"no Python {NEGATIVE_PYTHON}"})
        return
    key = result_key(src.wheel_sha256, f"neg:{pair}", str(interp.path), interp.version, "")
    cached = None if force else results.get(key)
    if cached and all(c.get("status") == PASS for c in cached["checks"]):
        with lock:
            out.extend({**c, "reused": True} for c in cached["checks"])
        return
    if deadline.passed():
        with lock:
            out.append({**base, "status": NOT_RUN, "detail": "time (deadline reached)"})
        return
    name = f"neg-{src.row.variant}-torch{pair.venv_torch}" + (
        f"-cuda{pair.simulated_cuda}" if pair.simulated_cuda else ""
    )
    log(f"negative {name}: running")
    try:
        checks = run_negative(pair, src.wheel, src.build_info, interp, work / name)
    except subprocess.CalledProcessError as exc:
        checks = [{**base, "status": FAIL, "detail": f"venv set-up failed: {exc}"}]
    for c in checks:
        c["date"] = utc_now()
        log(f"negative {name}: {c.get('check')}: {c['status']} - {c['detail']}")
    if all(c["status"] == PASS for c in checks):
        results.put(key, {"checks": checks})
    with lock:
        out.extend(checks)


def utc_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


# --------------------------------------------------------------------------- merging, rendering


def merge_previous(
    report: dict[str, Any], previous: Mapping[str, Any] | None, rows: Sequence[matrix.Row]
) -> dict[str, Any]:
    """Complete a restricted run (``--torch``) with the previous table's rows.

    Every row of the matrix gets an entry: this run's, else the previous one (only if it
    still describes the row: same CUDA and Pythons), else cells "not run". Rows that left the
    matrix disappear. Negatives of rows this run did not touch are kept.
    """
    prev_rows = {r["torch"]: r for r in (previous or {}).get("rows", [])}
    out_rows = []
    for row in rows:
        if row.torch in report["rows"]:
            entry = report["rows"][row.torch]
        else:
            old = prev_rows.get(row.torch)
            if old and old.get("cuda") == row.cuda and old.get("pythons") == list(row.pythons):
                entry = old
            else:
                entry = RowState(row).as_dict()
                entry["reason"] = "no result yet"
                for plan in plan_row(row, None):
                    entry["cells"][plan.python] = (
                        {"status": plan.action, "reason": plan.reason}
                        if plan.action != "test"
                        else {"status": NOT_RUN, "reason": "no result yet"}
                    )
        out_rows.append(entry)
    ran = set(report["rows"])
    known = {r.torch for r in rows}
    negatives = list(report.get("negatives", []))
    for neg in (previous or {}).get("negatives", []):
        if (
            neg.get("wheel_torch", "").split("+")[0] not in ran
            and neg.get("wheel_torch", "").split("+")[0] in known
        ):
            negatives.append(neg)
    return {**report, "rows": out_rows, "negatives": negatives}


def short_seconds(value: float | None) -> str:
    if value is None:
        return ""
    minutes, secs = divmod(round(value), 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def cell_text(cell: Mapping[str, Any]) -> str:
    status = cell.get("status", NOT_RUN)
    if status == PASS:
        return PASS
    if status == FAIL:
        return "**fail**: " + (cell.get("summary") or cell.get("reason") or "")
    if status == NOT_BUILT:
        return NOT_BUILT
    if status == NOT_RUN:
        return f"not run ({cell['reason']})" if cell.get("reason") else NOT_RUN
    return status


def md_escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def columns_of(report: Mapping[str, Any]) -> list[str]:
    cols = list(ALL_PYTHONS)
    for row in report["rows"]:
        cols += [p for p in row["cells"] if p not in cols]
    return cols


def render_markdown(report: Mapping[str, Any]) -> str:
    cols = columns_of(report)
    lines = [
        "# Compatibility",
        "",
        "<!-- Generated by `nox -s matrix` (scripts/compat.py) from scripts/matrix.toml. "
        "Do not edit: rerun it. -->",
        "",
        "Which hotloop wheel works with which torch, CUDA and Python, **as tested**: every "
        "cell is a fresh venv with that Python, the row's torch from PyPI and the row's wheel, "
        "running the installed-wheel op suite (`tests/ops`, CPU).",
        "",
        f"Run: {report['generated']}, commit `{report['commit']}`, on {report['host']}, "
        f"{short_seconds(report.get('seconds'))}.",
        "",
        "| torch | CUDA | wheel | " + " | ".join(f"Python {c}" for c in cols) + " |",
        "|---|---|---|" + "---|" * len(cols),
    ]
    for row in report["rows"]:
        wheel = (
            f"`{row['wheel']}`"
            if row.get("wheel")
            else f"{row['variant']}: "
            + (
                f"{NOT_BUILT}: {row['reason']}"
                if row.get("wheel_status") == NOT_BUILT
                else (row.get("reason") or "no wheel")
            )
        )
        cells = [md_escape(cell_text(row["cells"].get(c, {"status": UNSUPPORTED}))) for c in cols]
        lines.append(
            f"| {row['torch']} | {row['cuda']} | {md_escape(wheel)} | " + " | ".join(cells) + " |"
        )
    lines += [
        "",
        "`pass`: the op suite passed. `unsupported`: torch publishes no wheel for that Python. "
        f"`{NOT_BUILT}`: the row's CUDA toolkit is not available on the machine that made "
        "this table (the GitHub workflow builds these rows in PyTorch's builder images). "
        "`not run`: skipped in this run (reason given).",
        "",
        "## Wheels",
        "",
        "| wheel | torch pin | compiled GPU architectures | built from commit | wheel |",
        "|---|---|---|---|---|",
    ]
    for row in report["rows"]:
        archs = " ".join(row.get("archs") or []) or (
            "(planned) " + " ".join(row.get("archs_planned") or [])
        )
        lines.append(
            f"| {row['variant']} | `torch=={'.'.join(row['torch'].split('.')[:2])}.*` | {archs} | "
            f"{row.get('build_commit') or '-'} | {md_escape(row.get('wheel_status', ''))}"
            + (
                f" ({md_escape(row['reason'])})"
                if row.get("wheel_status") not in ("reused",) and row.get("reason")
                else ""
            )
            + " |"
        )
    lines += [
        "",
        "## Wrong torch: the wheel must refuse it",
        "",
        "A wheel in a venv whose torch is another row's: pip must refuse it (the `torch==A.*` "
        "pin; real pip, `--no-index`, the other torch already installed) and, forced in with "
        "`--no-deps`, `import hotloop` must raise the guard's ImportError naming both versions. "
        "`pass` means it failed the intended way.",
        "",
        "| wheel | torch in the venv | Python | check | result | message |",
        "|---|---|---|---|---|---|",
    ]
    for neg in report.get("negatives", []):
        lines.append(
            f"| {neg.get('wheel') or neg.get('wheel_torch')} | {neg.get('venv_torch')} "
            f"| {neg.get('python', '-')} | {md_escape(neg.get('check', '-'))} | {neg['status']} "
            f"| {md_escape(str(neg.get('detail', '')))[:300]} |"
        )
    if any(n.get("simulated") for n in report.get("negatives", [])):
        lines += [
            "",
            "*Simulated*: PyPI has no CUDA 12 build of torch 2.11 or newer, so the CUDA-major "
            "check runs the real import guard in a process whose `torch.version.cuda` (and "
            "`torch.__version__`) claim a CUDA 12.8 build before `import hotloop`.",
        ]
    return "\n".join(lines) + "\n"


def write_outputs(report: Mapping[str, Any], docs: Path = DOCS) -> None:
    docs.mkdir(parents=True, exist_ok=True)
    (docs / JSON_NAME).write_text(json.dumps(report, indent=2, sort_keys=False) + "\n")
    (docs / MD_NAME).write_text(render_markdown(report))


def load_previous(docs: Path = DOCS) -> dict[str, Any] | None:
    return read_json_or_none(docs / JSON_NAME)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="nox -s matrix --",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--torch",
        action="append",
        help="only these rows (repeatable); others keep their last result",
    )
    parser.add_argument("--python", action="append", help="only these Pythons (repeatable)")
    parser.add_argument("--jobs", type=int, default=2, help="test cells at a time (default 2)")
    parser.add_argument(
        "--wheels", action="append", help="more folders with wheels to reuse (default: wheelhouse/)"
    )
    parser.add_argument(
        "--deadline", help="start no cell after HH:MM UTC (or +SECONDS); the rest: not run (time)"
    )
    parser.add_argument("--force", action="store_true", help="rerun cells whose result is recorded")
    parser.add_argument(
        "--force-build", action="store_true", help="rebuild wheels even if reusable"
    )
    parser.add_argument(
        "--reuse-any",
        action="store_true",
        help="test the newest wheel of each variant even if the sources changed since",
    )
    parser.add_argument("--no-negatives", action="store_true", help="skip the wrong-torch cells")
    parser.add_argument(
        "--docs", type=Path, default=DOCS, help="where the table goes (default docs/)"
    )
    parser.add_argument(
        "--render-only", action="store_true", help="rewrite the .md from the committed .json"
    )
    args = parser.parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else list(argv)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.render_only:
        previous = load_previous(args.docs)
        if previous is None:
            raise SystemExit(f"no {args.docs / JSON_NAME} to render")
        (args.docs / MD_NAME).write_text(render_markdown(previous))
        return 0
    os.environ.setdefault("UV_PYTHON_DOWNLOADS", "never")
    report = run_matrix(args)
    final = merge_previous(report, load_previous(args.docs), matrix.load_rows())
    write_outputs(final, args.docs)
    print(render_markdown(final))
    bad = [
        f"torch {r['torch']} Python {p}"
        for r in final["rows"]
        if r["torch"] in report["rows"]
        for p, c in r["cells"].items()
        if c["status"] == FAIL
    ] + [
        f"negative {n.get('wheel_torch')} in {n.get('venv_torch')}"
        for n in report["negatives"]
        if n["status"] == FAIL
    ]
    log(f"wrote {args.docs / MD_NAME} and {JSON_NAME} in {report['seconds']:.0f}s")
    if bad:
        log("FAILED: " + ", ".join(bad))
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
