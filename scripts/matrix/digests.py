"""What a wheel and the op suite are made from, as sha256 digests.

A wheel is reused only while :func:`source_digest` of the tree equals the digest of the
sources it was built from; a recorded cell is reused only while :func:`suite_digest` is the
same (a changed test reruns the cells).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path

from scripts.basics import REPO

# Files whose content goes into a wheel (setup.py compiles csrc/, packages src/hotloop/).
SOURCE_FILES = ("setup.py", "pyproject.toml")
SOURCE_DIRS = ("csrc", "src/hotloop")
SOURCE_EXCLUDE = ("_build_info.py",)
SOURCE_EXCLUDE_DIRS = ("__pycache__", "build")
SOURCE_EXCLUDE_SUFFIXES = (".so", ".o", ".pyc")


def source_paths(repo: Path = REPO) -> list[Path]:
    """The files a wheel is built from, sorted (generated and compiled files left out)."""
    paths = [repo / f for f in SOURCE_FILES if (repo / f).is_file()]
    for folder in SOURCE_DIRS:
        root = repo / folder
        if not root.is_dir():
            continue
        for path in root.rglob("*"):
            rel = path.relative_to(root)
            if (
                not path.is_file()
                or path.name in SOURCE_EXCLUDE
                or path.suffix in SOURCE_EXCLUDE_SUFFIXES
                or any(
                    part in SOURCE_EXCLUDE_DIRS or part.endswith(".egg-info") for part in rel.parts
                )
            ):
                continue
            paths.append(path)
    return sorted(paths)


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
