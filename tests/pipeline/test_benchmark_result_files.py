"""benchmarks/result_files.py: a benchmark overwrites only the files it wrote itself."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "result_files.py"


@pytest.fixture(scope="module")
def result_files() -> Any:
    spec = importlib.util.spec_from_file_location("result_files", SCRIPT)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def record(path: Path, meta: object) -> None:
    path.write_text(json.dumps({"meta": meta, "results": []}))


def test_an_empty_or_missing_folder_is_free(result_files: Any, tmp_path: Path) -> None:
    result_files.claim(tmp_path / "new", ["rms_norm.json", "rms_norm.md"], "bench_rms_norm")
    result_files.claim(tmp_path, ["rms_norm.json", "rms_norm.md"], "bench_rms_norm")


def test_the_tools_own_outputs_are_its_to_rewrite(result_files: Any, tmp_path: Path) -> None:
    record(tmp_path / "rms_norm.json", {"tool": "bench_rms_norm"})
    (tmp_path / "rms_norm.md").write_text("| table |\n")
    (tmp_path / "rms_norm.png").write_bytes(b"\x89PNG")
    result_files.claim(tmp_path, ["rms_norm.json", "rms_norm.md", "rms_norm.png"], "bench_rms_norm")


@pytest.mark.parametrize(
    "meta",
    [{"tool": "bench_llama"}, {}, "not a dict", None],
    ids=["another-tool", "no-tool", "meta-not-a-dict", "meta-null"],
)
def test_a_record_of_another_kind_is_refused(
    result_files: Any, tmp_path: Path, meta: object
) -> None:
    record(tmp_path / "rms_norm.json", meta)
    with pytest.raises(SystemExit, match=r"rms_norm\.json already exists and was not written"):
        result_files.claim(tmp_path, ["rms_norm.json"], "bench_rms_norm")


def test_a_table_without_its_record_is_refused(result_files: Any, tmp_path: Path) -> None:
    (tmp_path / "rms_norm.md").write_text("somebody's notes\n")
    (tmp_path / "rms_norm.json").write_text("{not json")
    with pytest.raises(SystemExit) as refused:
        result_files.claim(tmp_path, ["rms_norm.json", "rms_norm.md"], "bench_rms_norm")
    message = str(refused.value)
    assert "rms_norm.json" in message
    assert "rms_norm.md" in message
    assert "were not written by bench_rms_norm" in message
    assert "Pass another --out folder" in message


def test_out_must_be_a_folder(result_files: Any, tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(SystemExit, match="is a file; expected a folder"):
        result_files.claim(tmp_path / "file", ["rms_norm.json"], "bench_rms_norm")
