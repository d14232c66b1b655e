"""Get each wheel once: one built from the current sources if there is one, else a build.

* A wheel this run builds gets ``<wheel>.sources.json`` beside it with the
  :func:`~scripts.matrix.digests.source_digest` of what went into it; it is reused only while
  that digest matches the tree.
* A wheel without that record (from ``nox -s wheels`` or CI) is adopted only if its
  ``_build_info.git_commit`` is a clean commit whose sources equal the tree's (``git diff``
  empty, nothing untracked).
* Builds go through :func:`scripts.wheels.run_cell` (build, repair, audit; no tests).
"""

from __future__ import annotations

import json
import re
import subprocess
import time
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scripts import names, toolchain, wheel_sources
from scripts.basics import REPO
from scripts.matrix.digests import source_digest
from scripts.matrix.results import NOT_BUILT, NOT_RUN, log
from scripts.matrix.table import Row, variant_wheels
from scripts.wheelfile import build_info_of, own_build_info_member
from scripts.wheelfile import sha256_of_file as file_sha256

BUILT = "built"
REUSED = "reused"
REUSED_AS_IS = "reused as is"
BUILD_FAILED = "build failed"


@dataclass
class WheelState:
    """One wheel of the run: where it came from, and the matrix rows it serves."""

    row: Row  # the row the wheel is compiled against
    serves: tuple[str, ...] = ()  # every torch of the matrix this wheel serves
    status: str = NOT_RUN  # BUILT, REUSED, REUSED_AS_IS, NOT_BUILT, BUILD_FAILED, NOT_RUN
    wheel: Path | None = None
    wheel_sha256: str = ""
    build_info: dict[str, Any] = field(default_factory=dict)
    reason: str = ""
    build_seconds: float | None = None
    sources_sha256: str | None = None  # what the wheel was built from, when known

    def as_dict(self) -> dict[str, Any]:
        row, info = self.row, self.build_info
        return {
            "variant": row.variant,
            "kind": row.kind,
            "requires_torch": row.requires_torch,
            "build_torch": row.torch,
            "cuda": row.cuda,
            "serves": list(self.serves),
            "wheel": self.wheel.name if self.wheel else None,
            "wheel_sha256": self.wheel_sha256 or None,
            "wheel_status": self.status,
            "reason": self.reason,
            "archs": list(info.get("archs", [])),
            "archs_planned": row.archs,
            "build_commit": info.get("git_commit"),
            "build_seconds": self.build_seconds,
            "sources_sha256": self.sources_sha256,
        }


def sidecar(wheel: Path) -> Path:
    return wheel.with_name(wheel.name + ".sources.json")


def write_sidecar(wheel: Path, digest: str) -> Path:
    path = sidecar(wheel)
    path.write_text(
        json.dumps({"sources_sha256": digest, "wheel_sha256": file_sha256(wheel)}) + "\n"
    )
    return path


def read_build_info(wheel: Path) -> dict[str, Any]:
    """``BUILD_INFO`` of the build-info module (the table's ``audit.build-info``) from inside a
    wheel (without importing it)."""
    member = own_build_info_member()
    with zipfile.ZipFile(wheel) as zf:
        info = build_info_of(zf.read(member).decode())
    if info is None:
        raise ValueError(f"{wheel.name}: no BUILD_INFO in {member}")
    return info


def commit_matches_tree(commit: str, repo: Path = REPO) -> bool:
    """True if ``commit`` is clean and its wheel sources equal the working tree's."""
    if not re.fullmatch(r"[0-9a-f]{7,40}", commit or ""):
        return False  # "unknown" or "<sha>-dirty": built from uncommitted sources
    paths = wheel_sources.code_items()
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
    """A wheel of ``variant`` in ``dirs`` built from sources with ``digest``, or why none is
    (by file name: the reason goes into the committed table, which names no machine paths)."""
    reasons = []
    for folder in dirs:
        for wheel in variant_wheels(folder, variant):
            record = sidecar(wheel)
            if record.is_file():
                try:
                    data = json.loads(record.read_text())
                except ValueError:
                    reasons.append(f"{wheel.name}: unreadable {record.name}")
                    continue
                if data.get("sources_sha256") != digest:
                    reasons.append(f"{wheel.name}: built from other sources")
                    continue
                if data.get("wheel_sha256") and data["wheel_sha256"] != file_sha256(wheel):
                    reasons.append(f"{wheel.name}: changed since it was recorded")
                    continue
                return WheelChoice(wheel, f"reused {wheel.name} (sources unchanged)")
            try:
                commit = str(read_build_info(wheel).get("git_commit", ""))
            except (KeyError, ValueError, zipfile.BadZipFile, SyntaxError) as exc:
                reasons.append(f"{wheel.name}: no build info ({exc})")
                continue
            if commit_ok(commit):
                return WheelChoice(
                    wheel, f"reused {wheel.name} (built at clean commit {commit[:12]})"
                )
            reasons.append(
                f"{wheel.name}: built at {commit[:12] or 'unknown commit'}, sources changed since"
            )
    return WheelChoice(None, "; ".join(reasons) or "no wheel of this variant yet")


def newest_wheel(variant: str, dirs: Sequence[Path]) -> Path | None:
    wheels = [w for d in dirs for w in variant_wheels(d, variant)]
    return max(wheels, key=lambda w: w.stat().st_mtime) if wheels else None


def not_built_reason(exc: BaseException) -> str:
    msg = str(exc)
    m = re.search(rf"point ({names.env_var('CUDA_HOME_')}\w+) at", msg)
    if "ship no bin/nvcc" in msg and m:
        return (
            f"PyPI's CUDA toolkit packages ship no nvcc; set {m.group(1)} to a toolkit "
            "(CI builds it)"
        )
    return msg.splitlines()[0] if msg else type(exc).__name__


def obtain_wheel(
    state: WheelState,
    store: Path,
    extra_dirs: Sequence[Path],
    force: bool,
    may_build: bool = True,
    reuse_any: bool = False,
) -> None:
    """Fill ``state.wheel``: reuse one built from the current sources, else build one.

    ``may_build=False`` (past the deadline): reuse only; the wheel stays "not run".
    ``reuse_any``: take the newest wheel of the variant whatever sources it was built from
    (the table then names the commit it was built at); build only if there is none.
    """
    row = state.row
    digest = source_digest()
    if not force:
        choice = find_reusable_wheel(row.variant, [store, *extra_dirs], digest)
        if choice.wheel is not None:
            state.wheel, state.status, state.reason = choice.wheel, REUSED, choice.why
            if sidecar(choice.wheel).is_file():
                state.sources_sha256 = digest
            log(f"{row.variant}: {choice.why}")
            return
        log(f"{row.variant}: no wheel built from the current sources ({choice.why})")
        anyway = newest_wheel(row.variant, [store, *extra_dirs]) if reuse_any else None
        if anyway is not None:
            state.wheel, state.status = anyway, REUSED_AS_IS
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
        state.status, state.reason = NOT_RUN, "deadline reached before the build"
        return
    from scripts.wheels import run_cell  # its imports (audit) need the pipeline tools

    start = time.monotonic()
    cell = run_cell(row, store, None, skip_tests=True)
    state.build_seconds = round(time.monotonic() - start, 1)
    if cell.status != "passed" or not cell.wheel:
        state.status = BUILD_FAILED
        state.reason = (
            f"failed at {cell.stage}: {cell.error.strip().splitlines()[0] if cell.error else ''}"
        )
        return
    wheel = store / cell.wheel
    state.wheel, state.status, state.reason = wheel, BUILT, f"built in {state.build_seconds:.0f}s"
    # scripts.build copies the tree to <work>/<variant>/src before building: that copy is
    # exactly what went into the wheel, whatever happened to the tree meanwhile.
    copy = toolchain.cache_dir() / "work" / row.variant / "src"
    built_from = source_digest(copy) if copy.is_dir() else None
    if built_from:
        write_sidecar(wheel, built_from)
        state.sources_sha256 = built_from
        if built_from != source_digest():
            state.reason += " (the tree changed meanwhile)"
