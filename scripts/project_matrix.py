"""``nox -s matrix -- --project PATH``: another project's compatibility table, as tested.

Each cell is one matrix row's torch and one of its Pythons: the project's wheel that serves
that row (from its wheelhouse, ``nox -s wheels -- --project``'s output) is installed with
exactly that torch into a fresh venv, and the table's ``test-command`` runs there, from an
empty folder. The wheel for a row is found by its variant label (``+pt29cu128``,
``+stable.cu13``, ``+stable.cpu`` with ``--cpu``) and, for per-Python wheels, by its
``cpXY`` tag; a row with no such wheel is a ``no wheel`` cell, a Python this machine lacks a
``no python`` cell, and neither fails the run. A Python the host lacks but the Debian root has
(3.14, 3.15: :mod:`scripts.interpreter_root`) runs its cell in that root, as this repository's own
matrix does; where the root cannot be made or entered, the cell is ``not run`` and says why.

The table lands in a folder this command owns (default ``build/projects/<distribution>/matrix``):
``compatibility.json`` (every cell, with the wheel, its sha256 and the test's last line) and
``compatibility.md``; the venvs and logs live under the cache
(``<cache>/projects/<distribution>/matrix``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from scripts import audit, basics, matrix, project, toolchain, variant
from scripts.interpreters import CONTAINER, find_with_reasons
from scripts.matrix import Row
from scripts.project_wheels import claim_output, cpu_row, served_rows, test_wheel
from scripts.wheelfile import sha256_of_file

log = basics.logger("matrix")

PASSED, FAILED, NO_WHEEL, NO_PYTHON = "passed", "failed", "no wheel", "no python"
NOT_RUN = "not run"  # a Python of the Debian root, which could not be made or entered here


@dataclass
class Cell:
    """One (torch, Python) cell of the project's table."""

    torch: str
    python: str
    variant: str
    status: str = NO_WHEEL
    wheel: str = ""
    sha256: str = ""
    summary: str = ""
    seconds: float = 0.0
    log: str = ""
    source: str = ""  # where the interpreter came from: host or container (the Debian root)


def wheel_for(wheels: Sequence[Path], distribution: str, variant: str, python: str) -> Path | None:
    """The wheel of ``variant`` that installs on ``python``: an abi3 wheel, else the
    ``cpXY-cpXY`` one of that Python; None when the wheelhouse has neither."""
    tag = "cp" + python.replace(".", "")
    found = []
    for wheel in wheels:
        parts = audit.wheel_name_parts(wheel.name)
        if parts["name"] != distribution or not parts["version"].endswith(f"+{variant}"):
            continue
        if parts["abi"] == "abi3" or parts["python"] == tag:
            found.append(wheel)
    return sorted(found)[-1] if found else None


def plan_cells(
    table: project.Project, rows: Sequence[Row], wheels: Sequence[Path], pythons: Sequence[str]
) -> list[tuple[Cell, Path | None]]:
    """Every (row, Python) cell of ``rows`` with the wheel that serves it (None: no wheel)."""
    cells = []
    for row in rows:
        for python in row.pythons:
            if pythons and python not in pythons:
                continue
            wheel = wheel_for(wheels, table.distribution, row.variant, python)
            cells.append((Cell(row.torch, python, row.variant), wheel))
    return cells


def run_cells(
    table: project.Project, planned: Sequence[tuple[Cell, Path | None]], workdir: Path
) -> list[Cell]:
    """Test each planned cell that has a wheel, per torch: a fresh venv per Python, on the
    host or in the Debian root."""
    by_torch: dict[str, list[tuple[Cell, Path]]] = {}
    for cell, wheel in planned:
        if wheel is not None:
            cell.wheel, cell.sha256 = wheel.name, sha256_of_file(wheel)
            by_torch.setdefault(f"{cell.torch} {wheel.name}", []).append((cell, wheel))
    # Once for every cell: the Debian root is made (or found unusable) a single time.
    pythons = dict.fromkeys(cell.python for group in by_torch.values() for cell, _ in group)
    found, reasons = find_with_reasons(pythons, container=True) if pythons else ({}, {})
    for group in by_torch.values():
        torch, wheel = group[0][0].torch, group[0][1]
        log(f"torch {torch}, {wheel.name}: Python {', '.join(c.python for c, _ in group)}")
        interpreters = {cell.python: found[cell.python] for cell, _ in group}
        results = test_wheel(table, wheel, torch, interpreters, workdir / torch / wheel.stem)
        for (cell, _), result in zip(group, results):
            cell.seconds, cell.log, cell.source = result.seconds, result.log, result.source
            cell.summary = reasons.get(cell.python, result.summary)
            if result.status == "skipped":  # a Python of the root, which is not usable here
                cell.status = NOT_RUN
            elif result.status == "missing":
                cell.status = NO_PYTHON
            else:
                cell.status = PASSED if result.status == "passed" else FAILED
    return [cell for cell, _ in planned]


def render_markdown(table: project.Project, cells: Sequence[Cell], meta: dict[str, object]) -> str:
    """The table: a row per torch, a column per Python, each cell its status."""
    pythons = sorted({c.python for c in cells}, key=lambda v: tuple(map(int, v.split("."))))
    by_key = {(c.torch, c.python): c for c in cells}
    torches = list(dict.fromkeys(c.torch for c in cells))
    command = " ".join(table.test_arguments())
    lines = [
        f"# {table.distribution}: compatibility, as tested",
        "",
        "Each cell installed the wheel with exactly that torch into a fresh venv and ran the "
        f"project's test command (`{command}`); {meta['date']}, arguments `{meta['args']}`.",
        "",
        "| torch | wheel | " + " | ".join(pythons) + " |",
        "| --- | --- | " + " | ".join("---" for _ in pythons) + " |",
    ]
    for torch in torches:
        row_cells = [c for c in cells if c.torch == torch]
        wheels = sorted({c.wheel for c in row_cells if c.wheel}) or ["(none)"]
        marks = []
        for python in pythons:
            cell = by_key.get((torch, python))
            marks.append("" if cell is None else cell.status)
        lines.append(f"| {torch} | {', '.join(wheels)} | " + " | ".join(marks) + " |")
    failed = [c for c in cells if c.status == FAILED]
    if failed:
        lines += ["", "Failed cells:", ""]
        lines += [
            f"- torch {c.torch}, Python {c.python}: {c.summary} (log {c.log})" for c in failed
        ]
    not_run = [c for c in cells if c.status == NOT_RUN]
    if not_run:
        lines += ["", "Cells not run:", ""]
        lines += [f"- torch {c.torch}, Python {c.python}: not run: {c.summary}" for c in not_run]
    sources = {c.python: c.source for c in cells if c.source.startswith(CONTAINER)}
    if sources:
        lines += ["", "Interpreters not from this host:", ""]
        lines += [f"- Python {python}: {source}" for python, source in sorted(sources.items())]
    return "\n".join(lines) + "\n"


def write_table(
    out_dir: Path, table: project.Project, cells: Sequence[Cell], meta: dict[str, object]
) -> Path:
    """``compatibility.json`` and ``compatibility.md`` in ``out_dir``; the Markdown's path."""
    document = {"project": table.distribution, **meta, "cells": [asdict(c) for c in cells]}
    (out_dir / "compatibility.json").write_text(json.dumps(document, indent=2) + "\n")
    markdown = out_dir / "compatibility.md"
    markdown.write_text(render_markdown(table, cells, meta))
    return markdown


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m scripts.matrix --project", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--project", type=Path, required=True, help="checkout or table file")
    parser.add_argument("--torch", action="append", help="torch rows (repeatable; default all)")
    parser.add_argument("--python", action="append", help="only these Pythons (repeatable)")
    parser.add_argument(
        "--cpu", action="store_true", help="the CPU wheels (nox -s wheels -- --project --cpu)"
    )
    parser.add_argument("--wheels", type=Path, help="wheelhouse (default: the project's)")
    parser.add_argument("--out", type=Path, help="output folder (default: the project's matrix/)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        table = project.other_project(
            args.project, "its table is `nox -s matrix` without --project"
        )
    except project.ProjectTableError as exc:
        print(f"matrix: {exc}", file=sys.stderr)
        return 2
    rows = matrix.select_rows(matrix.load_rows(), args.torch, all_rows=not args.torch)
    if "pinned" not in table.kinds:  # a stable-only project: the rows its wheels can serve
        rows = [r for r in rows if r.kind == variant.STABLE]
    rows = served_rows(table, rows)
    if args.cpu:
        rows = [cpu_row(r) for r in rows]
    wheel_dir = (args.wheels or table.output_dir("wheelhouse")).resolve()
    wheels = sorted(wheel_dir.glob("*.whl"))
    if not wheels:
        print(
            f"matrix: no wheels in {wheel_dir}: build them first with "
            f"`nox -s wheels -- --project {args.project}{' --cpu' if args.cpu else ''}`",
            file=sys.stderr,
        )
        return 2
    out_dir = claim_output(
        (args.out or table.output_dir("matrix")).resolve(), by="nox -s matrix -- --project"
    )
    planned = plan_cells(table, rows, wheels, args.python or [])
    workdir = toolchain.cache_dir() / "projects" / table.distribution / "matrix"
    with basics.exclusive_folder(workdir):
        cells = run_cells(table, planned, workdir)
    meta: dict[str, object] = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "args": " ".join(sys.argv[1:] if argv is None else argv),
        "wheels": str(wheel_dir),
    }
    markdown = write_table(out_dir, table, cells, meta)
    print(markdown.read_text())
    print(f"table: {markdown}")
    return 1 if any(c.status == FAILED for c in cells) else 0


if __name__ == "__main__":
    raise SystemExit(main())
