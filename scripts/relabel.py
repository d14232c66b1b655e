"""Give a built wheel the variant it was built as: the local version label and the torch pin.

A project's own setup.py usually names its wheel ``mypkg-0.0.1`` and requires ``torch``
unpinned; built for several torch minors and CUDA versions, those wheels would share one
name and each claim every torch. The pipeline, not the project, writes what it knows about
the build into the wheel it made (the project's files stay untouched):

* the version becomes ``0.0.1+pt28cu128`` (or ``+stable.cu13``): the file name, the
  ``.dist-info`` folder and METADATA's ``Version``;
* METADATA's torch requirement becomes the variant's (``torch==2.8.*``, ``torch>=2.10``),
  replacing any the project declared.

A wheel that already carries a label (a setup.py may write its own) must carry this
one; it is then left as it is.
"""

from __future__ import annotations

import re
import zipfile
from collections.abc import Mapping
from pathlib import Path

from scripts.reproducible import render_record
from scripts.wheelfile import parse_wheel_name

_TORCH_REQUIREMENT = re.compile(rb"^Requires-Dist: *torch\b(?![-_.\w]).*\r?\n", re.MULTILINE)
_VERSION = re.compile(rb"^Version: *(.+?)\r?$", re.MULTILINE)
_VERSIONEER_UNKNOWN = "0+unknown"
_NO_VERSION = "0.0.0"


class RelabelError(ValueError):
    """A wheel whose version or metadata cannot take the variant's label."""


def labelled_metadata(metadata: bytes, version: str, requires_torch: str) -> bytes:
    """METADATA with ``Version: version`` and exactly one ``Requires-Dist: requires_torch``
    (the project's torch requirements removed); everything else as it was."""
    end = metadata.find(b"\n\n")
    headers, body = (metadata, b"") if end < 0 else (metadata[: end + 1], metadata[end + 1 :])
    headers, count = _VERSION.subn(b"Version: " + version.encode(), headers)
    if count != 1:
        raise RelabelError(f"METADATA has {count} Version headers, expected one")
    headers = _TORCH_REQUIREMENT.sub(b"", headers)
    headers += f"Requires-Dist: {requires_torch}\n".encode()
    return headers + body


def unversioned_warning(wheel_name: str) -> str | None:
    """What to say of a wheel whose version is setuptools' ``0.0.0``, a project's that names
    none (diff-gaussian-rasterization's setup.py) or a version tool's fallback: every build of
    the project carries it, so an index cannot tell one from another. None for any other."""
    if parse_wheel_name(wheel_name).version.partition("+")[0] != _NO_VERSION:
        return None
    return (
        f"{wheel_name} is version {_NO_VERSION}, setuptools' default where a project names no "
        "version: every build of it will carry that version, and an index cannot tell them "
        "apart. Give the project a version (setup.py's version=, [project] version, or a tag "
        "that setuptools-scm reads)"
    )


def label_wheel(wheel: Path, label: str, requires_torch: str, out_dir: Path) -> Path:
    """``wheel`` as variant ``label`` in ``out_dir`` (a new file; ``wheel`` is not changed).

    A wheel already labelled ``label`` is returned as it is; one with another label is
    refused, naming both.
    """
    parts = parse_wheel_name(wheel.name)
    public, sep, existing = parts.version.partition("+")
    if parts.version == _VERSIONEER_UNKNOWN:
        raise RelabelError(
            f"{wheel.name}: {_VERSIONEER_UNKNOWN} is versioneer's version for a tree where it "
            "finds no git and no version: the build runs on a copy of the checkout without .git. "
            "Build "
            "from the project's sdist unpacked (versioneer writes the version into its "
            "_version.py), or move the project to setuptools-scm, whose version the pipeline "
            "takes from the checkout"
        )
    if sep:
        if existing != label:
            raise RelabelError(
                f"{wheel.name} carries the local version label {existing!r}, but it was built as "
                f"{label!r}: the project labels its own wheels differently from the pipeline's "
                "variants (stable.cuXX, ptXYcuZZZ); drop the project's label from its version. "
                "Where its setup.py adds one (a git commit, a date) unless a variable says "
                'otherwise (torchao: VERSION_SUFFIX = ""), set that variable in the table\'s '
                "build-env"
            )
        return wheel
    version = f"{public}+{label}"
    old_info = f"{parts.name}-{parts.version}.dist-info/"
    new_info = f"{parts.name}-{version}.dist-info/"
    build = f"-{parts.build}" if parts.build else ""
    target = out_dir / f"{parts.name}-{version}{build}-{parts.tag}.whl"

    def renamed(name: str) -> str:
        return new_info + name[len(old_info) :] if name.startswith(old_info) else name

    with zipfile.ZipFile(wheel) as zf:
        files = {renamed(i.filename): (i, zf.read(i)) for i in zf.infolist() if not i.is_dir()}
    metadata_name, record_name = new_info + "METADATA", new_info + "RECORD"
    if metadata_name not in files:
        raise RelabelError(f"{wheel.name}: no {old_info}METADATA")
    info, metadata = files[metadata_name]
    files[metadata_name] = (info, labelled_metadata(metadata, version, requires_torch))
    out_dir.mkdir(parents=True, exist_ok=True)
    return write_wheel(target, files, record_name)


def write_wheel(
    target: Path, members: Mapping[str, tuple[zipfile.ZipInfo, bytes]], record_name: str
) -> Path:
    """``members`` (name -> its entry in the wheel it comes from, and its bytes) written as
    the wheel ``target``, each keeping its entry's date and mode, with a new RECORD of them
    (any RECORD among ``members`` is replaced)."""
    files = {name: member for name, member in members.items() if name != record_name}
    record = render_record({name: data for name, (_, data) in files.items()}, record_name)
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as out:
        for name, (old, data) in files.items():
            new = zipfile.ZipInfo(name, old.date_time)
            new.external_attr = old.external_attr
            new.create_system = old.create_system
            new.compress_type = zipfile.ZIP_DEFLATED
            out.writestr(new, data)
        out.writestr(zipfile.ZipInfo(record_name, (1980, 1, 1, 0, 0, 0)), record)
    return target
