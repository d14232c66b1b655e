"""What every pipeline module shares, written once: the repository root, ``tomllib`` on the
Pythons nox runs on, progress lines on stderr, and running a command that must succeed.

stdout stays free for what a command produces (tables, JSON, paths); progress goes to
stderr as ``[source] message`` lines, ``source`` naming the module that speaks.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - nox may run on 3.9/3.10, where tomli is installed
    import tomli as tomllib

__all__ = ["REPO", "Log", "logger", "run", "tomllib"]

REPO = Path(__file__).resolve().parent.parent

Log = Callable[[str], None]


def logger(source: str) -> Log:
    """The ``log(message)`` of one module: writes ``[source] message`` to stderr at once."""

    def log(message: str) -> None:
        print(f"[{source}] {message}", file=sys.stderr, flush=True)

    return log


def run(
    cmd: Sequence[str | os.PathLike[str]], *, log: Log, **kwargs: Any
) -> subprocess.CompletedProcess[Any]:
    """Run ``cmd`` after logging it as ``$ cmd``; raises CalledProcessError when it fails.

    ``kwargs`` go to ``subprocess.run`` (``cwd``, ``env``, ``capture_output``, ...).
    """
    args = [str(c) for c in cmd]
    log("$ " + " ".join(args))
    return subprocess.run(args, check=True, **kwargs)
