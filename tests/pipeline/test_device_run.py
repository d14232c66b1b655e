"""benchmarks/device_run.sh: what it runs on a lent GPU machine, checked here with a stub
python3 that records each call (the GPU host has torch and a GPU; this one need not)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
STUB = """#!/usr/bin/env bash
echo "$(basename "$0") SHARD=${HOTLOOP_TEST_SHARD:-} PYTHONPATH=${PYTHONPATH:-} $*" >> "$STUB_LOG"
"""
STUBBED = ("python3", "nvidia-smi", "compute-sanitizer", "ncu")


def device_run(
    tmp_path: Path, *args: str, failing: tuple[str, ...] = (), **env: str
) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """device_run.sh with the STUBBED programs recording their calls; those in `failing` also
    print a last line and exit 1."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name in STUBBED:
        stub = bin_dir / name
        stub.write_text(STUB + (f'echo "{name} failed"\nexit 1\n' if name in failing else ""))
        stub.chmod(0o755)
    log = tmp_path / "calls.log"
    run = subprocess.run(
        ["bash", "benchmarks/device_run.sh", *args],
        cwd=REPO,
        env={
            **os.environ,
            "PATH": f"{bin_dir}:{os.environ['PATH']}",
            "STUB_LOG": str(log),
            "TMPDIR": str(tmp_path),  # the sites the script makes
            **env,
        },
        capture_output=True,
        text=True,
        check=False,
    )
    calls = log.read_text().splitlines() if log.exists() else []
    return run, calls


def wheel(tmp_path: Path, name: str) -> str:
    path = tmp_path / f"hotloop-0.1.0+{name}-cp39-abi3-linux_x86_64.whl"
    path.write_bytes(b"")
    return str(path)


def test_compare_runs_each_wheel_in_turn_then_compares(tmp_path: Path) -> None:
    new, base, out = wheel(tmp_path, "new"), wheel(tmp_path, "base"), tmp_path / "out"
    run, calls = device_run(
        tmp_path, "compare", new, str(out), base, "--hidden", "32768", HOTLOOP_COMPARE_ROUNDS="2"
    )
    assert run.returncode == 0, run.stderr
    installs = [c for c in calls if " -m pip install " in c]
    assert len(installs) == 2
    assert f" {new}" in installs[0]
    assert f" {base}" in installs[1]
    site_of = {w: c.split("--target ")[1].split()[0] for c, w in zip(installs, (new, base))}
    benches = [c for c in calls if "bench_rms_norm.py" in c]
    expected = [("base", 1), ("new", 1), ("base", 2), ("new", 2)]
    assert len(benches) == len(expected)
    for call, (label, round_) in zip(benches, expected):
        assert f" PYTHONPATH={site_of[base if label == 'base' else new]} " in call
        assert f"--out {out}/{label}-{round_} --hidden 32768" in call
    assert "compare_runs.py --label base" in calls[-1]
    assert f"--out {out}/compare" in calls[-1]


def test_compare_takes_several_candidates_against_one_base(tmp_path: Path) -> None:
    """WHEEL,WHEEL2: each candidate in turn with the base in every round, so the base's runs
    serve them all and the candidates compare with each other within one stretch of time."""
    one, two, base = wheel(tmp_path, "one"), wheel(tmp_path, "two"), wheel(tmp_path, "base")
    out = tmp_path / "out"
    run, calls = device_run(
        tmp_path, "compare", f"{one},{two}", str(out), base, "--hidden", "2047",
        HOTLOOP_COMPARE_ROUNDS="2",
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    installs = [c for c in calls if " -m pip install " in c]
    site_of = {w: c.split("--target ")[1].split()[0] for c, w in zip(installs, (one, two, base))}
    assert len(set(site_of.values())) == 3
    benches = [c for c in calls if "bench_rms_norm.py" in c]
    expected = [("base", 1), ("new", 1), ("new2", 1), ("base", 2), ("new", 2), ("new2", 2)]
    assert len(benches) == len(expected)
    wheel_of = {"base": base, "new": one, "new2": two}
    for call, (label, round_) in zip(benches, expected):
        assert f" PYTHONPATH={site_of[wheel_of[label]]} " in call
        assert f"--out {out}/{label}-{round_} --hidden 2047" in call
    assert f"--label new2 {out}/new2-1/rms_norm.json {out}/new2-2/rms_norm.json" in calls[-1]


def test_compare_names_a_candidate_that_is_not_there(tmp_path: Path) -> None:
    one, base, out = wheel(tmp_path, "one"), wheel(tmp_path, "base"), tmp_path / "out"
    missing = str(tmp_path / "o81" / "hotloop.whl")
    run, calls = device_run(tmp_path, "compare", f"{one},{missing}", str(out), base)
    assert run.returncode == 2
    assert f"{missing}: no such wheel" in run.stderr
    assert calls == []
    assert not out.exists()


def test_same_dumps_each_wheel_in_its_own_site_then_compares(tmp_path: Path) -> None:
    new, base, out = wheel(tmp_path, "new"), wheel(tmp_path, "base"), tmp_path / "out"
    run, calls = device_run(tmp_path, "same", new, str(out), base)
    assert run.returncode == 0, run.stderr
    installs = [c for c in calls if " -m pip install " in c]
    site_of = {w: c.split("--target ")[1].split()[0] for c, w in zip(installs, (new, base))}
    dumps = [c for c in calls if "output_digests.py dump" in c]
    assert len(dumps) == 2
    assert f" PYTHONPATH={site_of[base]} " in dumps[0]
    assert dumps[0].endswith(f"dump {out}/digests-base.json")
    assert f" PYTHONPATH={site_of[new]} " in dumps[1]
    assert dumps[1].endswith(f"dump {out}/digests-new.json")
    assert calls[-1].endswith(
        f"output_digests.py compare {out}/digests-base.json {out}/digests-new.json "
        f"--out {out}/same.md"
    )


def test_tests_runs_the_shards_beside_memcheck(tmp_path: Path) -> None:
    out = tmp_path / "out"
    run, calls = device_run(
        tmp_path, "tests", wheel(tmp_path, "new"), str(out), HOTLOOP_TEST_SHARDS="3"
    )
    assert run.returncode == 0, run.stderr
    shards = sorted(c.split()[1] for c in calls if " -m pytest " in c)
    assert shards == ["SHARD=0/3", "SHARD=1/3", "SHARD=2/3"]
    assert any(c.startswith("compute-sanitizer ") and "memcheck_ops.py" in c for c in calls)
    # env.txt names the GPU by UUID (the table nvidia-smi prints by default does not)
    assert any(c.startswith("nvidia-smi ") and "--query-gpu=name,uuid," in c for c in calls)
    assert sorted(p.name for p in out.glob("gpu-tests-*.log")) == [
        f"gpu-tests-{i}.log" for i in range(3)
    ]


def test_ncu_profiles_each_width_in_a_process_of_its_own(tmp_path: Path) -> None:
    out = tmp_path / "out"
    run, calls = device_run(
        tmp_path, "ncu", wheel(tmp_path, "new"), str(out), "2047,2048", "--mode", "fwd+bwd"
    )
    assert run.returncode == 0, run.stderr
    (install,) = [c for c in calls if " -m pip install " in c]
    site = install.split("--target ")[1].split()[0]
    profiles = [c for c in calls if c.startswith("ncu ") and "--import" not in c]
    assert len(profiles) == 2
    for call, hidden in zip(profiles, ("2047", "2048")):
        assert f" PYTHONPATH={site} " in call
        assert "--profile-from-start off" in call
        assert f"-o {out}/ncu-{hidden} " in call
        assert call.endswith(f"python3 benchmarks/profile_rows.py --hidden {hidden} --mode fwd+bwd")
        # The report's sections, then its source page, summarised
        imports = [c for c in calls if f"--import {out}/ncu-{hidden}.ncu-rep" in c]
        assert len(imports) == 2
        assert "--page source --print-source sass --csv" in imports[1]
        assert any(f"ncu_sass_summary.py {out}/ncu-{hidden}-sass.csv" in c for c in calls)
    assert sorted(p.name for p in out.iterdir()) == ["env.txt"] + [
        f"ncu-{h}{suffix}"
        for h in ("2047", "2048")
        for suffix in ("-sass.csv", "-sass.md", ".log", ".txt")
    ]


def test_ncu_names_a_width_whose_profile_failed(tmp_path: Path) -> None:
    out = tmp_path / "out"
    run, calls = device_run(
        tmp_path, "ncu", wheel(tmp_path, "new"), str(out), "2047,2048", failing=("ncu",)
    )
    assert run.returncode == 1
    assert "ncu, H = 2047 failed" in run.stderr
    assert "ncu, H = 2048 failed" in run.stderr
    assert "ncu failed" in run.stderr  # the log's end, where the failure is
    # The profile failed: no import of a report that is not there, no summary
    assert len([c for c in calls if c.startswith("ncu ")]) == 2
    assert not [c for c in calls if "--import" in c or "ncu_sass_summary.py" in c]


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (("compare",), {}, "usage:"),
        (("compare", "missing-base.whl"), {}, "usage:"),
        (("compare", "BASE"), {"HOTLOOP_COMPARE_ROUNDS": "0"}, "HOTLOOP_COMPARE_ROUNDS=0"),
        (("tests",), {"HOTLOOP_TEST_SHARDS": "four"}, "HOTLOOP_TEST_SHARDS=four"),
        (("tests",), {"HOTLOOP_TEST_SHARDS": "0"}, "HOTLOOP_TEST_SHARDS=0"),
        (("same",), {}, "usage:"),
        (("same", "BASE", "--quick"), {}, "takes no options after BASE_WHEEL"),
        (("ncu",), {}, "expected the widths to profile"),
        (("ncu", "2047,wide"), {}, "got '2047,wide'"),
    ],
)
def test_bad_arguments_are_named_before_anything_runs(
    tmp_path: Path, args: tuple[str, ...], env: dict[str, str], message: str
) -> None:
    new, base, out = wheel(tmp_path, "new"), wheel(tmp_path, "base"), tmp_path / "out"
    phase, *rest = args
    argv = [phase, new, str(out), *(base if a == "BASE" else a for a in rest)]
    run, calls = device_run(tmp_path, *argv, **env)
    assert run.returncode == 2
    assert message in run.stderr
    assert calls == []
    assert not out.exists()


@pytest.mark.parametrize("phase", ["tests", "bench", "compare", "same", "ncu"])
def test_a_folder_holding_files_is_refused_and_left_alone(tmp_path: Path, phase: str) -> None:
    # The phases write fixed names (env.txt, memcheck.log, bench.log, base-1.log, ...) into
    # OUT_DIR: a folder of the user's that holds files is not theirs to fill.
    new, base, out = wheel(tmp_path, "new"), wheel(tmp_path, "base"), tmp_path / "out"
    out.mkdir()
    (out / "memcheck.log").write_text("the user's own\n")
    extra = {"compare": [base], "same": [base], "ncu": ["2047"]}.get(phase, [])
    run, calls = device_run(tmp_path, phase, new, str(out), *extra)
    assert run.returncode == 2
    assert f"{out} is not empty" in run.stderr
    assert calls == []
    assert [p.name for p in out.iterdir()] == ["memcheck.log"]
    assert (out / "memcheck.log").read_text() == "the user's own\n"
