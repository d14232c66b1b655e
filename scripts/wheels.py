"""``nox -s wheels``: build, repair, audit and test the wheels serving the selected rows.

    python -m scripts.wheels [--torch 2.11 | --all] [--python 3.12] [--skip-tests] [--out DIR]

A row's wheel is built against the row's ``build_torch``: rows from the stable-ABI floor on
share one wheel per CUDA major, built once; older rows each get their own pinned wheel. The
wheel is then tested with the torch of every selected row it serves (``--torch 2.15`` builds
the CUDA 13 stable wheel against torch 2.11 and tests it with torch 2.15).

Wheels that passed everything land in ``--out`` (default ``wheelhouse/``), next to
``<variant>.json`` per cell and ``report.json`` / ``report.md`` for the run. A failed cell
leaves no wheel there. A new wheel replaces only a file of its own name: other releases in
``--out`` stay, and report files there that no run of this tool wrote stop the run. Work
folders (venvs, build logs, unrepaired wheels) live under the pipeline's cache
(``scripts.toolchain.cache_dir``), in ``work/<variant>/``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from scripts import audit, basics, build, matrix, project, project_wheels, reproducible, toolchain
from scripts.interpreters import find_interpreters
from scripts.report import CellReport, render_table, write_cell_json, write_run_report
from scripts.wheelfile import sha256_of_file
from scripts.wheeltest import failures, run_op_tests

DEFAULT_OUT = basics.REPO / "wheelhouse"


log = basics.logger("wheels")


def publish_wheel(wheel: Path, out_dir: Path) -> Path:
    """Put a wheel that passed into ``out_dir``, replacing only a file of the same name.

    ``out_dir`` may hold other releases (older versions of the same variant): they stay.
    Nothing in ``out_dir`` changes before this point: an interrupted or failed run leaves the
    last good wheel where it was. The copy lands under a temporary name and is renamed, so
    ``out_dir`` never holds half a wheel.
    """
    dest = out_dir / wheel.name
    partial = out_dir / f".{wheel.name}.partial"
    shutil.copy2(wheel, partial)
    partial.replace(dest)
    return dest


def _json_object(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def foreign_reports(out_dir: Path, variants: Sequence[str]) -> list[str]:
    """The report files this run would write over that a ``nox -s wheels`` run did not write
    (``--out`` may be any folder: a ``report.md`` of someone else's is never overwritten)."""
    written_by_us: dict[str, Callable[[Path], bool]] = {
        "report.json": lambda p: isinstance(_json_object(p).get("cells"), list),
        "report.md": lambda p: p.read_text(errors="replace").startswith("| cell "),
        **{
            f"{v}.json": (lambda p, v=v: _json_object(p).get("variant") == v)  # type: ignore[misc]
            for v in variants
        },
    }
    return [
        name
        for name, ours in written_by_us.items()
        if (out_dir / name).exists() and not ((out_dir / name).is_file() and ours(out_dir / name))
    ]


def kept_note(out_dir: Path, variant: str) -> str:
    kept = matrix.variant_wheels(out_dir, variant)
    if not kept:
        return ""
    return f" (kept the earlier wheel that passed: {', '.join(w.name for w in kept)})"


def wanted_pythons(row: matrix.Row, pythons: Sequence[str] | None) -> list[str]:
    wanted = [p for p in row.pythons if not pythons or p in pythons]
    if not wanted:
        raise RuntimeError(
            f"torch {row.torch} supports Python {', '.join(row.pythons)}; "
            f"none of --python {' '.join(pythons or [])}"
        )
    return wanted


def run_cell(
    row: matrix.Row,
    out_dir: Path,
    pythons: Sequence[str] | None,
    skip_tests: bool,
    test_rows: Sequence[matrix.Row] = (),
) -> CellReport:
    """Build ``row``'s wheel (``row`` is a build row), then test it with each of ``test_rows``
    (default: ``row`` itself)."""
    test_rows = list(test_rows) or [row]
    cell = CellReport(row.variant, row.torch, row.cuda)
    start = time.monotonic()
    workdir = toolchain.cache_dir() / "work" / row.variant
    with basics.exclusive_folder(workdir):
        try:
            cell.stage = "toolchain"
            wanted = {} if skip_tests else {r.torch: wanted_pythons(r, pythons) for r in test_rows}
            found = find_interpreters(
                sorted({p for r in test_rows for p in r.pythons} | set(row.pythons))
            )
            interp = build.pick_build_python(row, found)
            cell.build_python = f"{interp.version} ({interp.path})"

            tools = toolchain.assemble(
                row.cuda, row.toolkit, source_name=project.own_project().import_name
            )

            cell.stage = "build"
            result = build.build_wheel(row, workdir, tools, interp)
            cell.build_seconds = result.seconds
            cell.compile_seconds = result.compile_seconds
            for obj, secs in sorted(result.compile_seconds.items()):
                log(f"{row.variant}: compiled {obj} in {secs:.1f}s")
            log(f"{row.variant}: built {result.wheel.name} in {result.seconds:.0f}s")

            cell.stage = "repair/audit"
            site = build.site_packages(workdir / "venv" / "bin" / "python")
            epoch = int(build.source_date_epoch())

            def finalize(repaired: Path) -> Path:
                final_dir = workdir / "final"
                shutil.rmtree(final_dir, ignore_errors=True)
                final_dir.mkdir(parents=True)
                return reproducible.finalize_release(
                    row, repaired, final_dir, tools.cuda_home, tools.sysroot, epoch
                )

            repaired_dir = workdir / "repaired"  # this cell's own work folder: last run's wheel
            shutil.rmtree(repaired_dir, ignore_errors=True)
            repaired, report = audit.repair_and_audit(
                result.wheel, repaired_dir, row, site, finalize
            )
            cell.wheel = repaired.name
            cell.sha256 = sha256_of_file(repaired)
            cell.size_bytes = repaired.stat().st_size
            parts = audit.wheel_name_parts(repaired.name)
            cell.tag = f"{parts['python']}-{parts['abi']}-{parts['platform']}"
            cell.max_versions = report.max_versions
            cell.archs = report.archs
            cell.auditwheel_output = report.auditwheel_output
            cell.audit = "ok (" + ", ".join(sorted(report.max_versions.values())) + ")"
            log(
                f"{row.variant}: audit ok: {repaired.name} ({cell.size_bytes} bytes), "
                f"needs {cell.max_versions}, GPU code for {' '.join(cell.archs) or 'no arch'}"
            )

            cell.stage = "test"
            failed: list[str] = []
            for torch_version, versions in wanted.items():
                chosen = {v: found[v] for v in versions}
                for v, i in chosen.items():
                    log(
                        f"{row.variant}: torch {torch_version}, Python {v}: "
                        + (f"{i.path}, {i.origin}" if i else "not found")
                    )
                tests = run_op_tests(
                    torch_version, repaired, chosen, workdir / "tests" / torch_version
                )
                cell.tests += [{**t.as_dict(), "torch": torch_version} for t in tests]
                failed += failures(torch_version, tests)
            if failed:
                raise RuntimeError(f"{repaired.name}: tests: " + "; ".join(failed))
            cell.stage = "done"
            publish_wheel(repaired, out_dir)
            cell.status = "passed"
        except (build.BuildError, audit.AuditError, RuntimeError, OSError, SystemExit) as exc:
            cell.error = str(exc) + kept_note(out_dir, row.variant)
            log(f"{row.variant}: FAILED at {cell.stage}: {exc}")
        except Exception as exc:
            cell.error = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"
            log(f"{row.variant}: FAILED at {cell.stage}: {cell.error}")
    cell.total_seconds = time.monotonic() - start
    write_cell_json(out_dir, cell)
    return cell


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="nox -s wheels --",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--torch", action="append", help="torch version or minor of a row (repeatable)"
    )
    parser.add_argument(
        "--all", action="store_true", help="every row of scripts/matrix/matrix.toml"
    )
    parser.add_argument("--python", action="append", help="test only these Pythons (repeatable)")
    parser.add_argument("--skip-tests", action="store_true", help="build, repair and audit only")
    parser.add_argument(
        "--pinned",
        action="store_true",
        help="build pinned (ATen) wheels for the selected rows, even where the stable wheel "
        "serves them: to compare the two kinds (not released)",
    )
    parser.add_argument(
        "--out", type=Path, help="output folder (default: wheelhouse/, or the project's)"
    )
    parser.add_argument(
        "--project",
        type=Path,
        help="another project's checkout (its pyproject.toml's [tool.torch-wheels]) or a table "
        "file: build, audit and test its wheels (docs/any-project.md)",
    )
    parser.add_argument(
        "--cpu", action="store_true", help="with --project: CPU builds (labels stable.cpu, ptXYcpu)"
    )
    args = parser.parse_args(argv)
    os.environ.setdefault("UV_PYTHON_DOWNLOADS", "never")
    if args.project is not None:
        return project_main(args, argv)
    if args.cpu:
        parser.error(
            "--cpu builds another project's wheels (with --project); this repository's CPU "
            "build is `nox -s tests`"
        )
    args.out = args.out or DEFAULT_OUT

    every = matrix.load_rows()
    rows = matrix.select_rows(every, args.torch, args.all)
    if args.pinned:
        rows = [row.pinned() for row in rows]
        every = rows
    builds = matrix.build_rows(rows, every)
    out_dir = args.out.resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    foreign = foreign_reports(out_dir, [b.variant for b in builds])
    if foreign:
        print(
            f"wheels: {out_dir} holds {', '.join(foreign)}, which this run would write and which "
            "no `nox -s wheels` run wrote; it is left as it is: give another --out",
            file=sys.stderr,
        )
        return 2
    started = time.monotonic()
    for builder in builds:
        served = ", ".join(r.torch for r in rows if r.variant == builder.variant)
        log(f"{builder.variant}: built against torch {builder.torch}, tested with torch {served}")
    log(f"output: {out_dir}")
    cells = [
        run_cell(
            builder,
            out_dir,
            args.python,
            args.skip_tests,
            [r for r in rows if r.variant == builder.variant],
        )
        for builder in builds
    ]
    return finish(out_dir, cells, started, argv, build.git_commit())


def project_main(args: argparse.Namespace, argv: Sequence[str] | None) -> int:
    """``--project``: another project's wheels (scripts/project_wheels.py)."""
    try:
        table = project.other_project(
            args.project,
            "its release (SBOM, build info, reproducible zip) is `nox -s wheels` without --project",
        )
    except project.ProjectTableError as exc:
        print(f"wheels: {exc}", file=sys.stderr)
        return 2
    rows = matrix.select_rows(matrix.load_rows(), args.torch, args.all)
    if args.pinned:
        rows = [row.pinned() for row in rows]
    out_dir = project_wheels.claim_output((args.out or table.output_dir("wheelhouse")).resolve())
    log(f"{table.distribution} from {table.root}; output: {out_dir}")
    started = time.monotonic()
    cells = project_wheels.run_project(table, rows, out_dir, args.python, args.skip_tests, args.cpu)
    for cell in cells:
        write_cell_json(out_dir, cell)
    return finish(out_dir, cells, started, argv, build.checkout_commit(table.root))


def finish(
    out_dir: Path,
    cells: Sequence[CellReport],
    started: float,
    argv: Sequence[str] | None,
    commit: str,
) -> int:
    """Write the run's report (``commit``: that of the sources built), print its table and
    each failure; the exit status."""
    meta = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "commit": commit,
        "host": f"{platform.node()} {platform.machine()} {os.cpu_count()} cores",
        "seconds": round(time.monotonic() - started, 1),
        "args": sys.argv[1:] if argv is None else list(argv),
    }
    write_run_report(out_dir, cells, meta)
    print("\n" + render_table(cells))
    for cell in cells:
        if cell.status != "passed":
            print(f"\n{cell.variant} failed at {cell.stage}:\n{cell.error}")
    print(f"\nreport: {out_dir / 'report.json'} (run took {meta['seconds']:.0f}s)")
    return 0 if all(c.status == "passed" for c in cells) else 1


if __name__ == "__main__":
    raise SystemExit(main())
