"""The end-of-run table and JSON."""

from __future__ import annotations

import json

from scripts import report


def cells() -> list[report.CellReport]:
    good = report.CellReport(
        "pt214cu130", "2.14.1", "13.0", status="passed", stage="done",
        wheel="hotloop-0.1.0+pt214cu130-cp39-abi3-manylinux_2_24_x86_64.manylinux_2_28_x86_64.whl",
        size_bytes=3 * 1024 * 1024, tag="cp39-abi3-manylinux_2_24_x86_64.manylinux_2_28_x86_64",
        audit="ok (GLIBCXX_3.4.21, GLIBC_2.14)", build_seconds=125.0,
        archs=["compute_120", "sm_80", "sm_90"],
        tests=[{"python": "3.10", "status": "passed"}, {"python": "3.13", "status": "failed"}],
    )  # fmt: skip
    bad = report.CellReport(
        "pt211cu130", "2.11.0", "13.0", stage="repair/audit", error="x: glibc-version"
    )
    return [good, bad]


def test_table_has_every_cell_and_column():
    table = report.render_table(cells())
    lines = table.splitlines()
    assert lines[0].startswith("| cell ")
    assert "tests per Python" in lines[0]
    assert "| pt214cu130 | passed " in lines[2]
    assert "3.0 MiB" in lines[2]
    assert "3.10 passed, 3.13 failed" in lines[2]
    assert "| compute_120 sm_80 sm_90 |" in lines[2]
    assert "| none " in lines[3]
    assert "2m05s" in lines[2]
    assert "failed (repair/audit)" in lines[3]
    assert len({len(line) for line in lines}) == 1  # aligned


def test_json_round_trip(tmp_path):
    path = report.write_run_report(tmp_path, cells(), {"commit": "abc"})
    data = json.loads(path.read_text())
    assert data["commit"] == "abc"
    assert [c["variant"] for c in data["cells"]] == ["pt214cu130", "pt211cu130"]
    assert (tmp_path / "report.md").read_text().startswith("| cell")
    cell_json = report.write_cell_json(tmp_path, cells()[1])
    assert json.loads(cell_json.read_text())["error"] == "x: glibc-version"


def test_helpers():
    assert report.human_size(None) == "-"
    assert report.human_size(512) == "512 B"
    assert report.seconds(59.4) == "59s"
    assert report.tests_cell([]) == "skipped"


def test_tests_say_where_each_python_came_from():
    tests = [
        {"python": "3.12", "status": "passed", "source": "host (pyenv)"},
        {"python": "3.14", "status": "passed", "source": "container (Debian sid root)"},
    ]
    assert report.tests_cell(tests) == (
        "3.12 passed: host (pyenv), 3.14 passed: container (Debian sid root)"
    )
