"""HOTLOOP_TEST_SHARD=I/N: every N-th test from the I-th (0-based), so that N processes
split one run of tests/ops, each test's parametrizations spread over all of them.
benchmarks/device_run.sh runs the suite on a lent GPU that way, where one process needs
longer than a call may take. Only the standard library and pytest: the pipeline's tests
check it without torch."""

from __future__ import annotations

from typing import TypeVar

import pytest

T = TypeVar("T")


def parse_test_shard(value: str) -> tuple[int, int]:
    """HOTLOOP_TEST_SHARD's I/N, checked."""
    index_text, _, count_text = value.partition("/")
    if index_text.isdigit() and count_text.isdigit():
        index, count = int(index_text), int(count_text)
        if index < count:
            return index, count
    raise pytest.UsageError(
        f"HOTLOOP_TEST_SHARD={value!r}: expected INDEX/COUNT with 0 <= INDEX < COUNT, "
        "such as 0/4 for the first of four processes"
    )


def split_shard(items: list[T], index: int, count: int) -> tuple[list[T], list[T]]:
    """The shard's items and the others, each in collection order."""
    kept = items[index::count]
    others = [item for i, item in enumerate(items) if i % count != index]
    return kept, others
