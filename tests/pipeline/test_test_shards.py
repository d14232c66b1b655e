"""HOTLOOP_TEST_SHARD: tests/ops split over processes (benchmarks/device_run.sh tests)."""

from __future__ import annotations

import importlib.util
import itertools
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
_SPEC = importlib.util.spec_from_file_location("sharding", REPO / "tests" / "ops" / "sharding.py")
assert _SPEC is not None
assert _SPEC.loader is not None
sharding = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(sharding)


def test_shards_split_the_items_without_overlap() -> None:
    items = list(range(11))
    shards = [sharding.split_shard(items, i, 3) for i in range(3)]
    assert sorted(itertools.chain.from_iterable(kept for kept, _ in shards)) == items
    for kept, others in shards:
        assert sorted(kept + others) == items
        assert not set(kept) & set(others)
    assert [len(kept) for kept, _ in shards] == [4, 4, 3]


@pytest.mark.parametrize(("value", "expected"), [("0/1", (0, 1)), ("3/4", (3, 4))])
def test_a_shard_is_read(value: str, expected: tuple[int, int]) -> None:
    assert sharding.parse_test_shard(value) == expected


@pytest.mark.parametrize("bad", ["3/3", "1", "a/4", "-1/4", "1/0", "", "1/4/2"])
def test_a_bad_shard_is_named(bad: str) -> None:
    with pytest.raises(pytest.UsageError, match=r"expected INDEX/COUNT with 0 <= INDEX < COUNT"):
        sharding.parse_test_shard(bad)


def test_pytest_runs_one_shard_of_tests_ops() -> None:
    # The hook in tests/ops/conftest.py, through pytest: half of a test file's tests, and a
    # bad value refused with its name before any test runs.
    test_file = "tests/ops/test_elementwise.py"

    def collect(shard: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "--collect-only",
                "-q",
                "-p",
                "no:cacheprovider",
                test_file,
            ],
            cwd=REPO,
            env={**os.environ, "HOTLOOP_TEST_SHARD": shard},
            capture_output=True,
            text=True,
            check=False,
        )

    first = collect("0/2")
    assert first.returncode == 0, first.stdout + first.stderr
    ids = [line for line in first.stdout.splitlines() if line.startswith(test_file + "::")]
    assert ids
    assert f"{len(ids)}/" in first.stdout  # "N/M tests collected (K deselected)"
    refused = collect("2/2")
    assert refused.returncode != 0
    assert "HOTLOOP_TEST_SHARD='2/2'" in refused.stdout + refused.stderr
