"""When each job of the run starts: the job queue, its priorities and the deadline.

Wheels that exist already (or built before: warm ccache) are got first, so their cells test
while later wheels build; negative cells go before test cells (quick, and what the table must
not lack); with a deadline, every row gets its most used Python before any row gets a second.
Below a floor of free disk no cell starts (each new torch and Python adds a gigabyte to uv's
cache, and a full disk fails every run on the machine, not only this one).
"""

from __future__ import annotations

import datetime
import heapq
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from scripts import diskspace, toolchain
from scripts.matrix.model import release
from scripts.matrix.reuse import newest_wheel
from scripts.matrix.table import Row

NEGATIVE_PRIORITY = (0,)
# Which Python of each row tests first: the newest (from the Debian root) lead, since no
# other test covers them.
PYTHON_PRIORITY = ("3.14", "3.15", "3.12", "3.10", "3.13", "3.11", "3.9")


class Deadline:
    def __init__(self, at: datetime.datetime | None) -> None:
        self.at = at

    def passed(self) -> bool:
        return self.at is not None and datetime.datetime.now(datetime.timezone.utc) >= self.at


class DiskFloor:
    """No cell starts while less than ``min_free_gb`` is free in any of ``paths`` (where cells
    install: the cache folder with the cells and the root's uv cache, and uv's own cache)."""

    def __init__(self, min_free_gb: float, paths: Sequence[Path]) -> None:
        self.min_free_gb = min_free_gb
        self.paths = paths

    def shortage(self) -> str | None:
        """Why a cell must not start now, or None."""
        free = min(diskspace.free_bytes(p) for p in self.paths) / diskspace.GIB
        if free >= self.min_free_gb:
            return None
        return (
            f"disk: {free:.1f} GB free where the cells install, "
            f"below --min-free-gb {self.min_free_gb:g}"
        )


def parse_deadline(
    text: str | None, now: datetime.datetime | None = None
) -> datetime.datetime | None:
    """``HH:MM`` (UTC, today or tomorrow) or seconds from now (``+600``)."""
    if not text:
        return None
    now = now or datetime.datetime.now(datetime.timezone.utc)
    if text.startswith("+"):
        return now + datetime.timedelta(seconds=float(text[1:]))
    hour, minute = (int(x) for x in text.split(":"))
    at = now.replace(hour=hour, minute=minute, second=0, microsecond=0)
    return at if at > now else at + datetime.timedelta(days=1)


def _python_rank(python: str) -> int:
    return PYTHON_PRIORITY.index(python) if python in PYTHON_PRIORITY else len(PYTHON_PRIORITY)


def cell_priority(python: str, row: Row) -> tuple[int, int, tuple[int, ...]]:
    """Every row's first Python (by PYTHON_PRIORITY, among those it lists) before any row's
    second, and so on; older torch first within a round."""
    rank = sorted(row.pythons, key=_python_rank).index(python) if python in row.pythons else 99
    return (1, rank, release(row.torch))


def build_order(row: Row, dirs: Sequence[Path] = ()) -> tuple[int, tuple[int, ...]]:
    """Wheels already there first (reuse is instant), then wheels built before (warm ccache,
    a work folder), then oldest torch first."""
    if newest_wheel(row.variant, dirs) is not None:
        rank = 0
    elif (toolchain.cache_dir() / "work" / row.variant).is_dir():
        rank = 1
    else:
        rank = 2
    return (rank, release(row.torch))


class JobQueue:
    """A thread pool that runs the best job waiting, not the first submitted.

    Each ``submit`` pushes the job on a heap and hands the pool an anonymous runner that
    pops the heap's best job when a worker takes it, so jobs submitted later (a wheel
    that finished building) can overtake ones still waiting.
    """

    def __init__(self, workers: int) -> None:
        self._pool = ThreadPoolExecutor(max_workers=workers)
        self._heap: list[tuple[tuple[Any, ...], int, Callable[..., Any], tuple[Any, ...]]] = []
        self._lock = threading.Lock()
        self._futures: list[Future[None]] = []
        self._seq = 0

    def submit(self, priority: tuple[Any, ...], fn: Callable[..., Any], *args: Any) -> None:
        with self._lock:
            heapq.heappush(self._heap, (priority, self._seq, fn, args))
            self._seq += 1
        self._futures.append(self._pool.submit(self._run_best))

    def _run_best(self) -> None:
        with self._lock:
            _, _, fn, args = heapq.heappop(self._heap)
        fn(*args)

    def wait(self) -> None:
        try:
            for future in self._futures:
                future.result()
        finally:
            self._pool.shutdown()
