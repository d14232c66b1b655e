"""The published table: ``docs/compatibility.json`` and the Markdown rendered from it.

Both are generated (never edited). A run restricted with ``--torch`` completes the table with
the previous one's rows that still describe the matrix; rows it cannot vouch for say
"not run (no result yet)". Tables of an older format are not carried over at all: their cells
tested wheels this release no longer builds.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from scripts.basics import REPO
from scripts.matrix.negatives import DEFAULT_NEGATIVES, not_run, plan_negatives
from scripts.matrix.plan import ALL_PYTHONS, TEST, plan_row
from scripts.matrix.results import (
    FAIL,
    NOT_BUILT,
    NOT_RUN,
    PASS,
    UNSUPPORTED,
    read_json_or_none,
    row_entry,
)
from scripts.matrix.reuse import WheelState
from scripts.matrix.table import Row, build_rows
from scripts.project import own_project

DOCS = REPO / "docs"
MD_NAME = "compatibility.md"
JSON_NAME = "compatibility.json"
# 2: one wheel per variant ("wheels"), cells naming the wheel file (sha256) they tested.
FORMAT = 2
NO_RESULT = "no result yet"
# A row or wheel entry of the previous table still applies while these are unchanged. A wheel
# planned for other archs (its toolkit's arch list changed since) is another wheel.
ROW_KEYS = ("cuda", "kind", "variant", "build_torch", "pythons")
WHEEL_KEYS = ("kind", "requires_torch", "build_torch", "cuda", "serves", "archs_planned")


def empty_row(row: Row) -> dict[str, Any]:
    cells = {
        c.python: {"status": NOT_RUN, "reason": NO_RESULT}
        if c.action == TEST
        else {"status": c.action, "reason": c.reason}
        for c in plan_row(row, None)
    }
    return row_entry(row, cells)


def empty_wheel(builder: Row, rows: Sequence[Row]) -> dict[str, Any]:
    serves = tuple(r.torch for r in rows if r.build_torch == builder.torch)
    return WheelState(builder, serves, reason=NO_RESULT).as_dict()


def still_applies(
    old: Mapping[str, Any] | None, fresh: Mapping[str, Any], keys: Sequence[str]
) -> bool:
    return old is not None and all(old.get(k) == fresh[k] for k in keys)


def merge_previous(
    report: Mapping[str, Any], previous: Mapping[str, Any] | None, rows: Sequence[Row]
) -> dict[str, Any]:
    """Complete a run's report (``rows``/``wheels`` keyed by torch/variant) into the table.

    Every row and wheel of the matrix gets an entry: this run's, else the previous table's
    (only if it still describes the row: same CUDA, wheel, build torch and Pythons), else
    cells "not run (no result yet)". Rows that left the matrix disappear. Negatives of
    wheels this run did not get are kept; a pair with no result at all says so.
    """
    prev = previous if previous is not None and previous.get("format") == FORMAT else {}
    prev_rows = {r["torch"]: r for r in prev.get("rows", [])}
    prev_wheels = {w["variant"]: w for w in prev.get("wheels", [])}
    out_rows = []
    for row in rows:
        entry = report["rows"].get(row.torch)
        if entry is None:
            fresh = empty_row(row)
            old = prev_rows.get(row.torch)
            if still_applies(old, fresh, ROW_KEYS):
                assert old is not None
                # A Python column added since (3.14) gets this row's planned cell.
                entry = {**old, "cells": {**fresh["cells"], **old["cells"]}}
            else:
                entry = fresh
        out_rows.append(entry)
    out_wheels = []
    for builder in build_rows(rows):
        wheel = report["wheels"].get(builder.variant)
        if wheel is None:
            fresh = empty_wheel(builder, rows)
            old = prev_wheels.get(builder.variant)
            wheel = old if still_applies(old, fresh, WHEEL_KEYS) else fresh
        out_wheels.append(wheel)
    variants = {w["variant"] for w in out_wheels}
    negatives = list(report.get("negatives", []))
    negatives += [
        n
        for n in prev.get("negatives", [])
        if n.get("variant") in variants and n.get("variant") not in report["wheels"]
    ]
    listed = {(n["variant"], n["venv_torch"]) for n in negatives}
    negatives += [
        not_run(n, NO_RESULT)
        for n in plan_negatives(DEFAULT_NEGATIVES, rows)
        if (n.pair.variant, n.pair.torch_version) not in listed
    ]
    return {
        **report,
        "format": FORMAT,
        "wheels": out_wheels,
        "rows": out_rows,
        "negatives": negatives,
    }


def short_seconds(value: float | None) -> str:
    if value is None:
        return ""
    minutes, secs = divmod(round(value), 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def cell_text(cell: Mapping[str, Any]) -> str:
    status = cell.get("status", NOT_RUN)
    if status == FAIL:
        return "**fail**: " + (cell.get("summary") or cell.get("reason") or "")
    if status == NOT_RUN:
        return f"not run ({cell['reason']})" if cell.get("reason") else NOT_RUN
    return str(status)


def md_escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def columns_of(report: Mapping[str, Any]) -> list[str]:
    cols = list(ALL_PYTHONS)
    for row in report["rows"]:
        cols += [p for p in row["cells"] if p not in cols]
    return cols


def tested_sha256s(row: Mapping[str, Any]) -> list[str]:
    """The wheel files (sha256) the row's cells tested, each once."""
    shas: list[str] = []
    for cell in row["cells"].values():
        sha = cell.get("wheel_sha256")
        if sha and sha not in shas:
            shas.append(sha)
    return shas


def join_words(items: Sequence[str]) -> str:
    return ", ".join(items[:-1]) + f" or {items[-1]}" if len(items) > 1 else "".join(items)


def not_built_against(report: Mapping[str, Any]) -> list[str]:
    """One sentence per wheel serving torch releases it was not compiled against."""
    lines = []
    for wheel in report["wheels"]:
        others = [t for t in wheel["serves"] if t != wheel["build_torch"]]
        if others:
            lines.append(
                f"The `{wheel['variant']}` wheel was built against torch {wheel['build_torch']} "
                f"only: it was not built against torch {join_words(others)}. Those rows "
                "install the same file (same sha256) and run the same suite."
            )
    return lines


def interpreter_lines(report: Mapping[str, Any]) -> list[str]:
    """Where each Python column's interpreters came from (host or container), as the cells
    that ran recorded it."""
    seen: dict[str, list[str]] = {}
    for row in report["rows"]:
        for python, cell in row["cells"].items():
            where = cell.get("interpreter")
            if where and where not in seen.setdefault(python, []):
                seen[python].append(where)
    if not seen:
        return []
    lines = [
        "",
        "## Interpreters",
        "",
        "Where each Python of the cells that ran came from: the host (`PATH`, pyenv or uv), or "
        "a container, a Debian sid root filesystem made by `mmdebstrap` and entered with "
        "`unshare` + `chroot`, for the Pythons whose Debian builds need a newer glibc than the "
        "host's (`scripts/interpreter_root.py`). The venv, torch and the wheel are installed "
        "inside it the same way.",
        "",
        "| Python | interpreter |",
        "|---|---|",
    ]
    for python in columns_of(report):
        if python in seen:
            lines.append(f"| {python} | {md_escape('; '.join(seen[python]))} |")
    return lines


def free_threaded_note(name: str) -> str:
    """Why no cell tests a free-threaded Python, for the distribution ``name``."""
    return (
        f"**Free-threaded Python (3.14t, 3.15t): no {name} wheel.** torch publishes `cp314t` "
        f"and `cp315t` wheels, but {name}'s wheels use the limited API (`cp39-abi3`), which a "
        f'free-threaded interpreter cannot load, so pip and uv find no {name} wheel there ("no '
        'matching distribution") and no cell tests it; a copy installed there anyway refuses '
        "to import with an ImportError that says so. Use the regular build of the same Python "
        "(`python3.14`, not `python3.14t`). Debian (sid, experimental) ships no free-threaded "
        "interpreter to test that on."
    )


def run_line(report: Mapping[str, Any]) -> list[str]:
    """When and where the results were made; nothing for a table that no run has filled."""
    if not report.get("generated"):
        return []
    parts = [f"Run: {report['generated']}", f"commit `{report['commit']}`"]
    if report.get("host"):
        parts.append(f"on {report['host']}")
    if report.get("seconds") is not None:
        parts.append(short_seconds(report["seconds"]))
    return ["", ", ".join(parts) + "."]


def render_markdown(report: Mapping[str, Any]) -> str:
    cols = columns_of(report)
    # `nox -s matrix` tables this repository's own project (its table names it)
    name, import_name = own_project().distribution, own_project().import_name
    lines = [
        "# Compatibility",
        "",
        "<!-- Generated by `nox -s matrix` (python -m scripts.matrix) from "
        "scripts/matrix/matrix.toml. Do not edit: rerun it. -->",
        "",
        f"Which {name} wheel works with which torch, CUDA and Python, **as tested**: every "
        "cell is a fresh venv with that Python, the row's torch from PyPI and the wheel that "
        "serves it, running the installed-wheel op suite (`tests/ops`, CPU).",
        "",
        "Two kinds of wheel serve the rows. A **stable** wheel (the ops on the LibTorch stable "
        "ABI) is built once per CUDA major and serves every torch from 2.10 on: the same file, "
        "by sha256, is tested with each of them. A **pinned** wheel is built per torch minor "
        "and serves only that minor.",
        *run_line(report),
    ]
    if report.get("note"):
        lines += ["", str(report["note"])]
    lines += [
        "",
        "## Which wheel serves which torch",
        "",
        "| torch | CUDA | wheel | sha256 | built against torch | "
        + " | ".join(f"Python {c}" for c in cols)
        + " |",
        "|---|---|---|---|---|" + "---|" * len(cols),
    ]
    for row in report["rows"]:
        shas = " ".join(f"`{s[:12]}`" for s in tested_sha256s(row)) or "-"
        cells = [md_escape(cell_text(row["cells"].get(c, {"status": UNSUPPORTED}))) for c in cols]
        lines.append(
            f"| {row['torch']} | {row['cuda']} | {row['variant']} ({row['kind']}) | {shas} "
            f"| {row['build_torch']} | " + " | ".join(cells) + " |"
        )
    lines += [
        "",
        "`sha256`: the first 12 hex digits of the wheel file the row's cells tested (in full "
        f"below). `{PASS}`: the op suite passed. `{UNSUPPORTED}`: torch publishes no wheel for "
        f"that Python. `{NOT_BUILT}`: the wheel's CUDA toolkit is not available on the machine "
        "that made this table (the GitHub workflow builds it in PyTorch's builder images). "
        "`not run`: no result from this run (reason given).",
    ]
    for sentence in not_built_against(report):
        lines += ["", sentence]
    lines += ["", free_threaded_note(name)]
    lines += interpreter_lines(report)
    lines += [
        "",
        "## Wheels",
        "",
        "| wheel | kind | Requires-Dist | built against torch | serves torch | file | sha256 "
        "| compiled GPU architectures | built from commit | status |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for w in report["wheels"]:
        archs = " ".join(w.get("archs") or []) or (
            "(planned) " + " ".join(w.get("archs_planned") or [])
        )
        status = w.get("wheel_status", "")
        if w.get("reason") and status not in ("reused",):
            status += f" ({w['reason']})"
        lines.append(
            f"| {w['variant']} | {w['kind']} | `{w['requires_torch']}` | {w['build_torch']} "
            f"| {' '.join(w['serves'])} | {md_escape(w.get('wheel') or '-')} "
            f"| {w.get('wheel_sha256') or '-'} | {archs} | {w.get('build_commit') or '-'} "
            f"| {md_escape(status)} |"
        )
    lines += [
        "",
        "## Wrong torch: the wheel must refuse it",
        "",
        "A wheel in a venv whose torch it does not serve. Where the wheel's `Requires-Dist` "
        "excludes that torch, real pip (`--no-index`, the torch already installed) must refuse "
        f"it; forced in with `--no-deps`, `import {import_name}` must raise the guard's "
        "ImportError naming what it found and the install command. The CUDA major and a "
        "CPU-only torch are invisible to the metadata: there the guard is the only check. "
        "`pass` means it failed the intended way.",
        "",
        "| wheel | torch in the venv | sha256 | Python | check | expected | result | message |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for neg in report.get("negatives", []):
        sha = f"`{neg['wheel_sha256'][:12]}`" if neg.get("wheel_sha256") else "-"
        lines.append(
            f"| {neg['variant']} | {neg['venv_torch']} | {sha} | {neg.get('python', '-')} "
            f"| {md_escape(neg.get('check', '-'))} | {md_escape(neg.get('expected', ''))} "
            f"| {neg['status']} | {md_escape(str(neg.get('detail', '')))[:300]} |"
        )
    return "\n".join(lines) + "\n"


def write_outputs(report: Mapping[str, Any], docs: Path = DOCS) -> None:
    docs.mkdir(parents=True, exist_ok=True)
    (docs / JSON_NAME).write_text(json.dumps(report, indent=2, sort_keys=False) + "\n")
    (docs / MD_NAME).write_text(render_markdown(report))


def load_previous(docs: Path = DOCS) -> dict[str, Any] | None:
    return read_json_or_none(docs / JSON_NAME)
