"""CUDA 12.x toolkits from Debian's non-free archive (PyPI's 12.x nvcc wheels hold only
ptxas): the pinned ``.deb`` files checked against their sha256, only the files a build needs
unpacked, with an ``nvcc.profile`` relative to the binary.
"""

from __future__ import annotations

import subprocess
import tarfile
from collections.abc import Sequence
from pathlib import Path

from scripts import basics, diskspace
from scripts.toolchain.apt import apt_download
from scripts.toolchain.cache import cache_dir, stamp
from scripts.toolchain.cuda import DebPin, Toolkit, ToolkitError, check_nvcc_release, toolkit_root
from scripts.wheelfile import sha256_of_file as file_sha256

log = basics.logger("toolchain")

# Where the files of Debian's CUDA packages go in CUDA_HOME, by path prefix inside the .deb.
# Debian splits nvcc between /usr/lib/nvidia-cuda-toolkit/bin (the nvcc driver, cicc, and
# crt/ with the device-link stubs) and /usr/bin (ptxas, fatbinary, ...); one bin/ holds them.
DEB_LAYOUT = (
    ("usr/lib/nvidia-cuda-toolkit/bin/", "bin/"),
    ("usr/lib/nvidia-cuda-toolkit/libdevice/", "nvvm/libdevice/"),
    ("usr/bin/", "bin/"),
    ("usr/include/", "include/"),
    ("usr/lib/x86_64-linux-gnu/", "lib64/"),
)
# What is kept of each prefix. Left out: Debian's /usr/bin/nvcc (a shell wrapper with absolute
# paths that would replace the real driver), its gcc/g++ version pickers (nvcc would find them
# first on the PATH its profile sets), the profiler and the sanitizer.
DEB_DRIVER = frozenset({"nvcc", "cicc"})
DEB_TOOLS = frozenset(
    {"ptxas", "fatbinary", "nvlink", "cudafe++", "bin2c", "cuobjdump", "nvdisasm", "nvprune",
     "cu++filt"}
)  # fmt: skip
# Headers of the math libraries (cuBLAS, cuSPARSE, ...): torch's own nvidia-* packages carry
# the 12.8 ones its runtime uses, and the build puts those on CPATH; the toolkit keeps only
# the runtime, the device headers and CCCL, like the 13.x PyPI toolkit.
DEB_LIBRARY_HEADERS = (
    "cublas", "cufft", "curand", "cusolver", "cusparse", "npp", "nvjpeg", "nvblas", "cuda-gdb",
)  # fmt: skip
# Libraries a build links: the CUDA runtime (torch's libcudart.so.12 is loaded at run time),
# the device runtime for -rdc, the driver stub.
DEB_LIBS = ("libcudart.so", "libcudart_static.a", "libcudadevrt.a", "stubs/libcuda.so")


def _deb_keeps(prefix: str, rel: str) -> bool:
    if prefix == "usr/lib/nvidia-cuda-toolkit/bin/":
        return rel in DEB_DRIVER or rel.startswith("crt/")
    if prefix == "usr/bin/":
        return rel in DEB_TOOLS
    if prefix == "usr/include/":
        return not rel.startswith(DEB_LIBRARY_HEADERS)
    if prefix == "usr/lib/x86_64-linux-gnu/":
        return rel.startswith(DEB_LIBS)
    return True


# Debian's nvcc.profile has absolute /usr/lib/nvidia-cuda-toolkit paths; this one is relative
# to the binary ($(_HERE_)), so the tree works wherever the cache is. ``+=`` prepends.
NVCC_PROFILE = """\
TOP = $(_HERE_)/..
NVVMIR_LIBRARY_DIR = $(TOP)/nvvm/libdevice
PATH += $(_HERE_):
INCLUDES += "-I$(TOP)/include" $(_SPACE_)
LIBRARIES =+ $(_SPACE_) "-L$(TOP)/lib64/stubs" "-L$(TOP)/lib64"
CUDAFE_FLAGS +=
PTXAS_FLAGS +=
"""


def deb_member_target(name: str) -> str | None:
    """Where a ``.deb`` member lands in ``CUDA_HOME`` (relative), or ``None`` to drop it."""
    name = name.removeprefix("./")
    for prefix, dest in DEB_LAYOUT:
        if not name.startswith(prefix) or name == prefix:
            continue
        rel = name[len(prefix) :].rstrip("/")
        return dest + rel if _deb_keeps(prefix, rel) else None
    return None


def extract_deb_members(deb: Path, home: Path) -> list[str]:
    """Unpack the members of ``deb`` that :func:`deb_member_target` keeps; returns them."""
    kept: list[str] = []
    log(f"$ dpkg-deb --fsys-tarfile {deb} | (keep what CUDA_HOME needs)")
    with subprocess.Popen(["dpkg-deb", "--fsys-tarfile", str(deb)], stdout=subprocess.PIPE) as proc:
        assert proc.stdout is not None
        with tarfile.open(fileobj=proc.stdout, mode="r|") as tar:
            for member in tar:
                target = deb_member_target(member.name)
                if target is None or member.isdir():
                    continue
                member.name = target
                if member.islnk():
                    linked = deb_member_target(member.linkname)
                    if linked is None:
                        raise ToolkitError(f"{deb}: {target} is a hard link to a dropped file")
                    member.linkname = linked
                if hasattr(tarfile, "tar_filter"):
                    tar.extract(member, home, filter="tar")
                else:  # a Python without extraction filters (PEP 706)
                    tar.extract(member, home)
                kept.append(target)
    if proc.returncode != 0:
        raise ToolkitError(f"dpkg-deb --fsys-tarfile {deb} failed (exit {proc.returncode})")
    return kept


def deb_fields(deb: Path) -> tuple[str, str]:
    """``(Package, Version)`` from a ``.deb``'s control file."""
    out = basics.run(
        ["dpkg-deb", "--show", "--showformat=${Package}\t${Version}", deb],
        capture_output=True,
        text=True,
        log=log,
    ).stdout
    name, version = out.split("\t")
    return name, version


def check_debs(debs: Sequence[Path], pins: Sequence[DebPin]) -> None:
    """Raise unless ``debs`` are exactly the pinned packages, versions and sha256 sums."""
    by_name = {pin.name: pin for pin in pins}
    problems = []
    seen = set()
    for deb in debs:
        name, version = deb_fields(deb)
        seen.add(name)
        pin = by_name.get(name)
        if pin is None:
            problems.append(f"{deb.name}: package {name} is not pinned")
        elif version != pin.version:
            problems.append(f"{name}: got version {version}, pinned {pin.version}")
        elif file_sha256(deb) != pin.sha256:
            problems.append(f"{name} {version}: sha256 {file_sha256(deb)}, pinned {pin.sha256}")
    problems += [f"{name}: pinned but not downloaded" for name in sorted(set(by_name) - seen)]
    if problems:
        raise ToolkitError(
            "Debian CUDA packages differ from the pins in scripts/matrix.toml:\n  "
            + "\n  ".join(problems)
            + "\nIf the archive replaced them, update version and sha256 there "
            "(apt-cache show <package> lists both)."
        )


def _debian_key(toolkit: Toolkit) -> str:
    pins = "".join(f"{p.name}={p.version} {p.sha256}\n" for p in toolkit.debs)
    return f"{toolkit.suite} {' '.join(toolkit.components)} layout-v1\n{pins}"


def ensure_debian_toolkit(toolkit: Toolkit) -> Path:
    """A ``CUDA_HOME`` for Debian's nvcc ``toolkit.nvcc``, from the pinned ``.deb`` files.

    The ``.deb`` files (nvidia-cuda-dev alone is 930 MB) are deleted once unpacked: only the
    files :func:`deb_member_target` keeps stay in the cache.
    """
    key = _debian_key(toolkit)
    root, ready = toolkit_root(f"{toolkit.nvcc}-debian", key)
    home = root / "home"
    if ready:
        return home
    diskspace.require_free_space(
        [root],
        diskspace.cache_download(
            f"Debian's CUDA {toolkit.nvcc} toolkit (.deb files)",
            diskspace.TOOLKIT_BYTES,
            cache_dir(),
        ),
    )
    specs = [pin.spec for pin in toolkit.debs]
    try:
        debs = apt_download(specs, toolkit.suite, root, components=toolkit.components)
    except subprocess.CalledProcessError as exc:
        raise ToolkitError(
            f"apt-get could not download {' '.join(specs)} from Debian {toolkit.suite} "
            f"({' '.join(toolkit.components)}): exit {exc.returncode} (its output is above). "
            "If the suite moved on to newer versions, pin those in scripts/matrix.toml "
            "(apt-cache show <package> lists Version and SHA256)."
        ) from exc
    check_debs(debs, toolkit.debs)
    for deb in debs:
        extract_deb_members(deb, home)
        deb.unlink()
    (home / "bin" / "nvcc.profile").write_text(NVCC_PROFILE)
    if not (home / "lib64" / "libcudart.so").resolve().is_file():
        raise ToolkitError(
            f"{home}/lib64/libcudart.so does not resolve to a file: the pins need libcudart12 "
            "next to nvidia-cuda-dev (whose libcudart.so is only a link)"
        )
    check_nvcc_release(home / "bin" / "nvcc", toolkit.nvcc, f"Debian CUDA {toolkit.nvcc}")
    stamp(root, key)
    return home
