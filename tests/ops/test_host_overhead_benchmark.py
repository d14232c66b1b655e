"""benchmarks/host_overhead.py runs and records what each call did on the host."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from op_testing import load_benchmark


def test_host_overhead_records_each_calls_operators(tmp_path: Path) -> None:
    module = load_benchmark("host_overhead")
    assert module.main(["--device", "cpu", "--calls", "5", "--out", str(tmp_path)]) == 0

    record = json.loads((tmp_path / "host_overhead.json").read_text())
    # The versions every committed figure carries (no driver without a GPU).
    assert {"device_name", "driver", "torch", "cuda", "triton"} <= set(record["meta"])
    assert record["meta"]["driver"] is None
    rows = record["rows"]
    # Per shape: five forwards in two grad modes, two forward+backward steps (the third, over
    # torch's fused kernels, is CUDA's only) and one backward operator.
    assert len(rows) == len(module.SHAPES) * (5 * 2 + 2 + 1)
    by_call = {(r["call"], r["mode"], tuple(r["shape"])): r for r in rows}
    op = by_call["torch.ops.hotloop.rms_norm", "inference_mode", (1, 4096)]
    assert op["us_median"] > 0
    assert any(e["name"] == "hotloop::rms_norm" and e["per_call"] == 1 for e in op["events"])
    step = by_call["hotloop.rms_norm", "forward+backward", (8, 4096)]
    names = {e["name"]: e["per_call"] for e in step["events"]}
    assert names.get("hotloop::rms_norm") == 1
    assert names.get("hotloop::rms_norm_backward") == 1
    backward = by_call["torch.ops.hotloop.rms_norm_backward", "inference_mode", (32, 8192)]
    assert backward["us_median"] > 0
    assert "| (1, 4096) | F.rms_norm | no_grad |" in (tmp_path / "host_overhead.md").read_text()


def test_host_overhead_refuses_no_calls(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        load_benchmark("host_overhead").main(
            ["--device", "cpu", "--calls", "0", "--out", str(tmp_path)]
        )
    assert "--calls: must be at least 1, got 0" in capsys.readouterr().err
    assert not (tmp_path / "host_overhead.json").exists()


def test_host_overhead_leaves_a_foreign_file_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    notes = tmp_path / "host_overhead.md"
    notes.write_text("my own notes\n")
    with pytest.raises(SystemExit) as refused:
        load_benchmark("host_overhead").main(
            ["--device", "cpu", "--calls", "1", "--out", str(tmp_path)]
        )
    assert "host_overhead.md already exists and was not written by host_overhead" in str(
        refused.value
    )
    assert notes.read_text() == "my own notes\n"
    assert not (tmp_path / "host_overhead.json").exists()


def test_host_overhead_rewrites_its_own_output(tmp_path: Path) -> None:
    module = load_benchmark("host_overhead")
    for _ in range(2):
        assert module.main(["--device", "cpu", "--calls", "1", "--out", str(tmp_path)]) == 0
    assert json.loads((tmp_path / "host_overhead.json").read_text())["meta"]["tool"] == (
        "host_overhead"
    )
