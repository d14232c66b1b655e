"""Import-time check that this build of hotloop fits the running torch.

A wheel built against one torch minor (or CUDA major) links against that torch's C++
ABI; loading it into another torch fails with an ``undefined symbol`` at best. This
module compares the build info with the running torch *before* ``_C`` is loaded and
turns a mismatch into an ImportError that says what to install.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any


def torch_minor(version: str) -> str:
    """'2.11.0+cu130' -> '2.11'."""
    return ".".join(version.split("+")[0].split(".")[:2])


def cuda_major(version: str | None) -> str | None:
    return version.split(".")[0] if version else None


def variant_label(torch_version: str, cuda_version: str | None) -> str:
    """The wheel's local version label for a torch: 'pt211cu130' or 'pt211cpu'."""
    minor = torch_minor(torch_version).replace(".", "")
    return f"pt{minor}cu{cuda_version.replace('.', '')}" if cuda_version else f"pt{minor}cpu"


def install_hint(build_info: dict[str, Any], torch_version: str, torch_cuda: str | None) -> str:
    base = build_info["version"].split("+")[0]
    wanted = f"hotloop=={base}+{variant_label(torch_version, torch_cuda)}"
    built_for = f"torch=={build_info['torch_minor']}.*"
    return (
        f'install the hotloop wheel built for your torch: pip install --force-reinstall "{wanted}" '
        f"(from the index that serves hotloop's variants), "
        f'or install the torch this wheel was built for: pip install "{built_for}"'
    )


def find_mismatch(
    build_info: dict[str, Any], torch_version: str, torch_cuda: str | None
) -> str | None:
    """Why this build can't load into the given torch, or None when it can."""
    built = f"hotloop {build_info['version']} was built for torch {build_info['torch_version']}"
    running = f"this environment has torch {torch_version}"
    if torch_minor(torch_version) != build_info["torch_minor"]:
        return f"{built}, but {running}: torch's C++ ABI changes between minor versions."
    wheel_cuda = build_info["cuda_version"]
    if wheel_cuda and not torch_cuda:
        return f"{built} (CUDA {wheel_cuda}), but {running}, a CPU-only build."
    if wheel_cuda and cuda_major(wheel_cuda) != cuda_major(torch_cuda):
        return (
            f"{built} (CUDA {wheel_cuda}), but {running} (CUDA {torch_cuda}): "
            "the CUDA major versions differ."
        )
    return None


def read_build_info() -> dict[str, Any]:
    try:
        from hotloop._build_info import BUILD_INFO
    except ImportError:
        raise ImportError(
            "hotloop's compiled part is missing (no hotloop/_build_info.py): this looks like an "
            "unbuilt source tree. Build it with `pip install --no-build-isolation -e .`, "
            "or install a wheel."
        ) from None
    return BUILD_INFO


def load_extension() -> ModuleType:
    """Check the build against the running torch, then load ``hotloop._C``."""
    import torch

    build_info = read_build_info()
    mismatch = find_mismatch(build_info, torch.__version__, torch.version.cuda)
    if mismatch:
        hint = install_hint(build_info, torch.__version__, torch.version.cuda)
        raise ImportError(f"{mismatch} To fix: {hint}.")
    try:
        return importlib.import_module("hotloop._C")
    except (ImportError, OSError) as err:
        raise ImportError(
            f"hotloop {build_info['version']} (built for torch {build_info['torch_version']}) "
            f"failed to load its extension with torch {torch.__version__}: {err}. The wheel may "
            "be damaged or built by a different toolchain; reinstall it with "
            f'pip install --force-reinstall "hotloop=={build_info["version"]}"'
        ) from err
