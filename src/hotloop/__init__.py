"""hotloop: fast RMSNorm and elementwise custom operators for PyTorch.

The ops live under ``torch.ops.hotloop`` and are wrapped here with a Python API.
"""

import sys

from hotloop._guard import library_path, load_extension


def _doctor_is_starting() -> bool:
    """Whether this import is ``python -m hotloop`` locating its ``__main__``.

    The doctor must report a build that does not fit the running torch instead of
    dying in the guard it explains; every other import raises the guard's error.
    """
    argv = getattr(sys, "orig_argv", None)  # Python >= 3.10
    if argv is not None:
        return any(a == "-m" and b == "hotloop" for a, b in zip(argv, argv[1:]))
    return sys.argv[:1] == ["-m"]  # while -m locates the module (3.9)


# Order matters: the guard runs before the ops library is loaded, and the library's
# schemas must exist before ops.py registers fake and autograd kernels.
try:
    load_extension()
    LOAD_ERROR = None
except ImportError as _err:
    if not _doctor_is_starting():
        raise
    LOAD_ERROR = _err

from hotloop._build_info import BUILD_INFO  # noqa: E402

__version__: str = BUILD_INFO["version"]

if LOAD_ERROR is None:
    from hotloop._arithmetic import is_compile_arithmetic_enabled, set_compile_arithmetic
    from hotloop.modules import RMSNorm
    from hotloop.ops import (
        fused_add_rms_norm,
        fused_add_rms_norm_fp8,
        fused_add_rms_norm_fp8_dynamic,
        mul,
        muladd,
        rms_norm,
        rms_norm_fp8,
        rms_norm_fp8_dynamic,
    )

__all__ = [
    "BUILD_INFO",
    "RMSNorm",
    "__version__",
    "fused_add_rms_norm",
    "fused_add_rms_norm_fp8",
    "fused_add_rms_norm_fp8_dynamic",
    "is_compile_arithmetic_enabled",
    "library_path",
    "mul",
    "muladd",
    "rms_norm",
    "rms_norm_fp8",
    "rms_norm_fp8_dynamic",
    "set_compile_arithmetic",
]
