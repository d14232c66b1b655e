"""The build matrix table (scripts.matrix.table, re-exported as scripts.matrix): rows,
selection, labels, and the GitHub matrix."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from scripts import matrix
from scripts.matrix import table

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def rows() -> list[matrix.Row]:
    return matrix.load_rows()


def test_rows_match_the_design(rows):
    table = {r.torch: (r.cuda, r.pythons[0], r.pythons[-1]) for r in rows}
    assert table == {
        "2.8.0": ("12.8", "3.9", "3.13"),  # no cp314 wheel
        "2.9.1": ("12.8", "3.10", "3.14"),
        "2.10.0": ("12.8", "3.10", "3.14"),  # PyPI metadata: nvidia-cuda-runtime-cu12==12.8.90
        "2.11.0": ("13.0", "3.10", "3.14"),
        "2.12.1": ("13.0", "3.10", "3.14"),
        "2.13.0": ("13.0", "3.10", "3.14"),
        "2.14.1": ("13.0", "3.10", "3.14"),
        "2.15.0": ("13.2", "3.11", "3.15"),  # cp311..cp315
    }


def test_python_39_only_with_torch_28(rows):
    assert [r.torch for r in rows if "3.9" in r.pythons] == ["2.8.0"]


def test_toolkits_are_pinned_exactly_and_match_the_build_rows_cuda(rows):
    for row in rows:
        builder = matrix.build_row_of(row, rows)
        toolkit = row.toolkit
        # Same CUDA major as torch's runtime, never a newer minor (minor-version compatibility).
        nvcc = tuple(int(p) for p in toolkit.nvcc.split("."))
        runtime = tuple(int(p) for p in builder.cuda.split("."))
        assert nvcc[0] == runtime[0], row
        assert nvcc <= runtime, row
        for spec in toolkit.packages:
            name, _, version = spec.partition("==")
            assert version.startswith(toolkit.nvcc + "."), spec
            assert name.endswith("-cu12") == builder.cuda.startswith("12."), spec
        for pin in toolkit.debs:
            assert len(pin.sha256) == 64, pin


def test_labels(rows):
    by_torch = {r.torch: r for r in rows}
    assert by_torch["2.11.0"].variant == "stable.cu13"
    assert by_torch["2.11.0"].version == "0.1.0+stable.cu13"
    assert by_torch["2.11.0"].requires_torch == "torch>=2.10"
    assert by_torch["2.10.0"].variant == "stable.cu12"
    assert by_torch["2.9.1"].variant == "pt29cu128"
    assert by_torch["2.9.1"].requires_torch == "torch==2.9.*"
    assert by_torch["2.8.0"].variant == "pt28cu128"
    assert matrix.variant_label("2.14.1+cpu", None) == "stable.cpu"
    assert matrix.variant_label("2.9.1+cpu", None) == "pt29cpu"


def test_one_wheel_per_cuda_major_from_the_stable_floor_on(rows):
    assert {r.torch: r.build_torch for r in rows} == {
        "2.8.0": "2.8.0",
        "2.9.1": "2.9.1",
        "2.10.0": "2.10.0",
        "2.11.0": "2.11.0",
        "2.12.1": "2.11.0",
        "2.13.0": "2.11.0",
        "2.14.1": "2.11.0",
        "2.15.0": "2.11.0",  # released after the build torch: never built against
    }
    assert [r.variant for r in matrix.build_rows(rows)] == [
        "pt28cu128", "pt29cu128", "stable.cu12", "stable.cu13",
    ]  # fmt: skip


def test_archs():
    assert matrix.archs_from_list("8.0;8.6;8.9;9.0;10.0;12.0+PTX") == [
        "sm_80", "sm_86", "sm_89", "sm_90", "sm_100", "sm_120", "compute_120",
    ]  # fmt: skip


def test_archs_in_cmakes_spelling():
    """What CUDAARCHS gives a CMake build: cubins alone, except where PTX is asked for too."""
    cmake = matrix.cmake_cuda_architectures("8.0;9.0 10.0;12.0+PTX")
    assert cmake == "80-real;90-real;100-real;120"
    assert matrix.cmake_cuda_architectures("9.0a") == "90a-real"


def test_selection(rows):
    assert [r.torch for r in matrix.select_rows(rows)] == ["2.15.0"]
    assert [r.torch for r in matrix.select_rows(rows, "2.11")] == ["2.11.0"]
    assert [r.torch for r in matrix.select_rows(rows, ["2.8.0", "2.11"])] == ["2.8.0", "2.11.0"]
    assert matrix.select_rows(rows, all_rows=True) == rows
    with pytest.raises(SystemExit, match=r"no build-matrix row for torch '2\.7'"):
        matrix.select_rows(rows, "2.7")


def test_github_json_equals_table(rows, capsys):
    assert table.main(["--github-json"]) == 0
    data = json.loads(capsys.readouterr().out)
    builds = matrix.build_rows(rows)
    assert [c["torch"] for c in data["include"]] == [r.torch for r in builds]
    for cell, row in zip(data["include"], builds):
        assert cell["variant"] == row.variant
        assert cell["cuda"] == row.cuda
        assert cell["pythons"].split() == list(row.pythons)
        assert cell["arch-list"] == row.arch_list
        assert cell["serves"].split() == [r.torch for r in rows if r.variant == row.variant]


def test_github_json_selection(capsys):
    assert table.main(["--github-json", "--torch", "2.15"]) == 0
    cells = json.loads(capsys.readouterr().out)["include"]
    assert [(c["variant"], c["torch"], c["serves"]) for c in cells] == [
        ("stable.cu13", "2.11.0", "2.15.0")
    ]


def test_variant_wheels_are_that_labels_only(tmp_path):
    names = [
        "hotloop-0.1.0+stable.cu13-cp39-abi3-manylinux_2_28_x86_64.whl",
        "hotloop-0.1.0+stable.cu13-cp39-abi3-manylinux_2_24_x86_64.manylinux_2_28_x86_64.whl",
        "hotloop-0.1.0+stable.cu12-cp39-abi3-manylinux_2_28_x86_64.whl",
        "other-0.1.0+stable.cu13-cp39-abi3-manylinux_2_28_x86_64.whl",
    ]
    for name in names:
        (tmp_path / name).write_bytes(b"")
    assert [w.name for w in matrix.variant_wheels(tmp_path, "stable.cu13")] == sorted(names[:2])


def test_the_table_imports_without_the_run() -> None:
    """The workflow's matrix job reads the table with a bare Python: importing it must not
    pull in the compatibility run (which needs the pipeline's tools)."""
    code = (
        "import sys; from scripts import matrix; matrix.load_rows(); "
        "print(sorted(m for m in sys.modules if m.startswith('scripts.matrix')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "['scripts.matrix', 'scripts.matrix.model', 'scripts.matrix.table']"


def test_python_m_scripts_matrix_table_prints_the_rows() -> None:
    proc = subprocess.run(
        [sys.executable, "-W", "error", "-m", "scripts.matrix", "table", "--all"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    lines = proc.stdout.splitlines()
    assert len(lines) == len(matrix.load_rows())
    assert lines[-1].startswith("stable.cu13  torch 2.15.0")
    assert "served by the wheel built against torch 2.11.0" in lines[-1]
    assert proc.stderr == ""


def test_pinned_turns_a_stable_row_into_its_own_aten_build(rows):
    row = matrix.select_rows(rows, "2.15")[0]
    pinned = row.pinned()
    assert (pinned.variant, pinned.requires_torch, pinned.kind) == (
        "pt215cu132",
        "torch==2.15.*",
        "pinned",
    )
    assert pinned.is_build
    assert matrix.build_rows([pinned], [pinned]) == [pinned]
    assert row.variant == "stable.cu13"  # the table's row is unchanged
