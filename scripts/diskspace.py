"""Free space checked before the pipeline's large downloads, so that a full disk stops a run
with a message instead of a half-written torch or toolkit in a cache.

Each download names where it lands, an upper bound of what it adds there, and what frees or
moves that space. The bounds were measured here (November 2026): a torch wheel unpacked into
uv's cache is about 0.9 GB per (torch, Python) pair, and the first torch of a CUDA line adds
its NVIDIA libraries (2 to 3 GB more); a CUDA toolkit unpacks to 100-300 MB from up to 1.5 GB
of downloads (Debian's ``nvidia-cuda-dev`` alone is 930 MB); an interpreter or container root
is about 0.7 GB.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from scripts.names import CACHE_DIR_VARIABLE

GIB = 1024**3
TORCH_BYTES = 4 * GIB  # one torch wheel and, for a new CUDA line, its NVIDIA libraries
TOOLKIT_BYTES = 2 * GIB  # a CUDA toolkit's downloads and their unpacked tree
ROOT_BYTES = 2 * GIB  # an interpreter root, or a container root and its packed tar
TORCH_WHAT = "a torch wheel with its NVIDIA libraries, unpacked into uv's cache"


@dataclass(frozen=True)
class Download:
    """What is about to be written, at most ``size`` bytes, and how to make room for it."""

    what: str
    size: int
    room: str


def torch_install(uv_cache: Path) -> Download:
    return Download(
        TORCH_WHAT,
        TORCH_BYTES,
        f"prune uv's cache ({uv_cache}: `uv cache prune`, or `uv cache clean torch` to drop "
        "every cached torch) or move it to a bigger disk with UV_CACHE_DIR=<folder>",
    )


def cache_download(what: str, size: int, cache: Path) -> Download:
    """A download into the pipeline's cache (``cache``), which a variable moves."""
    return Download(
        what,
        size,
        f"remove the work folders of finished builds under {cache} (work/, projects/) or "
        f"point {CACHE_DIR_VARIABLE}=<folder> at a bigger disk",
    )


class DiskSpaceError(SystemExit):
    """Too little free space for a download; the message says what to free or move."""


def nearest_existing(path: Path) -> Path:
    """``path`` or its nearest existing parent: the filesystem a new folder would land on."""
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def free_bytes(path: Path, statvfs: Callable[[Path], os.statvfs_result] | None = None) -> int:
    """Bytes an unprivileged writer may still use on ``path``'s filesystem."""
    st = (statvfs or os.statvfs)(nearest_existing(path))
    return st.f_bavail * st.f_frsize


def require_free_space(
    folders: Sequence[Path],
    download: Download,
    statvfs: Callable[[Path], os.statvfs_result] | None = None,
) -> None:
    """Refuse ``download`` unless each of ``folders`` (where it writes) has its size free."""
    for folder in folders:
        free = free_bytes(folder, statvfs)
        if free < download.size:
            raise DiskSpaceError(
                f"{folder}: {free / GIB:.1f} GiB free, but {download.what} needs up to "
                f"{download.size / GIB:.1f} GiB there; {download.room}, then run again"
            )
