"""The CUDA compiler toolkit of a row (``[toolkits."X.Y"]`` in matrix.toml) and what its two
sources, NVIDIA's PyPI packages (``cuda_pypi``) and Debian's (``cuda_debian``), share: the
release check, the override variable and each toolkit's cache folder.
"""

from __future__ import annotations

import hashlib
import re
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scripts import basics, names
from scripts.toolchain.cache import cache_dir, stamped

log = basics.logger("toolchain")


def override_env_var(cuda: str) -> str:
    """The variable (``names.env_var("CUDA_HOME_12_8")`` for CUDA 12.8) naming a toolkit to
    use instead of the pinned packages."""
    return names.env_var("CUDA_HOME_" + cuda.replace(".", "_"))


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


def toolkit_root(name: str, key: str) -> tuple[Path, bool]:
    """``(<cache>/cuda/<name>-<digest of key>, whether its stamp says it is complete)``.

    An incomplete folder (an interrupted fetch) is this module's own work: it is emptied
    and made again for the caller to fill.
    """
    digest = hashlib.sha256(key.encode()).hexdigest()[:10]
    root = cache_dir() / "cuda" / f"{name}-{digest}"
    if stamped(root, key):
        return root, True
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    return root, False


def torch_cuda_include_dirs(site_packages: Path) -> list[Path]:
    """Header folders of torch's own nvidia deps (``cublas_v2.h``, ``cusparse.h``, ...).

    torch's headers include them; they are not part of the compiler toolkit.
    """
    nvidia = site_packages / "nvidia"
    if not nvidia.is_dir():
        return []
    return sorted(p for p in nvidia.glob("*/include") if p.is_dir())


# A run-time library name and the link-time name the linker's -lNAME looks for:
# libcublas.so.12 -> libcublas.so, libnvrtc-builtins.so.13.0 -> libnvrtc-builtins.so.
_RUN_TIME_NAME = re.compile(r"(?P<link>lib[^/]+\.so)(?:\.[0-9]+)*")


def torch_cuda_library_links(site_packages: Path, cuda_home: Path, dest: Path) -> list[str]:
    """Link-time names in ``dest`` (replaced: the build's own folder) for the libraries of
    torch's own nvidia deps that the toolkit lacks (cuBLAS, cuSPARSE, cuFFT, NVRTC, ...):
    ``libcublas.so`` -> ``<site>/nvidia/cublas/lib/libcublas.so.12``. Returns their names.

    The wheels ship run-time names alone, which neither ``-lcublas`` nor CMake's
    ``CUDA::cublas`` finds. What links through the links records the run-time name (the
    library's soname), which torch's installation provides where the extension runs, and the
    audit keeps out of the wheel. The toolkit's own libraries (its runtime) are not linked:
    the build links those as torch's cpp_extension does.
    """
    own = {p.name for lib in ("lib64", "lib") for p in (cuda_home / lib).glob("lib*.so")}
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    links: dict[str, Path] = {}
    for library in sorted((site_packages / "nvidia").glob("*/lib/lib*.so*")):
        match = _RUN_TIME_NAME.fullmatch(library.name)
        if match and match["link"] not in own:
            links.setdefault(match["link"], library)
    for name, library in links.items():
        (dest / name).symlink_to(library)
    return sorted(links)
