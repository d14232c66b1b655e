"""What every pipeline module shares, written once: the repository root, ``tomllib`` on the
Pythons nox runs on, progress lines on stderr, and running a command that must succeed.

stdout stays free for what a command produces (tables, JSON, paths); progress goes to
stderr as ``[source] message`` lines, ``source`` naming the module that speaks.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from scripts import names

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - nox may run on 3.9/3.10, where tomli is installed
    import tomli as tomllib

__all__ = ["REPO", "FolderInUse", "Log", "exclusive_folder", "logger", "run", "tomllib"]

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


class FolderInUse(RuntimeError):
    """Another process holds the work folder this run would rebuild."""


@contextlib.contextmanager
def exclusive_folder(folder: Path) -> Iterator[Path]:
    """Hold ``folder`` (created if missing) for this process while the block runs.

    Builds wipe and refill their work folders; two runs on one cache would do that under
    each other and ship a wheel the other one half-built. The lock is ``flock`` on a file next
    to the folder, so it goes away with the process that held it, however that process ends.
    """
    folder.mkdir(parents=True, exist_ok=True)
    lock_path = folder.parent / f".{folder.name}.lock"
    with open(lock_path, "a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            holder = lock.read().strip() or "an unknown process"
            raise FolderInUse(
                f"{folder} is in use by another run ({holder}); wait for it to finish, or give "
                f"this run a cache of its own with {names.CACHE_DIR_VARIABLE}=<another folder>"
            ) from None
        lock.truncate(0)
        lock.write(f"pid {os.getpid()}: {' '.join(sys.argv) or sys.executable}\n")
        lock.flush()
        try:
            yield folder
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def require_commands(names: Sequence[str], message: Callable[[list[str]], str]) -> None:
    """Stop with ``message(missing)`` when any of the commands ``names`` is not on PATH (the
    message says what to install)."""
    missing = [name for name in names if shutil.which(name) is None]
    if missing:
        raise SystemExit(message(missing))
