"""scripts.wheelfile's reading of BUILD_INFO, which the audit, the SBOM and the matrix share."""

from __future__ import annotations

import pytest

from scripts import wheelfile


def test_build_info_of_reads_the_literal_dict() -> None:
    source = "# generated\nBUILD_INFO = {'version': '0.1.0', 'archs': ['sm_90']}\n"
    assert wheelfile.build_info_of(source) == {"version": "0.1.0", "archs": ["sm_90"]}


@pytest.mark.parametrize(
    "source",
    [
        "",
        "BUILD_INFO = [1, 2]\n",  # not a dict
        "BUILD_INFO = dict(version='0.1.0')\n",  # not a literal
        "BUILD_INFO = {\n",  # not Python
        "OTHER = {}\n",
    ],
)
def test_build_info_of_is_none_without_a_literal_dict(source: str) -> None:
    assert wheelfile.build_info_of(source) is None
