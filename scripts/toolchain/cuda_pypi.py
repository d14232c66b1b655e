"""CUDA toolkits from NVIDIA's PyPI packages (13.x: nvcc, runtime, CCCL, crt, nvvm), installed
with ``uv pip install --target`` and merged into one ``CUDA_HOME`` tree.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

from scripts import basics, diskspace
from scripts.toolchain.cache import cache_dir, stamp
from scripts.toolchain.cuda import ToolkitError, check_nvcc_release, override_env_var, toolkit_root

log = basics.logger("toolchain")


def _toolkit_key(packages: Sequence[str]) -> str:
    return "\n".join(sorted(packages)) + "\n"


def _python_for_uv() -> str:
    """uv needs an interpreter to evaluate markers for ``--target``; the current one will do."""
    return sys.executable


def merge_tree(src: Path, dst: Path) -> None:
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


def ensure_pypi_toolkit(cuda: str, release: str, packages: Sequence[str]) -> Path:
    """A ``CUDA_HOME`` merged from NVIDIA's pinned PyPI ``packages``."""
    key = _toolkit_key(packages)
    root, ready = toolkit_root(release, key)
    home = root / "home"
    if ready:
        return home
    diskspace.require_free_space(
        [root],
        diskspace.cache_download(
            f"the CUDA {release} toolkit (NVIDIA's PyPI packages)",
            diskspace.TOOLKIT_BYTES,
            cache_dir(),
        ),
    )
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
        merge_tree(component, home)
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
    stamp(root, key)
    return home
