"""Which files of the repository a wheel is built from: its project table's ``sources``.

Two readers: the build copies them to a private folder before it runs setup.py
(``scripts.build.copy_sources``), and the matrix reuses a built wheel only while the digest
of its code is unchanged (``scripts.matrix.digests``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from scripts.basics import REPO
from scripts.project import own_project

# Read into the wheel's metadata only (long description, license, sdist manifest). The
# build needs them, but a wheel built before they changed still does the same, so the
# matrix's reuse digest leaves them out.
METADATA = ("README.md", "LICENSE", "MANIFEST.in")


def sources() -> tuple[str, ...]:
    """Everything the build reads: the project table's ``sources``."""
    return own_project().sources


def code_items() -> tuple[str, ...]:
    """What is compiled or packaged into the wheel (the ``sources`` that are not
    :data:`METADATA`): a change here changes what the wheel does."""
    return tuple(item for item in sources() if item not in METADATA)


# What builds leave inside those folders: never a source.
_OUTPUT_NAMES = ("_build_info.py",)
_OUTPUT_DIRS = ("__pycache__", "build")
_OUTPUT_SUFFIXES = (".so", ".o", ".pyc")


def is_build_output(rel: Path) -> bool:
    """Whether ``rel`` (relative to one of the items) is something a build wrote."""
    return (
        rel.name in _OUTPUT_NAMES
        or rel.suffix in _OUTPUT_SUFFIXES
        or any(part in _OUTPUT_DIRS or part.endswith(".egg-info") for part in rel.parts)
    )


def files(items: Sequence[str], repo: Path = REPO) -> list[Path]:
    """The files of ``items`` (files or folders under ``repo``) that exist, build outputs
    left out, sorted."""
    paths = [repo / item for item in items if (repo / item).is_file()]
    for item in items:
        root = repo / item
        if root.is_dir():
            paths += [
                path
                for path in root.rglob("*")
                if path.is_file() and not is_build_output(path.relative_to(root))
            ]
    return sorted(paths)


def code_files(repo: Path = REPO) -> list[Path]:
    """What the wheel's code is made from."""
    return files(code_items(), repo)


def build_inputs(repo: Path = REPO) -> list[Path]:
    """Everything the build reads: the code and the metadata files."""
    return files(sources(), repo)
