"""scripts.matrix.render, and the committed table (docs/compatibility.*) against the matrix."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from scripts import matrix
from scripts.matrix import negatives, plan, render, run
from scripts.matrix.results import FAIL, NOT_BUILT, NOT_RUN, PASS, STATUSES, UNSUPPORTED
from scripts.matrix.reuse import WheelState

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
SHA = "ab" * 32

# --------------------------------------------------------------------------- committed table


@pytest.fixture(scope="module")
def committed() -> dict:
    path = DOCS / render.JSON_NAME
    if not path.is_file():
        pytest.fail(f"{path} is missing: run `nox -s matrix` and commit docs/compatibility.*")
    return json.loads(path.read_text())


def test_committed_table_is_of_the_current_format(committed: dict) -> None:
    assert committed.get("format") == render.FORMAT, (
        "docs/compatibility.json predates one-wheel-per-CUDA-major: rewrite it with "
        "`python -m scripts.matrix --render-only` (cells become 'not run (no result yet)')"
    )


def test_committed_table_has_exactly_the_matrix_rows_and_wheels(committed: dict) -> None:
    rows = matrix.load_rows()
    assert [r["torch"] for r in committed["rows"]] == [r.torch for r in rows]
    for entry, row in zip(committed["rows"], rows):
        assert entry["cuda"] == row.cuda, row.torch
        assert entry["variant"] == row.variant, row.torch
        assert entry["build_torch"] == row.build_torch, row.torch
        assert entry["pythons"] == list(row.pythons), row.torch
    builders = matrix.build_rows(rows)
    assert [w["variant"] for w in committed["wheels"]] == [b.variant for b in builders]
    for wheel, builder in zip(committed["wheels"], builders):
        assert wheel["build_torch"] == builder.torch
        assert wheel["serves"] == [r.torch for r in rows if r.build_torch == builder.torch]


def test_every_committed_cell_says_what_it_tested_or_why_not(committed: dict) -> None:
    """A cell with a result names the wheel file (sha256) it tested; one without says why."""
    for entry, row in zip(committed["rows"], matrix.load_rows()):
        cells = entry["cells"]
        assert set(cells) == set(plan.ALL_PYTHONS) | set(row.pythons), row.torch
        for py, cell in cells.items():
            where = (row.torch, py, cell)
            assert cell["status"] in STATUSES, where
            # unsupported exactly where torch has no wheel for that Python
            assert (cell["status"] == UNSUPPORTED) == (py not in row.pythons), where
            if cell["status"] in (PASS, FAIL):
                assert f"+{row.variant}-" in cell["wheel"], where
                assert re.fullmatch(r"[0-9a-f]{64}", cell["wheel_sha256"]), where
            else:
                assert cell.get("reason"), where


def test_committed_wheels_that_exist_name_their_file(committed: dict) -> None:
    for wheel in committed["wheels"]:
        if wheel["wheel"]:
            assert f"+{wheel['variant']}-" in wheel["wheel"]
            assert re.fullmatch(r"[0-9a-f]{64}", wheel["wheel_sha256"])
            assert wheel["archs"], wheel["variant"]
        else:
            assert wheel["wheel_status"] in (NOT_BUILT, NOT_RUN, "build failed"), wheel
            assert wheel["reason"], wheel["variant"]


# An absolute path: a "/" that starts neither a URL's host or path nor a "<cache>/" name.
MACHINE_PATH = re.compile(r"(?<![:\w/>.])/[\w.+-]+/[\w.+-]+")


def strings_in(value) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in strings_in(v)]
    if isinstance(value, list):
        return [s for v in value for s in strings_in(v)]
    return []


def test_committed_table_names_no_machine_paths(committed: dict) -> None:
    found = [s for s in strings_in(committed) if MACHINE_PATH.search(s)]
    assert not found, f"machine paths in docs/compatibility.json: {found[:3]}"


@pytest.mark.parametrize(
    ("text", "is_path"),
    [
        ("reused /work/cache/hotloop/matrix/wheels/x.whl (sources unchanged)", True),
        ("Command '['/usr/bin/uv', 'pip']' returned non-zero exit status 2.", True),
        ("reused x.whl (sources unchanged)", False),
        ("torch 2.11.0+cpu from https://download.pytorch.org/whl/cpu: not installed", False),
        ("<cache>/matrix/cells/pt28cu128/2.8.0/py3.9.log", False),
        ("python3.12 (pyenv)", False),
    ],
)
def test_what_counts_as_a_machine_path(text, is_path) -> None:
    assert bool(MACHINE_PATH.search(text)) is is_path


def test_committed_wheels_plan_the_archs_of_their_own_toolkit(committed: dict) -> None:
    """The CUDA 12 wheels compile what nvcc 12.4 knows (toolkits."12.8".arch_list), not the
    CUDA 13 list."""
    builders = {b.variant: b for b in matrix.build_rows(matrix.load_rows())}
    for wheel in committed["wheels"]:
        assert wheel["archs_planned"] == builders[wheel["variant"]].archs, wheel["variant"]


def test_committed_negatives_cover_every_pair(committed: dict) -> None:
    listed = {(n["variant"], n["venv_torch"]) for n in committed["negatives"]}
    pairs = {(p.variant, p.torch_version) for p in negatives.DEFAULT_NEGATIVES}
    assert listed == pairs
    for neg in committed["negatives"]:
        assert neg["status"] in STATUSES, neg
        assert neg["detail"], neg
        if neg["status"] in (PASS, FAIL):  # it ran: it names the file it tested
            assert f"+{neg['variant']}-" in neg["wheel"], neg
            assert re.fullmatch(r"[0-9a-f]{64}", neg.get("wheel_sha256") or ""), neg


def test_committed_markdown_is_generated_from_the_json(committed: dict) -> None:
    md = (DOCS / render.MD_NAME).read_text()
    assert md == render.render_markdown(committed), (
        "docs/compatibility.md differs from what scripts/matrix/render.py makes of the JSON: "
        "it is generated (python -m scripts.matrix --render-only), never edited"
    )


def test_committed_markdown_says_the_stable_wheel_was_not_built_against_torch_215() -> None:
    md = (DOCS / render.MD_NAME).read_text()
    sentence = next(ln for ln in md.splitlines() if ln.startswith("The `stable.cu13` wheel"))
    assert "built against torch 2.11.0 only" in sentence
    assert "not built against torch" in sentence
    assert "2.15.0" in sentence


# --------------------------------------------------------------------------- merging


def entry(torch: str, cuda: str, pythons: list[str], status: str = PASS) -> dict:
    row = next(r for r in matrix.load_rows() if r.torch == torch)
    cells = {p: {"status": status if p in pythons else UNSUPPORTED} for p in plan.ALL_PYTHONS}
    return {
        "torch": torch,
        "cuda": cuda,
        "kind": row.kind,
        "variant": row.variant,
        "build_torch": row.build_torch,
        "pythons": pythons,
        "cells": cells,
    }


def nothing() -> dict:
    return {"wheels": {}, "rows": {}, "negatives": []}


def test_merge_keeps_only_previous_rows_that_still_describe_the_matrix() -> None:
    rows = matrix.load_rows()
    stale = entry("2.11.0", "13.0", list(rows[3].pythons))
    stale["build_torch"] = "2.10.0"  # served by another wheel since
    previous = {
        "format": render.FORMAT,
        "rows": [
            entry("2.8.0", "12.8", ["3.9", "3.10"]),  # Pythons changed since
            entry("2.9.1", "12.8", list(rows[1].pythons)),  # still valid
            stale,
        ],
        "wheels": [],
        "negatives": [{"variant": "pt27cu126", "venv_torch": "2.8.0", "status": "pass"}],
    }
    merged = render.merge_previous(nothing(), previous, rows)
    by = {r["torch"]: r for r in merged["rows"]}
    assert list(by) == [r.torch for r in rows]
    assert by["2.8.0"]["cells"]["3.11"] == {"status": NOT_RUN, "reason": render.NO_RESULT}
    assert by["2.9.1"]["cells"]["3.10"]["status"] == PASS
    assert by["2.11.0"]["cells"]["3.10"]["status"] == NOT_RUN
    assert "pt27cu126" not in {n["variant"] for n in merged["negatives"]}


def test_merge_drops_a_previous_wheel_planned_for_other_archs() -> None:
    """A wheel entry made before its toolkit got its own arch list must not carry the old
    plan into the table (the CUDA 12 rows showed the CUDA 13 archs)."""
    rows = matrix.load_rows()
    cu12 = next(r for r in rows if r.variant == "stable.cu12")
    cu13 = next(r for r in rows if r.variant == "stable.cu13")
    stale = {**WheelState(cu12, (cu12.torch,)).as_dict(), "archs_planned": cu13.archs}
    previous = {"format": render.FORMAT, "rows": [], "wheels": [stale], "negatives": []}
    merged = render.merge_previous(nothing(), previous, rows)
    wheel = next(w for w in merged["wheels"] if w["variant"] == "stable.cu12")
    assert wheel["archs_planned"] == cu12.archs
    assert "sm_100" not in wheel["archs_planned"]
    # An entry that still matches the matrix is kept as it was.
    current = {**WheelState(cu12, (cu12.torch,)).as_dict(), "reason": "kept"}
    previous["wheels"] = [current]
    merged = render.merge_previous(nothing(), previous, rows)
    assert next(w for w in merged["wheels"] if w["variant"] == "stable.cu12")["reason"] == "kept"


def test_a_table_of_the_old_format_is_not_carried_over() -> None:
    rows = matrix.load_rows()
    old = entry("2.9.1", "12.8", list(rows[1].pythons))  # would match, but no format 2
    merged = render.merge_previous(nothing(), {"rows": [old], "negatives": []}, rows)
    assert merged["rows"][1]["cells"]["3.10"]["status"] == NOT_RUN


def test_render_only_rewrites_an_old_table_as_not_run(tmp_path, capsys) -> None:
    old = {
        "generated": "2026-11-23T08:18:29Z",
        "commit": "53af0b2",
        "rows": [entry("2.11.0", "13.0", ["3.10", "3.11", "3.12", "3.13"])],
        "negatives": [],
    }
    (tmp_path / render.JSON_NAME).write_text(json.dumps(old))
    assert run.main(["--render-only", "--docs", str(tmp_path)]) == 0
    table = json.loads((tmp_path / render.JSON_NAME).read_text())
    assert table["format"] == render.FORMAT
    assert table["generated"] is None  # nothing ran: no run to describe
    statuses = {c["status"] for r in table["rows"] for c in r["cells"].values()}
    assert statuses == {NOT_RUN, UNSUPPORTED}
    md = (tmp_path / render.MD_NAME).read_text()
    assert "No cell has run since the table's format changed" in md
    assert "Run:" not in md
    # Rewriting again changes nothing.
    before = (tmp_path / render.JSON_NAME).read_text()
    assert run.main(["--render-only", "--docs", str(tmp_path)]) == 0
    assert (tmp_path / render.JSON_NAME).read_text() == before


# --------------------------------------------------------------------------- rendering


def wheel_entry(variant: str, build_torch: str, serves: list[str], **changes) -> dict:
    builder = next(r for r in matrix.load_rows() if r.torch == build_torch)
    return {**WheelState(builder, tuple(serves)).as_dict(), **changes}


def test_render_markdown_shows_both_kinds_the_sha256_and_every_cell_kind() -> None:
    name = "hotloop-0.1.0+stable.cu13-cp39-abi3-manylinux_2_28_x86_64.whl"
    tested = {"status": PASS, "wheel": name, "wheel_sha256": SHA}
    ok = entry("2.15.0", "13.2", ["3.11", "3.12", "3.13"])
    ok["cells"].update(
        {
            "3.11": {**tested, "status": FAIL, "summary": "1 failed, 9 passed"},
            "3.12": tested,
            "3.13": {"status": NOT_RUN, "reason": "time"},
        }
    )
    nb = entry("2.8.0", "12.8", list(plan.ALL_PYTHONS), NOT_BUILT)
    report = {
        "generated": "2026-11-23T05:00:00Z",
        "commit": "abc",
        "host": "h",
        "seconds": 61,
        "rows": [nb, ok],
        "wheels": [
            wheel_entry("pt28cu128", "2.8.0", ["2.8.0"], wheel_status=NOT_BUILT, reason="no nvcc"),
            wheel_entry(
                "stable.cu13",
                "2.11.0",
                ["2.11.0", "2.15.0"],
                wheel=name,
                wheel_sha256=SHA,
                wheel_status="built",
                archs=["sm_80", "compute_120"],
            ),
        ],
        "negatives": [
            {
                "variant": "stable.cu13",
                "venv_torch": "2.10.0",
                "python": "3.12",
                "check": "import guard after --no-deps",
                "expected": "ImportError: a CUDA 12.8 torch next to a CUDA 13 wheel",
                "status": "pass",
                "detail": "ImportError: a|b",
                "wheel": name,
                "wheel_sha256": SHA,
            }
        ],
    }
    md = render.render_markdown(report)
    line = next(ln for ln in md.splitlines() if ln.startswith("| 2.15.0 |"))
    cells = [c.strip() for c in line.strip("|").split(" | ")]
    assert cells[:5] == ["2.15.0", "13.2", "stable.cu13 (stable)", f"`{SHA[:12]}`", "2.11.0"]
    assert cells[5:] == [
        "unsupported",
        "unsupported",
        "**fail**: 1 failed, 9 passed",
        "pass",
        "not run (time)",
        "unsupported",  # 3.14, 3.15: columns of the matrix this row's entry does not list
        "unsupported",
    ]
    assert "| 2.8.0 | 12.8 | pt28cu128 (pinned) | - | 2.8.0 | not built here |" in md
    wheel_line = next(ln for ln in md.splitlines() if ln.startswith("| stable.cu13 | stable |"))
    assert f"| {name} | {SHA} | sm_80 compute_120 |" in wheel_line
    assert "`torch>=2.10`" in wheel_line
    assert "| pt28cu128 | pinned | `torch==2.8.*` |" in md
    assert "not built against torch 2.15.0" in md
    assert "ImportError: a\\|b" in md
    negative = next(ln for ln in md.splitlines() if ln.startswith("| stable.cu13 | 2.10.0 |"))
    assert f"| `{SHA[:12]}` |" in negative
    assert "Run: 2026-11-23T05:00:00Z, commit `abc`, on h, 1m01s." in md


def test_a_kept_row_gets_the_python_columns_added_since() -> None:
    """The 2.8.0 row (no cp314 wheel) keeps its results when 3.14 and 3.15 join the table's
    columns: its entry gains those cells as unsupported instead of lacking them."""
    rows = matrix.load_rows()
    old = entry("2.8.0", "12.8", list(rows[0].pythons))
    old["cells"] = {p: c for p, c in old["cells"].items() if p not in ("3.14", "3.15")}
    previous = {"format": render.FORMAT, "rows": [old], "wheels": [], "negatives": []}
    cells = render.merge_previous(nothing(), previous, rows)["rows"][0]["cells"]
    assert cells["3.12"]["status"] == PASS
    assert cells["3.14"] == {
        "status": UNSUPPORTED,
        "reason": "torch 2.8.0 has no wheel for Python 3.14",
    }
    assert set(cells) == set(plan.ALL_PYTHONS)
