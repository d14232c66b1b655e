"""The pipeline's own name, once: its environment variables, cache folder and marker files
are made from it.

The pipeline grew as hotloop's release tooling and keeps that name for its state: a cache
made by an earlier run (``.cache/hotloop``, ``.hotloop-complete`` stamps), an index or
staging folder it wrote (``.hotloop-index``), and the variables users and CI already set
(``HOTLOOP_CACHE_DIR``) stay valid. Nothing here is about the hotloop package: what a
project builds comes from its project table (``scripts/project.py``).
"""

from __future__ import annotations

PIPELINE = "hotloop"


def env_var(suffix: str) -> str:
    """The pipeline's variable ``suffix``: ``env_var("CACHE_DIR")`` is ``HOTLOOP_CACHE_DIR``."""
    return f"{PIPELINE.upper()}_{suffix}"


def marker(suffix: str) -> str:
    """A hidden file the pipeline writes to mark its own state: ``.hotloop-<suffix>``."""
    return f".{PIPELINE}-{suffix}"


CACHE_DIR_VARIABLE = env_var("CACHE_DIR")
