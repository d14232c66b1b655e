"""Which wheel file each cell of the compatibility table tests.

A cell is (torch release, Python). Every torch release is served by one wheel
(``Row.build_torch`` names the torch it is compiled against): a pinned wheel per torch 2.8 /
2.9 row, and one stable-ABI wheel per CUDA major for every torch from 2.10 on. The run gets
each wheel once and installs that same file, with each torch it serves, into a fresh venv per
Python: the CUDA 13 wheel is built against torch 2.11.0 and tested with 2.11.0 through 2.15.0.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from scripts.matrix.results import NOT_RUN, UNSUPPORTED
from scripts.matrix.table import Row, build_rows

# The table's Python columns; a row listing a newer Python adds its column.
ALL_PYTHONS = ("3.9", "3.10", "3.11", "3.12", "3.13", "3.14", "3.15")
TEST = "test"


@dataclass(frozen=True)
class CellPlan:
    torch: str
    python: str
    action: str  # TEST, or the cell's final status (unsupported, not run)
    reason: str = ""


def plan_row(row: Row, pythons: Sequence[str] | None) -> list[CellPlan]:
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
            cells.append(CellPlan(row.torch, py, NOT_RUN, "not selected with --python"))
        else:
            cells.append(CellPlan(row.torch, py, TEST))
    return cells


@dataclass(frozen=True)
class WheelPlan:
    """One wheel to get (built once), and the torch releases of this run that test it."""

    builder: Row  # the row whose torch the wheel is compiled against
    serves: tuple[Row, ...]  # every row of the matrix it serves
    tests: tuple[Row, ...]  # the selected ones: each gets a cell per Python

    @property
    def variant(self) -> str:
        return self.builder.variant


def plan_wheels(selected: Sequence[Row], rows: Sequence[Row]) -> list[WheelPlan]:
    """The wheels serving ``selected`` (each once), with the rows each is tested with."""
    return [
        WheelPlan(
            builder,
            tuple(r for r in rows if r.build_torch == builder.torch),
            tuple(r for r in selected if r.build_torch == builder.torch),
        )
        for builder in build_rows(selected, rows)
    ]


def describe(plans: Sequence[WheelPlan], pythons: Sequence[str] | None) -> list[str]:
    """The plan in words, one line per (wheel, torch): what ``--dry-run`` prints."""
    lines = []
    for plan in plans:
        b = plan.builder
        lines.append(
            f"{plan.variant} ({b.kind}, {b.requires_torch}): one wheel, built against torch "
            f"{b.torch} with CUDA {b.cuda}"
        )
        for row in plan.tests:
            tested = [c.python for c in plan_row(row, pythons) if c.action == TEST]
            note = "" if row.is_build else f" (not built against {row.torch})"
            lines.append(
                f"  torch {row.torch} (CUDA {row.cuda}){note}: Python {' '.join(tested) or '-'}"
            )
    return lines
