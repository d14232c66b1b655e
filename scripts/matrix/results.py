"""What a cell of the compatibility table can say, and the record of cells that passed.

A passed cell is recorded under the cache (``<cache>/matrix/results/<key>.json``), keyed by
the wheel's sha256, the torch, the interpreter and a digest of the op suite: a rerun with the
same key reuses it instead of testing again.
"""

from __future__ import annotations

import datetime
import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from scripts import basics
from scripts.matrix.table import Row

PASS = "pass"
FAIL = "fail"
UNSUPPORTED = "unsupported"  # torch publishes no wheel for that Python
NOT_BUILT = "not built here"  # the wheel's CUDA toolkit is missing on this machine
NOT_RUN = "not run"  # skipped in this run, or no result yet; the cell says why
STATUSES = (PASS, FAIL, UNSUPPORTED, NOT_BUILT, NOT_RUN)


# Progress lines of the run on stderr; stdout carries the table.
log = basics.logger("matrix")


def utc_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def result_key(
    wheel_sha: str, torch: str, interp_path: str, python_version: str, tests: str
) -> str:
    raw = json.dumps([wheel_sha, torch, interp_path, python_version, tests])
    return hashlib.sha256(raw.encode()).hexdigest()[:24]


def read_json_or_none(path: Path) -> dict[str, Any] | None:
    """The JSON in ``path``, or None when it is missing or unreadable (a stale record)."""
    if not path.is_file():
        return None
    try:
        record: dict[str, Any] = json.loads(path.read_text())
    except ValueError:
        return None
    return record


class ResultCache:
    """Passed cells (and negative checks) under ``<cache>/matrix/results/<key>.json``."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def get(self, key: str) -> dict[str, Any] | None:
        return read_json_or_none(self.root / f"{key}.json")

    def put(self, key: str, value: Mapping[str, Any]) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.root / f".{key}.tmp"
        tmp.write_text(json.dumps(dict(value), indent=1) + "\n")
        tmp.replace(self.root / f"{key}.json")


def row_entry(row: Row, cells: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """A row of the table: the torch release, the wheel serving it, and its cells."""
    return {
        "torch": row.torch,
        "cuda": row.cuda,
        "kind": row.kind,
        "variant": row.variant,
        "build_torch": row.build_torch,
        "pythons": list(row.pythons),
        "cells": {py: dict(cell) for py, cell in cells.items()},
    }
