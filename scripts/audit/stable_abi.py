"""torch-abi-audit's view of a wheel's libraries: which libtorch symbols each one uses.

A stable-ABI wheel loads into every torch from the floor on only if its libraries call
libtorch through the stable C shim (``aoti_torch_*``, ``torch_*``) and the header-only
``torch::stable``/``torch::headeronly`` code, never through ``at::``, ``c10::`` or other
``torch::`` C++ symbols, whose mangled names and layouts change between releases.
torch-abi-audit (Quansight) classifies each undefined dynamic symbol that way and maps
every shim symbol to the torch release that introduced it.

It reads symbols with ``nm -ujD`` (GNU binutils >= 2.37 for ``-j``) and needs
Python >= 3.11: both are checked here, so a tool that cannot run is a finding, never a
silent pass.
"""

from __future__ import annotations

import importlib.metadata
import re
import shutil
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from scripts import tools
from scripts.audit.wheelfile import AuditError

# "torch-abi-audit==0.3.0; python_version >= '3.11'" -> "torch-abi-audit==0.3.0"
REQUIREMENT = tools.TORCH_ABI_AUDIT.split(";")[0].strip()
PINNED_VERSION = REQUIREMENT.split("==")[1]


class ToolUnavailable(AuditError):
    """torch-abi-audit cannot run here; the message says what to install."""


@dataclass(frozen=True)
class LibraryAbi:
    """torch-abi-audit's findings for one library."""

    unstable_symbols: tuple[str, ...]
    stable_shim_count: int
    min_torch_version: str | None
    version_defining_symbols: tuple[str, ...]
    unknown_shim_symbols: tuple[str, ...]


def _check_tool() -> None:
    if sys.version_info < (3, 11):
        raise ToolUnavailable(
            f"torch-abi-audit needs Python >= 3.11; this audit runs on "
            f"{sys.version_info[0]}.{sys.version_info[1]}: run it with Python 3.11 or newer"
        )
    try:
        installed = importlib.metadata.version("torch-abi-audit")
    except importlib.metadata.PackageNotFoundError:
        raise ToolUnavailable(
            f"torch-abi-audit is not installed: pip install '{REQUIREMENT}' "
            "(the pin in scripts/tools.py)"
        ) from None
    if installed != PINNED_VERSION:
        raise ToolUnavailable(
            f"torch-abi-audit {installed} is installed, the pipeline pins {PINNED_VERSION}: "
            f"pip install '{REQUIREMENT}'"
        )
    if shutil.which("nm") is None:
        raise ToolUnavailable("torch-abi-audit reads symbols with nm: install GNU binutils")


def _temp_name(index: int, member: str) -> str:
    # Members are audited, not trusted: only the index and a tame suffix reach the disk.
    suffix = re.sub(r"[^A-Za-z0-9._]", "_", PurePosixPath(member).name)[-60:]
    return f"{index:04d}-{suffix or 'lib'}"


def torch_abi(libraries: Mapping[str, bytes]) -> dict[str, LibraryAbi]:
    """torch-abi-audit's verdict per library (member name -> findings).

    ToolUnavailable when the tool cannot run here; AuditError when it fails on a library.
    """
    _check_tool()
    from torch_abi_audit import inspect_extension

    found: dict[str, LibraryAbi] = {}
    with tempfile.TemporaryDirectory(prefix="torch-abi-") as tmp:
        for index, (member, data) in enumerate(sorted(libraries.items())):
            path = Path(tmp) / _temp_name(index, member)
            path.write_bytes(data)
            report = inspect_extension(path)
            if report.error:
                raise AuditError(f"torch-abi-audit failed on {member}: {report.error}")
            verdict = report.torch
            found[member] = LibraryAbi(
                unstable_symbols=tuple(verdict.unstable_symbols),
                stable_shim_count=verdict.stable_shim_count,
                min_torch_version=verdict.min_torch_version,
                version_defining_symbols=tuple(verdict.version_defining_symbols),
                unknown_shim_symbols=tuple(verdict.unknown_shim_symbols),
            )
    return found
