"""benchmarks/compare_runs.py, and bench_rms_norm.py's --hidden that its runs use."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from op_testing import load_benchmark, requires_cuda


@pytest.fixture(scope="module")
def compare_runs() -> Any:
    return load_benchmark("compare_runs")


def result(hidden: int, pct: float | None, mode: str = "fwd") -> dict:
    """A bench_rms_norm result row of hotloop CUDA; pct None: a row that failed its check."""
    return {
        "op": "rms_norm",
        "mode": mode,
        "impl": "hotloop CUDA",
        "shape": [1024, hidden],
        "hidden": hidden,
        "dtype": "bfloat16",
        "status": "ok" if pct is not None else "failed",
        "pct_copy": pct,
    }


def run(
    folder: Path,
    name: str,
    pcts: dict[int, float | None],
    device: str = "H100",
    uuid: str = "GPU-a",
) -> str:
    """A run's rms_norm.json with the given % of copy a hidden size; its path."""
    path = folder / f"{name}.json"
    record = {
        "meta": {"tool": "bench_rms_norm", "device": device, "device_uuid": uuid},
        "results": [result(hidden, pct) for hidden, pct in pcts.items()],
    }
    path.write_text(json.dumps(record))
    return path.as_posix()


def test_medians_per_label_and_differences_from_the_first(
    compare_runs: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    main = [
        run(tmp_path, "main-1", {4096: 97.0, 8192: 95.0}),
        run(tmp_path, "main-2", {4096: 97.4, 8192: 95.2}),
    ]
    new = [
        run(tmp_path, "new-1", {4096: 98.4, 8192: 94.0}),
        run(tmp_path, "new-2", {4096: 98.6, 8192: 94.2}),
    ]
    out = tmp_path / "compare"
    args = ["--label", "main", *main, "--label", "new", *new, "--out", str(out)]
    assert compare_runs.main(args) == 0
    report = json.loads((out / "compare_runs.json").read_text())
    assert report["meta"]["labels"] == ["main", "new"]
    rows = {row["shape"][1]: row for row in report["rows"]}
    assert rows[4096]["main"]["median"] == pytest.approx(97.2)
    assert rows[4096]["new"]["diff"] == pytest.approx(1.3)
    assert rows[8192]["new"]["diff"] == pytest.approx(-1.0)
    assert (rows[8192]["new"]["min"], rows[8192]["new"]["max"]) == (94.0, 94.2)
    printed = capsys.readouterr().out
    assert printed == (out / "compare_runs.md").read_text()
    assert "| 97.2 (97.0-97.4) | 98.5 (98.4-98.6) +1.3 |" in printed


def test_rows_that_a_label_did_not_measure_are_left_out(compare_runs: Any, tmp_path: Path) -> None:
    main = compare_runs.load_run(Path(run(tmp_path, "a", {4096: 90.0, 512: 80.0})))
    new = compare_runs.load_run(Path(run(tmp_path, "b", {4096: 91.0, 512: None})))
    report = compare_runs.compare({"main": [main], "new": [new]})
    assert [row["shape"][1] for row in report["rows"]] == [4096]


def test_runs_of_different_gpus_are_refused(compare_runs: Any, tmp_path: Path) -> None:
    a = run(tmp_path, "a", {4096: 90.0})
    b = run(tmp_path, "b", {4096: 91.0}, device="H200", uuid="GPU-b")
    with pytest.raises(SystemExit, match=r"different GPUs \(H100 GPU-a, H200 GPU-b\)"):
        compare_runs.main(["--label", "main", a, "--label", "new", b])
    # Two GPUs of one model, as a pool lends them: apart by a point at some widths.
    c = run(tmp_path, "c", {4096: 91.0}, uuid="GPU-c")
    with pytest.raises(SystemExit, match=r"different GPUs \(H100 GPU-a, H100 GPU-c\)"):
        compare_runs.main(["--label", "main", a, "--label", "new", c])


def test_a_file_of_another_tool_is_named(compare_runs: Any, tmp_path: Path) -> None:
    other = tmp_path / "host_overhead.json"
    other.write_text(json.dumps({"meta": {"tool": "host_overhead"}, "results": []}))
    with pytest.raises(
        SystemExit, match=r"host_overhead\.json was written by host_overhead, not bench_rms_norm"
    ):
        compare_runs.main(["--label", "main", str(other)])
    (tmp_path / "x.json").write_text("not json")
    with pytest.raises(SystemExit, match="is not JSON"):
        compare_runs.main(["--label", "main", str(tmp_path / "x.json")])


def test_a_label_needs_runs_and_a_name_of_its_own(
    compare_runs: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = run(tmp_path, "a", {4096: 90.0})
    with pytest.raises(SystemExit):
        compare_runs.main(["--label", "main", a, "--label", "new"])
    assert "--label new names no run" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        compare_runs.main(["--label", "main", a, "--label", "main", a])
    assert "each --label needs its own name" in capsys.readouterr().err


def test_out_never_replaces_a_file_it_did_not_write(compare_runs: Any, tmp_path: Path) -> None:
    a = run(tmp_path, "a", {4096: 90.0})
    out = tmp_path / "out"
    out.mkdir()
    (out / "compare_runs.md").write_text("notes of mine\n")
    with pytest.raises(SystemExit, match="not written by compare_runs"):
        compare_runs.main(["--label", "main", a, "--out", str(out)])
    assert (out / "compare_runs.md").read_text() == "notes of mine\n"


@pytest.mark.parametrize("option", ["--hidden", "--sweep-hidden"])
def test_bench_widths_take_a_list_of_positive_sizes(option: str) -> None:
    bench = load_benchmark("bench_rms_norm")
    attribute = option.removeprefix("--").replace("-", "_")
    assert getattr(bench.parse_args([option, "3001,12288"]), attribute) == {3001, 12288}
    assert getattr(bench.parse_args([]), attribute) is None
    for bad in ("0", "4096,x", ","):
        with pytest.raises(SystemExit):
            bench.parse_args([option, bad])


def test_bench_castings_is_off_unless_asked() -> None:
    bench = load_benchmark("bench_rms_norm")
    assert bench.parse_args([]).castings is False
    assert bench.parse_args(["--castings", "--hidden", "16384"]).castings is True


@pytest.mark.gpu
@requires_cuda
def test_castings_are_timed_at_the_chosen_widths(tmp_path: Path) -> None:
    bench = load_benchmark("bench_rms_norm")
    options = ["--hidden", "1024", "--rms-norm-only", "--no-small-batch", "--no-plot", "--quick"]
    assert (
        bench.main([*options, "--castings", "--only", "hotloop cuda", "--out", str(tmp_path)]) == 0
    )
    record = json.loads((tmp_path / "rms_norm.json").read_text())
    assert record["meta"]["castings_at_every_width"] is True
    rows = {(r["impl"], r["mode"]) for r in record["results"] if r["hidden"] == 1024}
    for impl in ("hotloop CUDA", "hotloop CUDA llama", "hotloop CUDA gemma"):
        assert {(impl, "fwd"), (impl, "fwd+bwd")} <= rows


@pytest.mark.gpu
@requires_cuda
def test_sweep_hidden_times_widths_the_sweep_does_not_hold(tmp_path: Path) -> None:
    bench = load_benchmark("bench_rms_norm")
    options = ["--rms-norm-only", "--no-small-batch", "--no-plot", "--quick"]
    widths = ["--sweep-hidden", "3001,6001", "--hidden", "3001,6001"]  # --hidden: no headline
    out = ["--only", "hotloop cuda", "--out", str(tmp_path)]
    assert bench.main([*options, *widths, *out]) == 0
    record = json.loads((tmp_path / "rms_norm.json").read_text())
    assert record["meta"]["sweep_hidden"] == [3001, 6001]
    sweep = {r["hidden"] for r in record["results"] if "sweep" in r["tags"]}
    assert sweep == {3001, 6001}


@pytest.mark.gpu
@requires_cuda
def test_runs_of_chosen_widths_compare(
    compare_runs: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bench = load_benchmark("bench_rms_norm")
    options = ["--hidden", "1024", "--rms-norm-only", "--no-small-batch", "--no-plot", "--quick"]
    for name in ("a", "b"):
        assert bench.main([*options, "--only", "hotloop cuda", "--out", str(tmp_path / name)]) == 0
    record = json.loads((tmp_path / "a" / "rms_norm.json").read_text())
    assert record["meta"]["hidden"] == [1024]
    assert record["meta"]["device_uuid"]  # which GPU of a pool, for compare_runs
    assert {tuple(r["shape"])[-1] for r in record["results"]} == {1024}
    capsys.readouterr()
    a, b = (str(tmp_path / name / "rms_norm.json") for name in ("a", "b"))
    compare_runs.main(["--label", "a", a, "--label", "b", b])
    table = capsys.readouterr().out
    assert "| rms_norm | fwd | hotloop CUDA |" in table
    assert "| rms_norm | fwd+bwd | hotloop CUDA |" in table
