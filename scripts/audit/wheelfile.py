"""Reading a wheel for the audit: its name, its zip members, its metadata.

A wheel under audit may be broken or hostile: every read that can fail raises
``WheelReadError`` (an ``AuditError``) saying what could not be read, so one bad member
becomes one rule's finding and one bad wheel never stops the audit of the others.
"""

from __future__ import annotations

import zipfile
import zlib
from collections.abc import Iterator
from email.message import Message
from email.parser import Parser
from pathlib import Path
from typing import Any

from scripts.wheelfile import build_info_of, own_build_info_member

# What zipfile raises for a member whose compressed data is cut short or corrupt.
_MEMBER_ERRORS = (zipfile.BadZipFile, zlib.error, EOFError, OSError)


class AuditError(RuntimeError):
    """A wheel failed the audit, or could not be audited; the message says which and why."""


class WheelReadError(AuditError):
    """Part of a wheel could not be read (missing member, corrupt data, bad encoding)."""


def wheel_name_parts(filename: str) -> dict[str, str]:
    """Split a wheel file name (PEP 427) into name, version, python, abi, platform.

    ValueError for a name that is not ``name-version[-build]-python-abi-platform.whl``.
    """
    if not filename.endswith(".whl"):
        raise ValueError(f"not a wheel file name (no .whl suffix): {filename}")
    parts = filename.removesuffix(".whl").split("-")
    if len(parts) == 6:  # build tag
        parts = [parts[0], parts[1], parts[3], parts[4], parts[5]]
    if len(parts) != 5 or not all(parts):
        raise ValueError(
            f"not a wheel file name (need name-version-python-abi-platform.whl): {filename}"
        )
    return dict(zip(("name", "version", "python", "abi", "platform"), parts))


def require_wheel_file(path: Path) -> None:
    """AuditError unless ``path`` is an existing file with a wheel's name."""
    if not path.exists():
        raise AuditError(f"{path.name or path}: no such file: {path}")
    if not path.is_file():
        raise AuditError(f"{path.name}: not a file (a wheel is a .whl zip archive): {path}")
    try:
        wheel_name_parts(path.name)
    except ValueError as exc:
        raise AuditError(f"{path.name}: {exc}") from None


class Wheel:
    """An open wheel: ``with Wheel.open(path) as wheel: ...``."""

    def __init__(self, path: Path, zf: zipfile.ZipFile, parts: dict[str, str]) -> None:
        self.path = path
        self.zip = zf
        self.parts = parts

    @classmethod
    def open(cls, path: Path) -> Wheel:
        """AuditError for a path that is missing, not a file, misnamed or not a zip."""
        require_wheel_file(path)
        parts = wheel_name_parts(path.name)
        try:
            zf = zipfile.ZipFile(path)
        except (zipfile.BadZipFile, OSError) as exc:
            raise AuditError(
                f"{path.name}: not a readable zip archive ({exc}); the file is truncated or "
                "is not a wheel: download or build it again"
            ) from None
        return cls(path, zf, parts)

    def __enter__(self) -> Wheel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.zip.close()

    # ------------------------------------------------------------------ names

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def version(self) -> str:
        """The version in the file name: ``0.1.0+stable.cu13``."""
        return self.parts["version"]

    @property
    def dist_info(self) -> str:
        """``mypkg-0.1.0+stable.cu13.dist-info``: the folder the file name promises."""
        return f"{self.parts['name']}-{self.version}.dist-info"

    def infos(self) -> list[zipfile.ZipInfo]:
        """Every zip entry in archive order, duplicates included."""
        return self.zip.infolist()

    def files(self) -> list[zipfile.ZipInfo]:
        """Zip entries that are files (not folder entries)."""
        return [i for i in self.zip.infolist() if not i.is_dir()]

    # ------------------------------------------------------------------ contents

    def has(self, name: str) -> bool:
        return name in self.zip.NameToInfo

    def read(self, member: str | zipfile.ZipInfo) -> bytes:
        name = member if isinstance(member, str) else member.filename
        if isinstance(member, str) and not self.has(member):
            raise WheelReadError(f"{name} is missing")
        try:
            return self.zip.read(member)
        except _MEMBER_ERRORS as exc:
            raise WheelReadError(f"{name} cannot be read from the zip: {exc}") from None

    def chunks(self, member: zipfile.ZipInfo, size: int = 1 << 20) -> Iterator[bytes]:
        """A member's bytes in pieces, so a large library is hashed without holding it."""
        try:
            with self.zip.open(member) as stream:
                yield from iter(lambda: stream.read(size), b"")
        except _MEMBER_ERRORS as exc:
            raise WheelReadError(f"{member.filename} cannot be read from the zip: {exc}") from None

    def head(self, member: zipfile.ZipInfo, size: int) -> bytes:
        """The first ``size`` bytes of a member (to recognise ELF files without reading them)."""
        try:
            with self.zip.open(member) as stream:
                return stream.read(size)
        except _MEMBER_ERRORS as exc:
            raise WheelReadError(f"{member.filename} cannot be read from the zip: {exc}") from None

    def text(self, name: str) -> str:
        try:
            return self.read(name).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise WheelReadError(f"{name} is not UTF-8 text: {exc}") from None

    def metadata(self) -> Message:
        """``<dist-info>/METADATA`` as an email message."""
        return Parser().parsestr(self.text(f"{self.dist_info}/METADATA"))

    def wheel_metadata(self) -> Message:
        """``<dist-info>/WHEEL`` as an email message."""
        return Parser().parsestr(self.text(f"{self.dist_info}/WHEEL"))

    def build_info(self, member: str | None = None) -> dict[str, Any] | None:
        """``BUILD_INFO`` from ``member`` (the project table's ``audit.build-info``, default
        this repository's); None if missing or not a literal dict."""
        member = member or own_build_info_member()
        if not self.has(member):
            return None
        return build_info_of(self.text(member))
