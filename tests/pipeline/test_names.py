"""The pipeline's own name is one fact (scripts/names.py); the names users, CI and earlier runs
know are made from it and stay what they were."""

from __future__ import annotations

from pathlib import Path

from scripts import ci, index, names, toolchain
from scripts.basics import REPO
from scripts.toolchain import cache

# scripts/variant.py loads this repository's package's own variant rule file by its path.
LOADS_THE_PACKAGES_FILE = {Path("scripts/variant.py")}


def test_the_pipeline_names_itself_in_one_place():
    named = [
        f"{path.relative_to(REPO)}:{number}"
        for path in sorted((REPO / "scripts").rglob("*"))
        if path.suffix in (".py", ".toml") and "__pycache__" not in path.parts
        if path.relative_to(REPO) not in {Path("scripts/names.py"), *LOADS_THE_PACKAGES_FILE}
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if names.PIPELINE in line.lower()
    ]
    assert named == [], f"say it through scripts/names.py: {named}"


def test_the_names_users_and_earlier_runs_know_are_unchanged():
    assert names.CACHE_DIR_VARIABLE == "HOTLOOP_CACHE_DIR"
    assert names.DEFAULT_CACHE.as_posix() == ".cache/hotloop"
    assert cache.STAMP == ".hotloop-complete"
    assert index.MANIFEST == ".hotloop-index"
    assert ci.STAGED_MARKER == ".hotloop-staged-project"
    assert toolchain.override_env_var("12.8") == "HOTLOOP_CUDA_HOME_12_8"
    assert toolchain.SYSROOT_VARIABLE == "HOTLOOP_SYSROOT"
    assert str(ci.CONTAINER_ROOT) == "/opt/hotloop"
    assert ci.BEFORE_TEST_COMMAND == 'uv pip install "torch==${HOTLOOP_TORCH}"'


def test_the_cache_falls_back_to_the_pipelines_folder_in_the_repository(tmp_path, monkeypatch):
    monkeypatch.delenv(names.CACHE_DIR_VARIABLE, raising=False)
    monkeypatch.setattr(cache, "REPO", tmp_path)
    assert cache.cache_dir() == tmp_path / ".cache" / "hotloop"
