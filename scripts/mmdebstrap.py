"""Debian's ``mmdebstrap``, which makes the project's root filesystems (the cibuildwheel image
of :mod:`scripts.container`, the newer Pythons' root of :mod:`scripts.interpreter_root`).

A machine that has it installed uses it. A fresh Debian machine does not: there the package of
the host's own suite is downloaded from the Debian mirror apt already uses, with private apt
state, and unpacked with ``dpkg-deb -x`` into the cache, as the toolchain brings its Debian
packages (:mod:`scripts.toolchain.apt`). mmdebstrap is a Perl script; what it runs (apt-get,
dpkg, perl) is part of every Debian system, and is checked first.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path

from scripts import basics
from scripts.toolchain import apt, ccache
from scripts.toolchain.cache import cache_dir, stamp, stamped

# What mmdebstrap itself calls on the host (Depends: apt, perl; dpkg for the archives).
HOST_TOOLS = ("apt-get", "dpkg", "dpkg-deb", "perl")
# Bump when the way the tool is unpacked changes.
LAYOUT = "1"

log = basics.logger("mmdebstrap")


def host_suite() -> str:
    """The host's Debian suite (``bookworm``): its mmdebstrap matches its apt."""
    return ccache._host_suite()


def ensure_mmdebstrap() -> Path:
    """The ``mmdebstrap`` executable: the installed one, else Debian's, unpacked in the cache."""
    system = shutil.which("mmdebstrap")
    if system:
        return Path(system)
    basics.require_commands(
        HOST_TOOLS,
        lambda missing: (
            f"mmdebstrap not found, and this machine lacks {', '.join(missing)} to bring "
            "Debian's package in (it needs a Debian or Ubuntu host): install it with "
            "`apt-get install mmdebstrap` (as root)"
        ),
    )
    suite = host_suite()
    base = cache_dir() / f"mmdebstrap-{suite}"
    exe = base / "root" / "usr" / "bin" / "mmdebstrap"
    key = f"mmdebstrap {suite} layout {LAYOUT}\n"
    if stamped(base, key) and exe.is_file():
        return exe
    log(f"mmdebstrap not installed: unpacking Debian {suite}'s package into {base}")
    if (base / "root").exists():
        shutil.rmtree(base / "root")  # our own unpacked tree, from an interrupted run
    base.mkdir(parents=True, exist_ok=True)
    for deb in apt.apt_download(["mmdebstrap"], suite, base):
        apt.extract_deb(deb, base / "root")
    if not exe.is_file():
        raise RuntimeError(f"Debian's mmdebstrap package of {suite} has no usr/bin/mmdebstrap")
    stamp(base, key)
    return exe


def command(
    exe: Path | str, suite: str, rootfs: Path, mirror: str, packages: Sequence[str]
) -> list[str]:
    """mmdebstrap (as root) of ``suite``'s minimal base plus ``packages`` into ``rootfs``."""
    return [
        str(exe),
        "--mode=root",
        "--variant=minbase",
        "--include=" + ",".join(sorted(packages)),
        # A Release file carries a Valid-Until; a mirror that is a snapshot (or a clock ahead
        # of it) must still be readable: apt checks the packages by their hashes all the same.
        '--aptopt=Acquire::Check-Valid-Until "false"',
        # No docs or man pages: smaller, and nothing a build or a test reads.
        "--dpkgopt=path-exclude=/usr/share/man/*",
        "--dpkgopt=path-exclude=/usr/share/doc/*",
        "--dpkgopt=path-exclude=/usr/share/locale/*",
        suite,
        str(rootfs),
        f"deb {mirror} {suite} main",
    ]


def tool_env(exe: Path, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """``base`` (default: ``os.environ``) with ``exe``'s folder first on PATH: mmdebstrap runs
    its helpers (``mmtarfilter``) by name."""
    env = dict(os.environ if base is None else base)
    env["PATH"] = os.pathsep.join([str(exe.parent), env.get("PATH", "")])
    return env
