from pathlib import Path

import pytest

from scripts import diskspace
from scripts.diskspace import GIB
from tests.pipeline.disk_helpers import fake_statvfs


def test_a_download_larger_than_the_free_space_is_refused_with_found_needed_and_remedy(tmp_path):
    uv_cache = tmp_path / "uv"
    download = diskspace.torch_install(uv_cache)
    with pytest.raises(diskspace.DiskSpaceError) as exc:
        diskspace.require_free_space([uv_cache], download, fake_statvfs(GIB // 4))
    message = str(exc.value)
    assert message.startswith(f"{uv_cache}: 0.2 GiB free, but a torch wheel")
    assert "needs up to 4.0 GiB there" in message
    assert "uv cache prune" in message
    assert "UV_CACHE_DIR=<folder>" in message


def test_enough_free_space_lets_the_download_go_on(tmp_path):
    download = diskspace.torch_install(tmp_path)
    diskspace.require_free_space([tmp_path], download, fake_statvfs(download.size))


def test_a_folder_not_made_yet_is_measured_on_its_nearest_existing_parent(tmp_path):
    seen: list[Path] = []
    target = tmp_path / "cuda" / "13.0-abc" / "home"
    diskspace.require_free_space(
        [target], diskspace.cache_download("x", 1, tmp_path), fake_statvfs(GIB, seen)
    )
    assert seen == [tmp_path]


def test_every_folder_a_download_writes_to_is_checked(tmp_path):
    seen: list[Path] = []
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    download = diskspace.cache_download("x", 1, tmp_path)
    diskspace.require_free_space(
        [tmp_path / "a", tmp_path / "b"], download, fake_statvfs(GIB, seen)
    )
    assert seen == [tmp_path / "a", tmp_path / "b"]


def test_a_cache_download_names_the_variable_that_moves_the_cache(tmp_path):
    with pytest.raises(diskspace.DiskSpaceError, match=r"point HOTLOOP_CACHE_DIR=<folder> at"):
        diskspace.require_free_space(
            [tmp_path],
            diskspace.cache_download("the CUDA 13.0 toolkit", 2 * GIB, tmp_path),
            fake_statvfs(GIB),
        )
