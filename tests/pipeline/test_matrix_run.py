"""scripts.matrix.run with builds, test cells and negatives faked: one wheel file per CUDA
major is got once and tested with every torch it serves; reruns redo only what changed."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from scripts import diskspace, matrix, wheeltest
from scripts.interpreters import Interpreter
from scripts.matrix import plan, render, reuse, run, schedule
from scripts.matrix.results import FAIL, NOT_BUILT, NOT_RUN, PASS, UNSUPPORTED

STABLE_CU13 = ["2.11.0", "2.12.1", "2.13.0", "2.14.1", "2.15.0"]


@pytest.fixture
def fake_run(monkeypatch, tmp_path, wheel_factory, build_info_for):
    """run_matrix with builds, test cells and negatives replaced; records what it ran."""
    monkeypatch.setenv("HOTLOOP_CACHE_DIR", str(tmp_path / "cache"))
    calls: dict[str, list] = {
        "build": [],
        "test": [],
        "negative": [],
        "missing": [],
        "no root": [],
    }
    lock = threading.Lock()

    def find(versions, container=False):
        """3.14 and 3.15 come from the Debian root (calls["no root"]: the reason it can't)."""
        assert container  # the matrix asks for the root's Pythons too
        found: dict = {}
        reasons = {}
        for v in versions:
            if v in calls["missing"]:
                found[v] = None
                reasons[v] = f"no Python {v} on this machine"
            elif v in ("3.14", "3.15") and calls["no root"]:
                found[v] = None
                reasons[v] = f"no Python {v} on this machine, and none from the Debian root: "
                reasons[v] += calls["no root"][0]
            elif v in ("3.14", "3.15"):
                found[v] = Interpreter(
                    v, Path(f"/usr/bin/python{v}"), "container", "Debian sid root", Path("/r")
                )
            else:
                found[v] = Interpreter(v, Path(f"/usr/bin/python{v}"), "PATH")
        return found, reasons

    def fake_obtain(state, store, extra_dirs, force, may_build=True, reuse_any=False):
        r = state.row
        with lock:
            calls["build"].append(r.variant)
        if r.cuda.startswith("12"):
            state.status, state.reason = NOT_BUILT, "no nvcc here"
            return
        existing = matrix.variant_wheels(store, r.variant)
        if existing:  # a rerun reuses the same file (same sha256)
            state.wheel, state.status = existing[0], reuse.REUSED
            return
        if not may_build:
            state.status, state.reason = NOT_RUN, "time"
            return
        wheel = wheel_factory(version=r.version, build_info=build_info_for(r))
        store.mkdir(parents=True, exist_ok=True)
        state.wheel, state.status = wheel.rename(store / wheel.name), reuse.BUILT

    def fake_tests(torch_spec, wheel, i, workdir):
        with lock:
            calls["test"].append((torch_spec, wheel.name, i.version))
        failed = (torch_spec, i.version) == ("torch==2.12.1", "3.10")
        status = "failed" if failed else "passed"
        return wheeltest.PythonTestResult(i.version, status, str(i.path), "PATH", "9 passed", 1.0)

    def fake_negative(negative, wheel, i, workdir):
        with lock:
            calls["negative"].append((negative.pair.name, wheel.name))
        return [
            {
                "wheel": wheel.name,
                "variant": negative.pair.variant,
                "venv_torch": negative.pair.torch_version,
                "python": i.version,
                "check": "import guard after --no-deps",
                "expected": f"ImportError: {negative.why}",
                "status": PASS,
                "detail": "ImportError: ...",
            }
        ]

    monkeypatch.setattr(run, "find_with_reasons", find)
    monkeypatch.setattr(run, "obtain_wheel", fake_obtain)
    monkeypatch.setattr(wheeltest, "run_op_tests_in_venv", fake_tests)
    monkeypatch.setattr(run, "run_negative", fake_negative)
    # This machine's free disk is no part of these tests.
    monkeypatch.setattr(run.build, "uv_cache_dir", lambda: tmp_path / "uv")
    monkeypatch.setattr(schedule.diskspace, "free_bytes", lambda path: 2**40)
    return calls


def test_one_wheel_file_per_cuda_major_is_tested_with_every_torch_it_serves(fake_run) -> None:
    report = run.run_matrix(run.parse_args([]))
    assert sorted(fake_run["build"]) == ["pt28cu128", "pt29cu128", "stable.cu12", "stable.cu13"]
    wheel = report["wheels"]["stable.cu13"]
    assert wheel["build_torch"] == "2.11.0"
    assert wheel["serves"] == STABLE_CU13
    assert "+stable.cu13-" in wheel["wheel"]
    assert len(wheel["wheel_sha256"]) == 64
    tested_torch = {spec.removeprefix("torch==") for spec, name, _ in fake_run["test"]}
    assert tested_torch == set(STABLE_CU13)
    assert {name for _, name, _ in fake_run["test"]} == {wheel["wheel"]}
    for torch in STABLE_CU13:
        row = report["rows"][torch]
        assert row["variant"] == "stable.cu13"
        assert row["build_torch"] == "2.11.0"
        for py in row["pythons"]:
            cell = row["cells"][py]
            assert cell["wheel_sha256"] == wheel["wheel_sha256"], (torch, py)
            assert cell["wheel"] == wheel["wheel"]
    assert report["rows"]["2.15.0"]["cells"]["3.10"]["status"] == UNSUPPORTED
    assert report["rows"]["2.15.0"]["cells"]["3.13"]["status"] == PASS
    assert report["rows"]["2.12.1"]["cells"]["3.10"]["status"] == FAIL
    # The CUDA 12 wheels are not built here: their rows say so, not "fail".
    assert report["rows"]["2.10.0"]["cells"]["3.12"]["status"] == NOT_BUILT
    assert report["rows"]["2.8.0"]["cells"]["3.9"]["status"] == NOT_BUILT


def test_negatives_run_once_their_wheel_exists(fake_run) -> None:
    report = run.run_matrix(run.parse_args([]))
    assert sorted(name for name, _ in fake_run["negative"]) == [
        "stable.cu13-torch2.10.0",
        "stable.cu13-torch2.11.0+cpu",
        "stable.cu13-torch2.9.1",
    ]
    pinned = [n for n in report["negatives"] if n["variant"] == "pt29cu128"]
    assert [(n["venv_torch"], n["status"]) for n in pinned] == [("2.11.0", NOT_RUN)]
    assert "no nvcc here" in pinned[0]["detail"]
    # Each check that ran names the wheel file it tested by sha256, as the test cells do.
    sha = report["wheels"]["stable.cu13"]["wheel_sha256"]
    ran = [n for n in report["negatives"] if n["status"] == PASS]
    assert len(ran) == 3
    assert {n["wheel_sha256"] for n in ran} == {sha}
    # A recorded pass reused by a rerun keeps it.
    again = run.run_matrix(run.parse_args([]))
    assert {n["wheel_sha256"] for n in again["negatives"] if n["status"] == PASS} == {sha}


def test_a_rerun_redoes_only_what_failed(fake_run) -> None:
    run.run_matrix(run.parse_args([]))
    fake_run["test"].clear()
    fake_run["negative"].clear()
    again = run.run_matrix(run.parse_args([]))
    assert [(spec, py) for spec, _, py in fake_run["test"]] == [("torch==2.12.1", "3.10")]
    assert fake_run["negative"] == []
    assert again["rows"]["2.14.1"]["cells"]["3.12"]["reused"] is True
    assert len(again["rows"]["2.14.1"]["cells"]["3.12"]["wheel_sha256"]) == 64


def test_a_python_this_machine_lacks_is_not_run(fake_run) -> None:
    fake_run["missing"].append("3.13")
    report = run.run_matrix(run.parse_args(["--torch", "2.15"]))
    cell = report["rows"]["2.15.0"]["cells"]["3.13"]
    assert cell == {"status": NOT_RUN, "reason": "no Python 3.13 on this machine"}


def test_restricted_run_keeps_the_other_rows(fake_run, tmp_path) -> None:
    docs = tmp_path / "docs"
    rows = matrix.load_rows()
    render.write_outputs(
        render.merge_previous(run.run_matrix(run.parse_args([])), None, rows), docs
    )
    fake_run["test"].clear()
    report = run.run_matrix(run.parse_args(["--torch", "2.15", "--python", "3.12"]))
    assert fake_run["test"] == []  # its one selected cell passed before: reused
    assert list(report["rows"]) == ["2.15.0"]
    assert list(report["wheels"]) == ["stable.cu13"]
    merged = render.merge_previous(report, render.load_previous(docs), rows)
    assert [r["torch"] for r in merged["rows"]] == [r.torch for r in rows]
    assert [w["variant"] for w in merged["wheels"]] == [b.variant for b in matrix.build_rows(rows)]
    by = {r["torch"]: r for r in merged["rows"]}
    assert by["2.15.0"]["cells"]["3.13"]["status"] == NOT_RUN  # not selected this time
    assert by["2.11.0"]["cells"]["3.10"]["status"] == PASS  # from the previous table
    assert len([n for n in merged["negatives"] if n["variant"] == "pt29cu128"]) == 1


def test_deadline_leaves_cells_not_run(fake_run) -> None:
    run.run_matrix(run.parse_args(["--torch", "2.14", "--python", "3.14"]))  # the wheel
    fake_run["test"].clear()
    args = ["--deadline", "+0", "--torch", "2.14", "--python", "3.10", "--python", "3.11"]
    cells = run.run_matrix(run.parse_args(args))["rows"]["2.14.1"]["cells"]
    assert {cells[p]["status"] for p in ("3.10", "3.11", "3.12", "3.13")} == {NOT_RUN}
    assert fake_run["test"] == []
    # Each reason reads once, in the cell's one pair of parentheses.
    assert render.cell_text(cells["3.10"]) == "not run (deadline reached)"
    assert render.cell_text(cells["3.12"]) == "not run (not selected with --python)"


def test_past_the_deadline_recorded_results_still_count(fake_run) -> None:
    run.run_matrix(run.parse_args(["--torch", "2.14"]))  # builds and passes
    fake_run["test"].clear()
    report = run.run_matrix(run.parse_args(["--deadline", "+0", "--torch", "2.14"]))
    cells = report["rows"]["2.14.1"]["cells"]
    assert {cells[p]["status"] for p in ("3.10", "3.11", "3.12", "3.13")} == {PASS}
    assert fake_run["test"] == []


def test_dry_run_prints_the_plan_and_runs_nothing(fake_run, capsys) -> None:
    assert run.main(["--dry-run", "--torch", "2.15"]) == 0
    out = capsys.readouterr().out
    assert "stable.cu13 (stable, torch>=2.10): one wheel, built against torch 2.11.0" in out
    assert "not built against 2.15.0" in out
    assert "stable.cu13 with torch 2.10.0: a CUDA 12.8 torch next to a CUDA 13 wheel" in out
    assert fake_run["build"] == fake_run["test"] == fake_run["negative"] == []


def test_every_cell_the_plan_tests_gets_a_result(fake_run) -> None:
    rows = matrix.load_rows()
    report = run.run_matrix(run.parse_args([]))
    for row in rows:
        planned = {c.python for c in plan.plan_row(row, None)}
        assert set(report["rows"][row.torch]["cells"]) == planned, row.torch


def test_a_cell_the_machine_cannot_run_does_not_lose_the_run(fake_run, monkeypatch) -> None:
    """A full disk (seen in this run: OSError 28 writing a cell's log) stopped the whole run
    before it wrote the table. The cell says why it has no result; the others go on."""
    passing = wheeltest.run_op_tests_in_venv

    def disk_full(torch_spec, wheel, i, workdir):
        if (torch_spec, i.version) == ("torch==2.13.0", "3.11"):
            raise OSError(28, "No space left on device")
        if (torch_spec, i.version) == ("torch==2.13.0", "3.13"):
            # the venv's free-space check (scripts.diskspace) refuses the torch install
            raise diskspace.DiskSpaceError("uv: 1.0 GiB free, but a torch wheel needs 4.0 GiB")
        return passing(torch_spec, wheel, i, workdir)

    monkeypatch.setattr(wheeltest, "run_op_tests_in_venv", disk_full)
    report = run.run_matrix(run.parse_args(["--torch", "2.13"]))
    cells = report["rows"]["2.13.0"]["cells"]
    assert cells["3.11"]["status"] == NOT_RUN
    assert "No space left on device" in cells["3.11"]["reason"]
    assert cells["3.13"] == {
        "status": NOT_RUN,
        "reason": "the cell could not run here: uv: 1.0 GiB free, but a torch wheel needs 4.0 GiB",
    }
    assert {cells[p]["status"] for p in ("3.10", "3.12")} == {PASS}
    # Not recorded: the next run tries it again.
    fake_run["test"].clear()
    monkeypatch.setattr(wheeltest, "run_op_tests_in_venv", passing)
    again = run.run_matrix(run.parse_args(["--torch", "2.13"]))
    assert again["rows"]["2.13.0"]["cells"]["3.11"]["status"] == PASS
    assert sorted(py for spec, _, py in fake_run["test"]) == ["3.11", "3.13"]


def test_the_newest_pythons_are_tested_in_the_root_and_say_so(fake_run) -> None:
    report = run.run_matrix(run.parse_args(["--torch", "2.15", "--no-negatives"]))
    cells = report["rows"]["2.15.0"]["cells"]
    assert cells["3.14"]["status"] == PASS
    assert cells["3.15"]["status"] == PASS
    assert cells["3.14"]["interpreter"] == "python3.14, container (Debian sid root)"
    assert cells["3.12"]["interpreter"] == "python3.12, host (PATH)"
    assert ("torch==2.15.0", "3.15") in [(t, p) for t, _, p in fake_run["test"]]
    md = render.render_markdown(render.merge_previous(report, None, matrix.load_rows()))
    assert "| 3.14 | python3.14, container (Debian sid root) |" in md


def test_a_root_that_cannot_run_leaves_its_cells_not_run_with_the_reason(fake_run) -> None:
    fake_run["no root"].append("entering the Debian root needs root on this machine")
    report = run.run_matrix(run.parse_args(["--torch", "2.15", "--no-negatives"]))
    cell = report["rows"]["2.15.0"]["cells"]["3.14"]
    assert cell == {
        "status": NOT_RUN,
        "reason": "no Python 3.14 on this machine, and none from the Debian root: "
        "entering the Debian root needs root on this machine",
    }
    assert report["rows"]["2.15.0"]["cells"]["3.12"]["status"] == PASS
    md = render.render_markdown(render.merge_previous(report, None, matrix.load_rows()))
    assert "not run (no Python 3.14 on this machine, and none from the Debian root" in md


def test_the_table_says_free_threaded_pythons_get_no_wheel(fake_run) -> None:
    report = run.run_matrix(run.parse_args(["--torch", "2.15", "--no-negatives"]))
    md = render.render_markdown(render.merge_previous(report, None, matrix.load_rows()))
    assert "Free-threaded Python (3.14t, 3.15t): no hotloop wheel." in md
    assert "`cp39-abi3`" in md
    assert "refuses to import with an ImportError" in md  # the guard's message, tests/ops


def test_below_the_free_disk_floor_cells_are_not_run_and_say_so(fake_run, monkeypatch) -> None:
    """Each new (torch, Python) pair adds about a gigabyte to uv's cache; a run that filled the
    disk failed other people's runs on the same machine. Below ``--min-free-gb`` no cell
    starts: it says "not run" with the free space found, and is not recorded."""
    free = {"bytes": 5 * 2**30}
    monkeypatch.setattr(schedule.diskspace, "free_bytes", lambda path: free["bytes"])
    report = run.run_matrix(run.parse_args(["--torch", "2.13", "--no-negatives"]))
    cells = report["rows"]["2.13.0"]["cells"]
    assert fake_run["test"] == []
    assert cells["3.12"] == {
        "status": NOT_RUN,
        "reason": "disk: 5.0 GB free where the cells install, below --min-free-gb 6",
    }
    free["bytes"] = 7 * 2**30
    report = run.run_matrix(run.parse_args(["--torch", "2.13", "--no-negatives"]))
    cells = report["rows"]["2.13.0"]["cells"]
    assert {cells[p]["status"] for p in report["rows"]["2.13.0"]["pythons"]} == {PASS}
    fake_run["test"].clear()
    run.run_matrix(run.parse_args(["--torch", "2.13", "--no-negatives", "--min-free-gb", "8"]))
    assert fake_run["test"] == []  # recorded passes still count below the floor
