"""scripts.matrix.negatives: which wheel must refuse which torch, and how that is judged."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from scripts import matrix
from scripts.interpreters import Interpreter
from scripts.matrix import negatives
from scripts.matrix.results import FAIL, NOT_RUN, PASS


@pytest.fixture(scope="module")
def plans() -> dict[str, negatives.NegativePlan]:
    return {
        p.pair.name: p
        for p in negatives.plan_negatives(negatives.DEFAULT_NEGATIVES, matrix.load_rows())
    }


@pytest.mark.parametrize(
    ("name", "builder", "pip_refuses", "words"),
    [
        # Below the floor: the stable wheel's pin refuses torch 2.9.
        ("stable.cu13-torch2.9.1", "2.11.0", True, ["2.9.1"]),
        # A pinned wheel next to a newer torch: its pin refuses.
        ("pt29cu128-torch2.11.0", "2.9.1", True, ["2.11.0"]),
        # torch 2.10.0 is a CUDA 12.8 build: the pin admits it, the guard must name both CUDAs.
        ("stable.cu13-torch2.10.0", "2.11.0", False, ["CUDA 12", "CUDA 13"]),
        # A CPU-only torch: only the guard can tell.
        ("stable.cu13-torch2.11.0+cpu", "2.11.0", False, ["CPU"]),
        # The CUDA 12 stable wheel next to the neighbouring row's CUDA 13 torch: the pin
        # torch>=2.10 admits it, the guard must name both CUDAs.
        ("stable.cu12-torch2.11.0", "2.10.0", False, ["CUDA 13", "CUDA 12"]),
    ],
)
def test_each_pair_is_refused_by_what_can_see_the_mismatch(
    plans, name, builder, pip_refuses, words
) -> None:
    plan = plans[name]
    assert plan.wheel_row.torch == builder
    assert plan.pip_refuses is pip_refuses
    assert set(words) <= set(plan.guard_words)
    # Every guard message names the installed hotloop, the torch found and a command.
    assert {"ImportError", "pip install", plan.wheel_row.version} <= set(plan.guard_words)


def test_the_cpu_pair_installs_torch_from_pytorchs_cpu_index(plans) -> None:
    assert plans["stable.cu13-torch2.11.0+cpu"].index_url == negatives.CPU_INDEX
    assert plans["stable.cu13-torch2.10.0"].index_url is None


@pytest.mark.parametrize(
    ("pair", "error"),
    [
        (negatives.NegativePair("stable.cu13", "2.14.1"), "serves torch 2.14.1"),
        (negatives.NegativePair("pt211cu130", "2.9.1"), "builds no pt211cu130 wheel"),
        (negatives.NegativePair("stable.cu13", "2.7.0"), "torch 2.7.0 is no matrix row"),
    ],
)
def test_a_pair_the_matrix_cannot_run_is_an_error(pair, error) -> None:
    with pytest.raises(ValueError, match=error):
        negatives.plan_negatives([pair], matrix.load_rows())


PIP_CONFLICT = """\
Processing ./hotloop-0.1.0+stable.cu13-cp39-abi3-manylinux_2_28_x86_64.whl
Requirement already satisfied: torch==2.9.1 in ./venv/lib/python3.12/site-packages (2.9.1)
ERROR: Cannot install hotloop==0.1.0+stable.cu13 and torch==2.9.1 because these package \
versions have conflicting dependencies.

The conflict is caused by:
    The user requested torch==2.9.1
    hotloop 0.1.0+stable.cu13 depends on torch>=2.10
ERROR: ResolutionImpossible: for help visit https://pip.pypa.io/...
"""
GUARD_ERROR = (
    "Traceback (most recent call last):\n"
    "ImportError: hotloop 0.1.0+stable.cu13 needs torch >= 2.10 built with CUDA 13, but this "
    "environment has torch 2.10.0+cu128 (CUDA 12.8): the CUDA major versions differ. "
    'To fix: pip install --force-reinstall "hotloop==0.1.0+stable.cu12" ...'
)


def test_pip_conflict_counts_as_refusal() -> None:
    ok, detail = negatives.check_pip_refusal(PIP_CONFLICT, 1, "torch>=2.10", "2.9.1")
    assert ok, detail
    assert "torch>=2.10" in detail


@pytest.mark.parametrize(
    ("output", "rc", "why"),
    [
        ("Successfully installed hotloop", 0, "installed"),
        ("ERROR: No matching distribution found for torch>=2.10", 1, "lacks"),
        ("ERROR: network down torch>=2.10 torch 2.9.1", 1, "not with a dependency conflict"),
    ],
)
def test_pip_failing_for_another_reason_is_not_a_refusal(output, rc, why) -> None:
    ok, detail = negatives.check_pip_refusal(output, rc, "torch>=2.10", "2.9.1")
    assert not ok
    assert why in detail


def test_guard_error_must_contain_the_pairs_words(plans) -> None:
    words = plans["stable.cu13-torch2.10.0"].guard_words
    ok, detail = negatives.check_guard_error(GUARD_ERROR, 1, words)
    assert ok, detail
    assert detail.startswith("ImportError")
    ok, detail = negatives.check_guard_error(GUARD_ERROR.replace("CUDA 12", "CUDA ?"), 1, words)
    assert not ok
    assert "CUDA 12" in detail
    ok, detail = negatives.check_guard_error("", 0, words)
    assert not ok
    assert "succeeded" in detail
    raw = "ImportError: _C.abi3.so: undefined symbol: aoti_torch_dtype_float32 " + " ".join(words)
    ok, detail = negatives.check_guard_error(raw, 1, words)
    assert not ok
    assert "undefined symbol" in detail


def test_clean_pip_env_ignores_the_machines_pip_config(monkeypatch) -> None:
    monkeypatch.setenv("PIP_FIND_LINKS", "/opt/wheels")
    monkeypatch.setenv("PIP_CONSTRAINT", "/etc/c.txt")
    env = negatives.clean_pip_env()
    assert "PIP_FIND_LINKS" not in env
    assert "PIP_CONSTRAINT" not in env
    assert env["PIP_CONFIG_FILE"] == "/dev/null"


# --------------------------------------------------------------------------- one pair, faked


class FakeProcesses:
    """Stands in for subprocess.run: records each command, answers as pip and Python would."""

    def __init__(self, guard_output: str, torch_install_fails: bool = False) -> None:
        self.commands: list[list[str]] = []
        self.guard_output = guard_output
        self.torch_install_fails = torch_install_fails

    def __call__(self, cmd, **kwargs):
        cmd = [str(c) for c in cmd]
        self.commands.append(cmd)
        if cmd[:2] == ["uv", "venv"]:
            Path(cmd[-1], "bin").mkdir(parents=True)
            return subprocess.CompletedProcess(cmd, 0, "", "")
        if cmd[:3] == ["uv", "pip", "install"]:
            if self.torch_install_fails:
                raise subprocess.CalledProcessError(2, cmd)
            return subprocess.CompletedProcess(cmd, 0, "", "")
        if "--no-deps" in cmd:
            return subprocess.CompletedProcess(cmd, 0, "Successfully installed hotloop", "")
        if cmd[1:3] == ["-m", "pip"]:
            return subprocess.CompletedProcess(cmd, 1, "", PIP_CONFLICT)
        if cmd[1] == "-c":
            return subprocess.CompletedProcess(cmd, 1, "", self.guard_output)
        raise AssertionError(f"unexpected command {cmd}")


@pytest.fixture
def interp() -> Interpreter:
    return Interpreter("3.12", Path("/usr/bin/python3.12"), "PATH")


def fake(monkeypatch, processes: FakeProcesses) -> FakeProcesses:
    monkeypatch.setattr(negatives.build, "uv_exe", lambda: "uv")
    monkeypatch.setattr(negatives.subprocess, "run", processes)
    return processes


def test_a_pin_that_excludes_the_torch_is_checked_with_pip_then_the_guard(
    monkeypatch, tmp_path, plans, interp
) -> None:
    guard = (
        "ImportError: hotloop 0.1.0+stable.cu13 needs torch>=2.10; found torch 2.9.1. pip install"
    )
    processes = fake(monkeypatch, FakeProcesses(guard))
    wheel = tmp_path / "hotloop-0.1.0+stable.cu13-cp39-abi3-manylinux_2_28_x86_64.whl"
    checks = negatives.run_negative(plans["stable.cu13-torch2.9.1"], wheel, interp, tmp_path / "w")
    assert [(c["check"], c["status"]) for c in checks] == [
        ("pip refuses the torch pin", PASS),
        ("import guard after --no-deps", PASS),
    ]
    torch_install = next(c for c in processes.commands if c[:3] == ["uv", "pip", "install"])
    assert torch_install[-1] == "torch==2.9.1"
    pip_check = next(c for c in processes.commands if c[1:3] == ["-m", "pip"])
    assert pip_check[-2:] == [str(wheel), "torch==2.9.1"]
    assert "--no-index" in pip_check


def test_a_cuda_mismatch_the_pin_cannot_see_is_checked_by_the_guard_alone(
    monkeypatch, tmp_path, plans, interp
) -> None:
    processes = fake(monkeypatch, FakeProcesses(GUARD_ERROR))
    wheel = tmp_path / "hotloop-0.1.0+stable.cu13-cp39-abi3-manylinux_2_28_x86_64.whl"
    plan = plans["stable.cu13-torch2.10.0"]
    checks = negatives.run_negative(plan, wheel, interp, tmp_path / "w")
    assert [(c["check"], c["status"]) for c in checks] == [("import guard after --no-deps", PASS)]
    assert checks[0]["venv_torch"] == "2.10.0"
    assert not [c for c in processes.commands if c[1:3] == ["-m", "pip"] and "--no-deps" not in c]


def test_an_unreachable_cpu_index_leaves_the_pair_not_run(
    monkeypatch, tmp_path, plans, interp
) -> None:
    processes = fake(monkeypatch, FakeProcesses("", torch_install_fails=True))
    wheel = tmp_path / "w.whl"
    checks = negatives.run_negative(plans["stable.cu13-torch2.11.0+cpu"], wheel, interp, tmp_path)
    assert [c["status"] for c in checks] == [NOT_RUN]
    assert negatives.CPU_INDEX in checks[0]["detail"]
    install = next(c for c in processes.commands if c[:3] == ["uv", "pip", "install"])
    assert install[-3:] == ["--extra-index-url", negatives.CPU_INDEX, "torch==2.11.0+cpu"]
    # A torch from PyPI that does not install is a failure, not a skip.
    fake(monkeypatch, FakeProcesses("", torch_install_fails=True))
    checks = negatives.run_negative(plans["stable.cu13-torch2.10.0"], wheel, interp, tmp_path / "p")
    assert [c["status"] for c in checks] == [FAIL]
