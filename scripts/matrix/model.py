"""What ``matrix.toml`` may say: one typed model, checked once, when the file is loaded.

Each key is a dataclass field below, with its docstring. :func:`load_matrix` reads the file
and checks every value against its field's type and rule; a bad table is one
:class:`MatrixTableError` that names the file, the row or table, the key and the value (an
unknown key gets the nearest known one as a suggestion), through the loader every table of
the pipeline shares (:mod:`scripts.typed_toml`). Everything after the loader
(:mod:`scripts.matrix.table`, the plan, nox, the GitHub matrix) can then trust the table.

Standard library only: the GitHub workflow reads the table with a bare Python.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from scripts.typed_toml import TOP, Check, TableError, build, describe, fail, read_document
from scripts.typed_toml import rule as _rule


class MatrixTableError(TableError):
    """A build matrix that cannot be used: the message names the file, the row or table, the
    key and the value."""


# -------------------------------------------------------------------------- value rules

_FINAL = re.compile(r"(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)")
_PRE = re.compile(r"[0-9.]+(a|b|rc|alpha|beta|c|pre|preview|dev)[0-9]*.*", re.IGNORECASE)
_CUDA = re.compile(r"[1-9][0-9]*\.[0-9]+")
_PYTHON = re.compile(r"3\.(0|[1-9][0-9]*)")
# torch's TORCH_CUDA_ARCH_LIST entries: 9.0, 9.0a (arch-specific), 10.0f (family), +PTX.
_ARCH = re.compile(r"[0-9]+\.[0-9][af]?(\+PTX)?")
_PIN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*==[0-9][A-Za-z0-9.+!_-]*")
_SHA256 = re.compile(r"[0-9a-f]{64}")


def release(version: str) -> tuple[int, ...]:
    """``"2.11.0"`` -> ``(2, 11, 0)``; for versions the model has checked."""
    return tuple(int(p) for p in version.split("."))


def final_release(value: str) -> str | None:
    if _FINAL.fullmatch(value):
        return None
    if _PRE.fullmatch(value):
        return (
            "a pre-release: a row is a torch release PyPI serves to `pip install torch`, "
            "final only (X.Y.Z)"
        )
    return "expected a final release, X.Y.Z (e.g. 2.11.0), without a local label"


def cuda_version(value: str) -> str | None:
    return None if _CUDA.fullmatch(value) else "expected a CUDA MAJOR.MINOR, e.g. 13.0"


def nvcc_version(value: str) -> str | None:
    return None if not value or _CUDA.fullmatch(value) else "expected MAJOR.MINOR, e.g. 12.4"


def python_list(values: tuple[str, ...]) -> str | None:
    if not values:
        return "expected at least one Python"
    for value in values:
        if value.endswith("t") and _PYTHON.fullmatch(value[:-1]):
            return (
                f"{value!r} is a free-threaded build: a limited-API (abi3) wheel cannot install "
                "there; list the Python as 3.N (README, 'Free-threaded Python')"
            )
        if not _PYTHON.fullmatch(value):
            return f"{value!r} is not a CPython minor version (3.N)"
        if values.count(value) > 1:
            return f"{value!r} is listed twice"
    if list(values) != sorted(values, key=release):
        return "expected oldest first"
    return None


def arch_list(value: str) -> str | None:
    entries = [e for e in value.replace(" ", ";").split(";") if e]
    if not entries:
        return "expected at least one architecture (TORCH_CUDA_ARCH_LIST syntax, 8.0;9.0+PTX)"
    for entry in entries:
        if not _ARCH.fullmatch(entry):
            return (
                f"{entry!r} is not a TORCH_CUDA_ARCH_LIST entry: expected compute capabilities "
                "like 8.0, 9.0a or 12.0+PTX, separated by ';'"
            )
    return None


def optional_arch_list(value: str) -> str | None:
    return arch_list(value) if value else None


def exact_pins(values: tuple[str, ...]) -> str | None:
    for value in values:
        if not _PIN.fullmatch(value):
            return f"{value!r} is not pinned exactly (NAME==VERSION)"
    return None


def non_empty(what: str) -> Check:
    def check(value: Any) -> str | None:
        return None if value else f"expected at least one {what}"

    return check


def sha256_hex(value: str) -> str | None:
    return None if _SHA256.fullmatch(value) else "expected 64 hex digits (the .deb's sha256)"


# -------------------------------------------------------------------------- the model


@dataclass(frozen=True)
class DebianPin:
    """One package of ``[toolkits."X.Y".debian] packages``."""

    name: str = _rule(non_empty("character"))
    """Debian package name (``nvidia-cuda-toolkit``)."""

    version: str = _rule(non_empty("character"))
    """Its exact Debian version (``12.4.131~12.4.1-2``)."""

    sha256: str = _rule(sha256_hex)
    """sha256 of the ``.deb``: the download is refused when it differs."""


@dataclass(frozen=True)
class DebianSpec:
    """``[toolkits."X.Y".debian]``: a toolkit made of Debian packages."""

    suite: str = _rule(non_empty("character"))
    """Debian suite the packages come from (``trixie``), on the host's Debian mirror."""

    packages: tuple[DebianPin, ...] = _rule(non_empty("package"))
    """The packages, each pinned by version and sha256."""

    components: tuple[str, ...] = _rule(non_empty("component"), ("main",))
    """Archive components to read (``["main", "non-free"]``)."""


@dataclass(frozen=True)
class ToolkitSpec:
    """``[toolkits."X.Y"]``: the compiler toolkit of the rows whose torch has CUDA X.Y."""

    nvcc: str = _rule(nvcc_version, "")
    """The compiler's release when it is not the table's CUDA (an older minor of the same
    major: CUDA minor-version compatibility). Empty: the table's CUDA."""

    arch_list: str = _rule(optional_arch_list, "")
    """Architectures this toolkit compiles for, when it cannot do the top-level list.
    Empty: the top-level ``arch_list``."""

    packages: tuple[str, ...] = _rule(exact_pins, ())
    """PyPI packages of the toolkit, each ``NAME==VERSION``."""

    debian: DebianSpec | None = None
    """Or Debian packages (``[toolkits."X.Y".debian]``): exactly one of the two."""


@dataclass(frozen=True)
class RowSpec:
    """``[[row]]``: one torch release, as PyPI serves it."""

    LABEL: ClassVar[str] = "torch"  # errors name a row by its torch

    torch: str = _rule(final_release)
    """The release (``2.11.0``): ``pip install torch==2.11.0`` from PyPI, one row each."""

    cuda: str = _rule(cuda_version)
    """The CUDA runtime of PyPI's wheel of that release (``13.0``), from its metadata."""

    pythons: tuple[str, ...] = _rule(python_list)
    """The CPython minors torch publishes wheels for (``cp3N``), oldest first."""

    arch_list: str = _rule(optional_arch_list, "")
    """Architectures for this row's wheel. Empty: the toolkit's list, else the top level's."""


@dataclass(frozen=True)
class MatrixSpec:
    """The whole ``matrix.toml``."""

    arch_list: str = _rule(arch_list)
    """Architectures every wheel compiles for (``TORCH_CUDA_ARCH_LIST`` syntax)."""

    row: tuple[RowSpec, ...] = _rule(non_empty("[[row]]"))
    """The torch releases, one ``[[row]]`` each."""

    toolkits: Mapping[str, ToolkitSpec] = field(default_factory=dict)
    """Compiler toolkits by the CUDA of the rows they build (``[toolkits."13.0"]``)."""


# -------------------------------------------------------------------------- loading


def row_error(number: int, row: RowSpec, key: str, why: str) -> MatrixTableError:
    """The error for a row that is well formed but wrong next to the others."""
    where = f"[[row]] {number} (torch {row.torch})"
    return MatrixTableError(describe(where, key, getattr(row, key), why))


def _check_toolkit(cuda: str, toolkit: ToolkitSpec) -> None:
    where = f'[toolkits."{cuda}"]'
    if _CUDA.fullmatch(cuda) is None:
        raise fail(TOP, "toolkits", cuda, 'a toolkit\'s key is a CUDA MAJOR.MINOR ("13.0")')
    debs = toolkit.debian.packages if toolkit.debian else ()
    if bool(toolkit.packages) == bool(debs):
        raise TableError(
            f"{where}: needs exactly one of packages = [...] (PyPI) or a "
            f'[toolkits."{cuda}".debian] table (Debian); found {len(toolkit.packages)} PyPI and '
            f"{len(debs)} Debian packages"
        )
    nvcc = toolkit.nvcc or cuda
    if release(nvcc)[0] != release(cuda)[0] or release(nvcc) > release(cuda):
        raise fail(
            where,
            "nvcc",
            toolkit.nvcc,
            f"expected a {cuda.split('.')[0]}.x release no newer than {cuda} (code from an "
            "older compiler of the same major runs on that runtime; a newer one's may not)",
        )


def load_matrix(path: Path) -> MatrixSpec:
    """The table in ``path``, each key checked against the model.

    Rules across rows that need the variant rule (which row builds which wheel) are
    :func:`scripts.matrix.table.load_rows`'s, with the same kind of error.
    """
    document = read_document(path, "the build matrix", MatrixTableError)
    try:
        spec: MatrixSpec = build(MatrixSpec, document, TOP)
        for cuda, toolkit in spec.toolkits.items():
            _check_toolkit(cuda, toolkit)
    except TableError as exc:
        raise MatrixTableError(f"{path}: {exc}") from None
    return spec
