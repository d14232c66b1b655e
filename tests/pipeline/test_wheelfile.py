"""scripts.wheelfile: reading BUILD_INFO (the audit, the SBOM and the matrix share it), and
reading a wheel that may be damaged (the index, publish and the PyPI upload read through it)."""

from __future__ import annotations

import re
import zipfile
from pathlib import Path

import pytest
from index_helpers import corrupt_member, make_tiny_wheel, release_members

from scripts import wheelfile
from scripts.wheelfile import WheelError, describe_wheel, sbom_member


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


@pytest.mark.parametrize(
    "compression", [zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED], ids=["crc", "deflate"]
)
@pytest.mark.parametrize("member", ["METADATA", "SBOM"])
def test_a_damaged_member_is_a_wheel_error_naming_the_file(
    tmp_path: Path, member: str, compression: int
) -> None:
    wheel = make_tiny_wheel(tmp_path, "stable.cu13", extra_files=release_members("stable.cu13"))
    dist_info = "hotloop-0.1.0+stable.cu13.dist-info"
    name = (
        f"{dist_info}/METADATA" if member == "METADATA" else f"{dist_info}/{sbom_member('hotloop')}"
    )
    corrupt_member(wheel, name, compression)
    with pytest.raises(
        WheelError, match=rf"{re.escape(wheel.name)}: {re.escape(name)} cannot be read"
    ):
        describe_wheel(wheel)
