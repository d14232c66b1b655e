"""A local manylinux-style build image for cibuildwheel, made from Debian's archive with podman.

PyPI's and PyTorch's manylinux images cannot be pulled everywhere (and Docker's engine does not
run everywhere); cibuildwheel only needs an image that has what its container code calls:

* ``/bin/bash``, coreutils, ``tar``, ``which`` (cibuildwheel drives a bash over stdin and
  copies the project in with tar),
* ``/opt/python/cp3X-cp3X/bin/python`` and ``pip`` for the build identifiers and for its own
  utility calls (``cp39``, hard-coded in cibuildwheel),
* a C++ compiler: Debian's gcc 12, the same compiler ``nox -s wheels`` uses,
* the project's glibc 2.31 sysroot (``toolchain.ensure_sysroot``), named by
  ``toolchain.SYSROOT_VARIABLE``, so the manylinux_2_28 tag holds whatever the image's own
  glibc is.

The root filesystem is made by ``mmdebstrap`` (Debian's reproducible debootstrap; the installed
one, else Debian's package unpacked into the cache by :mod:`scripts.mmdebstrap`) with its own
apt configuration, the interpreters are copied in from the machine's CPython installs (pyenv's
or any other ``find_interpreters`` finds; Debian has no 3.10), and the tree is packed into a tar
with sorted names, one mtime and numeric owners, then ``podman import``-ed as
``<IMAGE_REPOSITORY>:<key>``. The key hashes everything the image is made from (this
module's spec and the interpreters' versions), so a changed input gives a new image and an
unchanged one is reused. ``manifest.json`` next to the tar lists every Debian package with its
version and the tar's sha256.

Podman runs here with runc, cgroupfs, no default ulimits and the host's network: those settings
live in a ``containers.conf`` under the cache (``CONTAINERS_CONF``), never in ``/etc``.

    python -m scripts.container build                   build (or reuse) the image, print its name
    python -m scripts.container verify                  make the root again, compare sha256s
    python -m scripts.container env                     CONTAINERS_CONF=... for podman by hand
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from scripts import basics, diskspace, matrix, mmdebstrap, names, toolchain
from scripts.interpreters import find_interpreters

IMAGE_REPOSITORY = names.IMAGE_REPOSITORY
SUITE = "bookworm"
# Beyond mmdebstrap's minbase (bash, coreutils, tar, debianutils' which, dpkg, apt):
# gcc/g++ 12 build the extension; the libraries are what the copied CPython builds' modules
# link (ssl, ctypes, sqlite3, uuid, curses, nis); ca-certificates for pip over HTTPS.
PACKAGES = (
    "ca-certificates",
    "gcc",
    "g++",
    "libffi8",
    "libncursesw6",
    "libnsl2",
    "libsqlite3-0",
    "libssl3",
    "libuuid1",
    "zlib1g",
)
# One timestamp for every file of the image: the image is a function of its inputs, not of
# the day it was made. 2026-11-01T00:00:00Z.
IMAGE_EPOCH = 1793491200
# Bump when the way the image is assembled changes (the key then changes too).
LAYOUT_VERSION = "1"
UTILITY_PYTHON = "3.9"  # cibuildwheel runs /opt/python/cp39-cp39/bin/python for its own calls
SYSROOT_DIR = str(names.CONTAINER_SYSROOT)
CONTAINERS_CONF = """\
# Written by scripts/container.py. Podman on these machines needs runc and cgroupfs,
# inherits no ulimits, and uses the host's network (no slirp or CNI setup).
[containers]
default_ulimits = []
netns = "host"
cgroupns = "host"
log_driver = "k8s-file"

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
"""


log = basics.logger("container")


def podman_dir() -> Path:
    path = toolchain.cache_dir() / "podman"
    path.mkdir(parents=True, exist_ok=True)
    return path


def podman_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """``base`` (default: ``os.environ``) with ``CONTAINERS_CONF`` at the cache's config."""
    conf = podman_dir() / "containers.conf"
    if not conf.is_file() or conf.read_text() != CONTAINERS_CONF:
        conf.write_text(CONTAINERS_CONF)
    env = dict(os.environ if base is None else base)
    env["CONTAINERS_CONF"] = str(conf)
    return env


# The container engine, as Debian packages it: podman runs the image with runc (CONTAINERS_CONF).
ENGINE_COMMANDS = ("podman", "runc")


def require_engine() -> None:
    """Stop with the install command when podman or runc is missing (mmdebstrap, the other
    tool the image needs, is brought in by :mod:`scripts.mmdebstrap`)."""
    basics.require_commands(
        ENGINE_COMMANDS,
        lambda missing: (
            f"{' and '.join(missing)} not found: apt-get install {' '.join(missing)} (as root; "
            "Debian's packages). The local build image runs in podman with runc "
            "(docs/release.md); on GitHub Actions, cibuildwheel uses PyTorch's builder image"
        ),
    )


def podman(*args: str, capture: bool = False) -> subprocess.CompletedProcess[str]:
    require_engine()
    exe = shutil.which("podman") or "podman"
    return basics.run([exe, *args], log=log, env=podman_env(), capture_output=capture, text=True)


def image_pythons(rows: Sequence[matrix.Row]) -> list[str]:
    """The Pythons cibuildwheel needs: each build row's build identifier's, and its own 3.9."""
    wanted = {UTILITY_PYTHON} | {r.build_python for r in matrix.build_rows(rows)}
    return sorted(wanted, key=lambda v: tuple(int(p) for p in v.split(".")))


def python_tag(version: str) -> str:
    return "cp" + version.replace(".", "")


def interpreter_homes(versions: Sequence[str]) -> dict[str, Path]:
    """Install prefix of each ``X.Y`` interpreter found on this machine (``bin/pythonX.Y``'s)."""
    found = find_interpreters(versions)
    missing = [v for v in versions if found.get(v) is None]
    if missing:
        raise SystemExit(
            f"no CPython {', '.join(missing)} on this machine for the build image "
            "(cibuildwheel needs /opt/python/cp3X-cp3X for each); install them with pyenv"
        )
    homes = {}
    for version in versions:
        exe = Path(found[version].path).resolve()  # type: ignore[union-attr]
        homes[version] = exe.parent.parent
    return homes


def full_version(home: Path, version: str) -> str:
    out = subprocess.run(
        [
            str(home / "bin" / f"python{version}"),
            "-c",
            "import platform; print(platform.python_version())",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip()


def image_spec(pythons: Mapping[str, str]) -> dict[str, Any]:
    """Everything the image is made from; its hash is the image's tag."""
    return {
        "suite": SUITE,
        "packages": sorted(PACKAGES),
        "epoch": IMAGE_EPOCH,
        "layout": LAYOUT_VERSION,
        "pythons": dict(sorted(pythons.items())),
        "sysroot": [toolchain.SYSROOT_SUITE, *toolchain.SYSROOT_PACKAGES],
    }


def image_key(spec: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]


def image_name(key: str) -> str:
    return f"{IMAGE_REPOSITORY}:{key}"


def image_exists(name: str) -> bool:
    exe = shutil.which("podman")
    if exe is None:
        return False
    proc = subprocess.run(
        [exe, "image", "exists", name], env=podman_env(), capture_output=True, text=True
    )
    return proc.returncode == 0


# --------------------------------------------------------------------------- root filesystem


def mmdebstrap_command(rootfs: Path, mirror: str, exe: Path | str = "mmdebstrap") -> list[str]:
    return mmdebstrap.command(exe, SUITE, rootfs, mirror, PACKAGES)


SKIPPED_SITE_PACKAGES = ("pip", "pip-")


def copy_interpreter(home: Path, dest: Path) -> None:
    """Copy a CPython install to ``dest``: stdlib and pip only, scripts pointed at ``dest``.

    Whatever else was installed into it stays behind (a fresh interpreter, as in a manylinux
    image), and the console scripts' ``#!`` lines name the new place.
    """
    shutil.copytree(
        home,
        dest,
        symlinks=True,
        ignore=lambda folder, names: _site_packages_filter(Path(folder), names),
    )
    version = next(p.name for p in (dest / "lib").glob("python3.*") if p.is_dir())
    target = f"#!{SYSTEM_PREFIX / dest.name / 'bin' / version}"
    for script in (dest / "bin").iterdir():
        if script.is_symlink() or not script.is_file():
            continue
        data = script.read_bytes()
        if data.startswith(b"#!") and b"python" in data.split(b"\n", 1)[0]:
            script.write_bytes(target.encode() + b"\n" + data.split(b"\n", 1)[1])
    (dest / "bin" / "python").unlink(missing_ok=True)
    (dest / "bin" / "python").symlink_to(version)
    (dest / "bin" / "pip").unlink(missing_ok=True)
    (dest / "bin" / "pip").symlink_to(f"pip{version[len('python') :]}")


SYSTEM_PREFIX = Path("/opt/python")


def _site_packages_filter(folder: Path, names: list[str]) -> list[str]:
    if folder.name == "site-packages":
        return [n for n in names if not n.startswith(SKIPPED_SITE_PACKAGES)]
    return [n for n in names if n == "__pycache__"]


def pack_rootfs(rootfs: Path, tar: Path, epoch: int) -> str:
    """Deterministic tar of ``rootfs`` (sorted names, one mtime, numeric owners); its sha256."""
    cmd = [
        "tar",
        "--sort=name",
        f"--mtime=@{epoch}",
        "--numeric-owner",
        "--pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime",
        "--format=posix",
        "-C",
        str(rootfs),
        "-cf",
        str(tar),
        ".",
    ]
    basics.run(cmd, log=log)
    digest = hashlib.sha256()
    with tar.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def dpkg_packages(rootfs: Path) -> dict[str, str]:
    out = subprocess.run(
        ["dpkg-query", f"--admindir={rootfs}/var/lib/dpkg", "-W", "-f=${Package} ${Version}\n"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return dict(line.split(" ", 1) for line in out.splitlines() if line.strip())


# Written by dpkg, apt and ldconfig while the root is made: logs and caches that differ per run.
VOLATILE = (
    "var/log",
    "var/cache/apt",
    "var/cache/ldconfig/aux-cache",
    "var/lib/apt/lists",
    "var/cache/debconf/config.dat-old",
    "var/cache/debconf/templates.dat-old",
    "var/lib/dpkg/status-old",
    "var/lib/dpkg/diversions-old",
    "etc/machine-id",
)


def remove_volatile(rootfs: Path) -> None:
    for rel in VOLATILE:
        path = rootfs / rel
        if path.is_dir() and not path.is_symlink():
            for child in path.iterdir():
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child)
                else:
                    child.unlink()
        elif path.exists() or path.is_symlink():
            path.unlink()


def build_rootfs(rootfs: Path, homes: Mapping[str, Path]) -> None:
    mirror = toolchain.debian_mirror(toolchain.system_apt_sources()).uri
    env = dict(os.environ, SOURCE_DATE_EPOCH=str(IMAGE_EPOCH))
    exe = mmdebstrap.ensure_mmdebstrap()
    log(f"mmdebstrap {SUITE} from {mirror} into {rootfs}")
    subprocess.run(
        mmdebstrap_command(rootfs, mirror, exe), check=True, env=mmdebstrap.tool_env(exe, env)
    )
    for version, home in homes.items():
        tag = python_tag(version)
        copy_interpreter(home, rootfs / "opt" / "python" / f"{tag}-{tag}")
    libdirs = "".join(f"{SYSTEM_PREFIX}/{python_tag(v)}-{python_tag(v)}/lib\n" for v in homes)
    (rootfs / "etc" / "ld.so.conf.d" / "opt-python.conf").write_text(libdirs)
    sysroot = toolchain.ensure_sysroot()
    dest = rootfs / SYSROOT_DIR.lstrip("/")
    shutil.copytree(sysroot, dest / "root", symlinks=True)
    shutil.copytree(sysroot.parent / "debs", dest / "debs")
    basics.run(["ldconfig", "-r", str(rootfs)], log=log)
    remove_volatile(rootfs)


def image_inputs(
    rows: Sequence[matrix.Row] | None = None,
) -> tuple[dict[str, Any], dict[str, Path]]:
    """(spec, interpreter homes) of the image for every row of the table."""
    rows = list(rows or matrix.load_rows())
    versions = image_pythons(rows)
    homes = interpreter_homes(versions)
    return image_spec({v: full_version(homes[v], v) for v in versions}), homes


def verify_image() -> int:
    """Make the root filesystem again in a fresh folder; 0 when its tar has the recorded sha256.

    The Debian archive moves on (point releases): a mismatch with the same package versions in
    both manifests is a reproducibility bug, one with different versions is the archive's.
    """
    spec, homes = image_inputs()
    key = image_key(spec)
    recorded = toolchain.cache_dir() / "container" / key / "manifest.json"
    if not recorded.is_file():
        raise SystemExit(f"{recorded} missing: run `python -m scripts.container build` first")
    first = json.loads(recorded.read_text())
    work = toolchain.cache_dir() / "container" / f"{key}-verify"
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    build_rootfs(work / "rootfs", homes)
    digest = pack_rootfs(work / "rootfs", work / "rootfs.tar", IMAGE_EPOCH)
    packages = dpkg_packages(work / "rootfs")
    shutil.rmtree(work)
    print(f"{first['rootfs_sha256']}  recorded\n{digest}  rebuilt")
    if digest == first["rootfs_sha256"]:
        print(f"{image_name(key)}: root filesystem reproducible")
        return 0
    changed = {
        name: (first["debian_packages"].get(name), version)
        for name, version in packages.items()
        if first["debian_packages"].get(name) != version
    }
    print(
        f"{image_name(key)}: root filesystem differs; package versions changed: {changed or 'none'}"
    )
    return 1


def ensure_image(rows: Sequence[matrix.Row] | None = None) -> str:
    """Name of the build image for every row of the table, built if it is missing.

    One image serves every cell: the Pythons of all build identifiers are in it.
    """
    require_engine()
    spec, homes = image_inputs(rows)
    key = image_key(spec)
    name = image_name(key)
    if image_exists(name):
        log(f"{name}: present")
        return name
    work = toolchain.cache_dir() / "container" / key
    if work.exists():
        shutil.rmtree(work)
    diskspace.require_free_space(
        [work],
        diskspace.cache_download(
            f"the build image's root and its tar ({name})",
            diskspace.ROOT_BYTES,
            toolchain.cache_dir(),
        ),
    )
    work.mkdir(parents=True)
    rootfs = work / "rootfs"
    build_rootfs(rootfs, homes)
    tar = work / "rootfs.tar"
    digest = pack_rootfs(rootfs, tar, IMAGE_EPOCH)
    manifest = {
        "image": name,
        "spec": spec,
        "rootfs_sha256": digest,
        "debian_packages": dpkg_packages(rootfs),
    }
    (work / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    podman(
        "import",
        "--change",
        f"ENV {toolchain.SYSROOT_VARIABLE}={SYSROOT_DIR}/root",
        "--change",
        "ENV LANG=C.UTF-8",
        "--change",
        "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "--change",
        "CMD /bin/bash",
        str(tar),
        name,
    )
    shutil.rmtree(rootfs)
    log(f"{name}: built, rootfs sha256 {digest} ({work / 'manifest.json'})")
    return name


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m scripts.container",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("build", help="build (or reuse) the image and print its name")
    sub.add_parser("verify", help="make the root filesystem again and compare its sha256")
    sub.add_parser("env", help="CONTAINERS_CONF=... for running podman by hand")
    args = parser.parse_args(argv)
    if args.command == "env":
        print(f"CONTAINERS_CONF={podman_env()['CONTAINERS_CONF']}")
        return 0
    if args.command == "verify":
        return verify_image()
    print(ensure_image())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
