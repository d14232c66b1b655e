"""scripts.interpreter_root: Pythons the host cannot run, from a Debian sid root entered with
unshare + chroot, and where each interpreter comes from."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from scripts import diskspace, interpreter_root, interpreters, wheeltest
from scripts.basics import REPO
from scripts.interpreters import CONTAINER, Interpreter
from tests.pipeline.disk_helpers import fake_statvfs


def root_interp(tmp_path: Path, version: str = "3.14") -> Interpreter:
    return Interpreter(
        version,
        Path(f"/usr/bin/python{version}"),
        CONTAINER,
        "Debian sid root",
        tmp_path / "rootfs",
    )


def test_origin_says_host_or_container(tmp_path: Path) -> None:
    assert Interpreter("3.12", Path("/p/python3.12"), "pyenv").origin == "host (pyenv)"
    assert root_interp(tmp_path).origin == "container (Debian sid root)"


def test_the_host_first_then_the_root_for_what_it_lacks(tmp_path, monkeypatch) -> None:
    host = {"3.12": Interpreter("3.12", Path("/p/python3.12"), "pyenv")}
    monkeypatch.setattr(interpreters, "find_interpreter", lambda v, root=None: host.get(v))
    asked = []

    def fake_root(versions, make=True):
        asked.append(list(versions))
        return {"3.14": root_interp(tmp_path)}, "Debian sid's root has no python3.15"

    monkeypatch.setattr(interpreter_root, "root_interpreters", fake_root)
    found, reasons = interpreters.find_with_reasons(["3.12", "3.14", "3.15", "3.8"], container=True)
    assert asked == [["3.14", "3.15", "3.8"]]  # only what the host lacks
    assert found["3.12"] is host["3.12"]
    assert found["3.14"] == root_interp(tmp_path)
    assert found["3.15"] is None
    assert reasons == {
        "3.15": "no Python 3.15 on this machine, and none from the Debian root: "
        "Debian sid's root has no python3.15",
        "3.8": "no Python 3.8 on this machine",
    }
    # Without container=True no root is made.
    assert interpreters.find_interpreters(["3.14"]) == {"3.14": None}
    assert len(asked) == 1


def test_a_non_root_user_gets_the_reason_not_a_root(monkeypatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setattr(
        interpreter_root, "ensure_root", lambda *a: pytest.fail("made a root it cannot enter")
    )
    found, why = interpreter_root.root_interpreters(["3.14"])
    assert found == {}
    assert why == "entering the Debian root (unshare --mount + chroot) needs root on this machine"


def test_a_root_is_not_made_without_room_for_it(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("HOTLOOP_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(
        interpreter_root.mmdebstrap, "ensure_mmdebstrap", lambda: pytest.fail("fetched mmdebstrap")
    )
    monkeypatch.setattr(diskspace.os, "statvfs", fake_statvfs(diskspace.GIB // 2))
    with pytest.raises(diskspace.DiskSpaceError, match=r"0\.5 GiB free, but a Debian sid root"):
        interpreter_root.ensure_root(("3.14",))
    assert not interpreter_root.root_dir(("3.14",)).exists()


def test_root_key_follows_what_the_root_holds() -> None:
    assert interpreter_root.root_key(("3.14",)) != interpreter_root.root_key(("3.14", "3.15"))
    assert interpreter_root.root_key() == interpreter_root.root_key(interpreter_root.PYTHONS)
    assert {"python3.14", "python3.14-dev", "g++"} <= set(interpreter_root.packages())


def test_mmdebstrap_command_reads_sid_from_the_hosts_mirror(tmp_path: Path) -> None:
    cmd = interpreter_root.mmdebstrap_command(
        tmp_path / "mmdebstrap", tmp_path / "root", "http://deb.example/debian", ("3.14",)
    )
    assert cmd[0] == str(tmp_path / "mmdebstrap")
    assert "--mode=root" in cmd
    # A mirror snapshot's Release file has expired: the packages are still checked by hash.
    assert '--aptopt=Acquire::Check-Valid-Until "false"' in cmd
    included = next(a for a in cmd if a.startswith("--include=")).split("=", 1)[1].split(",")
    assert included == interpreter_root.packages(("3.14",))
    assert cmd[-3:] == ["sid", str(tmp_path / "root"), "deb http://deb.example/debian sid main"]


def test_enter_command_mounts_privately_at_the_same_paths(tmp_path: Path) -> None:
    rootfs = tmp_path / "rootfs"
    work = tmp_path / "work"
    work.mkdir()
    cert = tmp_path / "ca.pem"
    cert.write_text("")
    cmd = interpreter_root.enter_command(
        rootfs, ["python3.14", "-V"], {work: True, cert: False}, {"A": "b c"}, work
    )
    # Every mount lives in a private mount namespace: it is gone when the command ends.
    assert cmd[:6] == ["unshare", "--mount", "--propagation", "private", "--fork", "sh"]
    script = cmd[-1]
    assert f"mount --bind {work} {rootfs}{work}" in script
    assert f"mount --bind {cert} {rootfs}{cert}" in script
    assert f"mount -o remount,bind,ro {rootfs}{cert}" in script
    assert f"mount -o remount,bind,ro {rootfs}{work}" not in script
    assert f"mount -t proc proc {rootfs}/proc" in script
    assert f"mount -t tmpfs tmpfs {rootfs}/tmp" in script  # the cached root stays clean
    last = script.splitlines()[-1]
    assert last.startswith(f"exec chroot {rootfs} /usr/bin/env -i PATH=")
    assert "'A=b c'" in last
    assert f"cd {work} && exec python3.14 -V" in last


def test_a_path_inside_a_bound_folder_is_not_bound_again(tmp_path: Path) -> None:
    """uv lives in the checkout's .nox (bound read-only) under nox: binding it again needed a
    file made inside the read-only bind, and every root cell failed at once."""
    rootfs = tmp_path / "rootfs"
    repo = tmp_path / "repo"
    uv = repo / ".nox" / "matrix" / "bin" / "uv"
    uv.parent.mkdir(parents=True)
    uv.write_text("")
    script = interpreter_root.enter_command(rootfs, ["uv"], {repo: False, uv: False}, {}, repo)[-1]
    assert f"mount --bind {repo} {rootfs}{repo}" in script
    assert f"{rootfs}{uv}" not in script


def test_cells_of_a_root_interpreter_run_in_the_root(tmp_path, monkeypatch) -> None:
    ran = []

    def fake(packages, interp, workdir, command, env_extra, reads):
        ran.append((packages[0], interp.version, reads))
        return wheeltest.PythonTestResult(interp.version, "passed", summary="9 passed")

    monkeypatch.setattr(interpreter_root, "run_in_root", fake)
    res = wheeltest.run_op_tests_in_venv(
        "torch==2.15.0", tmp_path / "w.whl", root_interp(tmp_path), tmp_path
    )
    assert res.status == "passed"
    # the checkout (the op tests) and the wheel's folder are what the root must see
    assert ran == [("torch==2.15.0", "3.14", (REPO, tmp_path.resolve()))]


def test_a_root_cells_result_says_it_ran_in_the_container(tmp_path, monkeypatch) -> None:
    """The wheels report and the matrix say where each Python came from: host or container;
    hotloop's root cell installs its torch and wheel and runs its op suite in the root."""
    ran = []
    monkeypatch.setattr(interpreter_root.build, "uv_exe", lambda: str(tmp_path / "uv"))
    monkeypatch.setattr(interpreter_root, "uv_cache", lambda: tmp_path / "cache" / "uv-root")

    def fake_run(cmd, **kw):
        ran.append(cmd)
        return subprocess.CompletedProcess(cmd, 0, "9 passed in 1.0s\n", "")

    monkeypatch.setattr(interpreter_root.subprocess, "run", fake_run)
    wheel = tmp_path / "wheels" / "w.whl"
    res = wheeltest.run_op_tests_in_venv(
        "torch==2.15.0", wheel, root_interp(tmp_path), tmp_path / "cache" / "cells"
    )
    assert (res.status, res.summary) == ("passed", "9 passed in 1.0s")
    assert res.source == "container (Debian sid root)"
    (cmd,) = ran
    assert cmd[:2] == ["unshare", "--mount"]
    script = cmd[-1]
    for folder in (REPO, wheel.parent.resolve()):
        assert f"mount -o remount,bind,ro {tmp_path}/rootfs{folder}" in script
    python = tmp_path / "cache" / "cells" / "py3.14" / "venv" / "bin" / "python"
    steps = shlex.split(shlex.split(script.splitlines()[-1])[-1])[-1]
    assert f"torch==2.15.0 'hotloop[test] @ {wheel.resolve().as_uri()}'" in steps
    assert steps.endswith(" && " + shlex.join(wheeltest.pytest_command(python)))


@pytest.mark.parametrize(("returncode", "kept"), [(0, False), (1, True)])
def test_a_passed_root_cells_venv_is_removed_a_failed_ones_kept(
    tmp_path, monkeypatch, returncode, kept
) -> None:
    """As a host cell's: a root cell's venv holds a whole CUDA torch (4-5 GB wherever uv
    cannot hardlink it from the root's cache), so a table's cells would fill the disk."""
    monkeypatch.setattr(interpreter_root.build, "uv_exe", lambda: str(tmp_path / "uv"))
    monkeypatch.setattr(interpreter_root, "uv_cache", lambda: tmp_path / "cache" / "uv-root")
    venv = tmp_path / "cache" / "cells" / "py3.14" / "venv"

    def fake_run(cmd, **kw):
        (venv / "bin").mkdir(parents=True)  # what the root's uv made, seen from the host
        return subprocess.CompletedProcess(cmd, returncode, "9 passed in 1.0s\n", "")

    monkeypatch.setattr(interpreter_root.subprocess, "run", fake_run)
    wheel = tmp_path / "wheels" / "w.whl"
    res = wheeltest.run_op_tests_in_venv(
        "torch==2.15.0", wheel, root_interp(tmp_path), tmp_path / "cache" / "cells"
    )
    assert res.status == ("passed" if returncode == 0 else "failed")
    assert venv.exists() is kept
    assert Path(res.log).exists()


def test_a_python_only_the_root_has_is_skipped_by_host_runs(tmp_path) -> None:
    """``nox -s wheels`` tests on the host: a 3.14 it lacks is skipped (``nox -s matrix`` runs
    it in the root); a 3.13 it lacks is missing, a failure as before."""
    results = wheeltest.run_op_tests(
        "2.15.0", tmp_path / "w.whl", {"3.14": None, "3.13": None}, tmp_path
    )
    by = {r.python: r for r in results}
    assert by["3.14"].status == "skipped"
    assert "nox -s matrix" in by["3.14"].summary
    assert by["3.13"].status == "missing"


needs_root = pytest.mark.skipif(
    interpreter_root.cannot_enter() is not None, reason="entering a root needs root here"
)


@pytest.mark.slow
@needs_root
def test_the_roots_pythons_run_inside_it_and_the_host_stays_clean(tmp_path, monkeypatch) -> None:
    """Makes (or reuses) the real sid root: mmdebstrap, the network, about two minutes cold."""
    found, why = interpreter_root.root_interpreters(interpreter_root.PYTHONS)
    assert why is None, why
    work = tmp_path / "work"
    work.mkdir()
    for version, interp in found.items():
        assert interp.root is not None
        cmd = interpreter_root.enter_command(
            interp.root,
            [
                str(interp.path),
                "-c",
                "import sys, sysconfig; print(sys.version_info[:2], "
                "sysconfig.get_config_var('Py_GIL_DISABLED'), open('marker').read())",
            ],
            {work: True},
            {},
            work,
        )
        (work / "marker").write_text("bound")
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
        major, minor = version.split(".")
        assert out.strip() == f"({major}, {minor}) 0 bound"
    # The bind mounts were private: nothing is left mounted on the host.
    assert str(found["3.14"].root) not in Path("/proc/self/mounts").read_text()
    assert shutil.which("unshare")
