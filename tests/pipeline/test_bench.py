"""nox -s bench: what it installs, which benchmark it runs and what it passes to it."""

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
    run = bench.plan(["--wheelhouse", str(tmp_path), "--quick", "--only", "triton"])
    assert run == bench.Plan(bench.BENCHMARK, ["--quick", "--only", "triton"], wheel=wanted)


def test_torch_picks_the_wheel_serving_that_row(tmp_path: Path) -> None:
    stable = touch(tmp_path, "hotloop-0.1.0+stable.cu13-cp39-abi3-manylinux_2_28_x86_64.whl")
    pinned = touch(tmp_path, "hotloop-0.1.0+pt29cu128-cp39-abi3-manylinux_2_28_x86_64.whl")
    for torch, wheel in (("2.11", stable), ("2.15", stable), ("2.9", pinned)):
        assert bench.plan(["--torch", torch, "--wheelhouse", str(tmp_path)]).wheel == wheel


def test_missing_wheel_says_how_to_build_it(tmp_path: Path) -> None:
    expected = r"no wheel for stable\.cu13 .*nox -s wheels -- --torch 2.11"
    with pytest.raises(SystemExit, match=expected):
        bench.plan(["--torch", "2.11", "--wheelhouse", str(tmp_path)])


def test_explicit_wheel_must_exist(tmp_path: Path) -> None:
    wheel = touch(tmp_path, "hotloop-0.1.0+pt212cu130-cp39-abi3-manylinux_2_28_x86_64.whl")
    run = bench.plan(["--wheel", str(wheel), "--scale", "0.25"])
    assert run == bench.Plan(bench.BENCHMARK, ["--scale", "0.25"], wheel=wheel)
    with pytest.raises(SystemExit, match="no such file"):
        bench.plan(["--wheel", str(tmp_path / "missing.whl")])


def test_cpu_builds_the_source_tree_against_the_newest_rows_torch(tmp_path: Path) -> None:
    newest = matrix.load_rows()[-1]
    # No wheel is needed: an empty wheelhouse is fine.
    run = bench.plan(["--device", "cpu", "--wheelhouse", str(tmp_path), "--dtype", "float32"])
    assert run == bench.Plan(
        bench.CPU_BENCHMARK, ["--dtype", "float32"], torch=f"torch=={newest.torch}"
    )
    assert bench.cpu_build_env()["HOTLOOP_CUDA"] == "0"


def test_cpu_takes_a_rows_torch() -> None:
    run = bench.plan(["--device", "cpu", "--torch", "2.11"])
    assert run.torch == "torch==2.11.0"
    assert run.wheel is None


def test_cpu_refuses_a_wheel(tmp_path: Path) -> None:
    wheel = touch(tmp_path, "hotloop-0.1.0+stable.cu13-cp39-abi3-manylinux_2_28_x86_64.whl")
    with pytest.raises(SystemExit, match="--device cpu builds the source tree"):
        bench.plan(["--device", "cpu", "--wheel", str(wheel)])


def test_benchmarks_exist() -> None:
    for script in (bench.BENCHMARK, bench.CPU_BENCHMARK):
        assert (Path(__file__).resolve().parents[2] / script).is_file()
