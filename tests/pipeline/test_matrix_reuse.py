"""scripts.matrix.reuse: a wheel is reused only while it was built from the current sources."""

from __future__ import annotations

from pathlib import Path

import pytest

from scripts import matrix, toolchain
from scripts.matrix import render, reuse
from scripts.matrix.results import NOT_BUILT


@pytest.fixture
def wheel_in(wheel_factory, newest_row, build_info_for):
    def make(folder: Path, commit: str = "0" * 40) -> Path:
        wheel = wheel_factory(build_info=build_info_for(newest_row, git_commit=commit))
        folder.mkdir(parents=True, exist_ok=True)
        return wheel.rename(folder / wheel.name)

    return make


def builder_of(row: matrix.Row) -> matrix.Row:
    return matrix.build_row_of(row, matrix.load_rows())


def test_wheel_with_matching_record_is_reused(tmp_path, wheel_in, newest_row) -> None:
    wheel = wheel_in(tmp_path / "store")
    reuse.write_sidecar(wheel, "abc")
    choice = reuse.find_reusable_wheel(newest_row.variant, [tmp_path / "store"], "abc")
    assert choice.wheel == wheel


def test_wheel_from_other_sources_is_rebuilt(tmp_path, wheel_in, newest_row) -> None:
    wheel = wheel_in(tmp_path / "store")
    reuse.write_sidecar(wheel, "abc")
    choice = reuse.find_reusable_wheel(
        newest_row.variant, [tmp_path / "store"], "def", commit_ok=lambda c: True
    )
    assert choice.wheel is None
    assert "other sources" in choice.why


def test_wheel_changed_after_its_record_is_rebuilt(tmp_path, wheel_in, newest_row) -> None:
    wheel = wheel_in(tmp_path / "store")
    reuse.write_sidecar(wheel, "abc")
    with wheel.open("ab") as fh:
        fh.write(b"\0")
    choice = reuse.find_reusable_wheel(newest_row.variant, [tmp_path / "store"], "abc")
    assert choice.wheel is None
    assert "changed" in choice.why


def test_wheel_without_record_needs_a_clean_matching_commit(tmp_path, wheel_in, newest_row):
    wheel = wheel_in(tmp_path / "wheelhouse", commit="a" * 40)
    seen = []

    def commit_ok(commit: str) -> bool:
        seen.append(commit)
        return commit == "a" * 40

    choice = reuse.find_reusable_wheel(
        newest_row.variant, [tmp_path / "wheelhouse"], "x", commit_ok
    )
    assert choice.wheel == wheel
    assert seen == ["a" * 40]
    refused = reuse.find_reusable_wheel(
        newest_row.variant, [tmp_path / "wheelhouse"], "x", lambda c: False
    )
    assert refused.wheel is None
    assert "sources changed" in refused.why


def test_dirty_or_unknown_commits_never_match() -> None:
    assert not reuse.commit_matches_tree("a" * 40 + "-dirty")
    assert not reuse.commit_matches_tree("unknown")


def test_other_variants_are_ignored(tmp_path, wheel_in) -> None:
    wheel = wheel_in(tmp_path / "store")
    reuse.write_sidecar(wheel, "abc")
    assert reuse.find_reusable_wheel("pt211cu130", [tmp_path / "store"], "abc").wheel is None


def test_read_build_info_from_the_wheel(tmp_path, wheel_in, newest_row) -> None:
    info = reuse.read_build_info(wheel_in(tmp_path / "w", commit="b" * 40))
    assert info["git_commit"] == "b" * 40
    assert info["torch_minor"] == newest_row.torch_minor


def test_not_built_reason_from_the_toolkit_error() -> None:
    exc = toolchain.ToolkitError(
        "CUDA 12.8: the PyPI packages [...] ship no bin/nvcc (bin/ holds only ['ptxas']); "
        "point HOTLOOP_CUDA_HOME_12_8 at a CUDA 12.8 toolkit to build this row"
    )
    reason = reuse.not_built_reason(exc)
    assert "no nvcc" in reason
    assert "HOTLOOP_CUDA_HOME_12_8" in reason


def test_a_wheel_without_toolkit_is_not_built_here(monkeypatch, tmp_path) -> None:
    def no_toolkit(cuda, packages):
        raise toolchain.ToolkitError("ship no bin/nvcc; point HOTLOOP_CUDA_HOME_12_8 at a kit")

    monkeypatch.setattr(reuse.toolchain, "ensure_cuda_toolkit", no_toolkit)
    state = reuse.WheelState(matrix.load_rows()[0])
    reuse.obtain_wheel(state, tmp_path, [], force=False)
    assert state.wheel is None
    assert state.status == NOT_BUILT
    assert "HOTLOOP_CUDA_HOME_12_8" in state.reason


def test_reuse_any_takes_the_newest_wheel_whatever_its_sources(tmp_path, wheel_in, monkeypatch):
    monkeypatch.setenv("HOTLOOP_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(
        reuse.toolchain, "ensure_cuda_toolkit", lambda *a: pytest.fail("must not build")
    )
    wheel = wheel_in(tmp_path / "store", commit="c" * 40 + "-dirty")
    state = reuse.WheelState(builder_of(matrix.load_rows()[-1]))
    reuse.obtain_wheel(state, tmp_path / "store", [], force=False, reuse_any=True)
    assert state.wheel == wheel
    assert state.status == reuse.REUSED_AS_IS
    assert "--reuse-any" in state.reason


def test_the_wheel_entry_names_what_it_serves() -> None:
    rows = matrix.load_rows()
    builder = builder_of(rows[-1])
    entry = reuse.WheelState(builder, ("2.11.0", "2.15.0")).as_dict()
    assert entry["variant"] == "stable.cu13"
    assert entry["kind"] == "stable"
    assert entry["requires_torch"] == "torch>=2.10"
    assert entry["build_torch"] == "2.11.0"
    assert entry["serves"] == ["2.11.0", "2.15.0"]


def test_a_wheel_past_the_deadline_says_why_once(tmp_path, monkeypatch) -> None:
    """The table showed "not run (time (deadline reached before the build))": the cell's
    parentheses around a reason that had its own."""
    monkeypatch.setenv("HOTLOOP_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(reuse.toolchain, "ensure_cuda_toolkit", lambda *a: None)
    state = reuse.WheelState(builder_of(matrix.load_rows()[-1]))
    reuse.obtain_wheel(state, tmp_path / "store", [], force=False, may_build=False)
    assert state.wheel is None
    cell = {"status": state.status, "reason": state.reason}
    assert render.cell_text(cell) == "not run (deadline reached before the build)"
