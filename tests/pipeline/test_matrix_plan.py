"""scripts.matrix.plan: which wheel file each (torch, Python) cell tests."""

from __future__ import annotations

import pytest

from scripts import matrix
from scripts.matrix import plan
from scripts.matrix.results import NOT_RUN, UNSUPPORTED


def row(torch: str = "2.11.0", pythons: tuple[str, ...] = ("3.10", "3.11", "3.12", "3.13")):
    return matrix.Row(
        torch, "13.0", pythons, "8.0;12.0+PTX", ("nvidia-cuda-nvcc==13.0.88",), "2.11.0"
    )


@pytest.fixture(scope="module")
def rows() -> list[matrix.Row]:
    return matrix.load_rows()


def test_plan_row_marks_pythons_the_row_lacks_unsupported() -> None:
    cells = {c.python: c.action for c in plan.plan_row(row(), None)}
    assert cells == {
        "3.9": UNSUPPORTED,
        "3.10": plan.TEST,
        "3.11": plan.TEST,
        "3.12": plan.TEST,
        "3.13": plan.TEST,
        "3.14": UNSUPPORTED,
        "3.15": UNSUPPORTED,
    }


def test_plan_row_python_filter_and_newer_pythons() -> None:
    cells = {c.python: c.action for c in plan.plan_row(row(pythons=("3.12", "3.14")), ["3.12"])}
    assert cells["3.12"] == plan.TEST
    assert cells["3.14"] == NOT_RUN  # a Python newer than the columns gets a column
    assert cells["3.13"] == UNSUPPORTED


def test_every_row_is_tested_by_exactly_one_wheel(rows) -> None:
    plans = plan.plan_wheels(rows, rows)
    tested = [r.torch for p in plans for r in p.tests]
    assert sorted(tested) == sorted(r.torch for r in rows)
    assert {p.variant: [r.torch for r in p.tests] for p in plans} == {
        "pt28cu128": ["2.8.0"],
        "pt29cu128": ["2.9.1"],
        "stable.cu12": ["2.10.0"],
        "stable.cu13": ["2.11.0", "2.12.1", "2.13.0", "2.14.1", "2.15.0"],
    }
    for p in plans:
        assert p.builder.is_build
        assert all(r.variant == p.variant for r in p.tests), p.variant


def test_a_selected_row_gets_its_wheel_built_against_another_torch(rows) -> None:
    plans = plan.plan_wheels(matrix.select_rows(rows, "2.15"), rows)
    assert [(p.variant, p.builder.torch) for p in plans] == [("stable.cu13", "2.11.0")]
    assert [r.torch for r in plans[0].tests] == ["2.15.0"]
    assert [r.torch for r in plans[0].serves] == ["2.11.0", "2.12.1", "2.13.0", "2.14.1", "2.15.0"]


def test_describe_says_which_torch_the_wheel_was_not_built_against(rows) -> None:
    lines = plan.describe(plan.plan_wheels(matrix.select_rows(rows, ["2.11", "2.15"]), rows), None)
    assert lines[0].startswith("stable.cu13 (stable, torch>=2.10): one wheel, built against")
    assert lines[1] == "  torch 2.11.0 (CUDA 13.0): Python 3.10 3.11 3.12 3.13 3.14"
    assert lines[2] == (
        "  torch 2.15.0 (CUDA 13.2) (not built against 2.15.0): Python 3.11 3.12 3.13 3.14 3.15"
    )
