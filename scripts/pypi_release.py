"""The PyPI upload: the default variant's wheel under the public version.

``python -m scripts.pypi_release --wheels wheelhouse --out dist/pypi`` writes
``NAME-0.1.0-cp39-abi3-manylinux_2_28_x86_64.whl`` from
``NAME-0.1.0+stable.cu13-cp39-abi3-manylinux_2_28_x86_64.whl``.

PyPI refuses local version labels, and one PyPI version holds one file per wheel tag: every
variant has the same tag (``cp39-abi3-manylinux_2_28_x86_64``), so exactly one variant can be
``NAME 0.1.0`` there. It is the stable CUDA 13 wheel, because PyPI's own torch is a CUDA 13
build from 2.11 on (2.11.0 is ``+cu130``, 2.15.0 CUDA 13.2): ``pip install NAME`` next to
PyPI's torch gets the wheel that loads into it. The CUDA 12 stable wheel and the pinned
wheels (torch 2.8, 2.9) stay on the project's own index, where their labels tell them apart.

Only what the version is written in changes, so that the file describes itself: the
``.dist-info`` folder's name, the ``Version:`` line of METADATA, the ``'version'`` entry of
the build-info module the project table names (``audit.build-info``: the package's
``__version__``; its ``'variant'`` still says ``stable.cu13``), the SBOM's root component
(version, purl, description) and serial number, and the RECORD lines of those files. Every
other member (the code) keeps its bytes, its date and its permissions, and the result passes
``python -m scripts.audit`` as it is. The input's RECORD is checked first (a wheel whose files
do not match it is refused), nothing is overwritten, and the result is checked like the index
checks a wheel.
"""

from __future__ import annotations

import argparse
import base64
import csv
import hashlib
import io
import re
import shutil
import sys
import zipfile
import zlib
from collections.abc import Sequence
from pathlib import Path

from scripts import sbom
from scripts.variant import PYPI_VARIANT
from scripts.wheelfile import (
    WheelError,
    build_info_of,
    describe_wheel,
    find_wheels,
    own_build_info_member,
    parse_wheel_name,
)

_CHUNK = 1 << 20
# What zipfile raises for a member whose data is corrupt or cut short.
_MEMBER_ERRORS = (zipfile.BadZipFile, zlib.error, EOFError)


class ReleaseError(RuntimeError):
    pass


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest}"


def _member_hash(zf: zipfile.ZipFile, info: zipfile.ZipInfo) -> tuple[str, int]:
    digest = hashlib.sha256()
    try:
        with zf.open(info) as member:
            for chunk in iter(lambda: member.read(_CHUNK), b""):
                digest.update(chunk)
    except _MEMBER_ERRORS as exc:
        raise ReleaseError(f"{info.filename} cannot be read from the zip: {exc}") from None
    encoded = base64.urlsafe_b64encode(digest.digest()).rstrip(b"=").decode()
    return f"sha256={encoded}", info.file_size


def check_record(zf: zipfile.ZipFile, record_name: str) -> list[list[str]]:
    """RECORD's rows, after checking that they name every member once with its right hash."""
    try:
        rows = list(csv.reader(io.StringIO(zf.read(record_name).decode("utf-8"))))
    except (UnicodeDecodeError, csv.Error) as exc:
        raise ReleaseError(f"RECORD is not a UTF-8 CSV file ({exc})") from None
    for number, row in enumerate(rows, 1):
        if row and len(row) != 3:
            raise ReleaseError(
                f"RECORD line {number} {row!r} has {len(row)} fields, need path,hash,size"
            )
    listed = {row[0]: row for row in rows if row}
    members = {i.filename: i for i in zf.infolist() if not i.is_dir()}
    if set(listed) != set(members):
        missing = sorted(set(members) - set(listed))
        extra = sorted(set(listed) - set(members))
        raise ReleaseError(
            f"RECORD does not list the wheel's files: missing {missing}, extra {extra}"
        )
    for name, info in members.items():
        if name == record_name:
            continue
        digest, size = listed[name][1:3]
        if _member_hash(zf, info) != (digest, int(size) if size.isdigit() else -1):
            raise ReleaseError(f"{name}: its hash or size does not match RECORD")
    return [row for row in rows if row]


def copy_member(
    source: zipfile.ZipFile,
    info: zipfile.ZipInfo,
    target: zipfile.ZipFile,
    new_info: zipfile.ZipInfo,
) -> None:
    """Stream one member's bytes (a CUDA extension is hundreds of MB) under ``new_info``."""
    new_info.file_size = info.file_size
    large = info.file_size > zipfile.ZIP64_LIMIT
    with source.open(info) as src, target.open(new_info, "w", force_zip64=large) as dst:
        shutil.copyfileobj(src, dst, _CHUNK)


def public_metadata(metadata: bytes, version: str, public: str) -> bytes:
    """METADATA with its ``Version:`` header set to ``public``; every other byte unchanged."""
    end = metadata.find(b"\n\n")
    headers, body = (metadata, b"") if end < 0 else (metadata[: end + 1], metadata[end + 1 :])
    pattern = re.compile(rb"^Version: " + re.escape(version.encode()) + rb"(\r?)$", re.MULTILINE)
    new_headers, count = pattern.subn(b"Version: " + public.encode() + rb"\1", headers)
    if count != 1:
        raise ReleaseError(f"METADATA has {count} 'Version: {version}' headers, expected one")
    return new_headers + body


def public_build_info(source: bytes, version: str, public: str) -> bytes:
    """The build-info module (the table's ``audit.build-info``) with its ``'version'`` entry
    set to ``public``; every other byte unchanged (``variant`` still names the build: the
    import guard reads that)."""
    member = own_build_info_member()
    try:
        text = source.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ReleaseError(f"{member} is not UTF-8 ({exc})") from None
    info = build_info_of(text)
    if info is None or info.get("version") != version or "variant" not in info:
        raise ReleaseError(
            f"{member} names version {info and info.get('version')!r} and variant "
            f"{info and info.get('variant')!r}, expected {version!r} and a variant: rebuild the "
            "wheel with this checkout's setup.py"
        )
    entry = re.compile(r"(['\"]version['\"]\s*:\s*)(['\"])" + re.escape(version) + r"\2")
    new_text, count = entry.subn(lambda m: f"{m[1]}{m[2]}{public}{m[2]}", text)
    if count != 1 or build_info_of(new_text) != {**info, "version": public}:
        raise ReleaseError(f"{member}: found {count} 'version' entries, expected one")
    return new_text.encode("utf-8")


def public_wheel(source: Path, out_dir: Path) -> Path:
    """Write the public-version copy of ``source`` into ``out_dir``; refuse to overwrite."""
    described = describe_wheel(source)
    if described.label != PYPI_VARIANT.label:
        raise ReleaseError(f"not the {PYPI_VARIANT.label} wheel")
    parts = parse_wheel_name(source.name)
    public = parts.version.split("+", 1)[0]
    build = f"-{parts.build}" if parts.build else ""
    target = out_dir / f"{parts.name}-{public}{build}-{parts.tag}.whl"
    old_dist_info = f"{parts.name}-{parts.version}.dist-info/"
    new_dist_info = f"{parts.name}-{public}.dist-info/"
    record_name = old_dist_info + "RECORD"
    metadata_name = old_dist_info + "METADATA"
    sbom_name = old_dist_info + sbom.sbom_path(parts.name)
    build_info = own_build_info_member()

    def renamed(name: str) -> str:
        return (
            new_dist_info + name[len(old_dist_info) :] if name.startswith(old_dist_info) else name
        )

    with zipfile.ZipFile(source) as zf:
        needed = (record_name, metadata_name, sbom_name, build_info)
        missing = [name for name in needed if name not in zf.namelist()]
        if missing:
            raise ReleaseError(f"no {', '.join(missing)}: not a release wheel of this pipeline")
        rows = check_record(zf, record_name)
        # What says which version this is: everything else keeps its bytes.
        described_anew = {
            metadata_name: public_metadata(zf.read(metadata_name), parts.version, public),
            build_info: public_build_info(zf.read(build_info), parts.version, public),
        }
        try:
            described_anew[sbom_name] = sbom.describe_copy(zf.read(sbom_name), public, target.name)
        except ValueError as exc:
            raise ReleaseError(str(exc)) from None
        record = io.StringIO()
        writer = csv.writer(record, lineterminator="\n")
        for path, *rest in rows:
            if path in described_anew:
                rest = [_record_hash(described_anew[path]), str(len(described_anew[path]))]
            writer.writerow([renamed(path), *rest])
        out_dir.mkdir(parents=True, exist_ok=True)
        try:
            handle = target.open("xb")  # never replaces a file, even one created meanwhile
        except FileExistsError:
            raise ReleaseError(
                f"{target} exists already; a release file is never overwritten: move it away "
                "or give another --out"
            ) from None
        try:
            with handle, zipfile.ZipFile(handle, "w") as new:
                for info in zf.infolist():
                    new_info = zipfile.ZipInfo(renamed(info.filename), info.date_time)
                    new_info.compress_type = info.compress_type
                    new_info.external_attr = info.external_attr
                    new_info.create_system = info.create_system
                    if info.filename in described_anew:
                        new.writestr(new_info, described_anew[info.filename])
                    elif info.filename == record_name:
                        new.writestr(new_info, record.getvalue().encode())
                    else:
                        copy_member(zf, info, new, new_info)
            with zipfile.ZipFile(target) as written:
                check_record(written, new_dist_info + "RECORD")
            result = describe_wheel(target, require_label=False)
        except BaseException:
            target.unlink()  # created by this run ("xb" above)
            raise
    if result.requires_torch != "".join(PYPI_VARIANT.requires_torch.split()):
        target.unlink()
        raise ReleaseError(f"the copy's Requires-Dist on torch is {result.requires_torch}")
    return target


def pypi_wheels(sources: Sequence[Path], out_dir: Path) -> list[Path]:
    chosen = [p for p in find_wheels(sources) if f"+{PYPI_VARIANT.label}-" in p.name]
    if not chosen:
        raise ReleaseError(
            f"no {PYPI_VARIANT.label} wheel under {', '.join(map(str, sources))}: PyPI gets "
            f"the {PYPI_VARIANT.label} wheel only (build it with the CUDA 13 row)"
        )
    written = []
    for path in chosen:
        try:
            written.append(public_wheel(path, out_dir))
        except ReleaseError as exc:
            raise ReleaseError(f"{path.name}: {exc}") from None
    return written


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m scripts.pypi_release", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--wheels", type=Path, action="append", required=True,
        help="folder (searched recursively) or wheel file; repeatable",
    )  # fmt: skip
    parser.add_argument("--out", type=Path, required=True, help="folder for the PyPI upload")
    args = parser.parse_args(argv)
    try:
        written = pypi_wheels(args.wheels, args.out)
    except (ReleaseError, WheelError, OSError) as exc:
        print(f"pypi_release: {exc}", file=sys.stderr)
        return 1
    for path in written:
        print(f"pypi_release: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
