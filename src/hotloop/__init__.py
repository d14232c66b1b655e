"""hotloop: fast RMSNorm and elementwise custom operators for PyTorch.

The ops live under ``torch.ops.hotloop`` and are wrapped here with a Python API.
"""

from hotloop._guard import load_extension

# Order matters: the guard runs before the extension is loaded, and the extension's
# TORCH_LIBRARY schemas must exist before ops.py registers fake and autograd kernels.
_C = load_extension()

from hotloop._build_info import BUILD_INFO  # noqa: E402
from hotloop.modules import RMSNorm  # noqa: E402
from hotloop.ops import fused_add_rms_norm, mul, muladd, rms_norm  # noqa: E402

__version__: str = BUILD_INFO["version"]
__all__ = [
    "BUILD_INFO",
    "RMSNorm",
    "__version__",
    "fused_add_rms_norm",
    "mul",
    "muladd",
    "rms_norm",
]
