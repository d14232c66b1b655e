"""benchmarks/profile_rows.py, the driver device_run.sh runs under ncu: its calls, on the CPU."""

from __future__ import annotations

import pytest
from op_testing import DEVICES, load_benchmark


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", ["fwd", "fwd+bwd"])
@pytest.mark.parametrize("casting", ["torch", "gemma"])
def test_profile_rows_makes_its_calls(
    device: str, mode: str, casting: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # On a GPU the profiled call runs between cudaProfilerStart and cudaProfilerStop, which
    # do nothing without a profiler attached.
    module = load_benchmark("profile_rows")
    argv = ["--hidden", "2047", "--rows", "5", "--device", device, "--mode", mode]
    assert module.main([*argv, "--casting", casting]) == 0
    out = capsys.readouterr().out
    assert (
        f"rms_norm {mode} (5, 2047) bfloat16, casting {casting}, backend native on {device}" in out
    )


def test_profile_rows_needs_a_gpu_to_profile(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    module = load_benchmark("profile_rows")
    monkeypatch.setattr(module.torch.cuda, "is_available", lambda: False)
    assert module.main(["--hidden", "2047"]) == 2
    assert "profile_rows: no CUDA device" in capsys.readouterr().err


def test_profile_rows_names_a_bad_width(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        load_benchmark("profile_rows").parse_args(["--hidden", "0"])
    assert "--hidden 0: expected 1 or more" in capsys.readouterr().err


def test_profile_rows_names_a_device_it_does_not_profile(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        load_benchmark("profile_rows").parse_args(["--hidden", "2047", "--device", "cuda:1"])
    assert "invalid choice: 'cuda:1'" in capsys.readouterr().err
