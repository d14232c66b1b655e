"""benchmarks/output_digests.py: dumps of one build agree to the bit, a changed output is named,
and dumps of another device or grid are refused rather than compared."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from op_testing import DEVICES, load_benchmark


@pytest.fixture(scope="module")
def digests() -> Any:
    return load_benchmark("output_digests")


def dump(digests: Any, path: Path, device: str) -> dict[str, Any]:
    assert digests.main(["dump", str(path), "--device", device, "--quick"]) == 0
    return json.loads(path.read_text())


@pytest.mark.parametrize("device", DEVICES)
def test_a_build_agrees_with_itself_and_a_changed_output_is_named(
    digests: Any, tmp_path: Path, device: str, capsys: pytest.CaptureFixture[str]
) -> None:
    first = dump(digests, tmp_path / "first.json", device)
    dump(digests, tmp_path / "second.json", device)
    # Every op of the grid ran: no case raised, each case has its outputs
    assert not [c for c, v in first["cases"].items() if isinstance(v, str)]
    ops = {case.split()[0] for case in first["cases"]}
    assert ops == {"rms_norm", "fused_add_rms_norm", "rms_norm_fp8_dynamic"}
    assert (
        digests.main(["compare", str(tmp_path / "first.json"), str(tmp_path / "second.json")]) == 0
    )
    assert f"{len(first['cases'])} cases, 0 differ." in capsys.readouterr().out

    # A build whose grad_weight moved by one bit in one case, and which refuses another
    case, outputs = next((c, v) for c, v in first["cases"].items() if len(v) == 3)
    refused = next(c for c in first["cases"] if c.startswith("fused_add_rms_norm"))
    changed = {**first["cases"], case: [*outputs[:2], "0" * 24], refused: "RuntimeError: no"}
    (tmp_path / "changed.json").write_text(json.dumps({**first, "cases": changed}))
    report = tmp_path / "same.md"
    argv = ["compare", str(tmp_path / "first.json"), str(tmp_path / "changed.json")]
    assert digests.main([*argv, "--out", str(report)]) == 1
    text = report.read_text()
    assert f"{len(first['cases'])} cases, 2 differ." in text
    assert f"- {case}: output(s) 2 differ" in text
    assert f"- {refused}: " in text
    assert "RuntimeError: no" in text


def test_outputs_depend_on_the_kernels_input(digests: Any) -> None:
    torch = pytest.importorskip("torch")
    a = torch.tensor([1.0, 2.0], dtype=torch.bfloat16)
    b = torch.tensor([1.0, 2.015625], dtype=torch.bfloat16)  # one bfloat16 ulp apart
    assert digests.digest(a) != digests.digest(b)
    assert digests.digest(a) == digests.digest(a.clone())
    assert digests.digest(a) != digests.digest(a.view(2, 1))  # the shape counts too


@pytest.mark.parametrize(("key", "value"), [("device", "NVIDIA H200"), ("quick", False)])
def test_dumps_of_another_device_or_grid_are_refused(
    digests: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str], key: str, value: Any
) -> None:
    base = {"format": 1, "device": "cpu", "hotloop": "a", "torch": "t", "quick": True, "cases": {}}
    (tmp_path / "base.json").write_text(json.dumps(base))
    (tmp_path / "new.json").write_text(json.dumps({**base, key: value}))
    assert digests.main(["compare", str(tmp_path / "base.json"), str(tmp_path / "new.json")]) == 2
    assert f"has {key}" in capsys.readouterr().err


def test_a_dump_never_overwrites_a_file(
    digests: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    existing = tmp_path / "digests.json"
    existing.write_text("the user's own\n")
    assert digests.main(["dump", str(existing), "--device", "cpu", "--quick"]) == 2
    assert existing.read_text() == "the user's own\n"
    assert "exists" in capsys.readouterr().err


def test_a_report_never_overwrites_a_file(
    digests: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dump(digests, tmp_path / "base.json", "cpu")
    report = tmp_path / "same.md"
    report.write_text("the user's own\n")
    argv = ["compare", str(tmp_path / "base.json"), str(tmp_path / "base.json")]
    assert digests.main([*argv, "--out", str(report)]) == 2
    assert report.read_text() == "the user's own\n"
    assert "exists" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("text", "message"),
    [("not json", "Expecting value"), ('{"format": 1}', "not a dump of this tool")],
)
def test_a_file_that_is_not_a_dump_is_named(
    digests: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, message: str
) -> None:
    dump(digests, tmp_path / "base.json", "cpu")
    other = tmp_path / "other.json"
    other.write_text(text)
    assert digests.main(["compare", str(tmp_path / "base.json"), str(other)]) == 2
    err = capsys.readouterr().err
    assert str(other) in err
    assert message in err


def test_a_cuda_dump_without_a_gpu_says_what_to_pass(
    digests: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: the dump would run")
    assert digests.main(["dump", str(tmp_path / "d.json")]) == 2
    assert "pass --device cpu" in capsys.readouterr().err
    assert not (tmp_path / "d.json").exists()
