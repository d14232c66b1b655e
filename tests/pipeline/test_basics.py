"""scripts.basics: the one log and the one command runner of the pipeline modules."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from scripts import basics

SCRIPTS = Path(basics.__file__).resolve().parent


def test_logger_writes_tagged_lines_to_stderr(capsys) -> None:
    basics.logger("build")("compiling")
    out, err = capsys.readouterr()
    assert out == ""
    assert err == "[build] compiling\n"


def test_run_logs_the_command_and_returns_its_output(capsys) -> None:
    proc = basics.run(
        [sys.executable, "-c", "print('hi')"],
        log=basics.logger("t"),
        capture_output=True,
        text=True,
    )
    assert proc.stdout == "hi\n"
    assert capsys.readouterr().err == f"[t] $ {sys.executable} -c print('hi')\n"


def test_run_raises_when_the_command_fails() -> None:
    with pytest.raises(subprocess.CalledProcessError):
        basics.run([sys.executable, "-c", "raise SystemExit(3)"], log=lambda _: None)


def test_no_pipeline_module_defines_its_own_log() -> None:
    # One log: each module takes basics.logger(...) instead of a print to stderr of its own.
    own = [
        f"{path.relative_to(SCRIPTS)}:{node.lineno}"
        for path in sorted(SCRIPTS.rglob("*.py"))
        if path.name != "basics.py"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef) and node.name == "log"
    ]
    assert own == []


def test_a_folder_in_use_by_another_run_is_refused_with_the_holder_named(tmp_path) -> None:
    # Two `nox -s wheels` on one cache used to rebuild work/<variant> under each other.
    work = tmp_path / "work" / "stable.cu13"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from scripts import basics\n"
            f"with basics.exclusive_folder(basics.Path({str(work)!r})):\n"
            "    print('held', flush=True); time.sleep(60)",
        ],
        cwd=basics.REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline() == "held\n"
        with pytest.raises(basics.FolderInUse) as caught, basics.exclusive_folder(work):
            pass
        message = str(caught.value)
        assert str(work) in message
        assert f"pid {holder.pid}" in message
        assert "HOTLOOP_CACHE_DIR" in message
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()
    with basics.exclusive_folder(work):  # the holder is gone: free again
        assert work.is_dir()


def test_require_commands_names_only_what_is_missing(monkeypatch) -> None:
    monkeypatch.setattr(
        basics.shutil, "which", lambda name: None if name == "b" else f"/bin/{name}"
    )
    basics.require_commands(["a", "c"], lambda missing: "never")
    with pytest.raises(SystemExit, match=r"^missing \['b'\]$"):
        basics.require_commands(["a", "b"], lambda missing: f"missing {missing}")
