"""``nox -s matrix -- --project``: another project's compatibility table (project_matrix).

The cells, the wheel each one tests and the folder the table lands in, with the fresh-venv
test replaced by a recorder; .ci/run runs the real thing on the fixture's CPU wheel (which
needs the wheels session's auditwheel to build)."""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path

import pytest

from scripts import interpreter_root, project, project_matrix, project_wheels
from scripts.basics import REPO
from scripts.interpreters import CONTAINER, Interpreter
from scripts.wheeltest import PythonTestResult

FIXTURE = REPO / "tests" / "fixtures" / "anyext"
TAIL = "manylinux_2_24_x86_64.manylinux_2_28_x86_64.whl"
NO_ROOT = (
    "no Python 3.14 on this machine, and none from the Debian root: "
    "entering the Debian root (unshare --mount + chroot) needs root on this machine"
)


def wheel(folder: Path, label: str, tag: str = "cp39-abi3") -> Path:
    path = folder / f"anyext-0.3.0+{label}-{tag}-{TAIL}"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(label.encode())
    return path


def test_the_wheel_of_a_cell_is_its_variant_abi3_or_its_python(tmp_path) -> None:
    abi3 = wheel(tmp_path, "stable.cpu")
    cp312 = wheel(tmp_path, "pt29cpu", "cp312-cp312")
    other = [wheel(tmp_path, "pt29cu128"), tmp_path / f"otherpkg-1.0+pt29cpu-cp39-abi3-{TAIL}"]
    wheels = [abi3, cp312, *other]
    assert project_matrix.wheel_for(wheels, "anyext", "stable.cpu", "3.13") == abi3
    assert project_matrix.wheel_for(wheels, "anyext", "pt29cpu", "3.12") == cp312
    assert project_matrix.wheel_for(wheels, "anyext", "pt29cpu", "3.11") is None


@pytest.fixture
def recorded(monkeypatch, tmp_path):
    """The fresh-venv test replaced: each call recorded, Python 3.11 fails, 3.9 is missing."""
    calls: list[tuple[str, str, list[str]]] = []

    def fake_test(table, wheel_path, torch, interpreters, workdir):
        calls.append((torch, wheel_path.name, list(interpreters)))
        results = []
        for version, interp in interpreters.items():
            status = "failed" if version == "3.11" else "passed"
            if interp is None:  # as wheeltest says it: the Debian root's Pythons are "skipped"
                status = "skipped" if version in ("3.14", "3.15") else "missing"
            results.append(PythonTestResult(version, status, summary=f"{status} on {version}"))
        return results

    monkeypatch.setattr(project_matrix, "test_wheel", fake_test)
    monkeypatch.setattr(
        project_matrix,
        "find_with_reasons",
        lambda versions, container: (
            {v: None if v in ("3.9", "3.14") else object() for v in versions},
            {"3.9": "no Python 3.9 on this machine", "3.14": NO_ROOT},
        ),
    )
    monkeypatch.setenv("HOTLOOP_CACHE_DIR", str(tmp_path / "cache"))
    return calls


def test_a_run_writes_the_table_into_its_own_folder(tmp_path, recorded) -> None:
    wheels = tmp_path / "wheelhouse"
    wheel(wheels, "stable.cpu")
    wheel(wheels, "pt28cpu")  # 2.9 has no wheel: a "no wheel" row, not a failure of the run
    out = tmp_path / "out"
    args = ["--project", str(FIXTURE), "--cpu", "--wheels", str(wheels), "--out", str(out)]
    status = project_matrix.main([*args, "--torch", "2.8", "--torch", "2.9", "--torch", "2.15"])
    assert status == 1  # the 3.11 cells failed
    document = json.loads((out / "compatibility.json").read_text())
    cells = {(c["torch"], c["python"]): c for c in document["cells"]}
    assert cells["2.8.0", "3.9"]["status"] == "no python"
    assert cells["2.8.0", "3.10"]["status"] == "passed"
    assert cells["2.8.0", "3.11"]["status"] == "failed"
    assert {c["status"] for k, c in cells.items() if k[0] == "2.9.1"} == {"no wheel"}
    assert cells["2.15.0", "3.12"]["wheel"].startswith("anyext-0.3.0+stable.cpu-")
    # one fresh-venv run per (torch, wheel), with that torch
    assert [(t, w.split("-")[1]) for t, w, _ in recorded] == [
        ("2.8.0", "0.3.0+pt28cpu"),
        ("2.15.0", "0.3.0+stable.cpu"),
    ]
    markdown = (out / "compatibility.md").read_text()
    assert "| 2.9.1 | (none) |" in markdown
    assert "torch 2.8.0, Python 3.11: failed on 3.11" in markdown
    assert sorted(p.name for p in out.iterdir()) == [
        project_wheels.OWNER_MARK,
        "compatibility.json",
        "compatibility.md",
    ]


def test_a_python_whose_root_cannot_be_entered_is_not_run_with_the_reason(
    tmp_path, recorded
) -> None:
    wheels = tmp_path / "wheelhouse"
    wheel(wheels, "stable.cpu")
    out = tmp_path / "out"
    args = ["--project", str(FIXTURE), "--cpu", "--wheels", str(wheels), "--out", str(out)]
    assert (
        project_matrix.main([*args, "--torch", "2.15", "--python", "3.12", "--python", "3.14"]) == 0
    )
    cells = {c["python"]: c for c in json.loads((out / "compatibility.json").read_text())["cells"]}
    assert cells["3.12"]["status"] == "passed"
    assert (cells["3.14"]["status"], cells["3.14"]["summary"]) == ("not run", NO_ROOT)
    markdown = (out / "compatibility.md").read_text()
    assert "Failed cells" not in markdown
    assert f"- torch 2.15.0, Python 3.14: not run: {NO_ROOT}" in markdown


def test_a_python_only_the_debian_root_has_runs_the_projects_tests_in_the_root(
    tmp_path, monkeypatch
) -> None:
    """A 3.14 cell: a fresh venv of the root's interpreter with the row's torch, the wheel and
    the table's test requirements, then the table's test command, all inside the root, with the
    checkout and the wheelhouse bound read-only at their own paths."""
    monkeypatch.setenv("HOTLOOP_CACHE_DIR", str(tmp_path / "cache"))
    rootfs = tmp_path / "rootfs"
    interp = Interpreter("3.14", Path("/usr/bin/python3.14"), CONTAINER, "Debian sid root", rootfs)
    monkeypatch.setattr(
        project_matrix,
        "find_with_reasons",
        lambda versions, container: ({v: interp for v in versions}, {}),
    )
    monkeypatch.setattr(interpreter_root.build, "uv_exe", lambda: str(tmp_path / "uv"))
    entered = []

    def fake_run(cmd, **kw):
        entered.append(cmd)
        return subprocess.CompletedProcess(cmd, 0, "2 passed in 0.5s\n", "")

    monkeypatch.setattr(interpreter_root.subprocess, "run", fake_run)
    wheels = tmp_path / "wheelhouse"
    built = wheel(wheels, "stable.cpu")
    out = tmp_path / "out"
    args = ["--project", str(FIXTURE), "--cpu", "--wheels", str(wheels), "--out", str(out)]
    assert project_matrix.main([*args, "--torch", "2.15", "--python", "3.14"]) == 0
    (cell,) = json.loads((out / "compatibility.json").read_text())["cells"]
    assert (cell["status"], cell["summary"]) == ("passed", "2 passed in 0.5s")
    assert cell["source"] == "container (Debian sid root)"
    assert "Python 3.14: container (Debian sid root)" in (out / "compatibility.md").read_text()
    (cmd,) = entered
    assert cmd[:2] == ["unshare", "--mount"]
    script = cmd[-1]
    checkout = project.load_project(FIXTURE).root
    for folder in (checkout, wheels.resolve()):
        assert f"mount -o remount,bind,ro {rootfs}{folder}" in script
    venv_python = next(Path(tmp_path / "cache").rglob("py3.14")) / "venv" / "bin" / "python"
    # chroot ... /bin/sh -c 'cd RUN && exec sh -c STEPS': the steps, joined with &&
    steps = shlex.split(shlex.split(script.splitlines()[-1])[-1])[-1]
    assert f"--python {venv_python} torch==2.15.0 'anyext[test] @ {built.as_uri()}'" in steps
    test = project.load_project(FIXTURE).test_arguments(str(venv_python))
    assert steps.endswith(f" && {shlex.join(test)}")


def test_an_output_folder_it_did_not_write_is_refused(tmp_path, recorded) -> None:
    wheels = tmp_path / "wheelhouse"
    wheel(wheels, "stable.cpu")
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep")
    with pytest.raises(SystemExit, match="did not write"):
        project_matrix.main(["--project", str(FIXTURE), "--cpu", "--wheels", str(wheels),
                             "--out", str(out)])  # fmt: skip
    assert (out / "notes.txt").read_text() == "keep"
    assert recorded == []


def test_no_wheels_says_how_to_build_them(tmp_path, capsys, recorded) -> None:
    status = project_matrix.main(
        ["--project", str(FIXTURE), "--cpu", "--wheels", str(tmp_path / "none")]
    )
    assert status == 2
    assert "nox -s wheels -- --project" in capsys.readouterr().err


def test_a_stable_only_project_skips_rows_below_its_floor(tmp_path, recorded) -> None:
    table = tmp_path / "stable.toml"
    table.write_text(
        (FIXTURE / "pyproject.toml")
        .read_text()
        .split("[tool.torch-wheels]")[1]
        .join(["[tool.torch-wheels]\ncheckout = 'anyext'\n", ""])
        .replace('kinds = ["stable", "pinned"]', 'kinds = ["stable"]')
    )
    (tmp_path / "anyext").symlink_to(FIXTURE)
    assert project.load_project(table).kinds == ("stable",)
    wheels = tmp_path / "wheelhouse"
    wheel(wheels, "stable.cpu")
    out = tmp_path / "out"
    project_matrix.main(["--project", str(table), "--cpu", "--wheels", str(wheels), "--out",
                         str(out)])  # fmt: skip
    torches = {c["torch"] for c in json.loads((out / "compatibility.json").read_text())["cells"]}
    assert min(torches, key=lambda t: tuple(map(int, t.split(".")))) == "2.10.0"


def test_this_repository_is_not_another_project(capsys) -> None:
    assert project_matrix.main(["--project", str(REPO)]) == 2
    assert "own project: its table is `nox -s matrix` without --project" in capsys.readouterr().err
