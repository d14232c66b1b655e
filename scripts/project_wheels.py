"""``nox -s wheels -- --project PATH``: another project's wheels, built, audited and tested.

The same steps as this repository's own release (scripts/wheels.py), driven by the
project's table (scripts/project.py) instead of this repository's own files:

1. the rows: the table's ``kinds`` pick which wheel serves each selected torch row (a
   stable wheel per CUDA major from ``stable-floor`` on, a pinned wheel per torch minor);
2. the build (scripts/project_build.py), once per wheel, or once per Python of the row
   when ``python-abi = "per-python"``;
3. the variant label and torch pin written into the wheel (scripts/relabel.py);
4. auditwheel repair with torch's libraries excluded, abi3audit (abi3 wheels), and the
   audit rules with the project's table;
5. the table's ``test-command`` in a fresh venv per Python with the torch of every row the
   wheel serves.

Everything lands in an output folder this run owns (default
``build/projects/<distribution>/wheelhouse``): the wheels that passed, one JSON per cell and
``report.json``/``report.md``. Work folders live under the cache
(``<cache>/projects/<distribution>/<variant>``).
"""

from __future__ import annotations

import dataclasses
import shutil
import time
import traceback
from collections.abc import Sequence
from pathlib import Path

from scripts import audit, basics, matrix, relabel, toolchain, variant
from scripts.build import BuildError, site_packages
from scripts.interpreters import Interpreter, find_interpreters
from scripts.matrix import Row
from scripts.project import Project
from scripts.project_build import build_project_wheel
from scripts.report import CellReport
from scripts.wheelfile import sha256_of_file
from scripts.wheeltest import (
    PythonTestResult,
    failures,
    installed_requirement,
    run_in_fresh_venv,
    run_in_venvs,
)

log = basics.logger("wheels")
OWNER_MARK = ".torch-wheels-output"


def claim_output(out_dir: Path, by: str = "nox -s wheels -- --project") -> Path:
    """``out_dir``, created and marked as this pipeline's; a folder holding other files that
    an earlier run did not mark is refused (the run replaces the wheels it finds there)."""
    mark = out_dir / OWNER_MARK
    if out_dir.is_dir() and any(out_dir.iterdir()) and not mark.is_file():
        raise SystemExit(
            f"--out {out_dir} holds files this pipeline did not write; give an empty or new folder"
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    mark.write_text(f"written by `{by}`; what it writes is replaced per run\n")
    return out_dir


def served_rows(project: Project, rows: Sequence[Row]) -> list[Row]:
    """``rows`` as this project's wheels serve them: pinned-only projects pin every row;
    stable-only ones serve only rows from the floor on (SystemExit naming the others)."""
    floor = variant.torch_minor(project.stable_floor)
    if floor != variant.STABLE_ABI_FLOOR:
        raise SystemExit(
            f"{project.table_file}: stable-floor = {project.stable_floor!r}; the matrix's stable "
            f"wheels target torch {variant.minor_text(variant.STABLE_ABI_FLOOR)}, the only floor "
            "the pipeline builds for now"
        )
    if "stable" not in project.kinds:
        return [row.pinned() for row in rows]
    if "pinned" not in project.kinds:
        older = [r.torch for r in rows if r.kind != variant.STABLE]
        if older:
            raise SystemExit(
                f"{project.distribution} ships stable wheels only (kinds = ['stable']), which "
                f"need torch >= {project.stable_floor}; no wheel serves torch {', '.join(older)}: "
                "pick newer rows with --torch"
            )
    return list(rows)


def cpu_row(row: Row) -> Row:
    """The row as a CPU build: labels ``stable.cpu`` / ``pt211cpu``, no toolkit needed."""
    return dataclasses.replace(row, cuda="")


def test_wheel(
    project: Project,
    wheel: Path,
    torch_version: str,
    interpreters: dict[str, Interpreter | None],
    workdir: Path,
) -> list[PythonTestResult]:
    """The table's test command against ``wheel`` in a fresh venv per interpreter."""
    packages = [
        f"torch=={torch_version}",
        installed_requirement(project, wheel),
        *project.test_requires,
    ]
    return run_in_venvs(
        interpreters,
        workdir,
        lambda i: run_in_fresh_venv(
            packages,
            i,
            workdir,
            lambda py: project.test_arguments(str(py)),
            project.test_env,
            reads=(project.root, wheel.resolve().parent),
        ),
    )


def publish(wheel: Path, out_dir: Path) -> Path:
    """Put a wheel that passed into ``out_dir`` in place of the earlier wheels of its variant
    and Python tag; the copy lands under a temporary name first, never half a wheel."""
    parts = audit.wheel_name_parts(wheel.name)
    label = parts["version"].split("+", 1)[1]
    for old in out_dir.glob(f"{parts['name']}-*+{label}-{parts['python']}-*.whl"):
        if old.name != wheel.name:
            old.unlink()
    partial = out_dir / f".{wheel.name}.partial"
    shutil.copy2(wheel, partial)
    return partial.replace(out_dir / wheel.name)


def run_cell(
    project: Project,
    row: Row,
    served: Sequence[Row],
    interp: Interpreter,
    test_pythons: dict[str, dict[str, Interpreter | None]],
    out_dir: Path,
    cpu: bool,
) -> CellReport:
    """Build ``row``'s wheel on ``interp``, relabel, repair and audit it, test it with the
    torch of each ``served`` row on ``test_pythons[torch]``."""
    per_python = f"{row.variant}-py{interp.version}"
    name = per_python if project.python_abi == "per-python" else row.variant
    cell = CellReport(name, row.torch, row.cuda or "cpu")
    cell.build_python = f"{interp.version} ({interp.path})"
    start = time.monotonic()
    # a folder per Python unless the table promises one abi3 wheel
    folder = row.variant if project.python_abi == "abi3" else per_python
    workdir = toolchain.cache_dir() / "projects" / project.distribution / folder
    with basics.exclusive_folder(workdir):
        try:
            cell.stage = "toolchain"
            tools = toolchain.assemble(
                row.cuda, row.toolkit, source_name=project.import_name, with_cuda=not cpu
            )
            cell.stage = "build"
            result = build_project_wheel(project, row, row.kind, workdir, tools, interp)
            cell.build_seconds = result.seconds
            log(f"{name}: built {result.wheel.name} in {result.seconds:.0f}s")
            unversioned = relabel.unversioned_warning(result.wheel.name)
            if unversioned:
                log(f"{name}: warning: {unversioned}")
            cell.stage = "repair/audit"
            labelled_dir = workdir / "labelled"
            shutil.rmtree(labelled_dir, ignore_errors=True)
            labelled = relabel.label_wheel(
                result.wheel, row.variant, row.requires_torch, labelled_dir
            )
            repaired_dir = workdir / "repaired"  # this cell's own work folder: last run's wheel
            shutil.rmtree(repaired_dir, ignore_errors=True)
            repaired, report = audit.repair_and_audit(
                labelled,
                repaired_dir,
                row,
                site_packages(workdir / "venv" / "bin" / "python"),
                project=project,
                build_folders=[p for p in (tools.cuda_home, tools.sysroot, workdir) if p],
            )
            for entry in report.dropped_search_paths:
                log(f"{name}: dropped {entry}")
            cell.wheel, cell.size_bytes = repaired.name, repaired.stat().st_size
            cell.sha256 = sha256_of_file(repaired)
            parts = audit.wheel_name_parts(repaired.name)
            cell.tag = f"{parts['python']}-{parts['abi']}-{parts['platform']}"
            cell.max_versions, cell.archs = report.max_versions, report.archs
            cell.audit = "ok (" + ", ".join(sorted(report.max_versions.values())) + ")"
            archs = " ".join(cell.archs) or "no arch"
            log(f"{name}: audit ok: {repaired.name}, GPU code for {archs}")
            if project.python_abi == "auto" and parts["abi"] != "abi3":
                # the build made a per-Python wheel: it serves only the Python that built it
                cell.variant = per_python
                test_pythons = {
                    torch: {v: i for v, i in chosen.items() if v == interp.version}
                    for torch, chosen in test_pythons.items()
                }
            cell.stage = "test"
            failed: list[str] = []
            for served_row in served:
                chosen = test_pythons[served_row.torch]
                tests = test_wheel(
                    project,
                    repaired,
                    served_row.torch,
                    chosen,
                    workdir / "tests" / served_row.torch,
                )
                cell.tests += [{**t.as_dict(), "torch": served_row.torch} for t in tests]
                failed += failures(served_row.torch, tests)
            if failed:
                raise RuntimeError(f"{repaired.name}: tests: " + "; ".join(failed))
            publish(repaired, out_dir)
            cell.stage, cell.status = "done", "passed"
        except (BuildError, audit.AuditError, relabel.RelabelError, RuntimeError, OSError) as exc:
            cell.error = str(exc)
            log(f"{name}: FAILED at {cell.stage}: {exc}")
        except Exception as exc:
            cell.error = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"
            log(f"{name}: FAILED at {cell.stage}: {cell.error}")
    cell.total_seconds = time.monotonic() - start
    return cell


def run_project(
    project: Project,
    rows: Sequence[Row],
    out_dir: Path,
    pythons: Sequence[str] | None,
    skip_tests: bool,
    cpu: bool,
) -> list[CellReport]:
    """Every wheel serving ``rows`` (already chosen from the matrix), one cell each."""
    rows = served_rows(project, rows)
    # A stable wheel is built against the oldest row of its CUDA major, selected or not; a
    # pinned one against its own row.
    every = matrix.load_rows() if "stable" in project.kinds else rows
    if cpu:
        rows, every = [cpu_row(r) for r in rows], [cpu_row(r) for r in every]
    cells = []
    for builder in matrix.build_rows(rows, every):
        served = [r for r in rows if r.variant == builder.variant]
        log(
            f"{project.distribution} {builder.variant}: built against torch {builder.torch}, "
            f"tested with torch {', '.join(r.torch for r in served)}"
        )
        wanted = sorted({p for r in served for p in r.pythons if not pythons or p in pythons})
        found = find_interpreters(sorted({*wanted, builder.build_python}))
        if project.python_abi == "per-python":
            builds = [(p, [p]) for p in wanted]
        else:
            builds = [(builder.build_python, wanted)]
        first = True
        while builds:
            version, test_on = builds.pop(0)
            interp = found[version]
            if interp is None:
                raise SystemExit(f"{builder.variant} is built on Python {version}: not found")
            test_pythons = {
                r.torch: {} if skip_tests else {p: found[p] for p in test_on if p in r.pythons}
                for r in served
            }
            cell = run_cell(project, builder, served, interp, test_pythons, out_dir, cpu)
            cells.append(cell)
            if first and project.python_abi == "auto" and cell.variant != builder.variant:
                # the first build made a per-Python wheel: build for the other Pythons too
                builds += [(p, [p]) for p in wanted if p != version]
            first = False
    return cells
