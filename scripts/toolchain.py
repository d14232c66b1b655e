"""Toolchain for manylinux_2_28 CUDA builds without Docker, assembled from public packages.

* CUDA toolkit: NVIDIA's PyPI packages pinned per CUDA version (``scripts/matrix/matrix.toml``),
  installed once with ``uv pip install --target`` and merged into one ``CUDA_HOME`` tree
  (``bin/nvcc``, ``include/``, ``lib64/``, ``nvvm/``) that torch's cpp_extension accepts.
* glibc 2.31 sysroot from Debian bullseye (``libc6``, ``libc6-dev``, ``linux-libc-dev``) fetched
  with ``apt-get download`` against the mirror this machine's apt already uses, absolute symlinks
  made relative, the host's libstdc++ 12 headers copied in (docs/toolchain.md says why).
* ccache: Debian's package (and ``libhiredis``) extracted into the cache, no root install.

Everything lives under :func:`cache_dir` and is reused; each piece has a stamp file written
last, so an interrupted download is redone instead of trusted.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SYSROOT_SUITE = "bullseye"  # glibc 2.31; buster (2.28) is no longer on the Debian mirror
SYSROOT_PACKAGES = ("libc6", "libc6-dev", "linux-libc-dev")
GCC_MAJOR = "12"
STAMP = ".hotloop-complete"


def cache_dir() -> Path:
    """``$HOTLOOP_CACHE_DIR`` or ``<repo>/.cache/hotloop`` (gitignored)."""
    path = Path(os.environ.get("HOTLOOP_CACHE_DIR") or REPO / ".cache" / "hotloop")
    path.mkdir(parents=True, exist_ok=True)
    return path


def log(msg: str) -> None:
    print(f"[toolchain] {msg}", file=sys.stderr, flush=True)


def run(cmd: Sequence[str | os.PathLike[str]], **kwargs) -> subprocess.CompletedProcess:
    log("$ " + " ".join(str(c) for c in cmd))
    return subprocess.run([str(c) for c in cmd], check=True, **kwargs)


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
    """``HOTLOOP_CUDA_HOME_12_8``: a toolkit to use instead of the PyPI packages."""
    return "HOTLOOP_CUDA_HOME_" + cuda.replace(".", "_")


class ToolkitError(RuntimeError):
    pass


def ensure_cuda_toolkit(cuda: str, packages: Sequence[str]) -> Path:
    """Return a ``CUDA_HOME`` for ``cuda`` built from the pinned PyPI ``packages``.

    ``$HOTLOOP_CUDA_HOME_<major>_<minor>`` replaces the PyPI toolkit (for CI images that
    carry one). PyPI's 12.x ``nvidia-cuda-nvcc-cu12`` wheels hold only ``ptxas`` (no
    ``nvcc`` driver, ``cicc`` or ``cudafe++``), so 12.x rows need that override.
    """
    override = os.environ.get(override_env_var(cuda))
    if override:
        home = Path(override)
        out = run([home / "bin" / "nvcc", "--version"], capture_output=True, text=True).stdout
        if f"release {cuda}" not in out:
            raise ToolkitError(f"{override_env_var(cuda)}={home}: nvcc is not CUDA {cuda}:\n{out}")
        return home
    key = _toolkit_key(packages)
    digest = hashlib.sha256(key.encode()).hexdigest()[:10]
    root = cache_dir() / "cuda" / f"{cuda}-{digest}"
    home = root / "home"
    if _stamped(root, key):
        return home
    if root.exists():
        shutil.rmtree(root)
    site = root / "site-packages"
    root.mkdir(parents=True)
    uv = shutil.which("uv") or "uv"
    run(
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
        ]
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
    out = run([nvcc, "--version"], capture_output=True, text=True).stdout
    if f"release {cuda}" not in out:
        raise RuntimeError(f"{nvcc} is not CUDA {cuda}:\n{out}")
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
        "the sysroot needs one to fetch bullseye's libc6"
    )


def bullseye_sources_line(mirror: AptSource, suite: str = SYSROOT_SUITE) -> str:
    signed = f"[signed-by={mirror.signed_by}] " if mirror.signed_by else ""
    return f"deb {signed}{mirror.uri} {suite} main\n"


def apt_download(
    packages: Sequence[str], suite: str, workdir: Path, mirror: AptSource | None = None
) -> list[Path]:
    """``apt-get download`` ``packages`` of ``suite`` into ``workdir/debs``, private apt state."""
    mirror = mirror or debian_mirror(system_apt_sources())
    state = workdir / "apt"
    lists = state / "lists"
    cache = state / "cache"
    (lists / "partial").mkdir(parents=True, exist_ok=True)
    (cache / "archives" / "partial").mkdir(parents=True, exist_ok=True)
    sources = state / "sources.list"
    sources.write_text(bullseye_sources_line(mirror, suite))
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
    run(["apt-get", *opts, "update"], stdout=subprocess.DEVNULL)
    debs = workdir / "debs"
    debs.mkdir(exist_ok=True)
    for old in debs.glob("*.deb"):
        old.unlink()
    run(["apt-get", *opts, "download", *packages], cwd=debs, stdout=subprocess.DEVNULL)
    found = sorted(debs.glob("*.deb"))
    if len(found) != len(packages):
        raise RuntimeError(f"apt-get download {packages} gave {[f.name for f in found]}")
    return found


def extract_deb(deb: Path, dest: Path) -> None:
    run(["dpkg-deb", "-x", deb, dest])


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
    run([wrapper_dir / "ccache", "--version"], stdout=subprocess.DEVNULL)
    _stamp(base, key)
    return wrapper_dir


def compiler_wrappers(
    ccache_bin: Path, cuda_home: Path, cc: str = "gcc", cxx: str = "g++"
) -> dict[str, str]:
    """``CC``, ``CXX`` and ``PYTORCH_NVCC`` that run through ccache.

    The wrappers are named ``gcc``/``g++`` (nvcc gets ``CC`` as ``-ccbin`` and recognises the
    host compiler by name); ``CCACHE_DIR`` lives in the cache.
    """
    wrap = (
        cache_dir() / "ccache-wrappers" / hashlib.sha256(str(cuda_home).encode()).hexdigest()[:10]
    )
    wrap.mkdir(parents=True, exist_ok=True)
    ccache = ccache_bin / "ccache"
    out: dict[str, str] = {}
    for env_name, name, real in (
        ("CC", "gcc", shutil.which(cc) or cc),
        ("CXX", "g++", shutil.which(cxx) or cxx),
        ("PYTORCH_NVCC", "nvcc", str(cuda_home / "bin" / "nvcc")),
    ):
        script = wrap / name
        script.write_text(f'#!/bin/sh\nexec "{ccache}" "{real}" "$@"\n')
        script.chmod(0o755)
        out[env_name] = str(script)
    return out


def ccache_env() -> dict[str, str]:
    return {
        "CCACHE_DIR": str(cache_dir() / "ccache"),
        "CCACHE_MAXSIZE": os.environ.get("CCACHE_MAXSIZE", "5G"),
        # The build dir is fresh per build and absolute paths differ per venv; keep hits.
        "CCACHE_BASEDIR": str(REPO),
        "CCACHE_NOHASHDIR": "1",
        "CCACHE_COMPILERCHECK": "content",
    }


def main(argv: Sequence[str] | None = None) -> int:
    from scripts import matrix

    parser = argparse.ArgumentParser(prog="python -m scripts.toolchain", description=__doc__)
    parser.add_argument("--torch", action="append")
    parser.add_argument("--all", action="store_true")
    args = parser.parse_args(argv)
    rows = matrix.select_rows(matrix.load_rows(), args.torch, args.all)
    for cuda in sorted({r.cuda for r in rows}):
        row = next(r for r in rows if r.cuda == cuda)
        print(f"CUDA {cuda}: {ensure_cuda_toolkit(cuda, row.toolkit)}")
    print(f"sysroot: {ensure_sysroot()}")
    print(f"ccache: {ensure_ccache()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
