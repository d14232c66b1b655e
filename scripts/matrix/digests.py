"""What a wheel and the op suite are made from, as sha256 digests.

A wheel is reused only while :func:`source_digest` of the tree equals the digest of the
sources it was built from; a recorded cell is reused only while :func:`suite_digest` is the
same (a changed test reruns the cells).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path

from scripts import wheel_sources
from scripts.basics import REPO


def source_paths(repo: Path = REPO) -> list[Path]:
    """The files a wheel's code is built from, sorted (see scripts/wheel_sources.py)."""
    return wheel_sources.code_files(repo)


def digest_files(paths: Iterable[Path], root: Path) -> str:
    """sha256 over (relative path, content) pairs: a rename changes it too."""
    h = hashlib.sha256()
    for path in paths:
        h.update(path.relative_to(root).as_posix().encode() + b"\0")
        h.update(hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()


def source_digest(repo: Path = REPO) -> str:
    return digest_files(source_paths(repo), repo)


def suite_digest(repo: Path = REPO) -> str:
    """Digest of the installed-wheel suite (tests/ops): a changed test reruns the cells."""
    root = repo / "tests" / "ops"
    files = sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)
    return digest_files(files, repo)
