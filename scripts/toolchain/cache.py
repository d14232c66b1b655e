"""Where the toolchain's pieces live, and the stamps that say a piece is complete.

Each piece has a folder of :func:`cache_dir`; a stamp file, written last, holds the key the
piece was made from, so an interrupted download is redone instead of trusted.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from pathlib import Path

from scripts import names
from scripts.basics import REPO

STAMP = names.marker("complete")


def cache_dir() -> Path:
    """The folder ``names.CACHE_DIR_VARIABLE`` names, else ``names.DEFAULT_CACHE`` in the
    repository (gitignored)."""
    path = Path(os.environ.get(names.CACHE_DIR_VARIABLE) or REPO / names.DEFAULT_CACHE)
    path.mkdir(parents=True, exist_ok=True)
    return path


def stamped(path: Path, key: str) -> bool:
    stamp = path / STAMP
    return stamp.is_file() and stamp.read_text() == key


def stamp(path: Path, key: str) -> None:
    (path / STAMP).write_text(key)


def write_wrappers(parent: Path, scripts: Mapping[str, tuple[str, str]]) -> dict[str, str]:
    """Executable ``scripts`` (``{variable: (file name, text)}``) in a folder of ``parent``
    named after their content; returns ``{variable: path}``.

    The cache is shared by checkouts of other revisions building at the same time: a
    checkout whose scripts differ writes a folder of its own rather than replacing scripts
    another build is running, and a script is written only when missing, through a rename
    (never truncated under a running build).
    """
    content = "\0".join(f"{name}\0{text}" for name, text in scripts.values())
    folder = parent / hashlib.sha256(content.encode()).hexdigest()[:10]
    folder.mkdir(parents=True, exist_ok=True)
    out: dict[str, str] = {}
    for variable, (name, text) in scripts.items():
        script = folder / name
        if not (script.is_file() and script.read_text() == text):
            partial = folder / f".{name}.{os.getpid()}"
            partial.write_text(text)
            partial.chmod(0o755)
            os.replace(partial, script)
        out[variable] = str(script)
    return out
