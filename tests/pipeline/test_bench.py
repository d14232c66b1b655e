"""nox -s bench: which wheel it installs and what it passes to the benchmark."""

from __future__ import annotations

from pathlib import Path

import pytest

from scripts import bench, matrix


def touch(folder: Path, name: str) -> Path:
    path = folder / name
    path.write_bytes(b"")
    return path


def test_default_is_the_newest_rows_wheel(tmp_path: Path) -> None:
    newest = matrix.load_rows()[-1]
    touch(tmp_path, "hotloop-0.1.0+pt29cu128-cp39-abi3-manylinux_2_28_x86_64.whl")
    wanted = touch(tmp_path, f"hotloop-0.1.0+{newest.variant}-cp39-abi3-manylinux_2_28_x86_64.whl")
    wheel, rest = bench.plan(["--wheelhouse", str(tmp_path), "--quick", "--only", "triton"])
    assert wheel == wanted
    assert rest == ["--quick", "--only", "triton"]


def test_torch_picks_the_wheel_serving_that_row(tmp_path: Path) -> None:
    stable = touch(tmp_path, "hotloop-0.1.0+stable.cu13-cp39-abi3-manylinux_2_28_x86_64.whl")
    pinned = touch(tmp_path, "hotloop-0.1.0+pt29cu128-cp39-abi3-manylinux_2_28_x86_64.whl")
    assert bench.plan(["--torch", "2.11", "--wheelhouse", str(tmp_path)]) == (stable, [])
    assert bench.plan(["--torch", "2.15", "--wheelhouse", str(tmp_path)]) == (stable, [])
    assert bench.plan(["--torch", "2.9", "--wheelhouse", str(tmp_path)]) == (pinned, [])


def test_missing_wheel_says_how_to_build_it(tmp_path: Path) -> None:
    expected = r"no wheel for stable\.cu13 .*nox -s wheels -- --torch 2.11"
    with pytest.raises(SystemExit, match=expected):
        bench.plan(["--torch", "2.11", "--wheelhouse", str(tmp_path)])


def test_explicit_wheel_must_exist(tmp_path: Path) -> None:
    wheel = touch(tmp_path, "hotloop-0.1.0+pt212cu130-cp39-abi3-manylinux_2_28_x86_64.whl")
    assert bench.plan(["--wheel", str(wheel), "--scale", "0.25"]) == (wheel, ["--scale", "0.25"])
    with pytest.raises(SystemExit, match="no such file"):
        bench.plan(["--wheel", str(tmp_path / "missing.whl")])
