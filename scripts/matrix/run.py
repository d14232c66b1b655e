"""``nox -s matrix``: every wheel, with every torch it serves, on every Python; then the table.

    python -m scripts.matrix [--torch 2.15 ...] [--python 3.12 ...] [--jobs 2]
                             [--wheels DIR ...] [--deadline 06:00] [--force] [--dry-run]
    python -m scripts.matrix table [--torch 2.11 | --all] [--github-json]

Each wheel is got once (:mod:`scripts.matrix.reuse`: reused when built from the current
sources, else built, repaired and audited) and that same file is installed, with every torch
of the selected rows it serves and every Python the row lists and this machine has, into a
fresh venv that runs the installed-wheel op suite (:mod:`scripts.wheeltest`). The stable CUDA
13 wheel, built against torch 2.11.0, is tested with torch 2.11.0 through 2.15.0; the pinned
wheels with their own torch. Every cell records the sha256 of the wheel file it tested.
Wrong-torch cells (:mod:`scripts.matrix.negatives`) check that each wheel refuses a torch it
does not serve. Passed cells are recorded and not rerun (:mod:`scripts.matrix.results`).

Writes ``docs/compatibility.md`` and ``docs/compatibility.json`` (generated; never edit them).
``python -m scripts.matrix table`` prints the build matrix itself (``--github-json``: the
GitHub Actions matrix, one entry per wheel).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from scripts import build, diskspace, toolchain, wheeltest
from scripts.basics import REPO
from scripts.interpreters import Interpreter, find_with_reasons
from scripts.matrix.digests import source_digest, suite_digest
from scripts.matrix.model import release
from scripts.matrix.negatives import (
    DEFAULT_NEGATIVES,
    NEGATIVE_PYTHON,
    NegativePlan,
    not_run,
    plan_negatives,
    run_negative,
)
from scripts.matrix.plan import TEST, describe, plan_row, plan_wheels
from scripts.matrix.render import (
    DOCS,
    FORMAT,
    JSON_NAME,
    MD_NAME,
    load_previous,
    merge_previous,
    render_markdown,
    write_outputs,
)
from scripts.matrix.results import (
    FAIL,
    NOT_BUILT,
    NOT_RUN,
    PASS,
    ResultCache,
    log,
    result_key,
    row_entry,
    utc_now,
)
from scripts.matrix.reuse import WheelState, obtain_wheel, read_build_info
from scripts.matrix.schedule import (
    NEGATIVE_PRIORITY,
    Deadline,
    DiskFloor,
    JobQueue,
    build_order,
    cell_priority,
    parse_deadline,
)
from scripts.matrix.table import Row, load_rows, select_rows
from scripts.wheelfile import sha256_of_file as file_sha256


def cache_relative(path: str) -> str:
    """``path`` relative to the cache folder (``<cache>/...``), or its name when outside it."""
    try:
        return "<cache>/" + str(Path(path).resolve().relative_to(toolchain.cache_dir().resolve()))
    except ValueError:
        return Path(path).name


def interpreters_for(
    rows: Sequence[Row], pythons: Sequence[str] | None = None
) -> tuple[dict[str, Interpreter | None], dict[str, str]]:
    """The interpreters of the cells to test (the host's, else the Debian root's), and why
    any is missing. The root is made only when a selected cell needs it."""
    versions = {p for r in rows for p in r.pythons if not pythons or p in pythons}
    found, reasons = find_with_reasons(sorted(versions | {NEGATIVE_PYTHON}, key=release), True)
    for v, i in found.items():
        where = f"{i.path} in {i.root}" if i and i.root else str(i.path) if i else ""
        log(f"Python {v}: " + (f"{where}, {i.origin}" if i else f"not found: {reasons[v]}"))
    return found, reasons


def interpreter_key(interp: Interpreter) -> str:
    """The interpreter's place in a result key: a root's interpreter by its path in the root."""
    return f"{interp.root}{interp.path}" if interp.root else str(interp.path)


def run_matrix(args: argparse.Namespace) -> dict[str, Any]:
    """Get every wheel the selected rows need, test it, and report (rows keyed by torch,
    wheels by variant; :func:`scripts.matrix.render.merge_previous` makes it the table)."""
    started = time.monotonic()
    deadline = Deadline(parse_deadline(args.deadline))
    disk = DiskFloor(args.min_free_gb, [toolchain.cache_dir(), build.uv_cache_dir()])
    rows = load_rows()
    selected = select_rows(rows, args.torch, all_rows=not args.torch)
    negative_plans = [] if args.no_negatives else plan_negatives(DEFAULT_NEGATIVES, rows)
    cache = toolchain.cache_dir() / "matrix"
    store = cache / "wheels"
    store.mkdir(parents=True, exist_ok=True)
    dirs = [store, *(Path(d).resolve() for d in (args.wheels or [REPO / "wheelhouse"]))]
    results = ResultCache(cache / "results")
    work = cache / "cells"
    tdigest = suite_digest()
    interps, missing_why = interpreters_for(selected, args.python)

    wheels: dict[str, WheelState] = {}
    cells: dict[str, dict[str, dict[str, Any]]] = {r.torch: {} for r in selected}
    negatives: list[dict[str, Any]] = []
    lock = threading.Lock()
    queue = JobQueue(max(1, args.jobs))

    def test_cell(state: WheelState, row: Row, interp: Interpreter) -> None:
        assert state.wheel is not None
        name = f"{state.row.variant} torch {row.torch} Python {interp.version}"
        key = result_key(
            state.wheel_sha256, row.torch, interpreter_key(interp), interp.version, tdigest
        )
        cached = None if args.force else results.get(key)
        if cached and cached.get("status") == PASS:
            with lock:
                cells[row.torch][interp.version] = {**cached, "reused": True}
            log(f"{name}: pass (recorded {cached.get('date')})")
            return
        if deadline.passed():
            with lock:
                cells[row.torch][interp.version] = {
                    "status": NOT_RUN,
                    "reason": "deadline reached",
                }
            return
        short = disk.shortage()
        if short:
            log(f"{name}: not run - {short}")
            with lock:
                cells[row.torch][interp.version] = {"status": NOT_RUN, "reason": short}
            return
        log(f"{name}: testing")
        try:
            res = wheeltest.run_op_tests_in_venv(
                f"torch=={row.torch}", state.wheel, interp, work / state.row.variant / row.torch
            )
        except (OSError, diskspace.DiskSpaceError) as exc:
            # The machine, not the wheel (a full disk, or too little free for the venv's torch:
            # a SystemExit that would end the run): this cell has no result, the run goes on
            # and still writes the table; not recorded, so the next run tries it again.
            log(f"{name}: not run - {exc}")
            with lock:
                cells[row.torch][interp.version] = {
                    "status": NOT_RUN,
                    "reason": f"the cell could not run here: {exc}",
                }
            return
        cell = {
            "status": PASS if res.status == "passed" else FAIL,
            "wheel": state.wheel.name,
            "wheel_sha256": state.wheel_sha256,
            "summary": res.summary,
            "seconds": round(res.seconds, 1),
            # No machine paths in the committed table: the interpreter by name and origin
            # (host or container), the log relative to the cache folder it lies in.
            "interpreter": f"{Path(interp.path).name}, {interp.origin}",
            "date": utc_now(),
            "commit": build.git_commit(),
            "log": cache_relative(res.log),
        }
        log(f"{name}: {cell['status']} in {cell['seconds']:.0f}s - {res.summary}")
        if cell["status"] == PASS:
            results.put(key, cell)
        with lock:
            cells[row.torch][interp.version] = cell

    def negative_cell(plan: NegativePlan, state: WheelState, interp: Interpreter | None) -> None:
        assert state.wheel is not None
        if interp is None:
            with lock:
                negatives.append(
                    not_run(plan, f"no Python {NEGATIVE_PYTHON} on this machine", state.wheel.name)
                )
            return
        key = result_key(state.wheel_sha256, f"neg:{plan!r}", str(interp.path), interp.version, "")
        cached = None if args.force else results.get(key)
        if cached and all(c.get("status") == PASS for c in cached["checks"]):
            with lock:
                negatives.extend({**c, "reused": True} for c in cached["checks"])
            return
        if deadline.passed():
            with lock:
                negatives.append(not_run(plan, "deadline reached", state.wheel.name))
            return
        name = f"negative {plan.pair.name}"
        log(f"{name}: running")
        checks = run_negative(plan, state.wheel, interp, work / "negatives" / plan.pair.name)
        for c in checks:
            c["wheel_sha256"] = state.wheel_sha256
            c["date"] = utc_now()
            log(f"{name}: {c['check']}: {c['status']} - {c['detail']}")
        if all(c["status"] == PASS for c in checks):
            results.put(key, {"checks": checks})
        with lock:
            negatives.extend(checks)

    # Wheels that exist or build warm go first; their cells test while later wheels build.
    for plan in sorted(plan_wheels(selected, rows), key=lambda p: build_order(p.builder, dirs)):
        state = WheelState(plan.builder, tuple(r.torch for r in plan.serves))
        wheels[plan.variant] = state
        row_plans = {row.torch: plan_row(row, args.python) for row in plan.tests}
        for torch, cell_plans in row_plans.items():
            for c in cell_plans:
                if c.action != TEST:
                    cells[torch][c.python] = {"status": c.action, "reason": c.reason}
        obtain_wheel(
            state,
            dirs[0],
            dirs[1:],
            args.force_build,
            may_build=not deadline.passed(),
            reuse_any=args.reuse_any,
        )
        pairs = [n for n in negative_plans if n.pair.variant == plan.variant]
        if state.wheel is None:
            status = state.status if state.status in (NOT_BUILT, NOT_RUN) else FAIL
            for torch, cell_plans in row_plans.items():
                for c in cell_plans:
                    if c.action == TEST:
                        cells[torch][c.python] = {"status": status, "reason": state.reason}
            negatives.extend(not_run(n, f"no wheel: {state.reason}") for n in pairs)
            continue
        state.wheel_sha256 = file_sha256(state.wheel)
        state.build_info = read_build_info(state.wheel)
        for n in pairs:
            queue.submit(NEGATIVE_PRIORITY, negative_cell, n, state, interps.get(NEGATIVE_PYTHON))
        for row in plan.tests:
            for c in row_plans[row.torch]:
                if c.action != TEST:
                    continue
                interp = interps.get(c.python)
                if interp is None:
                    cells[row.torch][c.python] = {
                        "status": NOT_RUN,
                        "reason": missing_why[c.python],
                    }
                    continue
                queue.submit(cell_priority(c.python, row), test_cell, state, row, interp)

    queue.wait()
    return {
        "format": FORMAT,
        "generated": utc_now(),
        "commit": build.git_commit(),
        "sources_sha256": source_digest(),
        "tests_sha256": tdigest,
        "host": f"{platform.node()} {platform.machine()}, {os.cpu_count()} cores",
        "seconds": round(time.monotonic() - started, 1),
        "args": list(args.argv),
        "wheels": {v: s.as_dict() for v, s in wheels.items()},
        "rows": {r.torch: row_entry(r, cells[r.torch]) for r in selected},
        "negatives": sorted(
            negatives, key=lambda n: (n["variant"], n["venv_torch"], n.get("check", ""))
        ),
    }


def recorded_only(previous: dict[str, Any], argv: Sequence[str]) -> dict[str, Any]:
    """A report that ran nothing: the previous run's description when its format is current."""
    nothing: dict[str, Any] = {"wheels": {}, "rows": {}, "negatives": []}
    if previous.get("format") == FORMAT:
        kept = {k: v for k, v in previous.items() if k not in ("wheels", "rows", "negatives")}
        return {**kept, **nothing}
    return {
        "format": FORMAT,
        "generated": None,
        "commit": None,
        "args": list(argv),
        "note": (
            "No cell has run since the table's format changed (one wheel per CUDA major from "
            "torch 2.10 on, each cell naming the wheel file it tested): every cell says "
            "`not run (no result yet)` until `nox -s matrix` runs it."
        ),
        **nothing,
    }


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
        "--deadline",
        help="start no cell after HH:MM UTC (or +SECONDS); the rest: not run (deadline reached)",
    )
    parser.add_argument(
        "--min-free-gb",
        type=float,
        default=6.0,
        help="start no cell while less disk than this is free where cells install (default 6)",
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
        "--render-only",
        action="store_true",
        help="run nothing: rewrite the table from docs/compatibility.json and the matrix",
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="print which wheel each cell would test, and the wrong-torch pairs; run nothing",
    )
    args = parser.parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else list(argv)
    return args


def print_plan(args: argparse.Namespace) -> None:
    rows = load_rows()
    selected = select_rows(rows, args.torch, all_rows=not args.torch)
    for line in describe(plan_wheels(selected, rows), args.python):
        print(line)
    if args.no_negatives:
        return
    print("wrong torch (must refuse):")
    for n in plan_negatives(DEFAULT_NEGATIVES, rows):
        checks = "pip and the import guard" if n.pip_refuses else "the import guard"
        print(f"  {n.pair.variant} with torch {n.pair.torch_version}: {n.why}; checked by {checks}")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.dry_run:
        print_plan(args)
        return 0
    rows = load_rows()
    previous = load_previous(args.docs)
    if args.render_only:
        if previous is None:
            raise SystemExit(f"no {args.docs / JSON_NAME} to render: run `nox -s matrix` first")
        write_outputs(merge_previous(recorded_only(previous, args.argv), previous, rows), args.docs)
        log(f"wrote {args.docs / MD_NAME} and {JSON_NAME} from the recorded results")
        return 0
    os.environ.setdefault("UV_PYTHON_DOWNLOADS", "never")
    report = run_matrix(args)
    final = merge_previous(report, previous, rows)
    write_outputs(final, args.docs)
    print(render_markdown(final))
    bad = [
        f"torch {torch} Python {p}"
        for torch, entry in report["rows"].items()
        for p, c in entry["cells"].items()
        if c["status"] == FAIL
    ] + [
        f"negative {n['variant']} with torch {n['venv_torch']}: {n.get('check')}"
        for n in report["negatives"]
        if n["status"] == FAIL
    ]
    log(f"wrote {args.docs / MD_NAME} and {JSON_NAME} in {report['seconds']:.0f}s")
    if bad:
        log("FAILED: " + ", ".join(bad))
    return 1 if bad else 0
