"""Import-time check that this build of hotloop fits the running torch.

A pinned wheel is built on torch's C++ API (ATen) and loads into one torch minor only;
a stable wheel is built on the LibTorch stable ABI and loads into every torch from its
floor on. Either way the CUDA major must match torch's. Loading into a torch that does
not fit fails with an ``undefined symbol`` at best, so this module compares the build
info with the running torch *before* the ops library is loaded, and turns a mismatch
into an ImportError that says what was found, what is needed and what to install.
"""

from __future__ import annotations

import platform
import sysconfig
from pathlib import Path
from typing import Any

from hotloop import _variant

OPS_LIBRARY = "libhotloop_ops.so"
# The per-CUDA-major pages of hotloop's index, as `python -m scripts.index` lays them out.
INDEX_PAGE = "<hotloop index>/{cuda}/simple/"
# Building from a checkout: against the torch installed (no build isolation, which would bring
# another torch), replacing whatever hotloop is installed, and never touching torch itself.
SOURCE_BUILD = "pip install --no-build-isolation --no-deps --force-reinstall ."


def library_path() -> Path:
    """The compiled ops: a shared library without Python symbols.

    ``torch.ops.load_library(hotloop.library_path())`` registers the ops in a process
    that has torch (``import hotloop`` does that); a C++ program dlopens it.
    """
    return Path(__file__).resolve().parent / OPS_LIBRARY


def torch_build(torch_cuda: str | None, torch_hip: str | None) -> str:
    if torch_cuda:
        return f"CUDA {torch_cuda}"
    if torch_hip:
        return f"ROCm {torch_hip}"
    return "a CPU-only build"


def built_variant(build_info: dict[str, Any]) -> _variant.Variant:
    # The label, not the version: PyPI's copy of the wheel has the public version only.
    return _variant.parse_label(build_info["variant"])


def find_mismatch(
    build_info: dict[str, Any],
    torch_version: str,
    torch_cuda: str | None,
    torch_hip: str | None = None,
) -> str | None:
    """Why this build can't load into the given torch, or None when it can."""
    variant = built_variant(build_info)
    built = f"hotloop {build_info['version']} was built for {_serves(variant)}"
    running = f"this environment has torch {torch_version} ({torch_build(torch_cuda, torch_hip)})"
    try:
        minor = _variant.torch_minor(torch_version)
    except ValueError as err:
        return f"{built}, but {err}."
    if variant.kind == _variant.STABLE and minor < _variant.STABLE_ABI_FLOOR:
        return (
            f"{built}, but {running}: the stable ABI it uses exists from torch "
            f"{_variant.minor_text(_variant.STABLE_ABI_FLOOR)} on."
        )
    if variant.kind == _variant.PINNED and minor != variant.torch:
        return f"{built}, but {running}: torch's C++ ABI changes between minor versions."
    wheel_cuda = build_info["cuda_version"]
    if wheel_cuda and not torch_cuda:
        return f"{built}, but {running}: its GPU kernels need a CUDA build of torch."
    if wheel_cuda and _variant.cuda_major(wheel_cuda) != _variant.cuda_major(torch_cuda):
        return f"{built}, but {running}: the CUDA major versions differ."
    return None


def free_threaded_mismatch(build_info: dict[str, Any], python: str) -> str | None:
    """Why this build can't load into a free-threaded Python ``python`` (X.Y.Z), or None
    when the running interpreter has the GIL.

    Its ``_C`` module uses the limited API (a ``cp39-abi3`` wheel), and a free-threaded
    interpreter imports no ``.abi3.so`` module: without this, the import reads as a damaged
    wheel.
    """
    if not sysconfig.get_config_var("Py_GIL_DISABLED"):
        return None
    name = "python" + ".".join(python.split(".")[:2])
    return (
        f"hotloop {build_info['version']} is a limited-API build (a cp39-abi3 wheel), which a "
        f"free-threaded Python cannot load, but this Python {python} is free-threaded. hotloop "
        f"has no free-threaded build. To fix: use the regular build of the same Python "
        f"({name}, not {name}t) with torch's wheel for it"
    )


def _serves(variant: _variant.Variant) -> str:
    device = f"CUDA {variant.cuda_major}" if variant.cuda else "CPU"
    if variant.kind == _variant.STABLE:
        floor = _variant.minor_text(_variant.STABLE_ABI_FLOOR)
        return f"torch >= {floor} with {device} (stable ABI)"
    assert variant.torch is not None
    return f"torch {_variant.minor_text(variant.torch)}.* with {device}"


def install_hint(
    build_info: dict[str, Any],
    torch_version: str,
    torch_cuda: str | None,
    torch_hip: str | None = None,
) -> str:
    """What to install instead: a released wheel that fits this torch, or why there is none.

    Only variants the build matrix released are suggested (``released_variants`` in the
    build info, written by the release build); a development build knows none.
    """
    released = [_variant.parse_label(label) for label in build_info.get("released_variants", [])]
    release = torch_version.split("+")[0].strip()
    try:
        _variant.torch_minor(torch_version)
        readable = True
    except ValueError:
        readable = False
    fits = [v for v in released if readable and torch_cuda and v.serves(torch_version, torch_cuda)]
    if fits:
        best = max(fits, key=lambda v: v.kind == _variant.STABLE)
        page = INDEX_PAGE.format(cuda=f"cu{best.cuda_major}")
        # Only hotloop's page: next to PyPI, pip would take a newer public hotloop (a CUDA 13
        # build) over this one. The installed torch satisfies the pin without an index.
        return (
            f"install the hotloop wheel built for your torch, keeping torch as it is: pip install "
            f'"hotloop=={best.version}" "torch=={release}" --index-url {page}'
        )
    built_for = built_variant(build_info)
    keep_wheel = f'or install a torch this wheel fits: pip install "{built_for.requires_torch}"'
    if not readable:
        reason = f"hotloop cannot tell which torch release {torch_version!r} is"
    elif torch_hip:
        reason = "hotloop has no ROCm wheels"
    elif not released:
        reason = "this is a development build that lists no released wheels"
    else:
        listed = ", ".join(f"{v.label} ({_serves(v)})" for v in released)
        reason = f"no released hotloop wheel fits torch {torch_version}; released: {listed}"
    # No sdist is published, and pip keeps an installed wheel of the same version: the
    # advice builds a checkout against the torch that is there and replaces the wheel.
    return (
        f"{reason}. Build hotloop from source against your torch: in a clone of hotloop's "
        f"repository run {SOURCE_BUILD} (it needs setuptools>=77, ninja and g++ >= 11, and "
        "for the GPU kernels a CUDA toolkit of your torch's CUDA major in CUDA_HOME; "
        f"CONTRIBUTING.md says more), {keep_wheel}"
    )


def reinstall_command(build_info: dict[str, Any]) -> str:
    """How to reinstall the same wheel without touching torch; a labelled version comes
    from hotloop's index only, the public one (PyPI's copy) from PyPI."""
    version = build_info["version"]
    command = f'pip install --force-reinstall --no-deps "hotloop=={version}"'
    variant = built_variant(build_info)
    if "+" not in version:
        return command
    device = f"cu{variant.cuda_major}" if variant.cuda_major else "cpu"
    return f"{command} --index-url {INDEX_PAGE.format(cuda=device)}"


def read_build_info() -> dict[str, Any]:
    try:
        from hotloop._build_info import BUILD_INFO
    except ImportError:
        raise ImportError(
            "hotloop's compiled part is missing (no hotloop/_build_info.py): this looks like an "
            "unbuilt source tree. Build it with `pip install --no-build-isolation -e .`, "
            "or install a wheel."
        ) from None
    build_info: dict[str, Any] = BUILD_INFO
    return build_info


def load_extension() -> None:
    """Check the build against the running torch, then load the ops into it."""
    import torch

    build_info = read_build_info()
    free_threaded = free_threaded_mismatch(build_info, platform.python_version())
    if free_threaded:
        raise ImportError(f"{free_threaded}.")
    hip = getattr(torch.version, "hip", None)
    mismatch = find_mismatch(build_info, torch.__version__, torch.version.cuda, hip)
    if mismatch:
        hint = install_hint(build_info, torch.__version__, torch.version.cuda, hip)
        raise ImportError(f"{mismatch} To fix: {hint}.")
    path = library_path()
    try:
        # torch.ops.load_library carries no annotations of its own.
        torch.ops.load_library(str(path))  # type: ignore[no-untyped-call]
        import hotloop._C  # noqa: F401  (the limited-API module the wheel's tag stands for)
    except (ImportError, OSError, RuntimeError) as err:
        raise ImportError(
            f"hotloop {build_info['version']} (built for torch {build_info['torch_version']}) "
            f"failed to load {path} into torch {torch.__version__}: {err}. The wheel may "
            f"be damaged or built by a different toolchain; reinstall it with "
            f"{reinstall_command(build_info)}"
        ) from err
