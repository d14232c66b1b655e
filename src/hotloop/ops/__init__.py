"""Python API of hotloop's operators, with their fake kernels, autograd and vmap rules.

The C++/CUDA kernels register the ops (schemas in csrc/hotloop.cpp); this package adds
what the dispatcher needs from Python, one module per job, imported below in the order
the dispatcher needs them:

- ``api``: the Python functions and the constants that describe the ops (no registrations);
- ``checks``: the input checks, worded as csrc/common/checks.h words them;
- ``fake``: fake (meta) kernels, so that torch.compile and torch.export trace the ops
  without running them. They refuse every input the real kernels refuse, with the same
  messages: a fake kernel also serves tensors on the ``meta`` device, and one that accepted
  ``rms_norm(cpu_x, meta_weight)`` would hand back uninitialised CPU memory;
- ``autograd``: autograd kernels, built from single-level autograd Functions with a
  ``setup_context``, so that ``torch.func.grad``/``vjp``/``vmap`` can go through them;
- ``inplace``: the in-place bookkeeping of ``fused_add_rms_norm`` and the FP8 ops (version
  counters, leaf and inference-tensor errors), which torch's own in-place ops get from their
  generated code;
- ``vmap``: batching rules (``torch.library.register_vmap``), so that ``torch.vmap`` never
  falls back to a per-sample loop.
"""

# Registration order is a correctness property (CONTRIBUTING.md): it lives here, in one spot.
from hotloop.ops import api, checks, fake, autograd, inplace, vmap  # noqa: F401, I001

# The constants stay importable from hotloop.ops, where the doctor and the tests read them.
from hotloop._casting import CASTINGS  # noqa: F401
from hotloop.ops.api import (  # noqa: F401
    _DEPRECATED_BACKENDS,
    BACKENDS,
    DEFAULT_CUDA_BACKEND,
    E4M3_MAX,
    FLOATING_DTYPES,
    FP8_DTYPE,
    FP8_MIN_CAPABILITY,
    FP8_OPS,
    MIN_DYNAMIC_SCALE,
)
from hotloop.ops.api import (
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
    "fused_add_rms_norm",
    "fused_add_rms_norm_fp8",
    "fused_add_rms_norm_fp8_dynamic",
    "mul",
    "muladd",
    "rms_norm",
    "rms_norm_fp8",
    "rms_norm_fp8_dynamic",
]
