"""`nox -s matrix`: cell planning, wheel/result reuse, the checks of the negative cells, the
rendering, and the committed table (docs/compatibility.*) against scripts/matrix.toml."""

from __future__ import annotations

import datetime
import json
import threading
from pathlib import Path

import pytest

from scripts import compat, matrix, toolchain, wheeltest
from scripts.interpreters import Interpreter

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"

# --------------------------------------------------------------------------- committed table


@pytest.fixture(scope="module")
def committed() -> dict:
    path = DOCS / compat.JSON_NAME
    if not path.is_file():
        pytest.fail(f"{path} is missing: run `nox -s matrix` and commit docs/compatibility.*")
    return json.loads(path.read_text())


def test_committed_table_has_exactly_the_matrix_rows(committed: dict) -> None:
    rows = matrix.load_rows()
    assert [r["torch"] for r in committed["rows"]] == [r.torch for r in rows]
    for entry, row in zip(committed["rows"], rows):
        assert entry["cuda"] == row.cuda, row.torch
        assert entry["variant"] == row.variant
        assert entry["pythons"] == list(row.pythons)


def test_committed_cells_match_each_rows_pythons(committed: dict) -> None:
    for entry, row in zip(committed["rows"], matrix.load_rows()):
        cells = entry["cells"]
        assert set(cells) == set(compat.ALL_PYTHONS) | set(row.pythons), row.torch
        for py, cell in cells.items():
            assert cell["status"] in compat.STATUSES, (row.torch, py, cell)
            # unsupported exactly where torch has no wheel for that Python
            assert (cell["status"] == compat.UNSUPPORTED) == (py not in row.pythons), (
                row.torch,
                py,
            )


def test_committed_rows_are_consistent(committed: dict) -> None:
    for entry in committed["rows"]:
        statuses = {c["status"] for c in entry["cells"].values()}
        if compat.PASS in statuses:
            assert entry["wheel"]
            assert f"+{entry['variant']}-" in entry["wheel"]
            assert entry["archs"], entry["variant"]
        if compat.NOT_BUILT in statuses:
            assert entry["wheel"] is None
            assert entry["wheel_status"] == compat.NOT_BUILT
            assert entry["reason"]


def test_committed_markdown_is_generated_from_the_json(committed: dict) -> None:
    md = (DOCS / compat.MD_NAME).read_text()
    assert md == compat.render_markdown(committed), (
        "docs/compatibility.md differs from what scripts/compat.py renders from the JSON: "
        "it is generated (python -m scripts.compat --render-only), never edited"
    )


# --------------------------------------------------------------------------- planning


def row(torch: str = "2.11.0", pythons: tuple[str, ...] = ("3.10", "3.11", "3.12", "3.13")):
    return matrix.Row(torch, "13.0", pythons, "8.0;12.0+PTX", ("nvidia-cuda-nvcc==13.0.88",))


def test_plan_row_marks_pythons_the_row_lacks_unsupported() -> None:
    plan = {c.python: c.action for c in compat.plan_row(row(), None)}
    assert plan == {
        "3.9": compat.UNSUPPORTED,
        "3.10": "test",
        "3.11": "test",
        "3.12": "test",
        "3.13": "test",
    }


def test_plan_row_python_filter_and_newer_pythons() -> None:
    plan = {c.python: c.action for c in compat.plan_row(row(pythons=("3.12", "3.14")), ["3.12"])}
    assert plan["3.12"] == "test"
    assert plan["3.14"] == compat.NOT_RUN  # a Python newer than the columns gets a column
    assert plan["3.13"] == compat.UNSUPPORTED


def test_parse_deadline() -> None:
    now = datetime.datetime(2026, 1, 1, 5, 0, tzinfo=datetime.timezone.utc)
    assert compat.parse_deadline("05:55", now) == now.replace(minute=55)
    assert compat.parse_deadline("04:00", now) == now.replace(hour=4) + datetime.timedelta(days=1)
    assert compat.parse_deadline("+60", now) == now + datetime.timedelta(seconds=60)
    assert compat.parse_deadline(None, now) is None


def test_not_built_reason_from_the_toolkit_error() -> None:
    exc = toolchain.ToolkitError(
        "CUDA 12.8: the PyPI packages [...] ship no bin/nvcc (bin/ holds only ['ptxas']); "
        "point HOTLOOP_CUDA_HOME_12_8 at a CUDA 12.8 toolkit to build this row"
    )
    reason = compat.not_built_reason(exc)
    assert "no nvcc" in reason
    assert "HOTLOOP_CUDA_HOME_12_8" in reason


def test_a_row_without_toolkit_is_not_built_here(monkeypatch, tmp_path) -> None:
    def no_toolkit(cuda, packages):
        raise toolchain.ToolkitError("ship no bin/nvcc; point HOTLOOP_CUDA_HOME_12_8 at a kit")

    monkeypatch.setattr(compat.toolchain, "ensure_cuda_toolkit", no_toolkit)
    state = compat.RowState(matrix.load_rows()[0])
    compat.obtain_wheel(state, tmp_path, [], force=False)
    assert state.wheel is None
    assert state.status == compat.NOT_BUILT
    assert "HOTLOOP_CUDA_HOME_12_8" in state.reason


# --------------------------------------------------------------------------- source digest


def make_tree(root: Path) -> Path:
    (root / "csrc" / "op").mkdir(parents=True)
    (root / "src" / "hotloop" / "__pycache__").mkdir(parents=True)
    (root / "setup.py").write_text("setup()\n")
    (root / "pyproject.toml").write_text("[project]\n")
    (root / "csrc" / "op" / "op.cu").write_text("kernel\n")
    (root / "src" / "hotloop" / "__init__.py").write_text("x = 1\n")
    (root / "src" / "hotloop" / "_build_info.py").write_text("BUILD_INFO = {}\n")
    (root / "src" / "hotloop" / "_C.abi3.so").write_bytes(b"\x7fELF")
    (root / "src" / "hotloop" / "__pycache__" / "x.pyc").write_bytes(b"pyc")
    (root / "README.md").write_text("readme\n")
    return root


def test_source_digest_covers_only_what_goes_into_the_wheel(tmp_path) -> None:
    tree = make_tree(tmp_path)
    names = [p.relative_to(tree).as_posix() for p in compat.source_paths(tree)]
    assert names == ["csrc/op/op.cu", "pyproject.toml", "setup.py", "src/hotloop/__init__.py"]
    before = compat.source_digest(tree)
    (tree / "src" / "hotloop" / "_build_info.py").write_text("BUILD_INFO = {'x': 2}\n")
    (tree / "src" / "hotloop" / "_C.abi3.so").write_bytes(b"other")
    (tree / "README.md").write_text("changed\n")
    assert compat.source_digest(tree) == before
    (tree / "csrc" / "op" / "op.cu").write_text("kernel 2\n")
    assert compat.source_digest(tree) != before


def test_a_renamed_source_changes_the_digest(tmp_path) -> None:
    tree = make_tree(tmp_path)
    before = compat.source_digest(tree)
    (tree / "csrc" / "op" / "op.cu").rename(tree / "csrc" / "op" / "op2.cu")
    assert compat.source_digest(tree) != before


# --------------------------------------------------------------------------- wheel reuse


@pytest.fixture
def wheel_in(wheel_factory, newest_row, build_info_for):
    def make(folder: Path, commit: str = "0" * 40) -> Path:
        wheel = wheel_factory(build_info=build_info_for(newest_row, git_commit=commit))
        folder.mkdir(parents=True, exist_ok=True)
        return wheel.rename(folder / wheel.name)

    return make


def test_wheel_with_matching_record_is_reused(tmp_path, wheel_in, newest_row) -> None:
    wheel = wheel_in(tmp_path / "store")
    compat.write_sidecar(wheel, "abc")
    choice = compat.find_reusable_wheel(newest_row.variant, [tmp_path / "store"], "abc")
    assert choice.wheel == wheel


def test_wheel_from_other_sources_is_rebuilt(tmp_path, wheel_in, newest_row) -> None:
    wheel = wheel_in(tmp_path / "store")
    compat.write_sidecar(wheel, "abc")
    choice = compat.find_reusable_wheel(
        newest_row.variant, [tmp_path / "store"], "def", commit_ok=lambda c: True
    )
    assert choice.wheel is None
    assert "other sources" in choice.why


def test_wheel_changed_after_its_record_is_rebuilt(tmp_path, wheel_in, newest_row) -> None:
    wheel = wheel_in(tmp_path / "store")
    compat.write_sidecar(wheel, "abc")
    with wheel.open("ab") as fh:
        fh.write(b"\0")
    choice = compat.find_reusable_wheel(newest_row.variant, [tmp_path / "store"], "abc")
    assert choice.wheel is None
    assert "changed" in choice.why


def test_wheel_without_record_needs_a_clean_matching_commit(tmp_path, wheel_in, newest_row):
    wheel = wheel_in(tmp_path / "wheelhouse", commit="a" * 40)
    seen = []

    def commit_ok(commit: str) -> bool:
        seen.append(commit)
        return commit == "a" * 40

    choice = compat.find_reusable_wheel(
        newest_row.variant, [tmp_path / "wheelhouse"], "x", commit_ok
    )
    assert choice.wheel == wheel
    assert seen == ["a" * 40]
    refused = compat.find_reusable_wheel(
        newest_row.variant, [tmp_path / "wheelhouse"], "x", lambda c: False
    )
    assert refused.wheel is None
    assert "sources changed" in refused.why


def test_dirty_or_unknown_commits_never_match() -> None:
    assert not compat.commit_matches_tree("a" * 40 + "-dirty")
    assert not compat.commit_matches_tree("unknown")


def test_other_variants_are_ignored(tmp_path, wheel_in) -> None:
    wheel = wheel_in(tmp_path / "store")
    compat.write_sidecar(wheel, "abc")
    assert compat.find_reusable_wheel("pt211cu130", [tmp_path / "store"], "abc").wheel is None


def test_read_build_info_from_the_wheel(tmp_path, wheel_in, newest_row) -> None:
    info = compat.read_build_info(wheel_in(tmp_path / "w", commit="b" * 40))
    assert info["git_commit"] == "b" * 40
    assert info["torch_minor"] == newest_row.torch_minor


# --------------------------------------------------------------------------- negative checks

PIP_CONFLICT = """\
Processing ./hotloop-0.1.0+pt211cu130-cp39-abi3-manylinux_2_28_x86_64.whl
Requirement already satisfied: torch==2.14.1 in ./venv/lib/python3.12/site-packages (2.14.1)
ERROR: Cannot install hotloop==0.1.0+pt211cu130 and torch==2.14.1 because these package \
versions have conflicting dependencies.

The conflict is caused by:
    The user requested torch==2.14.1
    hotloop 0.1.0+pt211cu130 depends on torch==2.11.*
ERROR: ResolutionImpossible: for help visit https://pip.pypa.io/...
"""
GUARD_ERROR = (
    "Traceback (most recent call last):\n"
    "ImportError: hotloop 0.1.0+pt211cu130 was built for torch 2.11.0+cu130, but this "
    "environment has torch 2.14.1+cu130: torch's C++ ABI changes between minor versions. "
    'To fix: install ... pip install --force-reinstall "hotloop==0.1.0+pt214cu130" ...'
)


def test_pip_conflict_counts_as_refusal() -> None:
    ok, detail = compat.check_pip_refusal(PIP_CONFLICT, 1, "2.11", "2.14.1")
    assert ok, detail
    assert "torch==2.11.*" in detail


@pytest.mark.parametrize(
    ("output", "rc", "why"),
    [
        ("Successfully installed hotloop", 0, "installed"),
        ("ERROR: No matching distribution found for torch==2.11.*", 1, "lacks"),
        ("ERROR: network down torch==2.11.* torch 2.14.1", 1, "not with a dependency conflict"),
    ],
)
def test_pip_failing_for_another_reason_is_not_a_refusal(output, rc, why) -> None:
    ok, detail = compat.check_pip_refusal(output, rc, "2.11", "2.14.1")
    assert not ok
    assert why in detail


def test_guard_error_must_name_both_versions() -> None:
    ok, detail = compat.check_guard_error(GUARD_ERROR, 1, "2.11.0+cu130", "2.14.1", ("minor",))
    assert ok
    assert detail.startswith("ImportError")
    ok, detail = compat.check_guard_error(GUARD_ERROR, 1, "2.11.0+cu130", "2.13.0")
    assert not ok
    assert "2.13.0" in detail
    ok, detail = compat.check_guard_error("", 0, "2.11.0+cu130", "2.14.1")
    assert not ok
    assert "succeeded" in detail
    raw = "ImportError: _C.abi3.so: undefined symbol: _ZN3c10 built for torch 2.11.0+cu130"
    ok, detail = compat.check_guard_error(raw, 1, "2.11.0+cu130", "2.14.1")
    assert not ok
    assert "undefined symbol" in detail


def test_guard_probe_patches_torch_before_importing_hotloop() -> None:
    code = compat.guard_probe_code("12.8", "2.14.1+cu128")
    lines = code.splitlines()
    assert lines.index("torch.version.cuda = '12.8'") < lines.index("import hotloop")
    assert lines.index("torch.__version__ = '2.14.1+cu128'") < lines.index("import hotloop")
    assert "torch.version.cuda" not in compat.guard_probe_code(None, None)


def test_clean_pip_env_ignores_the_machines_pip_config(monkeypatch) -> None:
    monkeypatch.setenv("PIP_FIND_LINKS", "/opt/wheels")
    monkeypatch.setenv("PIP_CONSTRAINT", "/etc/c.txt")
    env = compat.clean_pip_env()
    assert "PIP_FIND_LINKS" not in env
    assert "PIP_CONSTRAINT" not in env
    assert env["PIP_CONFIG_FILE"] == "/dev/null"


# --------------------------------------------------------------------------- the run, faked


@pytest.fixture
def fake_run(monkeypatch, tmp_path, wheel_factory, build_info_for):
    """run_matrix with builds, test cells and negatives replaced; counts what it ran."""
    monkeypatch.setenv("HOTLOOP_CACHE_DIR", str(tmp_path / "cache"))
    calls = {"build": [], "test": [], "negative": []}
    lock = threading.Lock()
    interp = {v: Interpreter(v, Path(f"/usr/bin/python{v}"), "PATH") for v in compat.ALL_PYTHONS}
    monkeypatch.setattr(
        compat, "find_interpreters", lambda versions: {v: interp[v] for v in versions}
    )

    def fake_obtain(state, store, extra_dirs, force, may_build=True, reuse_any=False):
        r = state.row
        with lock:
            calls["build"].append(r.torch)
        if r.cuda.startswith("12"):
            state.status, state.reason = compat.NOT_BUILT, "no nvcc here"
            return
        existing = sorted(store.glob(f"hotloop-*+{r.variant}-*.whl"))
        if existing:  # a rerun reuses the same file (same sha256)
            state.wheel, state.status = existing[0], "reused"
            return
        if not may_build:
            state.status, state.reason = compat.NOT_RUN, "time"
            return
        wheel = wheel_factory(version=r.version, build_info=build_info_for(r))
        store.mkdir(parents=True, exist_ok=True)
        state.wheel, state.status = wheel.rename(store / wheel.name), "built"

    def fake_tests(torch_spec, wheel, i, workdir):
        with lock:
            calls["test"].append((torch_spec, i.version))
        status = "failed" if (torch_spec, i.version) == ("torch==2.12.1", "3.10") else "passed"
        return wheeltest.PythonTestResult(i.version, status, str(i.path), "PATH", "9 passed", 1.0)

    def fake_negative(pair, wheel, info, i, workdir):
        with lock:
            calls["negative"].append(pair)
        return [
            {
                "wheel": wheel.name,
                "wheel_torch": info["torch_version"],
                "venv_torch": pair.venv_torch,
                "python": i.version,
                "check": "c",
                "expected": "e",
                "status": compat.PASS,
                "detail": "ImportError: ...",
                "simulated": pair.simulated_cuda is not None,
            }
        ]

    monkeypatch.setattr(compat, "obtain_wheel", fake_obtain)
    monkeypatch.setattr(wheeltest, "run_op_tests_in_venv", fake_tests)
    monkeypatch.setattr(compat, "run_negative", fake_negative)
    return calls


def test_run_plans_every_cell_and_reruns_only_what_changed(fake_run, tmp_path) -> None:
    report = compat.run_matrix(compat.parse_args([]))
    rows = matrix.load_rows()
    assert list(report["rows"]) == [r.torch for r in sorted(rows, key=compat.build_order)]
    by = report["rows"]
    assert by["2.8.0"]["cells"]["3.9"]["status"] == compat.NOT_BUILT
    assert by["2.11.0"]["cells"]["3.9"]["status"] == compat.UNSUPPORTED
    assert by["2.14.1"]["cells"]["3.13"]["status"] == compat.PASS
    assert by["2.12.1"]["cells"]["3.10"]["status"] == compat.FAIL
    cuda13 = [r for r in rows if r.cuda == "13.0"]
    assert len(fake_run["test"]) == sum(len(r.pythons) for r in cuda13)
    assert len(fake_run["negative"]) == len(compat.DEFAULT_NEGATIVES)
    assert any(n["simulated"] for n in report["negatives"])

    # Same wheels, same tests: only the failed cell runs again.
    fake_run["test"].clear()
    fake_run["negative"].clear()
    again = compat.run_matrix(compat.parse_args([]))
    assert fake_run["test"] == [("torch==2.12.1", "3.10")]
    assert fake_run["negative"] == []
    assert again["rows"]["2.14.1"]["cells"]["3.12"]["reused"] is True


def test_restricted_run_keeps_the_other_rows(fake_run, tmp_path) -> None:
    docs = tmp_path / "docs"
    full = compat.merge_previous(compat.run_matrix(compat.parse_args([])), None, matrix.load_rows())
    compat.write_outputs(full, docs)
    fake_run["test"].clear()
    report = compat.run_matrix(compat.parse_args(["--torch", "2.14", "--python", "3.12"]))
    assert fake_run["test"] == []  # its one selected cell passed before: reused
    assert report["rows"]["2.14.1"]["cells"]["3.12"]["reused"] is True
    assert list(report["rows"]) == ["2.14.1"]
    merged = compat.merge_previous(report, compat.load_previous(docs), matrix.load_rows())
    assert [r["torch"] for r in merged["rows"]] == [r.torch for r in matrix.load_rows()]
    assert merged["rows"][-1]["cells"]["3.10"]["status"] == compat.NOT_RUN  # not selected
    assert merged["rows"][3]["cells"]["3.10"]["status"] == compat.PASS  # 2.11 from before


def test_deadline_leaves_cells_not_run(fake_run) -> None:
    report = compat.run_matrix(compat.parse_args(["--deadline", "+0", "--torch", "2.14"]))
    cells = report["rows"]["2.14.1"]["cells"]
    assert {cells[p]["status"] for p in ("3.10", "3.11", "3.12", "3.13")} == {compat.NOT_RUN}
    assert fake_run["test"] == []


def test_past_the_deadline_recorded_results_still_count(fake_run) -> None:
    compat.run_matrix(compat.parse_args(["--torch", "2.14"]))  # builds and passes
    fake_run["test"].clear()
    report = compat.run_matrix(compat.parse_args(["--deadline", "+0", "--torch", "2.14"]))
    cells = report["rows"]["2.14.1"]["cells"]
    assert {cells[p]["status"] for p in ("3.10", "3.11", "3.12", "3.13")} == {compat.PASS}
    assert fake_run["test"] == []


def test_job_queue_runs_the_best_waiting_job_first() -> None:
    order: list[str] = []
    gate = threading.Event()
    queue = compat.JobQueue(1)
    queue.submit((5,), gate.wait)  # occupies the only worker while the rest is queued
    queue.submit((2,), order.append, "late cell")
    queue.submit((1, 0), order.append, "3.12 cell")
    queue.submit((0,), order.append, "negative")
    gate.set()
    queue.wait()
    assert order == ["negative", "3.12 cell", "late cell"]


def test_every_row_gets_one_python_before_any_row_gets_a_second() -> None:
    rows = matrix.load_rows()
    keys = sorted((compat.cell_priority(p, r), r.torch, p) for r in rows[-2:] for p in r.pythons)
    assert [(t, p) for _, t, p in keys[:2]] == [(rows[-2].torch, "3.12"), (rows[-1].torch, "3.12")]


# --------------------------------------------------------------------------- merging, rendering


def entry(torch: str, cuda: str, pythons: list[str], status: str = compat.PASS) -> dict:
    cells = {
        p: {"status": status if p in pythons else compat.UNSUPPORTED} for p in compat.ALL_PYTHONS
    }
    return {
        "torch": torch,
        "cuda": cuda,
        "variant": matrix.variant_label(torch, cuda),
        "pythons": pythons,
        "wheel": None,
        "archs": [],
        "cells": cells,
    }


def test_merge_drops_stale_rows_and_resets_changed_ones() -> None:
    rows = matrix.load_rows()
    previous = {
        "rows": [
            entry("2.7.0", "12.6", ["3.9"]),  # left the matrix
            entry("2.8.0", "12.8", ["3.9", "3.10"]),  # Pythons changed since
            entry("2.9.1", "12.8", list(rows[1].pythons)),  # still valid
        ],
        "negatives": [{"wheel_torch": "2.7.0", "venv_torch": "2.8.0", "status": "pass"}],
    }
    merged = compat.merge_previous({"rows": {}, "negatives": []}, previous, rows)
    assert [r["torch"] for r in merged["rows"]] == [r.torch for r in rows]
    assert merged["rows"][0]["cells"]["3.11"]["status"] == compat.NOT_RUN
    assert merged["rows"][1]["cells"]["3.10"]["status"] == compat.PASS
    assert merged["negatives"] == []


def test_render_markdown_shows_every_cell_kind() -> None:
    ok = entry("2.14.1", "13.0", ["3.10", "3.11", "3.12", "3.13"])
    ok["wheel"] = "hotloop-0.1.0+pt214cu130-cp39-abi3-manylinux_2_28_x86_64.whl"
    ok["archs"] = ["sm_80", "compute_120"]
    ok["cells"]["3.11"] = {"status": compat.FAIL, "summary": "1 failed, 9 passed"}
    ok["cells"]["3.13"] = {"status": compat.NOT_RUN, "reason": "time"}
    nb = entry("2.8.0", "12.8", list(compat.ALL_PYTHONS), compat.NOT_BUILT)
    nb.update(wheel_status=compat.NOT_BUILT, reason="no nvcc here")
    report = {
        "generated": "2026-11-23T05:00:00Z",
        "commit": "abc",
        "host": "h",
        "seconds": 61,
        "rows": [nb, ok],
        "negatives": [
            {
                "wheel": "w",
                "venv_torch": "2.14.1+cu128 (simulated)",
                "python": "3.12",
                "check": "cuda",
                "status": "pass",
                "detail": "ImportError: a|b",
                "simulated": True,
            }
        ],
    }
    md = compat.render_markdown(report)
    assert "| 2.8.0 | 12.8 | pt28cu128: not built here: no nvcc here | not built here |" in md
    line = next(ln for ln in md.splitlines() if ln.startswith("| 2.14.1 |"))
    cells = [c.strip() for c in line.strip("|").split(" | ")]
    assert cells[3:] == [
        "unsupported",
        "pass",
        "**fail**: 1 failed, 9 passed",
        "pass",
        "not run (time)",
    ]
    assert "`" + ok["wheel"] + "`" in line
    assert "sm_80 compute_120" in md
    assert "ImportError: a\\|b" in md
    assert "*Simulated*" in md
    assert "2026-11-23T05:00:00Z" in md
    assert "`abc`" in md


def test_reuse_any_takes_the_newest_wheel_whatever_its_sources(tmp_path, wheel_in, monkeypatch):
    monkeypatch.setenv("HOTLOOP_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(
        compat.toolchain, "ensure_cuda_toolkit", lambda *a: pytest.fail("must not build")
    )
    wheel = wheel_in(tmp_path / "store", commit="c" * 40 + "-dirty")
    state = compat.RowState(matrix.load_rows()[-1])
    compat.obtain_wheel(state, tmp_path / "store", [], force=False, reuse_any=True)
    assert state.wheel == wheel
    assert state.status == "reused as is"
    assert "--reuse-any" in state.reason
