"""The glibc 2.31 sysroot (Debian bullseye's ``libc6``, ``libc6-dev``, ``linux-libc-dev``) with
the host's libstdc++ headers copied in: built against it, an extension needs no newer glibc
than manylinux_2_28 allows (docs/toolchain.md says why).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from scripts.toolchain.apt import apt_download, extract_deb, relativize_symlinks
from scripts.toolchain.cache import cache_dir, stamp, stamped

SYSROOT_SUITE = "bullseye"  # glibc 2.31; buster (2.28) is no longer on the Debian mirror
SYSROOT_PACKAGES = ("libc6", "libc6-dev", "linux-libc-dev")
GCC_MAJOR = "12"


def ensure_sysroot() -> Path:
    """glibc 2.31 sysroot (Debian bullseye) with the host's libstdc++ headers."""
    root = cache_dir() / f"sysroot-{SYSROOT_SUITE}-gcc{GCC_MAJOR}"
    key = f"{SYSROOT_SUITE} {' '.join(SYSROOT_PACKAGES)} gcc{GCC_MAJOR} v1\n"
    sysroot = root / "root"
    if stamped(root, key):
        return sysroot
    if sysroot.exists():
        shutil.rmtree(sysroot)
    sysroot.mkdir(parents=True)
    for deb in apt_download(SYSROOT_PACKAGES, SYSROOT_SUITE, root):
        extract_deb(deb, sysroot)
    relativize_symlinks(sysroot)
    # gcc's C++ headers are not inside its install prefix on Debian; with --sysroot the
    # compiler looks for them under <sysroot>/usr/include, so copy the host's in.
    for sub in (f"usr/include/c++/{GCC_MAJOR}", f"usr/include/x86_64-linux-gnu/c++/{GCC_MAJOR}"):
        src = Path("/") / sub
        if not src.is_dir():
            raise RuntimeError(
                f"{src} missing: install g++-{GCC_MAJOR} (the host compiler the sysroot pairs with)"
            )
        shutil.copytree(src, sysroot / sub, symlinks=True, dirs_exist_ok=True)
    libc = sysroot / "lib" / "x86_64-linux-gnu" / "libc.so.6"
    if not libc.exists():
        raise RuntimeError(f"sysroot {sysroot} has no libc.so.6")
    stamp(root, key)
    return sysroot
