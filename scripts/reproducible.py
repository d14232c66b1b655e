"""Byte-reproducible wheels: a deterministic rewrite of a wheel, and a build-twice check.

A release wheel goes through :func:`finalize_wheel` after ``auditwheel repair``: the SBOM is
added under ``.dist-info/sboms/`` (PEP 770), ``RECORD`` is rewritten, and the zip is written
again with members in a fixed order, every timestamp at ``SOURCE_DATE_EPOCH`` and fixed
permissions. What is left to differ between two builds is then only what the compiler put in
the binary, which setup.py keeps free of build paths (``-ffile-prefix-map``).

    python -m scripts.reproducible --torch 2.14 [--cpu | --arch-list 9.0] [--work DIR]

builds the row's wheel twice, in two folders with different paths and no compiler cache (both
in a new ``run-*`` folder under ``--work``; nothing else there is touched),
repairs and finalizes both, and exits 1 naming every member that differs (``diffoscope``
shows how, when it is installed). A reproducible run removes its own ``run-*`` folder unless
``--keep`` is given; a run that is not reproducible keeps it for comparing.
"""

from __future__ import annotations

import argparse
import base64
import csv
import dataclasses
import datetime
import hashlib
import io
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from scripts import basics, matrix, toolchain
from scripts.project import own_project
from scripts.wheelfile import sha256_of_file as sha256_file

# Zip cannot store times before 1980; a commit older than that is clamped (as wheel does).
ZIP_EPOCH_MIN = 315532800
# Regular file with rw-r--r-- or rwxr-xr-x: owners and umask of the build machine drop out.
FILE_MODE = 0o100644
EXEC_MODE = 0o100755
COMPRESSION = zipfile.ZIP_DEFLATED
COMPRESS_LEVEL = 9


log = basics.logger("reproducible")


def record_hash(data: bytes) -> str:
    """``sha256=<urlsafe b64, unpadded>`` as wheel RECORD files write it."""
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return "sha256=" + digest.decode()


def zip_time(epoch: int) -> tuple[int, int, int, int, int, int]:
    stamp = datetime.datetime.fromtimestamp(max(epoch, ZIP_EPOCH_MIN), tz=datetime.timezone.utc)
    return (stamp.year, stamp.month, stamp.day, stamp.hour, stamp.minute, stamp.second)


def dist_info_dir(names: Sequence[str]) -> str:
    dirs = {n.split("/")[0] for n in names if n.split("/")[0].endswith(".dist-info")}
    if len(dirs) != 1:
        raise ValueError(f"expected one .dist-info folder in the wheel, found {sorted(dirs)}")
    return dirs.pop()


def member_order(names: Sequence[str], dist_info: str) -> list[str]:
    """Package files first, then ``.dist-info`` with ``RECORD`` last (the wheel spec's advice)."""
    record = f"{dist_info}/RECORD"

    def key(name: str) -> tuple[int, str]:
        if name == record:
            return (2, name)
        return (1 if name.startswith(dist_info + "/") else 0, name)

    return sorted(names, key=key)


def render_record(files: Mapping[str, bytes], record_name: str) -> bytes:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    for name in sorted(files):
        writer.writerow([name, record_hash(files[name]), len(files[name])])
    writer.writerow([record_name, "", ""])
    return out.getvalue().encode()


def finalize_wheel(
    wheel: Path, dest: Path, epoch: int, extra_files: Mapping[str, bytes] | None = None
) -> Path:
    """Write ``wheel`` to ``dest`` (a file path) deterministically, adding ``extra_files``.

    ``extra_files`` maps paths relative to the ``.dist-info`` folder (``sboms/x.cdx.json``)
    to their bytes; an existing member of that name is an error, never overwritten silently
    (auditwheel may add its own SBOM: both are kept).
    """
    with zipfile.ZipFile(wheel) as zf:
        infos = [i for i in zf.infolist() if not i.is_dir()]
        files = {i.filename: zf.read(i) for i in infos}
        modes = {i.filename: (i.external_attr >> 16) & 0o111 for i in infos}
    dist_info = dist_info_dir(list(files))
    record_name = f"{dist_info}/RECORD"
    for rel, data in (extra_files or {}).items():
        name = f"{dist_info}/{rel}"
        if name in files:
            raise ValueError(f"{wheel.name}: already holds {name}; not replacing it")
        files[name] = data
        modes[name] = 0
    files.pop(record_name, None)
    files[record_name] = render_record(
        {n: d for n, d in files.items() if n != record_name}, record_name
    )
    date_time = zip_time(epoch)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + ".part")
    with zipfile.ZipFile(tmp, "w") as out:
        for name in member_order(list(files), dist_info):
            info = zipfile.ZipInfo(name, date_time=date_time)
            info.create_system = 3  # Unix, so external_attr holds the mode
            info.external_attr = (EXEC_MODE if modes.get(name) else FILE_MODE) << 16
            info.compress_type = COMPRESSION
            out.writestr(info, files[name], compress_type=COMPRESSION, compresslevel=COMPRESS_LEVEL)
    tmp.replace(dest)
    return dest


def finalize_release(
    row: matrix.Row,
    repaired: Path,
    dest_dir: Path,
    cuda_home: Path | None,
    sysroot: Path | None,
    epoch: int,
) -> Path:
    """The step after ``auditwheel repair`` for every release wheel: SBOM + deterministic zip.

    Writes ``dest_dir/<repaired.name>`` with the SBOM of :mod:`scripts.sbom` and checks it
    with the audit rule ``sbom``; raises ``AuditError`` (and leaves no wheel) when it fails.
    ``cuda_home``/``sysroot``: what the build used (``None``: a CPU build / the image's glibc).
    """
    from scripts import audit, sbom

    inputs = sbom.collect_inputs(row, repaired, cuda_home, sysroot, epoch)
    final = finalize_wheel(
        repaired,
        dest_dir / repaired.name,
        epoch,
        {sbom.sbom_path(sbom.distribution_of(repaired)): sbom.build_sbom(inputs)},
    )
    problems = sbom.check_sbom(final)
    if problems:
        final.unlink()
        raise audit.AuditError("\n".join(f"{final.name}: {p}" for p in problems))
    return final


# --------------------------------------------------------------------------- comparing


def differing_members(a: Path, b: Path) -> list[str]:
    """Names of members whose bytes or zip entries differ between wheels ``a`` and ``b``.

    ``[]`` means the two files are identical. A member only in one wheel is listed with
    ``(only in a.whl)``; equal contents with different zip metadata as ``name (zip entry: ...)``.
    """
    if sha256_file(a) == sha256_file(b):
        return []
    with zipfile.ZipFile(a) as za, zipfile.ZipFile(b) as zb:
        ia = {i.filename: i for i in za.infolist()}
        ib = {i.filename: i for i in zb.infolist()}
        diffs = [f"{n} (only in {a.name})" for n in ia if n not in ib]
        diffs += [f"{n} (only in {b.name})" for n in ib if n not in ia]
        for name in ia:
            if name not in ib:
                continue
            if za.read(name) != zb.read(name):
                diffs.append(name)
                continue
            fields = [
                f
                for f in ("date_time", "external_attr", "compress_type", "create_system", "extra")
                if getattr(ia[name], f) != getattr(ib[name], f)
            ]
            if fields:
                diffs.append(f"{name} (zip entry: {', '.join(fields)})")
        if not diffs and [i.filename for i in za.infolist()] != [i.filename for i in zb.infolist()]:
            diffs.append("(member order)")
    return diffs or ["(zip container bytes: same members, different compression or headers)"]


def diffoscope_report(a: Path, b: Path, out: Path) -> Path | None:
    """``diffoscope --text`` of two wheels into ``out`` when diffoscope is installed."""
    exe = shutil.which("diffoscope")
    if exe is None:
        return None
    with out.open("w") as fh:
        subprocess.run([exe, "--text", "-", str(a), str(b)], stdout=fh, stderr=subprocess.STDOUT)
    return out


# --------------------------------------------------------------------------- building twice


def write_nvcc_wrapper(path: Path, nvcc: Path | str, launcher: str | None = None) -> Path:
    """``path``: ``[launcher] nvcc`` (ccache, say) as every build of this repository's
    package runs it (``toolchain.nvcc_wrapper_script``: the source name without the build
    folder, after the package's import name)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    command = [part for part in (launcher, nvcc) if part]
    path.write_text(toolchain.nvcc_wrapper_script(command, own_project().import_name))
    path.chmod(0o755)
    return path


def cold_toolchain(row: matrix.Row, with_cuda: bool) -> toolchain.Toolchain:
    """The row's toolchain without ccache: what a user rebuilding the wheel elsewhere has."""
    return toolchain.assemble(
        row.cuda,
        row.toolkit,
        source_name=own_project().import_name,
        with_cuda=with_cuda,
        ccache=False,
    )


@dataclass
class Build:
    label: str
    workdir: Path
    wheel: Path
    sha256: str
    seconds: float


def build_once(
    row: matrix.Row,
    workdir: Path,
    with_cuda: bool,
    python: Path | None = None,
    provenance: Mapping[str, str] | None = None,
) -> tuple[Path, Path]:
    """Build ``row``'s wheel in ``workdir`` with no compiler cache; (wheel, build venv python).

    The same steps as ``scripts.build.build_wheel`` (fresh venv with the row's torch, sources
    copied, setup.py's environment contract), without ccache: a cold build is what a user
    rebuilding the wheel elsewhere gets. ``provenance`` (``SOURCE_DATE_EPOCH``,
    ``build.GIT_COMMIT_VARIABLE``) replaces what ``scripts.build`` reads from git at this moment.
    """
    from scripts import build

    interp = python or build.pick_build_python(row).path
    tools = cold_toolchain(row, with_cuda)
    py = build.create_venv(
        workdir / "venv", interp, [f"torch=={row.torch}", *build.BUILD_REQUIREMENTS]
    )
    src = workdir / "src"
    build.copy_sources(src)
    env = build.build_env(row, tools, build.site_packages(py))
    if tools.cuda_home is not None:
        wrapper = write_nvcc_wrapper(workdir / "bin" / "nvcc", tools.cuda_home / "bin" / "nvcc")
        env["PYTORCH_NVCC"] = str(wrapper)
    for var in [v for v in env if v.startswith("CCACHE_")]:
        env.pop(var)
    env.update(provenance or {})
    wheel, _ = build.build_in_venv(py, src, workdir, env, what=f"build in {workdir}")
    return wheel, py


def release_wheel(
    row: matrix.Row, wheel: Path, python: Path, out_dir: Path, epoch: int, with_cuda: bool
) -> Path:
    """What a release build does after setup.py: auditwheel repair, SBOM, deterministic zip.

    The project's audit rules are not applied here (``nox -s wheels`` and cibuildwheel's
    repair step do): this check is about bytes, whatever the wheel's label.
    """
    from scripts import audit, build

    site = build.site_packages(python)
    provided = audit.torch_provided_libs(site)
    repaired, _ = audit.repair_wheel(wheel, out_dir / "repaired", provided)
    tools = cold_toolchain(row, with_cuda)
    return finalize_release(row, repaired, out_dir / "final", tools.cuda_home, tools.sysroot, epoch)


def build_twice(
    row: matrix.Row, work: Path, with_cuda: bool, python: Path | None = None
) -> tuple[Build, Build]:
    """Two cold builds of ``row`` in folders whose paths differ in name and length.

    Both live in a fresh folder of their own under ``work`` (``work/run-XXXXXXXX/first`` and
    ``.../second-build-tree/deeper``): ``work`` may be any folder the caller names (``--work ~``),
    and nothing already in it is read, replaced or removed.
    """
    from scripts import build as build_mod

    # Read once: a commit made while the builds run must not make them differ.
    provenance = {
        "SOURCE_DATE_EPOCH": build_mod.source_date_epoch(),
        build_mod.GIT_COMMIT_VARIABLE: build_mod.git_commit(),
    }
    epoch = int(provenance["SOURCE_DATE_EPOCH"])
    work.mkdir(parents=True, exist_ok=True)
    run = Path(tempfile.mkdtemp(prefix="run-", dir=work))
    builds = []
    for label, rel in (("a", "first"), ("b", "second-build-tree/deeper")):
        workdir = run / rel
        start = time.monotonic()
        log(f"build {label} in {workdir}")
        wheel, py = build_once(row, workdir, with_cuda, python, provenance)
        final = release_wheel(row, wheel, py, workdir, epoch, with_cuda)
        seconds = time.monotonic() - start
        builds.append(Build(label, workdir, final, sha256_file(final), seconds))
        log(f"build {label}: {final.name} sha256 {builds[-1].sha256} ({seconds:.0f}s)")
    return builds[0], builds[1]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m scripts.reproducible",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--torch", help="row (default: newest); its wheel's build row is built")
    parser.add_argument("--cpu", action="store_true", help="CPU kernels only (no CUDA toolkit)")
    parser.add_argument(
        "--arch-list", help="TORCH_CUDA_ARCH_LIST instead of the row's (a quicker CUDA check)"
    )
    parser.add_argument("--python", type=Path, help="build interpreter (default: the row's newest)")
    parser.add_argument(
        "--work",
        type=Path,
        help="folder for a new run-* folder of this run (default: <cache>/reproducible/<variant>)",
    )
    parser.add_argument(
        "--keep", action="store_true", help="keep this run's build folders when it passes too"
    )
    args = parser.parse_args(argv)
    os.environ.setdefault("UV_PYTHON_DOWNLOADS", "never")
    rows = matrix.load_rows()
    row = matrix.build_row_of(matrix.select_rows(rows, args.torch)[0], rows)
    if args.arch_list:
        row = dataclasses.replace(row, arch_list=args.arch_list)
    kind = "cpu" if args.cpu else row.variant
    work = (args.work or toolchain.cache_dir() / "reproducible" / kind).resolve()
    a, b = build_twice(row, work, not args.cpu, args.python)
    print(f"{a.sha256}  {a.wheel}\n{b.sha256}  {b.wheel}")
    diffs = differing_members(a.wheel, b.wheel)
    run = a.workdir.parent  # the run-* folder build_twice made for both builds
    if not diffs:
        print(
            f"reproducible: {a.wheel.name} sha256 {a.sha256} ({a.seconds:.0f}s, {b.seconds:.0f}s)"
        )
        if args.keep:
            log(f"kept both builds in {run}")
        else:
            shutil.rmtree(run)
            log(f"removed this run's builds in {run} (--keep keeps them)")
        return 0
    log(f"kept both builds in {run} to compare")
    print(f"NOT reproducible: {a.wheel.name} differs in: " + ", ".join(diffs), file=sys.stderr)
    report = diffoscope_report(a.wheel, b.wheel, a.workdir.parent / "diffoscope.txt")
    if report:
        print(f"diffoscope: {report}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    raise SystemExit(main())
