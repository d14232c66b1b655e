"""The glibc 2.31 sysroot (Debian bullseye's ``libc6``, ``libc6-dev``, ``linux-libc-dev``) with
the host's libstdc++ headers copied in: built against it, an extension needs no newer glibc
than manylinux_2_28 allows (docs/toolchain.md says why).
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Mapping
from pathlib import Path

from scripts import names
from scripts.toolchain.apt import apt_download, extract_deb, relativize_symlinks
from scripts.toolchain.cache import cache_dir, stamp, stamped, write_wrappers

SYSROOT_SUITE = "bullseye"  # glibc 2.31; buster (2.28) is no longer on the Debian mirror
SYSROOT_PACKAGES = ("libc6", "libc6-dev", "linux-libc-dev")
# Names the sysroot to a build that reads it (this repository's setup.py, the build image).
SYSROOT_VARIABLE = names.env_var("SYSROOT")
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


def sysroot_flags(sysroot: Path) -> list[str]:
    """What gcc needs to compile and link against ``sysroot``: its lib dirs go before gcc's
    built-in ones, otherwise the host's libpthread binds symbols newer than manylinux_2_28
    allows (docs/toolchain.md)."""
    libdirs = (sysroot / "usr" / "lib" / "x86_64-linux-gnu", sysroot / "lib" / "x86_64-linux-gnu")
    return [f"--sysroot={sysroot}", *(f"-L{d}" for d in libdirs)]


# The flags that tune a compile to the CPU it runs on. A wheel runs on other machines: built
# with -march=native on this builder (AVX-512), its host code dies of SIGILL on a CPU without
# those instructions, and two builders give two binaries. flash-attention's csrc/rotary asked
# for it in its setup.py (docs/any-project.md); an explicit -march (a baseline the project
# chose, such as x86-64-v3) passes.
HOST_TUNED_FLAGS = ("-march=native", "-mtune=native", "-mcpu=native")
# How the wrappers say, in the build log, that they left one out (host_tuned_flags_left_out).
LEFT_OUT_NOTE = "torch-wheels: left out"
LEAVE_OUT_HOST_TUNED_FLAGS = f"""\
for arg do
  shift
  case "$arg" in
    {"|".join(HOST_TUNED_FLAGS)})
      echo "{LEFT_OUT_NOTE} $arg, which builds for this machine's CPU alone: the wheel \
is built for any x86-64 CPU" >&2 ;;
    *) set -- "$@" "$arg" ;;
  esac
done
"""


def host_tuned_flags_left_out(build_log: str) -> list[str]:
    """The HOST_TUNED_FLAGS the wrappers left out of a build, from its log, each once."""
    found = re.findall(rf"^{re.escape(LEFT_OUT_NOTE)} (\S+),", build_log, flags=re.MULTILINE)
    return list(dict.fromkeys(found))


def sysroot_compilers(sysroot: Path, compilers: Mapping[str, str]) -> dict[str, str]:
    """``CC`` and ``CXX`` wrappers (named gcc and g++: nvcc, given ``CC`` as ``-ccbin``,
    recognises the host compiler by name) that run ``compilers``' with the sysroot's flags,
    leaving out HOST_TUNED_FLAGS.

    For a project whose setup.py knows nothing of a sysroot: every compile and link it makes
    through ``CC``/``CXX`` (and nvcc's host compiles through ``-ccbin``) targets glibc 2.31,
    and any x86-64 CPU. The wrappers live in a folder of the cache named after their content
    (:func:`scripts.toolchain.cache.write_wrappers`).
    """
    flags = " ".join(f'"{flag}"' for flag in sysroot_flags(sysroot))
    scripts = {
        env_name: (
            name,
            f'#!/bin/sh\n{LEAVE_OUT_HOST_TUNED_FLAGS}exec "{compilers[env_name]}" {flags} "$@"\n',
        )
        for env_name, name in (("CC", "gcc"), ("CXX", "g++"))
    }
    return write_wrappers(cache_dir() / "sysroot-wrappers", scripts)
