"""The pipeline's own name, once: the names of its environment variables, cache folder,
marker files, temporary folders, build image and container paths are made from it.

The pipeline grew as hotloop's release tooling and keeps that name for its state, so that
what earlier runs made stays valid: a warm cache (``.cache/hotloop``, ``.hotloop-complete``
stamps), an index it wrote (``.hotloop-index``), a built image, and the variables users and
CI already set (``HOTLOOP_CACHE_DIR``). Nothing here is about the hotloop package: what a
project builds, and the variables its own build reads, come from its project table
(``scripts/project.py``).
"""

from __future__ import annotations

from pathlib import PurePosixPath

PIPELINE = "hotloop"


def env_var(suffix: str) -> str:
    """The pipeline's variable ``suffix``: ``env_var("CACHE_DIR")`` is ``HOTLOOP_CACHE_DIR``."""
    return f"{PIPELINE.upper()}_{suffix}"


def marker(suffix: str) -> str:
    """A hidden file the pipeline writes to mark its own state: ``.hotloop-<suffix>``."""
    return f".{PIPELINE}-{suffix}"


def prefixed(what: str) -> str:
    """A name of the pipeline's own (a temporary folder, a log mark): ``hotloop-<what>``."""
    return f"{PIPELINE}-{what}"


CACHE_DIR_VARIABLE = env_var("CACHE_DIR")
# The cache's folder under the repository when CACHE_DIR_VARIABLE is unset (gitignored).
DEFAULT_CACHE = PurePosixPath(".cache") / PIPELINE
# Inside the build container: the toolchain before-build assembles, and the sysroot's copy.
CONTAINER_ROOT = PurePosixPath("/opt") / PIPELINE
CONTAINER_SYSROOT = PurePosixPath("/opt") / prefixed("sysroot")
IMAGE_REPOSITORY = f"localhost/{prefixed('builder')}"
