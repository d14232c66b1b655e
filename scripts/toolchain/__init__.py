"""Toolchain for manylinux_2_28 CUDA builds without Docker, assembled from public packages.

One module per source:

* ``cuda``: a row's toolkit pins and what both toolkit sources share. ``cuda_pypi``: 13.x
  from NVIDIA's PyPI packages, installed with ``uv pip install --target`` and merged into one
  ``CUDA_HOME`` tree (``bin/nvcc``, ``include/``, ``lib64/``, ``nvvm/``) that torch's
  cpp_extension accepts. ``cuda_debian``: 12.x (PyPI's 12.x nvcc wheels hold only
  ``ptxas``) from Debian's ``nvidia-cuda-toolkit`` / ``nvidia-cuda-dev`` (non-free) and CCCL
  packages, checked against their pinned sha256.
* ``sysroot``: glibc 2.31 from Debian bullseye, so that builds need no newer glibc than
  manylinux_2_28 allows.
* ``ccache``: the compiler cache and the wrappers that put every compiler through it.
* ``apt``: downloads from the Debian mirror this machine's apt already uses; ``cache``: where
  the pieces live and the stamps that say a piece is complete.

:func:`assemble` puts the pieces together once per build, as one :class:`Toolchain` value
that the build reads; ``python -m scripts.toolchain`` fetches them ahead of a build.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from scripts.toolchain.apt import (
    AptSource,
    apt_download,
    debian_mirror,
    debian_sources_line,
    parse_deb822,
    parse_one_line,
    relativize_symlinks,
    system_apt_sources,
)
from scripts.toolchain.cache import cache_dir
from scripts.toolchain.ccache import (
    ccache_env,
    compiler_wrappers,
    ensure_ccache,
    nvcc_wrapper_script,
    plain_compilers,
)
from scripts.toolchain.cuda import (
    DebPin,
    Toolkit,
    ToolkitError,
    check_nvcc_release,
    override_env_var,
    torch_cuda_include_dirs,
    torch_cuda_library_links,
)
from scripts.toolchain.cuda_debian import (
    check_debs,
    deb_fields,
    deb_member_target,
    ensure_debian_toolkit,
    extract_deb_members,
)
from scripts.toolchain.cuda_pypi import component_roots, ensure_pypi_toolkit
from scripts.toolchain.sysroot import (
    SYSROOT_PACKAGES,
    SYSROOT_SUITE,
    SYSROOT_VARIABLE,
    ensure_sysroot,
)

__all__ = [
    "SYSROOT_PACKAGES",
    "SYSROOT_SUITE",
    "SYSROOT_VARIABLE",
    "AptSource",
    "DebPin",
    "Toolchain",
    "Toolkit",
    "ToolkitError",
    "apt_download",
    "assemble",
    "cache_dir",
    "ccache_env",
    "check_debs",
    "compiler_wrappers",
    "component_roots",
    "deb_fields",
    "deb_member_target",
    "debian_mirror",
    "debian_sources_line",
    "ensure_ccache",
    "ensure_cuda_toolkit",
    "ensure_debian_toolkit",
    "ensure_pypi_toolkit",
    "ensure_sysroot",
    "extract_deb_members",
    "nvcc_wrapper_script",
    "override_env_var",
    "parse_deb822",
    "parse_one_line",
    "plain_compilers",
    "relativize_symlinks",
    "system_apt_sources",
    "torch_cuda_include_dirs",
    "torch_cuda_library_links",
]


def ensure_cuda_toolkit(cuda: str, toolkit: Toolkit) -> Path:
    """Return a ``CUDA_HOME`` that builds the CUDA ``cuda`` rows, from ``toolkit``'s pins.

    The variable ``override_env_var(cuda)`` names (the row's CUDA, e.g. a real 12.8 toolkit
    in CI images) replaces the pinned packages.
    """
    override = os.environ.get(override_env_var(cuda))
    if override:
        home = Path(override)
        check_nvcc_release(home / "bin" / "nvcc", cuda, override_env_var(cuda))
        return home
    if toolkit.debs:
        return ensure_debian_toolkit(toolkit)
    return ensure_pypi_toolkit(cuda, toolkit.nvcc, toolkit.packages)


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
        env = {SYSROOT_VARIABLE: str(self.sysroot), **self.compilers, **self.ccache_env}
        if self.cuda_home is not None:
            env["CUDA_HOME"] = str(self.cuda_home)
        return env


def assemble(
    cuda: str,
    toolkit: Toolkit,
    *,
    source_name: str,
    with_cuda: bool = True,
    ccache: bool = True,
) -> Toolchain:
    """The toolchain of a build for CUDA ``cuda``: its toolkit (unless ``with_cuda`` is
    False), the glibc 2.31 sysroot and the compilers, wrapped in ccache when ``ccache`` is
    wanted and available. Each piece is fetched once, then taken from the cache.
    ``source_name``: the project's import name, which starts nvcc's source names."""
    cuda_home = ensure_cuda_toolkit(cuda, toolkit) if with_cuda else None
    sysroot = ensure_sysroot()
    ccache_bin = ensure_ccache() if ccache else None
    if ccache_bin is None:
        return Toolchain(cuda_home, sysroot, plain_compilers(), {})
    compilers = compiler_wrappers(ccache_bin, cuda_home, source_name=source_name)
    return Toolchain(cuda_home, sysroot, compilers, ccache_env())
