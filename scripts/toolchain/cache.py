"""Where the toolchain's pieces live, and the stamps that say a piece is complete.

Each piece has a folder of :func:`cache_dir`; a stamp file, written last, holds the key the
piece was made from, so an interrupted download is redone instead of trusted.
"""

from __future__ import annotations

import os
from pathlib import Path

from scripts.basics import REPO

STAMP = ".hotloop-complete"


def cache_dir() -> Path:
    """``$HOTLOOP_CACHE_DIR`` or ``<repo>/.cache/hotloop`` (gitignored)."""
    path = Path(os.environ.get("HOTLOOP_CACHE_DIR") or REPO / ".cache" / "hotloop")
    path.mkdir(parents=True, exist_ok=True)
    return path


def stamped(path: Path, key: str) -> bool:
    stamp = path / STAMP
    return stamp.is_file() and stamp.read_text() == key


def stamp(path: Path, key: str) -> None:
    (path / STAMP).write_text(key)
