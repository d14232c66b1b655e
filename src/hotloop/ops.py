"""Python API of hotloop's operators, with their fake kernels, autograd and vmap rules.

The C++/CUDA kernels register the ops (schemas in csrc/hotloop.cpp); this module adds
what the dispatcher needs from Python, in the order it needs it:

- fake (meta) kernels, so that torch.compile and torch.export trace the ops without
  running them. They refuse every input the real kernels refuse, with the same messages:
  a fake kernel also serves tensors on the ``meta`` device, and one that accepted
  ``rms_norm(cpu_x, meta_weight)`` would hand back uninitialised CPU memory;
- autograd kernels, built from single-level autograd Functions with a ``setup_context``,
  so that ``torch.func.grad``/``vjp``/``vmap`` can go through them;
- the in-place bookkeeping of ``fused_add_rms_norm`` (version counters, leaf and
  inference-tensor errors), which torch's own in-place ops get from their generated code;
- batching rules (``torch.library.register_vmap``), so that ``torch.vmap`` never falls
  back to a per-sample loop.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor
from torch._functorch.utils import enable_single_level_autograd_function

try:
    from hotloop import triton_rms_norm
except ImportError as err:  # Triton ships with CUDA builds of torch only
    triton_rms_norm = None  # type: ignore[assignment]
    _TRITON_MISSING: ImportError | None = err

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

# "native" is hotloop's C++ kernels for x's device (CPU or CUDA), "triton" the Triton ones.
BACKENDS = ("native", "triton")
# Until 0.1.0 the native kernels of a CUDA tensor were also called "cuda": the same code
# under a device's name, which said nothing for CPU tensors. Still accepted, with a warning,
# so that code written against 0.1.0 keeps running for one more release.
_DEPRECATED_BACKENDS = {"cuda": "native"}
# The backend `rms_norm` uses for CUDA tensors when none is named: the faster one in
# benchmarks/results/rms_norm.json.
DEFAULT_CUDA_BACKEND = "native"

FLOATING_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)

# The FP8 ops' output: float8_e4m3fn, saturated to +-E4M3_MAX. A dynamic row's scale is
# max|y| / E4M3_MAX, at least MIN_DYNAMIC_SCALE (vLLM's floor; csrc/rms_norm_fp8 says why).
FP8_DTYPE = torch.float8_e4m3fn
E4M3_MAX = 448.0
MIN_DYNAMIC_SCALE = 1.0 / (E4M3_MAX * 512.0)
# The oldest GPUs the FP8 ops run on: Ada (8.9) and Hopper (9.0) convert to float8 in
# hardware and run the FP8 GEMMs that consume the output.
FP8_MIN_CAPABILITY = (8, 9)
FP8_OPS = (
    "rms_norm_fp8",
    "rms_norm_fp8_dynamic",
    "fused_add_rms_norm_fp8",
    "fused_add_rms_norm_fp8_dynamic",
)


# ------------------------------------------------------------------------ Python API


def muladd(a: Tensor, b: Tensor, c: float) -> Tensor:
    """a * b + c, elementwise."""
    return torch.ops.hotloop.muladd.default(a, b, c)


def mul(a: Tensor, b: Tensor) -> Tensor:
    """a * b, elementwise."""
    return torch.ops.hotloop.mul.default(a, b)


def _pick_backend(x: Tensor, backend: str | None) -> str:
    if backend is None:  # first: the common call pays for one comparison
        return DEFAULT_CUDA_BACKEND if x.is_cuda else "native"
    if backend in _DEPRECATED_BACKENDS:
        new = _DEPRECATED_BACKENDS[backend]
        # Dynamo can't trace warnings.warn (a graph break, an error under fullgraph):
        # eager calls warn, compiled ones stay whole.
        if not torch.compiler.is_compiling():
            warnings.warn(
                f"rms_norm: backend={backend!r} is deprecated and will be removed in hotloop "
                f"0.2; it runs the same kernels as backend={new!r}, which works on every device",
                DeprecationWarning,
                stacklevel=3,
            )
        if not x.is_cuda:
            raise ValueError(
                f"rms_norm(backend={backend!r}): x is on {x.device}; pass a CUDA tensor, "
                f"or backend={new!r} (or None) to use the kernels for x's device"
            )
        return new
    if backend not in BACKENDS:
        raise ValueError(f"rms_norm: backend must be one of {BACKENDS} or None, got {backend!r}")
    return backend


# Looked up once: torch.ops' attribute lookups cost a decode-sized call about 0.3 us.
_RMS_NORM = torch.ops.hotloop.rms_norm.default


def rms_norm(
    x: Tensor,
    weight: Tensor | None = None,
    eps: float | None = None,
    backend: str | None = None,
) -> Tensor:
    """RMSNorm over the last dimension, as ``torch.nn.functional.rms_norm(x, (H,), weight, eps)``.

    ``eps=None`` takes ``torch.finfo(x.dtype).eps`` like torch does. ``backend`` picks the
    kernels: "native" (hotloop's C++ kernels for x's device), "triton", or None for the
    fastest one available for x's device.
    """
    if eps is None:
        # A non-floating x gets no eps of its own: the op refuses it with its own message,
        # which under torch.compile comes from the fake kernel. (Raising here instead would
        # surface as Dynamo's "Observed exception" with the message buried in its context.)
        eps = torch.finfo(x.dtype).eps if x.is_floating_point() else 0.0
    if _pick_backend(x, backend) == "triton":
        if triton_rms_norm is None:
            raise RuntimeError(
                f"rms_norm(backend='triton'): Triton can't be imported ({_TRITON_MISSING}); "
                "install a CUDA build of torch, which brings Triton"
            )
        return triton_rms_norm.rms_norm(x, weight, eps)
    if _autograd_has_nothing_to_do(x, weight) and not torch.is_inference_mode_enabled():
        # (Inference mode keeps the dispatcher out of Autograd kernels already, and the
        # guard costs a decode-sized call about 0.4 us.)
        with torch._C._AutoDispatchBelowAutograd():
            return _RMS_NORM(x, weight, eps)
    return _RMS_NORM(x, weight, eps)


def fused_add_rms_norm(x: Tensor, residual: Tensor, weight: Tensor, eps: float = 1e-6) -> None:
    """In place: ``residual += x``, then ``x = rms_norm(residual) * weight``.

    The inference step between two transformer blocks, in one pass over memory. It has no
    backward: call it under ``torch.no_grad()`` or ``torch.inference_mode()``.
    """
    if _autograd_has_nothing_to_do(x, residual, weight):
        _bump_versions_in_place("fused_add_rms_norm", x, residual)
        with torch._C._AutoDispatchBelowADInplaceOrView():
            torch.ops.hotloop.fused_add_rms_norm.default(x, residual, weight, eps)
        return
    torch.ops.hotloop.fused_add_rms_norm.default(x, residual, weight, eps)


def rms_norm_fp8(x: Tensor, weight: Tensor, scale: Tensor, eps: float = 1e-6) -> Tensor:
    """RMSNorm quantised to float8_e4m3fn with a static per-tensor scale, for FP8 GEMMs.

    ``out = e4m3(rms_norm(x) * weight / scale)``: the norm in float32 (float64 for
    float64 x), the division as a multiplication by ``1 / scale`` formed in float32, then
    rounded to nearest even and saturated to +-448. ``scale`` is a float32 tensor of one
    element on x's device (read there: no host synchronisation); ``out.float() * scale``
    dequantises. CUDA needs compute capability 8.9 or newer. Inference only: no backward.
    """
    return torch.ops.hotloop.rms_norm_fp8.default(x, weight, scale, eps)


def rms_norm_fp8_dynamic(
    x: Tensor, weight: Tensor, eps: float = 1e-6, scale_ub: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """RMSNorm quantised to float8_e4m3fn with one scale per row (per token).

    Returns ``(out, scales)``: ``scales`` is float32 of shape ``x.shape[:-1] + (1,)``,
    ``scales = max(min(max|y_row|, scale_ub) / 448, 1 / (448 * 512))`` with ``y`` the
    normalised row times ``weight``; the floor keeps a row of zeros from a zero scale.
    ``out = e4m3(y / scales)`` as in :func:`rms_norm_fp8`; values above ``scale_ub``
    saturate. ``out.float() * scales`` dequantises.
    """
    out, scales = torch.ops.hotloop.rms_norm_fp8_dynamic.default(x, weight, eps, scale_ub)
    return out, scales


def fused_add_rms_norm_fp8(
    x: Tensor, residual: Tensor, weight: Tensor, scale: Tensor, eps: float = 1e-6
) -> Tensor:
    """In place ``residual += x``, then :func:`rms_norm_fp8` of the new residual.

    The step between two transformer blocks feeding an FP8 GEMM, in one pass over memory:
    equals ``residual.add_(x); rms_norm_fp8(residual, weight, scale, eps)``. x is only
    read. Call it under ``torch.no_grad()`` or ``torch.inference_mode()``.
    """
    return torch.ops.hotloop.fused_add_rms_norm_fp8.default(x, residual, weight, scale, eps)


def fused_add_rms_norm_fp8_dynamic(
    x: Tensor,
    residual: Tensor,
    weight: Tensor,
    eps: float = 1e-6,
    scale_ub: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """In place ``residual += x``, then :func:`rms_norm_fp8_dynamic` of the new residual."""
    out, scales = torch.ops.hotloop.fused_add_rms_norm_fp8_dynamic.default(
        x, residual, weight, eps, scale_ub
    )
    return out, scales


def _autograd_has_nothing_to_do(*tensors: Tensor | None) -> bool:
    """Whether the op's Python Autograd kernel (below) would only pass the call on.

    Then the API functions call below it: that kernel is a Python function the dispatcher
    enters for every tensor outside inference mode, about 5 us of a decode-sized call's
    20 (H100, torch 2.11; benchmarks/NOTES.md). Under torch.compile/export and torch.func
    transforms the call keeps its usual path, which those trace or transform.
    """
    # is_compiling() first: Dynamo traces this function and cannot trace the torch._C calls.
    if torch.compiler.is_compiling():
        return False
    if torch.is_grad_enabled() and torch._C._any_requires_grad(*tensors):
        return False
    return not torch._C._are_functorch_transforms_active()


# ------------------------------------------------------------------------ input checks
# The checks of csrc/common/checks.h, with the same wording. Shape conditions go through
# torch._check so that symbolic sizes under torch.compile become runtime asserts rather
# than specialisations.


def _check_floating(op: str, name: str, t: Tensor) -> None:
    if t.dtype not in FLOATING_DTYPES:
        raise RuntimeError(
            f"{op}: expected a floating-point tensor (float16, bfloat16, float32, float64) "
            f"but got {t.dtype} for {name}"
        )


def _check_same_device(op: str, name_a: str, a: Tensor, name_b: str, b: Tensor) -> None:
    if a.device != b.device:
        raise RuntimeError(f"{op}: {name_a} is on {a.device} but {name_b} is on {b.device}")


def _check_same_dtype(op: str, name_a: str, a: Tensor, name_b: str, b: Tensor) -> None:
    if a.dtype != b.dtype:
        raise RuntimeError(
            f"{op}: {name_a} is {a.dtype} but {name_b} is {b.dtype} (expected the same dtype)"
        )


def _check_same_shape(op: str, name_a: str, a: Tensor, name_b: str, b: Tensor) -> None:
    def message() -> str:
        return (
            f"{op}: {name_a} has shape {tuple(a.shape)} but {name_b} has shape "
            f"{tuple(b.shape)} (expected the same shape)"
        )

    torch._check(a.dim() == b.dim(), message)
    for size_a, size_b in zip(a.shape, b.shape):
        torch._check(size_a == size_b, message)


def _check_elementwise_inputs(op: str, a: Tensor, b: Tensor) -> None:
    _check_same_device(op, "a", a, "b", b)
    _check_floating(op, "a", a)
    _check_same_dtype(op, "a", a, "b", b)
    _check_same_shape(op, "a", a, "b", b)


def _check_norm_input(op: str, name: str, x: Tensor) -> None:
    if x.dim() < 1:
        raise RuntimeError(
            f"{op}: expected {name} to have at least 1 dimension (the normalised one) "
            "but got a 0-dim tensor"
        )
    _check_floating(op, name, x)


def _check_norm_weight(op: str, weight: Tensor, x: Tensor, batched: bool = False) -> None:
    """weight: 1-D with x.size(-1) elements, x's dtype and device. ``batched``: weight
    holds one such row per sample of a vmap (its first dim), and x has the batch first."""
    _check_same_device(op, "x", x, "weight", weight)
    _check_same_dtype(op, "x", x, "weight", weight)
    shape = tuple(weight.shape[1:] if batched else weight.shape)
    hidden = x.size(-1)
    torch._check(
        len(shape) == 1,
        lambda: f"{op}: weight must be 1-D (x's last dim, {hidden} elements) but has shape {shape}",
    )
    torch._check(
        shape[0] == hidden,
        lambda: f"{op}: weight has {shape[0]} elements but x's last dim is {hidden}",
    )


def _check_rms_norm_inputs(op: str, x: Tensor, weight: Tensor | None) -> None:
    _check_norm_input(op, "x", x)
    if weight is not None:
        _check_norm_weight(op, weight, x)


def _check_rms_norm_backward_inputs(
    op: str, grad_out: Tensor, x: Tensor, weight: Tensor | None
) -> None:
    _check_rms_norm_inputs(op, x, weight)
    _check_same_device(op, "x", x, "grad_out", grad_out)
    _check_same_dtype(op, "x", x, "grad_out", grad_out)
    _check_same_shape(op, "x", x, "grad_out", grad_out)


def _element_span(t: Tensor) -> tuple[Any, Any]:
    """[first, last] storage element a non-empty tensor can touch."""
    first = t.storage_offset()
    return first, first + sum((size - 1) * abs(stride) for size, stride in zip(t.shape, t.stride()))


def _check_no_overlap(op: str, written: str, a: Tensor, name_b: str, b: Tensor) -> None:
    """Refuse b sharing memory with a, which the op writes: torch's in-place ops refuse it
    too (at::assert_no_overlap), since the result would depend on the order of the writes.
    Spans are compared only for tensors of one storage, so the usual call adds no guards."""
    shares_storage = torch._C._is_alias_of(a, b)  # type: ignore[attr-defined]
    if not shares_storage or a.numel() == 0 or b.numel() == 0:
        return
    a_first, a_last = _element_span(a)
    b_first, b_last = _element_span(b)
    if a_first <= b_last and b_first <= a_last:
        raise RuntimeError(
            f"{op}: unsupported operation: some elements of the input tensor and the "
            f"written-to tensor refer to a single memory location ({written} is written in "
            f"place and {name_b} overlaps it); pass a tensor that owns its memory, "
            f"e.g. {name_b}.clone()"
        )


def _check_fused_add_rms_norm_inputs(x: Tensor, residual: Tensor, weight: Tensor) -> None:
    op = "fused_add_rms_norm"
    _check_norm_input(op, "x", x)
    _check_same_device(op, "x", x, "residual", residual)
    _check_same_dtype(op, "x", x, "residual", residual)
    _check_same_shape(op, "x", x, "residual", residual)
    # Both are written in place, so a contiguous copy would silently drop the result.
    for name, t in (("x", x), ("residual", residual)):
        if not t.is_contiguous():
            raise RuntimeError(
                f"{op}: {name} is updated in place and must be contiguous, but got strides "
                f"{tuple(t.stride())} for shape {tuple(t.shape)}"
            )
    _check_norm_weight(op, weight, x)
    _check_no_overlap(op, "x", x, "residual", residual)
    _check_no_overlap(op, "x", x, "weight", weight)
    _check_no_overlap(op, "residual", residual, "weight", weight)


def _check_scale_tensor(op: str, name: str, scale: Tensor, x: Tensor) -> None:
    """The static scale or scale_ub: one float32 element on x's device."""
    _check_same_device(op, "x", x, name, scale)
    if scale.dtype != torch.float32:
        raise RuntimeError(
            f"{op}: {name} must be a float32 tensor but is {scale.dtype}; pass {name}.float()"
        )
    torch._check(
        scale.dim() <= 1 and scale.numel() == 1,
        lambda: (
            f"{op}: {name} must hold one element (shape [] or [1]) but has shape "
            f"{tuple(scale.shape)}; for one scale per row use the _dynamic op"
        ),
    )


def _check_rms_norm_fp8_inputs(
    op: str, x: Tensor, weight: Tensor, scale: Tensor | None, scale_ub: Tensor | None
) -> None:
    _check_norm_input(op, "x", x)
    _check_norm_weight(op, weight, x)
    for name, t in (("scale", scale), ("scale_ub", scale_ub)):
        if t is not None:
            _check_scale_tensor(op, name, t, x)


def _check_fp8_residual(
    op: str, x: Tensor, residual: Tensor, weight: Tensor, scale: Tensor | None
) -> None:
    """The fused FP8 ops' residual: like x, written in place, sharing no memory with inputs."""
    _check_same_device(op, "x", x, "residual", residual)
    _check_same_dtype(op, "x", x, "residual", residual)
    _check_same_shape(op, "x", x, "residual", residual)
    if not residual.is_contiguous():
        raise RuntimeError(
            f"{op}: residual is updated in place and must be contiguous, but got strides "
            f"{tuple(residual.stride())} for shape {tuple(residual.shape)}"
        )
    _check_no_overlap(op, "residual", residual, "x", x)
    _check_no_overlap(op, "residual", residual, "weight", weight)
    if scale is not None:
        _check_no_overlap(op, "residual", residual, "scale", scale)


def _fp8_outputs(x: Tensor, dynamic: bool) -> tuple[Tensor, Tensor | None]:
    out = torch.empty(x.shape, dtype=FP8_DTYPE, device=x.device)
    if not dynamic:
        return out, None
    return out, torch.empty((*x.shape[:-1], 1), dtype=torch.float32, device=x.device)


# ------------------------------------------------------------------------ fake kernels


@torch.library.register_fake("hotloop::muladd")
def _muladd_fake(a: Tensor, b: Tensor, c: float) -> Tensor:
    _check_elementwise_inputs("muladd", a, b)
    return torch.empty(a.shape, dtype=a.dtype, device=a.device)


@torch.library.register_fake("hotloop::mul")
def _mul_fake(a: Tensor, b: Tensor) -> Tensor:
    _check_elementwise_inputs("mul", a, b)
    return torch.empty(a.shape, dtype=a.dtype, device=a.device)


@torch.library.register_fake("hotloop::rms_norm")
def _rms_norm_fake(x: Tensor, weight: Tensor | None, eps: float) -> Tensor:
    _check_rms_norm_inputs("rms_norm", x, weight)
    # x's memory format (channels_last, a transpose), as torch's own norms keep it.
    return torch.empty_like(x, memory_format=torch.preserve_format)


@torch.library.register_fake("hotloop::rms_norm_backward")
def _rms_norm_backward_fake(
    grad_out: Tensor, x: Tensor, weight: Tensor | None, eps: float
) -> tuple[Tensor, Tensor]:
    _check_rms_norm_backward_inputs("rms_norm_backward", grad_out, x, weight)
    grad_x = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if weight is None:
        return grad_x, x.new_empty((0,))
    return grad_x, torch.empty(weight.shape, dtype=weight.dtype, device=weight.device)


@torch.library.register_fake("hotloop::fused_add_rms_norm")
def _fused_add_rms_norm_fake(x: Tensor, residual: Tensor, weight: Tensor, eps: float) -> None:
    _check_fused_add_rms_norm_inputs(x, residual, weight)


@torch.library.register_fake("hotloop::rms_norm_fp8")
def _rms_norm_fp8_fake(x: Tensor, weight: Tensor, scale: Tensor, eps: float) -> Tensor:
    _check_rms_norm_fp8_inputs("rms_norm_fp8", x, weight, scale, None)
    return _fp8_outputs(x, dynamic=False)[0]


@torch.library.register_fake("hotloop::rms_norm_fp8_dynamic")
def _rms_norm_fp8_dynamic_fake(
    x: Tensor, weight: Tensor, eps: float, scale_ub: Tensor | None = None
) -> tuple[Tensor, Tensor | None]:
    _check_rms_norm_fp8_inputs("rms_norm_fp8_dynamic", x, weight, None, scale_ub)
    return _fp8_outputs(x, dynamic=True)


@torch.library.register_fake("hotloop::fused_add_rms_norm_fp8")
def _fused_add_rms_norm_fp8_fake(
    x: Tensor, residual: Tensor, weight: Tensor, scale: Tensor, eps: float
) -> Tensor:
    op = "fused_add_rms_norm_fp8"
    _check_rms_norm_fp8_inputs(op, x, weight, scale, None)
    _check_fp8_residual(op, x, residual, weight, scale)
    return _fp8_outputs(x, dynamic=False)[0]


@torch.library.register_fake("hotloop::fused_add_rms_norm_fp8_dynamic")
def _fused_add_rms_norm_fp8_dynamic_fake(
    x: Tensor, residual: Tensor, weight: Tensor, eps: float, scale_ub: Tensor | None = None
) -> tuple[Tensor, Tensor | None]:
    op = "fused_add_rms_norm_fp8_dynamic"
    _check_rms_norm_fp8_inputs(op, x, weight, None, scale_ub)
    _check_fp8_residual(op, x, residual, weight, scale_ub)
    return _fp8_outputs(x, dynamic=True)


# ------------------------------------------------------------------------ autograd
# torch.library.register_autograd would do for eager and torch.compile, but the
# autograd.Function it generates has no setup_context, which torch.func (grad, vjp, vmap
# of either) refuses. These kernels do what it does, with Functions torch.func can run.

_LIB = torch.library.Library("hotloop", "IMPL")


# A single-level Function: the kind torch.func's own grad rule for autograd.Functions
# builds and applies. Applied inside an Autograd kernel it records on the tensors of the
# transform level that is running the kernel, as the C++ autograd kernels of torch's ops do.
# (torch.autograd.Function.apply would instead hand the Function to torch.func as a whole,
# through custom_function_call, which has no kernel below the transform running this one.)
_AutogradFunction = torch.autograd.function._SingleLevelFunction


def _register_autograd(name: str, function: type[_AutogradFunction]) -> None:
    op = getattr(torch.ops.hotloop, name).default

    def autograd_kernel(keyset: torch._C.DispatchKeySet, *args: Any) -> Any:
        if torch.is_grad_enabled() and torch._C._any_requires_grad(*args):
            apply = function.apply  # type: ignore[attr-defined]  # defined in C
            if not torch._C._are_functorch_transforms_active():
                return apply(*args)
            with enable_single_level_autograd_function():
                return apply(*args)
        with torch._C._AutoDispatchBelowAutograd():
            return op.redispatch(keyset & torch._C._after_autograd_keyset, *args)

    _LIB.impl(name, autograd_kernel, "Autograd", with_keyset=True)


class _MulFunction(_AutogradFunction):
    @staticmethod
    def forward(a: Tensor, b: Tensor) -> Tensor:
        return mul(a, b)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
        ctx.save_for_backward(*inputs[:2])

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, Tensor | None]:
        a, b = ctx.saved_tensors
        grad_a = mul(grad, b) if ctx.needs_input_grad[0] else None
        grad_b = mul(grad, a) if ctx.needs_input_grad[1] else None
        return grad_a, grad_b


class _MulAddFunction(_AutogradFunction):
    @staticmethod
    def forward(a: Tensor, b: Tensor, c: float) -> Tensor:
        return muladd(a, b, c)

    setup_context = _MulFunction.setup_context

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, Tensor | None, None]:
        return (*_MulFunction.backward(ctx, grad), None)


class _RmsNormFunction(_AutogradFunction):
    @staticmethod
    def forward(x: Tensor, weight: Tensor | None, eps: float) -> Tensor:
        return _RMS_NORM(x, weight, eps)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
        x, weight, eps = inputs
        ctx.save_for_backward(x, weight)
        ctx.eps = eps

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, Tensor | None, None]:
        x, weight = ctx.saved_tensors
        grad_x, grad_weight = torch.ops.hotloop.rms_norm_backward.default(grad, x, weight, ctx.eps)
        return grad_x, (grad_weight if weight is not None else None), None


class _RmsNormBackwardFunction(_AutogradFunction):
    """Without a formula autograd would pass silently through the backward op."""

    @staticmethod
    def forward(
        grad_out: Tensor, x: Tensor, weight: Tensor | None, eps: float
    ) -> tuple[Tensor, Tensor]:
        return torch.ops.hotloop.rms_norm_backward.default(grad_out, x, weight, eps)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        pass

    @staticmethod
    def backward(ctx: Any, *grads: Tensor) -> None:
        raise RuntimeError(
            "hotloop.rms_norm: the gradient of its gradient (double backward) is not implemented"
        )


_register_autograd("mul", _MulFunction)
_register_autograd("muladd", _MulAddFunction)
_register_autograd("rms_norm", _RmsNormFunction)
_register_autograd("rms_norm_backward", _RmsNormBackwardFunction)


# ------------------------------------------------------------------------ in place
# fused_add_rms_norm writes x and residual. torch's in-place ops (add_, copy_) get two
# things from their generated autograd code that an op defined in C++ without an autograd
# kernel lacks, so it gets them here, with torch's behaviour and messages:
# - Autograd: the check_inplace errors (a leaf that requires grad); and since the op has
#   no backward, an error whenever autograd would have to record it, rather than outputs
#   that silently carry no gradient;
# - ADInplaceOrView: the version-counter bump, which makes backward refuse tensors that
#   were saved and then overwritten ("modified by an inplace operation"), and the refusal
#   of inference tensors outside inference mode (this key still runs for them there).
#   torch.library.custom_op registers the same kernel for its mutable ops.
# Under torch.inference_mode() neither key is dispatched to, as for torch's ops.


def _bump_versions_in_place(op: str, *written: Tensor) -> None:
    """What ADInplaceOrView does for torch's in-place ops before they write."""
    if not torch.is_inference_mode_enabled() and any(t.is_inference() for t in written):
        # torch's version counter raises this for its own ops; increment_version below
        # skips inference tensors instead.
        raise RuntimeError(
            f"{op}: Inplace update to inference tensor outside InferenceMode is "
            "not allowed. You can make a clone to get a normal tensor before doing inplace "
            "update. See https://github.com/pytorch/rfcs/pull/17 for more details."
        )
    torch.autograd.graph.increment_version(written)


def _fused_add_rms_norm_inplace_or_view(
    keyset: torch._C.DispatchKeySet, x: Tensor, residual: Tensor, weight: Tensor, eps: float
) -> None:
    _bump_versions_in_place("fused_add_rms_norm", x, residual)
    with torch._C._AutoDispatchBelowADInplaceOrView():
        torch.ops.hotloop.fused_add_rms_norm.default.redispatch(
            keyset & torch._C._after_ADInplaceOrView_keyset, x, residual, weight, eps
        )


def _fused_add_rms_norm_autograd(
    keyset: torch._C.DispatchKeySet, x: Tensor, residual: Tensor, weight: Tensor, eps: float
) -> None:
    if torch.is_grad_enabled():
        for name, t in (("x", x), ("residual", residual)):
            if t.requires_grad and t.is_leaf:
                raise RuntimeError(
                    f"fused_add_rms_norm: {name}: a leaf Variable that requires grad is being "
                    "used in an in-place operation."
                )
        needing_grad = [
            n for n, t in (("x", x), ("residual", residual), ("weight", weight)) if t.requires_grad
        ]
        if needing_grad:
            raise RuntimeError(
                f"fused_add_rms_norm: {' and '.join(needing_grad)} requires grad, but the op is "
                "an inference op without a backward. Call it under torch.no_grad() or "
                "torch.inference_mode(), or for training write residual.add_(x) and "
                "x.copy_(hotloop.rms_norm(residual, weight, eps)), which autograd differentiates"
            )
    # The ADInplaceOrView step runs from here rather than as a second dispatch through
    # Python: each Python kernel adds about 25 us to a call (no_grad, CPU, torch 2.11).
    _fused_add_rms_norm_inplace_or_view(keyset, x, residual, weight, eps)


_LIB.impl("fused_add_rms_norm", _fused_add_rms_norm_autograd, "Autograd", with_keyset=True)
_LIB.impl(
    "fused_add_rms_norm",
    _fused_add_rms_norm_inplace_or_view,
    "ADInplaceOrView",
    with_keyset=True,
)


# ------------------------------------------------------------------------ inference ops
# The FP8 ops have no backward (a float8 output has no gradient worth the name): their
# Autograd kernels refuse inputs that require grad, with a message saying so, instead of
# outputs that silently carry no gradient. The fused ones write residual in place and get
# fused_add_rms_norm's bookkeeping for it (leaf check, version bump, inference tensors).


def _register_inference_op(name: str, arg_names: tuple[str, ...], written: str | None) -> None:
    op = getattr(torch.ops.hotloop, name).default

    def inplace_or_view(keyset: torch._C.DispatchKeySet, *args: Any) -> Any:
        target = args[arg_names.index(written)]
        if not torch.is_inference_mode_enabled() and target.is_inference():
            raise RuntimeError(
                f"{name}: Inplace update to inference tensor outside InferenceMode is not "
                "allowed. You can make a clone to get a normal tensor before doing inplace "
                "update. See https://github.com/pytorch/rfcs/pull/17 for more details."
            )
        torch.autograd.graph.increment_version(target)
        with torch._C._AutoDispatchBelowADInplaceOrView():
            return op.redispatch(keyset & torch._C._after_ADInplaceOrView_keyset, *args)

    def autograd(keyset: torch._C.DispatchKeySet, *args: Any) -> Any:
        if torch.is_grad_enabled():
            tensors = [(n, t) for n, t in zip(arg_names, args) if isinstance(t, Tensor)]
            for arg_name, t in tensors:
                if arg_name == written and t.requires_grad and t.is_leaf:
                    raise RuntimeError(
                        f"{name}: {arg_name}: a leaf Variable that requires grad is being "
                        "used in an in-place operation."
                    )
            needing_grad = [n for n, t in tensors if t.requires_grad]
            if needing_grad:
                raise RuntimeError(
                    f"{name}: {' and '.join(needing_grad)} requires grad, but the op is an "
                    "inference op without a backward (its output is float8). Call it under "
                    "torch.no_grad() or torch.inference_mode()"
                )
        if written is not None:
            return inplace_or_view(keyset, *args)
        with torch._C._AutoDispatchBelowAutograd():
            return op.redispatch(keyset & torch._C._after_autograd_keyset, *args)

    _LIB.impl(name, autograd, "Autograd", with_keyset=True)
    if written is not None:
        _LIB.impl(name, inplace_or_view, "ADInplaceOrView", with_keyset=True)


_register_inference_op("rms_norm_fp8", ("x", "weight", "scale", "eps"), None)
_register_inference_op("rms_norm_fp8_dynamic", ("x", "weight", "eps", "scale_ub"), None)
_register_inference_op(
    "fused_add_rms_norm_fp8", ("x", "residual", "weight", "scale", "eps"), "residual"
)
_register_inference_op(
    "fused_add_rms_norm_fp8_dynamic", ("x", "residual", "weight", "eps", "scale_ub"), "residual"
)


# ------------------------------------------------------------------------ vmap
# Batching rules: each gets the tensors with their batch dims (in_dims) and moves the
# batch to the front. The C++ kernels already take any number of leading dims, so with
# one weight for all samples a batch is just more rows. A batched weight (one per sample)
# is not something the kernels take: those cases compute in float32 (float64) from
# hotloop's weightless norm and torch ops, rounding once at the end as the kernels do.


def _batch_first(t: Tensor, bdim: int | None, batch_size: int) -> Tensor:
    if bdim is None:
        return t.expand(batch_size, *t.shape)
    return t.movedim(bdim, 0)


def _accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _per_row(weight: Tensor, x: Tensor) -> Tensor:
    """A (B, H) weight shaped to multiply a (B, ..., H) x row by row."""
    return weight.reshape(weight.shape[0], *([1] * (x.dim() - 2)), weight.shape[-1])


def _check_batched_norm_input(op: str, x: Tensor) -> None:
    """_check_norm_input for a sample of x, whose batch dim is the first."""
    if x.dim() < 2:
        raise RuntimeError(
            f"{op}: expected x to have at least 1 dimension (the normalised one) "
            "but got a 0-dim tensor"
        )
    _check_floating(op, "x", x)


def _rms_norm_batched_weight(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    acc = _accumulation_dtype(x.dtype)
    normed = torch.ops.hotloop.rms_norm.default(x.to(acc), None, eps)
    return (normed * _per_row(weight, x).to(acc)).to(x.dtype)


def _sum_rows(t: Tensor) -> Tensor:
    """(B, ..., H) -> (B, H): the sum over every row of each sample."""
    row_dims = tuple(range(1, t.dim() - 1))
    return t.sum(row_dims) if row_dims else t


@torch.library.register_vmap("hotloop::muladd")
def _muladd_vmap(
    info: Any, in_dims: Sequence[int | None], a: Tensor, b: Tensor, c: float
) -> tuple[Tensor, int]:
    a_dim, b_dim, _ = in_dims
    a, b = _batch_first(a, a_dim, info.batch_size), _batch_first(b, b_dim, info.batch_size)
    return muladd(a, b, c), 0


@torch.library.register_vmap("hotloop::mul")
def _mul_vmap(info: Any, in_dims: Sequence[int | None], a: Tensor, b: Tensor) -> tuple[Tensor, int]:
    a_dim, b_dim = in_dims
    a, b = _batch_first(a, a_dim, info.batch_size), _batch_first(b, b_dim, info.batch_size)
    return mul(a, b), 0


@torch.library.register_vmap("hotloop::rms_norm")
def _rms_norm_vmap(
    info: Any, in_dims: Sequence[int | None], x: Tensor, weight: Tensor | None, eps: float
) -> tuple[Tensor, int]:
    x_dim, weight_dim, _ = in_dims
    x = _batch_first(x, x_dim, info.batch_size)
    if weight is None or weight_dim is None:
        return _RMS_NORM(x, weight, eps), 0
    weight = weight.movedim(weight_dim, 0)
    _check_batched_norm_input("rms_norm", x)
    _check_norm_weight("rms_norm", weight, x, batched=True)
    return _rms_norm_batched_weight(x, weight, eps), 0


@torch.library.register_vmap("hotloop::rms_norm_backward")
def _rms_norm_backward_vmap(
    info: Any,
    in_dims: Sequence[int | None],
    grad_out: Tensor,
    x: Tensor,
    weight: Tensor | None,
    eps: float,
) -> tuple[tuple[Tensor, Tensor], tuple[int, int | None]]:
    grad_dim, x_dim, weight_dim, _ = in_dims
    op = "rms_norm_backward"
    grad_out = _batch_first(grad_out, grad_dim, info.batch_size)
    x = _batch_first(x, x_dim, info.batch_size)
    if weight is None:
        grad_x, no_grad_weight = torch.ops.hotloop.rms_norm_backward.default(grad_out, x, None, eps)
        return (grad_x, no_grad_weight), (0, None)
    # Each sample's weight gradient is a sum over that sample's rows only, which the
    # kernel (one sum over all rows) does not give: it is computed here.
    if weight_dim is None:
        grad_x, _ = torch.ops.hotloop.rms_norm_backward.default(grad_out, x, weight, eps)
        weight_rows = weight.expand(info.batch_size, *weight.shape)
    else:
        weight_rows = weight.movedim(weight_dim, 0)
        _check_batched_norm_input(op, x)
        _check_same_device(op, "x", x, "grad_out", grad_out)
        _check_same_dtype(op, "x", x, "grad_out", grad_out)
        _check_same_shape(op, "x", x, "grad_out", grad_out)
        _check_norm_weight(op, weight_rows, x, batched=True)
    acc = _accumulation_dtype(x.dtype)
    x_acc, grad_acc = x.to(acc), grad_out.to(acc)
    rstd = torch.rsqrt(x_acc.pow(2).mean(-1, keepdim=True) + eps)
    x_hat = x_acc * rstd
    grad_weight = _sum_rows(grad_acc * x_hat).to(weight.dtype)
    if weight_dim is not None:
        # grad_x = rstd * (g - x_hat * mean(g * x_hat)), g = grad_out * weight
        g = grad_acc * _per_row(weight_rows, x).to(acc)
        grad_x = (rstd * (g - x_hat * (g * x_hat).mean(-1, keepdim=True))).to(x.dtype)
    return (grad_x, grad_weight), (0, 0)


@torch.library.register_vmap("hotloop::fused_add_rms_norm")
def _fused_add_rms_norm_vmap(
    info: Any,
    in_dims: Sequence[int | None],
    x: Tensor,
    residual: Tensor,
    weight: Tensor,
    eps: float,
) -> tuple[None, None]:
    x_dim, residual_dim, weight_dim, _ = in_dims
    if x_dim is None or residual_dim is None:
        unbatched = [n for n, d in (("x", x_dim), ("residual", residual_dim)) if d is None]
        # torch's in-place ops refuse the same ("vmap: inplace arithmetic(self, *extra_args)
        # is not possible ..."): one tensor would receive a different value per sample.
        raise RuntimeError(
            f"vmap: fused_add_rms_norm writes x and residual in place, so both must be "
            f"batched, but {' and '.join(unbatched)} is not while another argument is: every "
            "sample would write its own result into the same memory. Give the unbatched "
            "tensor a batch dimension (e.g. t.expand(B, *t.shape).clone()) before vmap"
        )
    x_rows, residual_rows = x.movedim(x_dim, 0), residual.movedim(residual_dim, 0)
    if weight_dim is not None:
        weight_rows = weight.movedim(weight_dim, 0)
        op = "fused_add_rms_norm"
        _check_batched_norm_input(op, x_rows)
        _check_same_device(op, "x", x_rows, "residual", residual_rows)
        _check_same_dtype(op, "x", x_rows, "residual", residual_rows)
        _check_same_shape(op, "x", x_rows, "residual", residual_rows)
        _check_norm_weight(op, weight_rows, x_rows, batched=True)
        # The op's definition, unfused: residual += x rounded to the dtype (torch's add_
        # adds in float32 too), then the norm of that rounded residual.
        residual_rows.add_(x_rows)
        x_rows.copy_(_rms_norm_batched_weight(residual_rows, weight_rows, eps))
        return None, None
    if x_rows.is_contiguous() and residual_rows.is_contiguous():
        fused_add_rms_norm(x_rows, residual_rows, weight, eps)
        return None, None
    # The kernel writes contiguous memory only; a batch dim that is not the outermost
    # one gets contiguous copies, written back afterwards.
    x_copy, residual_copy = x_rows.contiguous(), residual_rows.contiguous()
    fused_add_rms_norm(x_copy, residual_copy, weight, eps)
    x_rows.copy_(x_copy)
    residual_rows.copy_(residual_copy)
    return None, None


# The FP8 ops take one weight and one scale (or scale_ub) for every row: a batch of x is more
# rows. A weight or scale per sample is not something the kernels take, and emulating it would
# round differently from them: those calls are refused.


def _padded(in_dims: Sequence[int | None], count: int) -> tuple[int | None, ...]:
    """in_dims for all `count` arguments: vmap leaves out trailing defaulted ones (scale_ub)."""
    return (*in_dims, *[None] * (count - len(in_dims)))


def _refuse_batched(op: str, in_dims: Sequence[int | None], names: Sequence[str]) -> None:
    batched = [n for n, d in zip(names, in_dims) if d is not None]
    if batched:
        raise RuntimeError(
            f"vmap: {op} takes one {' and one '.join(names)} for all samples, but "
            f"{' and '.join(batched)} is batched; call {op} once per sample's "
            f"{' and '.join(batched)} instead"
        )


@torch.library.register_vmap("hotloop::rms_norm_fp8")
def _rms_norm_fp8_vmap(
    info: Any, in_dims: Sequence[int | None], x: Tensor, weight: Tensor, scale: Tensor, eps: float
) -> tuple[Tensor, int]:
    _refuse_batched("rms_norm_fp8", in_dims[1:3], ("weight", "scale"))
    return rms_norm_fp8(_batch_first(x, in_dims[0], info.batch_size), weight, scale, eps), 0


@torch.library.register_vmap("hotloop::rms_norm_fp8_dynamic")
def _rms_norm_fp8_dynamic_vmap(
    info: Any,
    in_dims: Sequence[int | None],
    x: Tensor,
    weight: Tensor,
    eps: float,
    scale_ub: Tensor | None = None,
) -> tuple[tuple[Tensor, Tensor], tuple[int, int]]:
    in_dims = _padded(in_dims, 4)
    _refuse_batched("rms_norm_fp8_dynamic", (in_dims[1], in_dims[3]), ("weight", "scale_ub"))
    x = _batch_first(x, in_dims[0], info.batch_size)
    return rms_norm_fp8_dynamic(x, weight, eps, scale_ub), (0, 0)


def _fused_fp8_rows(
    op: str, info: Any, in_dims: Sequence[int | None], x: Tensor, residual: Tensor
) -> tuple[Tensor, Tensor]:
    """x and residual with the batch first; residual must be batched (it is written)."""
    if in_dims[1] is None:
        raise RuntimeError(
            f"vmap: {op} writes residual in place, so it must be batched, but it is not while "
            "x is: every sample would write its own result into the same memory. Give residual "
            "a batch dimension (e.g. residual.expand(B, *residual.shape).clone()) before vmap"
        )
    return _batch_first(x, in_dims[0], info.batch_size), residual.movedim(in_dims[1], 0)


def _run_fused_fp8(residual_rows: Tensor, run: Any) -> Any:
    """run(residual) on residual_rows, through a contiguous copy where the batch dim is not
    the outermost one (the kernel writes contiguous memory only)."""
    if residual_rows.is_contiguous():
        return run(residual_rows)
    residual_copy = residual_rows.contiguous()
    result = run(residual_copy)
    residual_rows.copy_(residual_copy)
    return result


@torch.library.register_vmap("hotloop::fused_add_rms_norm_fp8")
def _fused_add_rms_norm_fp8_vmap(
    info: Any,
    in_dims: Sequence[int | None],
    x: Tensor,
    residual: Tensor,
    weight: Tensor,
    scale: Tensor,
    eps: float,
) -> tuple[Tensor, int]:
    op = "fused_add_rms_norm_fp8"
    _refuse_batched(op, in_dims[2:4], ("weight", "scale"))
    x_rows, residual_rows = _fused_fp8_rows(op, info, in_dims, x, residual)
    out = _run_fused_fp8(
        residual_rows, lambda r: fused_add_rms_norm_fp8(x_rows, r, weight, scale, eps)
    )
    return out, 0


@torch.library.register_vmap("hotloop::fused_add_rms_norm_fp8_dynamic")
def _fused_add_rms_norm_fp8_dynamic_vmap(
    info: Any,
    in_dims: Sequence[int | None],
    x: Tensor,
    residual: Tensor,
    weight: Tensor,
    eps: float,
    scale_ub: Tensor | None = None,
) -> tuple[tuple[Tensor, Tensor], tuple[int, int]]:
    op = "fused_add_rms_norm_fp8_dynamic"
    in_dims = _padded(in_dims, 5)
    _refuse_batched(op, (in_dims[2], in_dims[4]), ("weight", "scale_ub"))
    x_rows, residual_rows = _fused_fp8_rows(op, info, in_dims, x, residual)
    outputs = _run_fused_fp8(
        residual_rows, lambda r: fused_add_rms_norm_fp8_dynamic(x_rows, r, weight, eps, scale_ub)
    )
    return outputs, (0, 0)
