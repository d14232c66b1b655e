"""The end-of-run table and its JSON twin for ``nox -s wheels``."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class CellReport:
    """One matrix cell's outcome; ``status`` is ``passed`` only if build, audit and tests passed."""

    variant: str
    torch: str
    cuda: str
    status: str = "failed"  # passed | failed
    stage: str = ""  # where it stopped: toolchain, build, repair/audit, test, done
    wheel: str | None = None
    sha256: str | None = None
    size_bytes: int | None = None
    tag: str | None = None
    audit: str = "not run"
    max_versions: dict[str, str] = field(default_factory=dict)
    # GPU targets read from the wheel's fat binaries (sm_XX code, compute_XX PTX).
    archs: list[str] = field(default_factory=list)
    auditwheel_output: str = ""
    tests: list[dict[str, Any]] = field(default_factory=list)
    build_seconds: float | None = None
    compile_seconds: dict[str, float] = field(default_factory=dict)
    total_seconds: float | None = None
    error: str = ""
    build_python: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def human_size(size: int | None) -> str:
    if size is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024  # type: ignore[assignment]
    return str(size)


def seconds(value: float | None) -> str:
    if value is None:
        return "-"
    minutes, secs = divmod(round(value), 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def tests_cell(tests: Sequence[dict[str, Any]]) -> str:
    if not tests:
        return "skipped"
    return ", ".join(
        (f"torch {t['torch']} " if "torch" in t else "")
        + f"{t['python']} {t['status']}"
        + (f": {t['source']}" if t.get("source") else "")
        for t in tests
    )


def render_table(cells: Sequence[CellReport]) -> str:
    """A Markdown table (readable in a terminal too)."""
    header = [
        "cell",
        "status",
        "wheel",
        "size",
        "tag",
        "audit",
        "GPU archs compiled",
        "tests per Python",
        "build time",
    ]
    rows = [
        [
            c.variant,
            c.status if c.status == "passed" else f"{c.status} ({c.stage})",
            c.wheel or "-",
            human_size(c.size_bytes),
            c.tag or "-",
            c.audit,
            " ".join(c.archs) or "none",
            tests_cell(c.tests),
            seconds(c.build_seconds),
        ]
        for c in cells
    ]
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    lines = ["| " + " | ".join(h.ljust(w) for h, w in zip(header, widths)) + " |"]
    lines.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    lines += ["| " + " | ".join(str(x).ljust(w) for x, w in zip(r, widths)) + " |" for r in rows]
    return "\n".join(lines)


def write_cell_json(out_dir: Path, cell: CellReport) -> Path:
    path = out_dir / f"{cell.variant}.json"
    path.write_text(json.dumps(cell.as_dict(), indent=2) + "\n")
    return path


def write_run_report(out_dir: Path, cells: Sequence[CellReport], meta: dict[str, Any]) -> Path:
    """``report.json`` (this run) and ``report.md`` (its table) in ``out_dir``."""
    path = out_dir / "report.json"
    path.write_text(json.dumps({**meta, "cells": [c.as_dict() for c in cells]}, indent=2) + "\n")
    (out_dir / "report.md").write_text(render_table(cells) + "\n")
    return path
