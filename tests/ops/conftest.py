"""Shared set-up of the op tests; they run against the source tree or an installed wheel."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from op_testing import DEVICES
from sharding import parse_test_shard, split_shard

import hotloop

REPO_SRC = Path(__file__).resolve().parents[2] / "src"


def pytest_report_header(config: pytest.Config) -> list[str]:
    info = hotloop.BUILD_INFO
    return [
        f"hotloop {info['version']} from {Path(hotloop.__file__).parent}",
        f"torch {torch.__version__}, CUDA available: {torch.cuda.is_available()}",
    ]


def pytest_sessionstart(session: pytest.Session) -> None:
    # The wheel pipeline sets this to make sure the installed package is under test,
    # not the source tree that happens to sit beside the tests.
    if os.environ.get("HOTLOOP_TEST_INSTALLED") == "1":
        location = Path(hotloop.__file__).resolve()
        if REPO_SRC in location.parents:
            raise pytest.UsageError(
                f"HOTLOOP_TEST_INSTALLED=1 but hotloop was imported from the source tree "
                f"({location}); run the tests from a folder that doesn't put src/ on sys.path"
            )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    shard = os.environ.get("HOTLOOP_TEST_SHARD")  # sharding.py says what it is for
    if shard:
        kept, others = split_shard(items, *parse_test_shard(shard))
        config.hook.pytest_deselected(items=others)
        items[:] = kept


@pytest.fixture(params=DEVICES)
def device(request: pytest.FixtureRequest) -> str:
    return request.param
