"""The cell runner of `nox -s wheels`, with build/repair/test replaced by fakes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scripts import audit, basics, build, toolchain, wheels, wheeltest
from scripts.interpreters import Interpreter


@pytest.fixture
def fake_pipeline(monkeypatch, tmp_path, wheel_factory, newest_row):
    """Replace the expensive steps; returns a dict the test edits to make one step fail."""
    failures: dict[str, str] = {}
    monkeypatch.setenv("HOTLOOP_CACHE_DIR", str(tmp_path / "cache"))
    interp = Interpreter("3.12", Path("/usr/bin/python3.12"), "PATH")
    monkeypatch.setattr(
        wheels, "find_interpreters", lambda versions: dict.fromkeys(versions, interp)
    )
    monkeypatch.setattr(wheels.toolchain, "ensure_cuda_toolkit", lambda cuda, pkgs: tmp_path)
    monkeypatch.setattr(wheels.toolchain, "ensure_sysroot", lambda: tmp_path)
    monkeypatch.setattr(wheels.toolchain, "ensure_ccache", lambda: None)
    monkeypatch.setattr(build, "site_packages", lambda python: tmp_path)

    def fake_build(row, workdir, tools, interp):
        if "build" in failures:
            raise build.BuildError(failures["build"])
        return build.BuildResult(wheel_factory(tag="cp39-abi3-linux_x86_64"), 1.0, tmp_path / "log")

    def fake_repair(wheel, out_dir, row, site, finalize=None):
        if "audit" in failures:
            raise audit.AuditError(failures["audit"])
        return wheel_factory(), audit.AuditReport(wheel.name, max_versions={"GLIBC": "GLIBC_2.14"})

    def fake_tests(torch, wheel, interpreters, workdir):
        status = "failed" if "test" in failures else "passed"
        return [wheeltest.PythonTestResult(v, status, summary="1 failed") for v in interpreters]

    monkeypatch.setattr(build, "build_wheel", fake_build)
    monkeypatch.setattr(audit, "repair_and_audit", fake_repair)
    monkeypatch.setattr(wheels, "run_op_tests", fake_tests)
    return failures


def test_passing_cell_puts_wheel_and_json_in_out(fake_pipeline, tmp_path, newest_row):
    out = tmp_path / "out"
    assert wheels.main(["--out", str(out)]) == 0
    assert [p.name for p in out.glob("*.whl")] == [
        f"hotloop-{newest_row.version}-cp39-abi3-manylinux_2_28_x86_64.whl"
    ]
    cell = json.loads((out / f"{newest_row.variant}.json").read_text())
    assert cell["status"] == "passed"
    assert [t["python"] for t in cell["tests"]] == list(newest_row.pythons)
    assert (
        json.loads((out / "report.json").read_text())["cells"][0]["variant"] == newest_row.variant
    )


def test_a_cell_whose_work_folder_another_run_holds_stops_before_building(
    fake_pipeline, tmp_path, newest_row
):
    held = toolchain.cache_dir() / "work" / newest_row.variant
    with basics.exclusive_folder(held), pytest.raises(basics.FolderInUse, match="HOTLOOP_CACHE"):
        wheels.run_cell(newest_row, tmp_path / "out", None, skip_tests=False)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("stage", ["build", "audit", "test"])
def test_failed_cell_keeps_the_last_good_wheel(fake_pipeline, tmp_path, newest_row, stage):
    out = tmp_path / "out"
    assert wheels.main(["--out", str(out)]) == 0  # an earlier good wheel of this variant ...
    good = sorted(out.glob("*.whl"))
    fake_pipeline[stage] = f"{stage} broke"
    assert wheels.main(["--out", str(out)]) == 1
    assert sorted(out.glob("*.whl")) == good  # ... stays: only a passing wheel replaces it
    cell = json.loads((out / f"{newest_row.variant}.json").read_text())
    assert cell["status"] == "failed"
    assert stage in cell["stage"]
    assert f"kept the earlier wheel that passed: {good[0].name}" in cell["error"]


def test_passing_cell_replaces_only_the_file_it_writes(fake_pipeline, tmp_path, newest_row):
    """--out may be a folder of releases: older wheels of the same variant stay there."""
    out = tmp_path / "out"
    out.mkdir()
    older = out / f"hotloop-0.0.9+{newest_row.variant}-cp39-abi3-manylinux_2_28_x86_64.whl"
    older.write_bytes(b"an older release")
    same = out / f"hotloop-{newest_row.version}-cp39-abi3-manylinux_2_28_x86_64.whl"
    same.write_bytes(b"the last build of this version")
    assert wheels.main(["--out", str(out)]) == 0
    assert older.read_bytes() == b"an older release"
    assert same.read_bytes().startswith(b"PK")  # the new build took its own name's place
    assert sorted(p.name for p in out.glob("*.whl")) == sorted([older.name, same.name])


@pytest.mark.parametrize("name", ["report.md", "report.json", "VARIANT.json"])
def test_report_files_it_did_not_write_stop_the_run(fake_pipeline, tmp_path, newest_row, name):
    out = tmp_path / "out"
    out.mkdir()
    theirs = out / name.replace("VARIANT", newest_row.variant)
    theirs.write_text("# my notes\n")
    assert wheels.main(["--out", str(out)]) == 2
    assert [p.name for p in out.iterdir()] == [theirs.name]
    assert theirs.read_text() == "# my notes\n"
    # What a run wrote, a later run may write again.
    theirs.unlink()
    assert wheels.main(["--out", str(out)]) == 0
    assert wheels.main(["--out", str(out)]) == 0


def test_an_interrupted_run_changes_nothing_in_out(fake_pipeline, tmp_path, monkeypatch):
    out = tmp_path / "out"
    assert wheels.main(["--out", str(out)]) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    def interrupted(row, workdir, tools, interp):
        raise KeyboardInterrupt

    monkeypatch.setattr(build, "build_wheel", interrupted)
    with pytest.raises(KeyboardInterrupt):
        wheels.main(["--out", str(out)])
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_python_option_restricts_tested_pythons(fake_pipeline, tmp_path, newest_row):
    out = tmp_path / "out"
    assert wheels.main(["--out", str(out), "--python", "3.12"]) == 0
    cell = json.loads((out / f"{newest_row.variant}.json").read_text())
    assert [t["python"] for t in cell["tests"]] == ["3.12"]


def test_python_option_outside_the_row_is_an_error(fake_pipeline, tmp_path, newest_row):
    out = tmp_path / "out"
    assert wheels.main(["--out", str(out), "--python", "3.9"]) == 1
    assert (
        "none of --python 3.9"
        in json.loads((out / f"{newest_row.variant}.json").read_text())["error"]
    )


def test_skip_tests(fake_pipeline, tmp_path, newest_row):
    out = tmp_path / "out"
    assert wheels.main(["--out", str(out), "--skip-tests"]) == 0
    assert json.loads((out / f"{newest_row.variant}.json").read_text())["tests"] == []


def test_pinned_option_builds_the_aten_flavour_of_the_row(fake_pipeline, tmp_path, monkeypatch):
    built = []

    def record(row, workdir, tools, interp):
        built.append((row.variant, row.kind, row.torch))
        raise build.BuildError("stop after recording what was asked for")

    monkeypatch.setattr(build, "build_wheel", record)
    out = tmp_path / "out"
    assert wheels.main(["--out", str(out), "--torch", "2.11", "--pinned"]) == 1
    assert built == [("pt211cu130", "pinned", "2.11.0")]
