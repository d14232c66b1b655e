"""What a wheel file says about itself, checked: its name's parts, its METADATA, its torch pin.

``scripts.index``, ``scripts.publish`` and ``scripts.pypi_release`` read wheels through this
module. Every name that later becomes a path or reaches HTML is checked here: the file name
against the wheel file name rules (PEP 427) with a canonical PEP 440 version, the local label
against the variant grammar (:mod:`scripts.variant`), and the wheel's ``Requires-Dist``
on torch against what its label promises. A wheel is never read into memory: it is hashed in
chunks and only METADATA is read from the zip. Standard library only.
"""

from __future__ import annotations

import ast
import hashlib
import re
import zipfile
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from email.parser import Parser
from email.policy import compat32
from pathlib import Path
from typing import Any

from scripts.variant import Variant, parse_label

_CHUNK = 1 << 20
# A METADATA file is a few KiB; a larger one is a broken or hostile wheel, not read into memory.
_METADATA_LIMIT = 1 << 20
# The wheel file name (PEP 427 and the binary distribution format spec): the version and tags
# never hold "-", the name never holds anything but letters, digits, "_" and ".".
_WHEEL_NAME = re.compile(
    r"(?P<name>[A-Za-z0-9](?:[A-Za-z0-9._]*[A-Za-z0-9])?)-(?P<version>[^-]+)"
    r"(?:-(?P<build>[0-9][A-Za-z0-9_.]*))?"
    r"-(?P<python>[A-Za-z0-9_.]+)-(?P<abi>[A-Za-z0-9_.]+)-(?P<platform>[A-Za-z0-9_.]+)\.whl"
)
# PEP 440's canonical form (its appendix B), with a canonical local label: what build tools
# write into wheel names, and nothing that could be a path or markup.
_CANONICAL_VERSION = re.compile(
    r"(?:[1-9][0-9]*!)?(?:0|[1-9][0-9]*)(?:\.(?:0|[1-9][0-9]*))*"
    r"(?:(?:a|b|rc)(?:0|[1-9][0-9]*))?(?:\.post(?:0|[1-9][0-9]*))?(?:\.dev(?:0|[1-9][0-9]*))?"
    r"(?:\+[a-z0-9]+(?:\.[a-z0-9]+)*)?"
)
_REQUIREMENT_NAME = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


class WheelError(RuntimeError):
    """A wheel that is not what its name says, or that cannot be read."""


@dataclass(frozen=True)
class WheelName:
    name: str
    version: str
    build: str | None
    tag: str  # python-abi-platform


@dataclass(frozen=True)
class WheelInfo:
    filename: str
    project: str  # PEP 503 normalised
    version: str
    label: str  # local version label, e.g. "stable.cu13"; "" for a public version
    variant: Variant | None  # what the label says; None for a public version
    sha256: str
    metadata: bytes  # the wheel's .dist-info/METADATA, byte for byte
    metadata_sha256: str
    requires_python: str | None
    requires_torch: str | None  # the Requires-Dist on torch, e.g. "torch>=2.10"
    source: Path
    sbom: bytes | None = None  # the wheel's .dist-info/sboms/<name>.cdx.json (PEP 770)


def normalize(name: str) -> str:
    """PEP 503 normalised project name: runs of ``-_.`` become ``-``, lower case."""
    return re.sub(r"[-_.]+", "-", name).lower()


def sha256_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_of_file(path: Path) -> str:
    """The file's sha256, read in chunks: a CUDA wheel is hundreds of MB."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def parse_wheel_name(filename: str) -> WheelName:
    """The parts of a wheel file name; WheelError unless every part is well formed."""
    match = _WHEEL_NAME.fullmatch(filename)
    if match is None:
        raise WheelError(
            f"{filename!r} is not a wheel file name: expected "
            "<name>-<version>[-<build>]-<python>-<abi>-<platform>.whl with letters, digits, "
            "'_' and '.' only (PEP 427); rename it back to what the build wrote"
        )
    version = match["version"]
    if _CANONICAL_VERSION.fullmatch(version) is None:
        raise WheelError(
            f"{filename!r}: {version!r} is not a canonical PEP 440 version (e.g. 0.1.0+stable.cu13)"
        )
    tag = f"{match['python']}-{match['abi']}-{match['platform']}"
    return WheelName(match["name"], version, match["build"], tag)


# What zipfile raises for a member whose data is corrupt or cut short.
_MEMBER_ERRORS = (zipfile.BadZipFile, zlib.error, EOFError)


def _read_member(path: Path, zf: zipfile.ZipFile, name: str, limit: int) -> bytes:
    """Up to ``limit`` + 1 bytes of one member; WheelError naming the wheel and the member when
    its data is damaged (a bad CRC, a broken deflate stream)."""
    try:
        with zf.open(name) as member:
            return member.read(limit + 1)
    except _MEMBER_ERRORS as exc:
        raise WheelError(f"{path.name}: {name} cannot be read from the zip ({exc})") from None


def read_wheel_metadata(path: Path) -> bytes:
    """The raw bytes of the wheel's one top-level ``*.dist-info/METADATA``, read from the zip
    alone (the rest of the wheel is never loaded)."""
    try:
        with zipfile.ZipFile(path) as zf:
            infos = [
                i
                for i in zf.infolist()
                if i.filename.count("/") == 1
                and i.filename.endswith("/METADATA")
                and i.filename.split("/")[0].endswith(".dist-info")
            ]
            if len(infos) != 1:
                found = [i.filename for i in infos]
                raise WheelError(f"{path.name}: expected one .dist-info/METADATA, found {found}")
            data = _read_member(path, zf, infos[0].filename, _METADATA_LIMIT)
    except zipfile.BadZipFile as exc:
        raise WheelError(f"{path.name}: not a readable zip file ({exc})") from exc
    if len(data) > _METADATA_LIMIT:
        raise WheelError(f"{path.name}: METADATA is larger than {_METADATA_LIMIT} bytes")
    return data


def own_build_info_member() -> str:
    """Where this repository's wheels record their build (version, torch, CUDA, archs, commit)
    as a literal dict: its project table's ``audit.build-info``."""
    # Imported here: the table's module imports the matrix, whose toolchain imports this one.
    from scripts.project import own_project

    return own_project().audit.build_info


def build_info_of(source: str) -> dict[str, Any] | None:
    """``BUILD_INFO`` of a ``_build_info.py``'s source, read without running it; None when
    the source has no literal ``BUILD_INFO`` dict."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "BUILD_INFO" for t in node.targets
        ):
            try:
                value = ast.literal_eval(node.value)
            # A literal that is no value: {[]: 1} (unhashable key), or nested past the stack.
            except (ValueError, TypeError, RecursionError):
                return None
            return value if isinstance(value, dict) else None
    return None


def sbom_member(distribution: str) -> str:
    """A project's own SBOM inside its wheel, under the .dist-info folder (PEP 770;
    scripts/sbom.py writes it), named after the distribution (the wheel file's first part)."""
    return f"sboms/{distribution}.cdx.json"


def read_wheel_sbom(path: Path) -> bytes | None:
    """The wheel's own CycloneDX SBOM, or None for a wheel built without one."""
    member = sbom_member(path.name.split("-")[0])
    with zipfile.ZipFile(path) as zf:
        names = [
            n for n in zf.namelist() if n.count("/") == 2 and n.endswith(f".dist-info/{member}")
        ]
        if len(names) != 1:
            return None
        data = _read_member(path, zf, names[0], _METADATA_LIMIT)
    if len(data) > _METADATA_LIMIT:
        raise WheelError(f"{path.name}: {names[0]} is larger than {_METADATA_LIMIT} bytes")
    return data


def torch_requirements(requires_dist: Iterable[str]) -> list[str]:
    """The ``Requires-Dist`` values on torch, whitespace removed (``torch>=2.10``)."""
    found = []
    for value in requires_dist:
        match = _REQUIREMENT_NAME.match(value)
        if match and normalize(match.group(1)) == "torch":
            found.append("".join(value.split()))
    return found


def describe_wheel(path: Path, require_label: bool = True) -> WheelInfo:
    """Check one wheel and read what the index needs from it.

    ``require_label=False`` accepts a public version (the PyPI upload); a wheel that carries a
    label is always checked against the variant grammar and its torch pin.
    """
    parts = parse_wheel_name(path.name)
    version = parts.version
    _, _, label = version.partition("+")
    variant = None
    if label:
        try:
            variant = parse_label(label)
        except ValueError as exc:
            raise WheelError(f"{path.name}: {exc}") from exc
    elif require_label:
        raise WheelError(
            f"{path.name}: version {version!r} has no local label; every wheel in this index "
            "carries its variant (e.g. 0.1.0+stable.cu13)"
        )
    metadata = read_wheel_metadata(path)
    try:
        text = metadata.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise WheelError(f"{path.name}: METADATA is not UTF-8 ({exc})") from exc
    # Parsed from text, not bytes: the bytes parser turns non-ASCII values into Header objects.
    headers = Parser(policy=compat32).parsestr(text, headersonly=True)
    if normalize(str(headers.get("Name", ""))) != normalize(parts.name):
        raise WheelError(
            f"{path.name}: METADATA names {headers.get('Name')!r}, the file name {parts.name!r}"
        )
    if headers.get("Version") != version:
        raise WheelError(
            f"{path.name}: METADATA has version {headers.get('Version')!r}, "
            f"the file name {version!r}"
        )
    pins = torch_requirements(str(v) for v in headers.get_all("Requires-Dist") or [])
    if variant is not None and pins != ["".join(variant.requires_torch.split())]:
        found = ", ".join(pins) if pins else "no requirement on torch"
        raise WheelError(
            f"{path.name}: the label {label!r} promises Requires-Dist: {variant.requires_torch}, "
            f"but METADATA has {found}; the wheel was built against another torch than its "
            "name says: rebuild it"
        )
    if len(pins) > 1:
        raise WheelError(f"{path.name}: more than one requirement on torch: {pins}")
    requires_python = headers.get("Requires-Python")
    return WheelInfo(
        filename=path.name,
        project=normalize(parts.name),
        version=version,
        label=label,
        variant=variant,
        sha256=sha256_of_file(path),
        metadata=metadata,
        metadata_sha256=sha256_of(metadata),
        requires_python=str(requires_python) if requires_python is not None else None,
        requires_torch=pins[0] if pins else None,
        source=path,
        sbom=read_wheel_sbom(path),
    )


def find_wheels(sources: Iterable[Path]) -> list[Path]:
    """Wheel files under each source (a folder, searched recursively, or a file), by name.

    CI artifacts arrive one folder per matrix cell; the same file in two of them is kept
    once, two different files with one name are an error.
    """
    by_name: dict[str, Path] = {}
    for source in sources:
        if not source.exists():
            raise WheelError(f"{source} does not exist")
        found = [source] if source.is_file() else sorted(source.rglob("*.whl"))
        for path in found:
            seen = by_name.get(path.name)
            if seen is not None and sha256_of_file(seen) != sha256_of_file(path):
                raise WheelError(
                    f"two different files named {path.name!r}: {seen} and {path}; "
                    "keep the one you mean to publish"
                )
            by_name.setdefault(path.name, path)
    return [by_name[name] for name in sorted(by_name)]
