"""A faked ``os.statvfs``: a filesystem with a chosen number of free bytes."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path


def fake_statvfs(free: int, seen: list[Path] | None = None) -> Callable[[Path], os.statvfs_result]:
    """os.statvfs for a filesystem with ``free`` bytes left, noting the paths it was asked."""

    def statvfs(path: Path) -> os.statvfs_result:
        if seen is not None:
            seen.append(Path(path))
        return os.statvfs_result((4096, 4096, 0, 0, free // 4096, 0, 0, 0, 0, 255))

    return statvfs
