"""Toolchain for manylinux_2_28 CUDA builds without Docker, assembled from public packages.

* CUDA toolkit, pinned per row CUDA in ``scripts/matrix/matrix.toml``, assembled into one
  ``CUDA_HOME`` tree (``bin/nvcc``, ``include/``, ``lib64/``, ``nvvm/``) that torch's
  cpp_extension accepts. 13.x: NVIDIA's PyPI packages, installed with ``uv pip install
  --target`` and merged. 12.x: PyPI's 12.x nvcc wheels hold only ``ptxas``, so Debian's
  ``nvidia-cuda-toolkit`` / ``nvidia-cuda-dev`` (non-free) and CCCL packages are fetched with
  ``apt-get download``, checked against their pinned sha256 and only the files a build needs
  unpacked, with an ``nvcc.profile`` relative to the binary.
* glibc 2.31 sysroot from Debian bullseye (``libc6``, ``libc6-dev``, ``linux-libc-dev``) fetched
  with ``apt-get download`` against the mirror this machine's apt already uses, absolute symlinks
  made relative, the host's libstdc++ 12 headers copied in (docs/toolchain.md says why).
* ccache: Debian's package (and ``libhiredis``) extracted into the cache, no root install.

Everything lives under :func:`cache_dir` and is reused; each piece has a stamp file written
last, so an interrupted download is redone instead of trusted. :func:`assemble` puts the
pieces together once per build, as one :class:`Toolchain` value that the build reads.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scripts import basics
from scripts.basics import REPO
from scripts.wheelfile import sha256_of_file as file_sha256

SYSROOT_SUITE = "bullseye"  # glibc 2.31; buster (2.28) is no longer on the Debian mirror
SYSROOT_PACKAGES = ("libc6", "libc6-dev", "linux-libc-dev")
GCC_MAJOR = "12"
STAMP = ".hotloop-complete"


def cache_dir() -> Path:
    """``$HOTLOOP_CACHE_DIR`` or ``<repo>/.cache/hotloop`` (gitignored)."""
    path = Path(os.environ.get("HOTLOOP_CACHE_DIR") or REPO / ".cache" / "hotloop")
    path.mkdir(parents=True, exist_ok=True)
    return path


log = basics.logger("toolchain")


def _stamped(path: Path, key: str) -> bool:
    stamp = path / STAMP
    return stamp.is_file() and stamp.read_text() == key


def _stamp(path: Path, key: str) -> None:
    (path / STAMP).write_text(key)


# --------------------------------------------------------------------------- CUDA toolkit


def _toolkit_key(packages: Sequence[str]) -> str:
    return "\n".join(sorted(packages)) + "\n"


def _python_for_uv() -> str:
    """uv needs an interpreter to evaluate markers for ``--target``; the current one will do."""
    return sys.executable


def _merge_tree(src: Path, dst: Path) -> None:
    """Hard-link (or copy) ``src`` into ``dst``; nvcc then finds its ``nvcc.profile`` siblings."""
    for item in src.rglob("*"):
        rel = item.relative_to(src)
        target = dst / rel
        if item.is_symlink():
            target.parent.mkdir(parents=True, exist_ok=True)
            if not target.exists() and not target.is_symlink():
                target.symlink_to(os.readlink(item))
        elif item.is_dir():
            target.mkdir(parents=True, exist_ok=True)
        elif not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(item, target)
            except OSError:
                shutil.copy2(item, target)


def component_roots(site: Path) -> list[Path]:
    """The toolkit component folders under ``site/nvidia``.

    13.x wheels all install into ``nvidia/cu13``; 12.x wheels each into their own
    ``nvidia/<component>`` (``cuda_nvcc``, ``cuda_runtime``, ``cuda_cccl``).
    """
    nvidia = site / "nvidia"
    return sorted(p for p in nvidia.iterdir() if p.is_dir() and p.name != "__pycache__")


def override_env_var(cuda: str) -> str:
    """``HOTLOOP_CUDA_HOME_12_8``: a toolkit to use instead of the pinned packages."""
    return "HOTLOOP_CUDA_HOME_" + cuda.replace(".", "_")


class ToolkitError(RuntimeError):
    pass


@dataclass(frozen=True)
class DebPin:
    """One Debian package of a toolkit, pinned by version and the sha256 of its ``.deb``."""

    name: str
    version: str
    sha256: str

    @property
    def spec(self) -> str:
        """What ``apt-get download`` takes: ``name=version``."""
        return f"{self.name}={self.version}"


@dataclass(frozen=True)
class Toolkit:
    """The compiler toolkit that builds the wheels of one row CUDA (``[toolkits."X.Y"]``).

    ``nvcc`` is the compiler's release; it may be older than the row's CUDA (torch's runtime),
    e.g. Debian's nvcc 12.4 builds the CUDA 12.8 rows. Either ``packages`` (PyPI pins) or
    ``debs`` (Debian pins from ``suite``/``components``) says where it comes from.
    """

    nvcc: str
    packages: tuple[str, ...] = ()
    debs: tuple[DebPin, ...] = ()
    suite: str = ""
    components: tuple[str, ...] = ()
    arch_list: str | None = None

    @classmethod
    def from_table(cls, cuda: str, table: Mapping[str, Any]) -> Toolkit:
        """Parse a ``[toolkits."<cuda>"]`` table of ``scripts/matrix.toml``."""
        debian = table.get("debian", {})
        toolkit = cls(
            nvcc=table.get("nvcc", cuda),
            packages=tuple(table.get("packages", ())),
            debs=tuple(DebPin(**pin) for pin in debian.get("packages", ())),
            suite=debian.get("suite", ""),
            components=tuple(debian.get("components", ("main",))),
            arch_list=table.get("arch_list"),
        )
        if bool(toolkit.packages) == bool(toolkit.debs):
            raise ValueError(
                f'[toolkits."{cuda}"] needs exactly one of packages = [...] (PyPI) or '
                f'[toolkits."{cuda}".debian] packages = [...] (Debian); found '
                f"{len(toolkit.packages)} PyPI and {len(toolkit.debs)} Debian packages"
            )
        if toolkit.debs and not toolkit.suite:
            raise ValueError(f'[toolkits."{cuda}".debian] has packages but no suite')
        return toolkit


def check_nvcc_release(nvcc: Path, release: str, what: str) -> None:
    """Raise unless ``nvcc --version`` says ``release <release>``."""
    out = basics.run([nvcc, "--version"], capture_output=True, text=True, log=log).stdout
    if f"release {release}," not in out:
        raise ToolkitError(f"{what}: {nvcc} is not CUDA {release}:\n{out}")


def ensure_cuda_toolkit(cuda: str, toolkit: Toolkit) -> Path:
    """Return a ``CUDA_HOME`` that builds the CUDA ``cuda`` rows, from ``toolkit``'s pins.

    ``$HOTLOOP_CUDA_HOME_<major>_<minor>`` (the row's CUDA, e.g. a real 12.8 toolkit in CI
    images) replaces the pinned packages.
    """
    override = os.environ.get(override_env_var(cuda))
    if override:
        home = Path(override)
        check_nvcc_release(home / "bin" / "nvcc", cuda, override_env_var(cuda))
        return home
    if toolkit.debs:
        return ensure_debian_toolkit(toolkit)
    return ensure_pypi_toolkit(cuda, toolkit.nvcc, toolkit.packages)


def _toolkit_root(name: str, key: str) -> tuple[Path, bool]:
    """``(<cache>/cuda/<name>-<digest of key>, whether its stamp says it is complete)``.

    An incomplete folder (an interrupted fetch) is this module's own work: it is emptied
    and made again for the caller to fill.
    """
    digest = hashlib.sha256(key.encode()).hexdigest()[:10]
    root = cache_dir() / "cuda" / f"{name}-{digest}"
    if _stamped(root, key):
        return root, True
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    return root, False


def ensure_pypi_toolkit(cuda: str, release: str, packages: Sequence[str]) -> Path:
    """A ``CUDA_HOME`` merged from NVIDIA's pinned PyPI ``packages``."""
    key = _toolkit_key(packages)
    root, ready = _toolkit_root(release, key)
    home = root / "home"
    if ready:
        return home
    site = root / "site-packages"
    uv = shutil.which("uv") or "uv"
    basics.run(
        [
            uv,
            "pip",
            "install",
            "--no-deps",
            "--python",
            _python_for_uv(),
            "--target",
            site,
            *packages,
        ],
        log=log,
    )
    for component in component_roots(site):
        _merge_tree(component, home)
    lib = home / "lib"
    lib64 = home / "lib64"
    if lib.is_dir() and not lib64.exists():
        lib64.symlink_to("lib")
    # torch links ``-lcudart``; the wheels carry only the soname (libcudart.so.12/13).
    for soname in sorted(lib.glob("libcudart.so.*")):
        unversioned = lib / "libcudart.so"
        if not unversioned.exists():
            unversioned.symlink_to(soname.name)
        break
    nvcc = home / "bin" / "nvcc"
    if not nvcc.is_file():
        shipped = (
            sorted(p.name for p in (home / "bin").glob("*")) if (home / "bin").is_dir() else []
        )
        raise ToolkitError(
            f"CUDA {cuda}: the PyPI packages {list(packages)} ship no bin/nvcc "
            f"(bin/ holds only {shipped}); point {override_env_var(cuda)} at a CUDA {cuda} "
            "toolkit to build this row"
        )
    check_nvcc_release(nvcc, release, f"CUDA {cuda}")
    _stamp(root, key)
    return home


# --------------------------------------------------------------------------- Debian toolkit

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
    root, ready = _toolkit_root(f"{toolkit.nvcc}-debian", key)
    home = root / "home"
    if ready:
        return home
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
    _stamp(root, key)
    return home


def torch_cuda_include_dirs(site_packages: Path) -> list[Path]:
    """Header folders of torch's own nvidia deps (``cublas_v2.h``, ``cusparse.h``, ...).

    torch's headers include them; they are not part of the compiler toolkit.
    """
    nvidia = site_packages / "nvidia"
    if not nvidia.is_dir():
        return []
    return sorted(p for p in nvidia.glob("*/include") if p.is_dir())


# --------------------------------------------------------------------------- apt helpers


@dataclass(frozen=True)
class AptSource:
    uri: str
    suites: tuple[str, ...]
    components: tuple[str, ...]
    signed_by: str | None


def parse_deb822(text: str) -> list[AptSource]:
    sources = []
    for stanza in re.split(r"\n\s*\n", text):
        fields: dict[str, str] = {}
        for line in stanza.splitlines():
            if line.startswith("#") or ":" not in line or line[:1].isspace():
                continue
            name, value = line.split(":", 1)
            fields[name.strip().lower()] = value.strip()
        if "deb" not in fields.get("types", "").split() or "uris" not in fields:
            continue
        if fields.get("enabled", "yes").lower() == "no":
            continue
        for uri in fields["uris"].split():
            sources.append(
                AptSource(
                    uri.rstrip("/"),
                    tuple(fields.get("suites", "").split()),
                    tuple(fields.get("components", "main").split()),
                    fields.get("signed-by"),
                )
            )
    return sources


def parse_one_line(text: str) -> list[AptSource]:
    sources = []
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line.startswith("deb "):
            continue
        options = None
        rest = line[4:].strip()
        if rest.startswith("["):
            options, rest = rest[1:].split("]", 1)
        parts = rest.split()
        if len(parts) < 2:
            continue
        signed = None
        if options:
            for opt in options.split():
                if opt.startswith("signed-by="):
                    signed = opt.split("=", 1)[1]
        sources.append(
            AptSource(parts[0].rstrip("/"), (parts[1],), tuple(parts[2:]) or ("main",), signed)
        )
    return sources


def system_apt_sources(etc: Path = Path("/etc/apt")) -> list[AptSource]:
    sources: list[AptSource] = []
    if (etc / "sources.list").is_file():
        sources += parse_one_line((etc / "sources.list").read_text())
    for f in (
        sorted((etc / "sources.list.d").glob("*.list")) if (etc / "sources.list.d").is_dir() else []
    ):
        sources += parse_one_line(f.read_text())
    for f in (
        sorted((etc / "sources.list.d").glob("*.sources"))
        if (etc / "sources.list.d").is_dir()
        else []
    ):
        sources += parse_deb822(f.read_text())
    return sources


def debian_mirror(sources: Sequence[AptSource]) -> AptSource:
    """The main Debian archive among the configured sources (not -security, not -updates)."""
    for src in sources:
        if any(re.fullmatch(r"[a-z]+", s) for s in src.suites) and "security" not in src.uri:
            return src
    raise RuntimeError(
        "no Debian archive found in /etc/apt (sources.list or sources.list.d/*.sources); "
        "the sysroot (bullseye's libc6) and the CUDA 12 toolkit (Debian's nvidia-cuda-*) are "
        "fetched from it"
    )


def debian_sources_line(
    mirror: AptSource, suite: str = SYSROOT_SUITE, components: Sequence[str] = ("main",)
) -> str:
    """A one-line ``deb`` source for ``suite`` on the host's mirror, with its keyring."""
    signed = f"[signed-by={mirror.signed_by}] " if mirror.signed_by else ""
    return f"deb {signed}{mirror.uri} {suite} {' '.join(components)}\n"


def apt_download(
    packages: Sequence[str],
    suite: str,
    workdir: Path,
    mirror: AptSource | None = None,
    components: Sequence[str] = ("main",),
) -> list[Path]:
    """``apt-get download`` ``packages`` of ``suite`` into ``workdir/debs``, private apt state.

    Nothing is installed and the host's apt state is untouched: lists, cache and status live
    under ``workdir/apt``.
    """
    mirror = mirror or debian_mirror(system_apt_sources())
    state = workdir / "apt"
    lists = state / "lists"
    cache = state / "cache"
    (lists / "partial").mkdir(parents=True, exist_ok=True)
    (cache / "archives" / "partial").mkdir(parents=True, exist_ok=True)
    sources = state / "sources.list"
    sources.write_text(debian_sources_line(mirror, suite, components))
    opts = [
        f"-o=Dir::Etc::sourcelist={sources}",
        "-o=Dir::Etc::sourceparts=-",
        f"-o=Dir::State::Lists={lists}",
        f"-o=Dir::Cache={cache}",
        f"-o=Dir::State::status={state / 'status'}",
        "-o=APT::Get::List-Cleanup=0",
        "-o=Debug::NoLocking=1",
    ]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        # root downloads into our own cache dir, which apt's _apt sandbox user cannot write
        opts.append("-o=APT::Sandbox::User=root")
    (state / "status").touch()
    basics.run(["apt-get", *opts, "update"], stdout=subprocess.DEVNULL, log=log)
    debs = workdir / "debs"
    debs.mkdir(exist_ok=True)
    for old in debs.glob("*.deb"):
        old.unlink()
    basics.run(
        ["apt-get", *opts, "download", *packages], cwd=debs, stdout=subprocess.DEVNULL, log=log
    )
    found = sorted(debs.glob("*.deb"))
    if len(found) != len(packages):
        raise RuntimeError(f"apt-get download {packages} gave {[f.name for f in found]}")
    return found


def extract_deb(deb: Path, dest: Path) -> None:
    basics.run(["dpkg-deb", "-x", deb, dest], log=log)


def relativize_symlinks(root: Path) -> int:
    """Point absolute symlinks inside ``root`` at their target inside ``root``, relatively."""
    fixed = 0
    for link in root.rglob("*"):
        if not link.is_symlink():
            continue
        target = os.readlink(link)
        if not target.startswith("/"):
            continue
        inside = root / target.lstrip("/")
        link.unlink()
        link.symlink_to(os.path.relpath(inside, link.parent))
        fixed += 1
    return fixed


# --------------------------------------------------------------------------- sysroot


def ensure_sysroot() -> Path:
    """glibc 2.31 sysroot (Debian bullseye) with the host's libstdc++ headers."""
    root = cache_dir() / f"sysroot-{SYSROOT_SUITE}-gcc{GCC_MAJOR}"
    key = f"{SYSROOT_SUITE} {' '.join(SYSROOT_PACKAGES)} gcc{GCC_MAJOR} v1\n"
    sysroot = root / "root"
    if _stamped(root, key):
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
    _stamp(root, key)
    return sysroot


# --------------------------------------------------------------------------- ccache


def _host_suite() -> str:
    for line in Path("/etc/os-release").read_text().splitlines():
        if line.startswith("VERSION_CODENAME="):
            return line.split("=", 1)[1].strip().strip('"')
    return "bookworm"


def ensure_ccache() -> Path | None:
    """Folder with ``ccache`` (a wrapper that finds its private libs); ``None`` if unavailable.

    Uses an installed ``ccache`` when there is one; otherwise Debian's package (and
    ``libhiredis``, its one library the base system lacks) extracted into the cache.
    Without ccache the build still works, only rebuilds are not instant.
    """
    base = cache_dir() / "ccache-tool"
    wrapper_dir = base / "bin"
    system = shutil.which("ccache")
    key = f"ccache system={system} v1\n"
    if _stamped(base, key):
        return wrapper_dir
    if base.exists():
        shutil.rmtree(base)
    wrapper_dir.mkdir(parents=True)
    if system:
        (wrapper_dir / "ccache").symlink_to(system)
    else:
        try:
            suite = _host_suite()
            debs = apt_download(["ccache", "libhiredis0.14"], suite, base)
        except (subprocess.CalledProcessError, RuntimeError) as exc:
            log(f"ccache unavailable ({exc}); building without a compiler cache")
            shutil.rmtree(base, ignore_errors=True)
            return None
        tree = base / "root"
        for deb in debs:
            extract_deb(deb, tree)
        libdir = tree / "usr" / "lib" / "x86_64-linux-gnu"
        script = wrapper_dir / "ccache"
        script.write_text(
            "#!/bin/sh\n"
            f'LD_LIBRARY_PATH="{libdir}${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}" '
            f'exec "{tree}/usr/bin/ccache" "$@"\n'
        )
        script.chmod(0o755)
    basics.run([wrapper_dir / "ccache", "--version"], stdout=subprocess.DEVNULL, log=log)
    _stamp(base, key)
    return wrapper_dir


def plain_compilers() -> dict[str, str]:
    """``CC`` and ``CXX`` without a compiler cache: the host's gcc and g++."""
    return {"CC": shutil.which("gcc") or "gcc", "CXX": shutil.which("g++") or "g++"}


def compiler_wrappers(
    ccache_bin: Path, cuda_home: Path | None, cc: str = "gcc", cxx: str = "g++"
) -> dict[str, str]:
    """``CC``, ``CXX`` and (with a CUDA toolkit) ``PYTORCH_NVCC`` that run through ccache.

    The wrappers are named ``gcc``/``g++`` (nvcc gets ``CC`` as ``-ccbin`` and recognises the
    host compiler by name); ``CCACHE_DIR`` lives in the cache.

    The cache folder is shared by checkouts of other revisions, building at the same time:
    the folder is named after the wrappers' content, so a checkout whose wrappers differ
    writes its own rather than replacing the ones another build is running, and a wrapper is
    written only when missing, through a rename (never truncated under a running build).
    """
    ccache = ccache_bin / "ccache"
    scripts = {
        env_name: (name, f'#!/bin/sh\nexec "{ccache}" "{real}" "$@"\n')
        for env_name, name, real in (
            ("CC", "gcc", shutil.which(cc) or cc),
            ("CXX", "g++", shutil.which(cxx) or cxx),
        )
    }
    if cuda_home is not None:
        scripts["PYTORCH_NVCC"] = (
            "nvcc",
            nvcc_wrapper_script([ccache, cuda_home / "bin" / "nvcc"]),
        )
    content = "\0".join(f"{name}\0{text}" for name, text in scripts.values())
    key = hashlib.sha256(content.encode()).hexdigest()[:10]
    wrap = cache_dir() / "ccache-wrappers" / key
    wrap.mkdir(parents=True, exist_ok=True)
    out: dict[str, str] = {}
    for env_name, (name, text) in scripts.items():
        script = wrap / name
        if not (script.is_file() and script.read_text() == text):
            partial = wrap / f".{name}.{os.getpid()}"
            partial.write_text(text)
            partial.chmod(0o755)
            os.replace(partial, script)
        out[env_name] = str(script)
    return out


# nvcc, as every build runs it (PYTORCH_NVCC): release builds through ccache, the
# reproducibility check and cibuildwheel's container alike, so that the wheel a release ships
# is built the way the check proves reproducible. Two rewrites of the arguments:
# - torch's ninja rule gives nvcc --generate-dependencies-with-compile --dependency-output F.
#   ccache (4.7 here; 4.12.2 too, per ccache issue 1663) does not know those spellings: it
#   takes F for a second source file and caches no nvcc compile at all. nvcc's short names
#   for the same options, -MD -MF F, it handles (the .d file included).
# - nvcc hands cudafe++ and cicc the absolute path of each .cu file (--orig_src_path_name),
#   and they hash it into the object's module ID and anonymous-namespace names: two build
#   folders, two binaries. Torch passes one flag list to every .cu file, so the per-file name
#   (the path from csrc/ on, the same everywhere) goes in here.
NVCC_ARGUMENT_REWRITES = """\
src=
for arg do
  shift
  case "$arg" in
    --generate-dependencies-with-compile) set -- "$@" -MD ;;
    --dependency-output) set -- "$@" -MF ;;
    --dependency-output=*) set -- "$@" -MF "${arg#--dependency-output=}" ;;
    *.cu) src="$arg"; set -- "$@" "$arg" ;;
    *) set -- "$@" "$arg" ;;
  esac
done
case "$src" in
  */csrc/*) set -- "$@" "-Xcudafe=--orig_src_path_name=hotloop/csrc/${src##*/csrc/}" ;;
esac
"""


def nvcc_wrapper_script(command: Sequence[str | Path]) -> str:
    """A shell script running ``command`` (``[ccache] nvcc``) with NVCC_ARGUMENT_REWRITES."""
    quoted = " ".join(f'"{part}"' for part in command)
    return f'#!/bin/sh\n{NVCC_ARGUMENT_REWRITES}exec {quoted} "$@"\n'


def ccache_env() -> dict[str, str]:
    return {
        "CCACHE_DIR": str(cache_dir() / "ccache"),
        "CCACHE_MAXSIZE": os.environ.get("CCACHE_MAXSIZE", "5G"),
        # No CCACHE_BASEDIR: it hands the compiler relative paths, which -ffile-prefix-map
        # does not map, so __FILE__ would read ../../csrc/… in a release wheel and
        # hotloop/csrc/… in the reproducibility check's. Builds of a variant run in one
        # folder of the cache (build.build_wheel), so absolute paths repeat and still hit.
        "CCACHE_NOHASHDIR": "1",
        "CCACHE_COMPILERCHECK": "content",
    }


# --------------------------------------------------------------------------- the whole toolchain


@dataclass(frozen=True)
class Toolchain:
    """What one build compiles with, assembled once (:func:`assemble`) and handed to it.

    ``cuda_home``: the CUDA toolkit, ``None`` for a CPU-only build. ``compilers``: ``CC``,
    ``CXX`` and, with ccache and a toolkit, ``PYTORCH_NVCC``: ccache wrappers where ccache is
    used, else the host's gcc and g++. ``ccache_env``: ccache's settings (empty without it).
    """

    cuda_home: Path | None
    sysroot: Path
    compilers: Mapping[str, str]
    ccache_env: Mapping[str, str]

    def environment(self) -> dict[str, str]:
        """The variables of setup.py's build contract that the toolchain decides."""
        env = {"HOTLOOP_SYSROOT": str(self.sysroot), **self.compilers, **self.ccache_env}
        if self.cuda_home is not None:
            env["CUDA_HOME"] = str(self.cuda_home)
        return env


def assemble(
    cuda: str, toolkit: Toolkit, *, with_cuda: bool = True, ccache: bool = True
) -> Toolchain:
    """The toolchain of a build for CUDA ``cuda``: its toolkit (unless ``with_cuda`` is
    False), the glibc 2.31 sysroot and the compilers, wrapped in ccache when ``ccache`` is
    wanted and available. Each piece is fetched once, then taken from the cache."""
    cuda_home = ensure_cuda_toolkit(cuda, toolkit) if with_cuda else None
    sysroot = ensure_sysroot()
    ccache_bin = ensure_ccache() if ccache else None
    if ccache_bin is None:
        return Toolchain(cuda_home, sysroot, plain_compilers(), {})
    return Toolchain(cuda_home, sysroot, compiler_wrappers(ccache_bin, cuda_home), ccache_env())


def main(argv: Sequence[str] | None = None) -> int:
    from scripts import matrix

    parser = argparse.ArgumentParser(prog="python -m scripts.toolchain", description=__doc__)
    parser.add_argument("--torch", action="append")
    parser.add_argument("--all", action="store_true")
    args = parser.parse_args(argv)
    rows = matrix.select_rows(matrix.load_rows(), args.torch, args.all)
    builders: dict[str, matrix.Row] = {}
    for builder in matrix.build_rows(rows, matrix.load_rows()):
        builders.setdefault(builder.cuda, builder)
    for cuda, row in sorted(builders.items()):
        home = ensure_cuda_toolkit(cuda, row.toolkit)
        print(f"CUDA {cuda} (nvcc {row.toolkit.nvcc}): {home}")
    print(f"sysroot: {ensure_sysroot()}")
    print(f"ccache: {ensure_ccache()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
