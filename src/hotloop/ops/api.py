"""The Python API of hotloop's operators and the constants that describe them."""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import Tensor
from torch.autograd import forward_ad

from hotloop._arithmetic import rms_norm_arithmetic, traced_as_arithmetic
from hotloop._casting import FLOATING_DTYPES, GEMMA, LLAMA, casting_index
from hotloop._grad_ownership import GradOverwritingFunction, engine_alone_holders

try:
    from hotloop import triton_rms_norm
except ImportError as err:  # Triton ships with CUDA builds of torch only
    triton_rms_norm = None  # type: ignore[assignment]
    _TRITON_MISSING: ImportError | None = err


# "native" is hotloop's C++ kernels for x's device (CPU or CUDA), "triton" the Triton ones.
BACKENDS = ("native", "triton")
# Until 0.1.0 the native kernels of a CUDA tensor were also called "cuda": the same code
# under a device's name, which said nothing for CPU tensors. Still accepted, with a warning,
# so that code written against 0.1.0 keeps running for one more release.
_DEPRECATED_BACKENDS = {"cuda": "native"}
# The backend `rms_norm` uses for CUDA tensors when none is named, on every GPU and width.
# Measured on an H100 and an H200 (benchmarks/results/rms_norm*.json, NOTES.md runs 70-71):
# the Triton kernels are faster at odd 2048-blocks (2047: 83-93 against 63-84 % of copy
# forward) and, on the H100, 1-4 points faster forward+backward at 512-8192, but an eager
# Triton call costs 3-6x F.rms_norm's host time (0.3-0.7 ms a forward+backward step, which
# left the GPU waiting at the headline shape on the H200), more than those kernels save.
DEFAULT_CUDA_BACKEND = "native"

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
# The op's C++ entry without OpOverload.__call__'s Python frame around it, for the eager
# calls below that no tracer sees (0.3-0.4 us of a decode-sized call's host time on the CPU
# here); Dynamo traces _RMS_NORM itself.
_RMS_NORM_EAGER = _RMS_NORM._op


def rms_norm(
    x: Tensor,
    weight: Tensor | None = None,
    eps: float | None = None,
    backend: str | None = None,
    *,
    casting: str = "torch",
    offset: float = 0.0,
    in_place_backward: bool = False,
) -> Tensor:
    """RMSNorm over the last dimension, as ``torch.nn.functional.rms_norm(x, (H,), weight, eps)``.

    ``eps=None`` takes the machine epsilon of the dtype the norm is computed in, float32
    (float64 for float64 x), as torch does. A ``weight`` of another floating dtype (float32
    master weights with bfloat16 activations) gives what torch gives: x's dtype, the weight
    applied in float32 (or the weight's wider dtype) and one rounding, and gradients in each
    input's own dtype. ``backend`` picks the kernels: "native" (hotloop's C++ kernels for x's
    device), "triton", or None for the fastest one available for x's device.

    ``casting`` says where the result is rounded to x's dtype, by the model whose bits it
    reproduces (:data:`hotloop.ops.CASTINGS`): "torch" (the default, ``torch.nn.RMSNorm``:
    once, at the end), "llama" (transformers' ``LlamaRMSNorm`` and its copies: the
    normalised value is rounded before the weight multiplies it) or "gemma"
    (``GemmaRMSNorm``: times ``offset + weight``, all in float32, rounded once; Gemma's
    ``offset`` is 1.0, which only "gemma" takes). With a weight of another dtype, "llama"
    returns ``weight * rms_norm(x)`` in the promoted dtype, as ``LlamaRMSNorm`` does, and
    "gemma" applies the weight in float32, as ``GemmaRMSNorm`` does.

    ``in_place_backward=True``: an eager backward writes grad_x over the gradient it
    receives wherever only autograd's engine holds that gradient, which saves one x-sized
    buffer at the norm's backward; where anything else holds it (a fan-out such as
    ``x + rms_norm(x)``, the caller, a hook) the usual backward runs
    (hotloop._grad_ownership says how it tells). Compiled and torch.func calls take the
    usual backward, and so do a backward that compiled autograd traces and one that builds
    a graph (``create_graph``); the in-place one is not differentiable again. Every backend
    takes it (the native ones through ``torch.ops.hotloop.rms_norm_backward_``).

    torch.compile traces the mode's arithmetic in torch ops, which Inductor fuses with its
    neighbours, and torch.export hotloop's op (which an AOTInductor package then calls);
    :func:`hotloop.set_compile_arithmetic` sets either way for both (every backend; eager
    calls run the kernels either way).
    """
    if x is None:  # before x.dtype below, which would fail without naming the op
        raise _missing_tensor("rms_norm", "x")
    mode = casting_index("rms_norm", casting, offset)
    if eps is None:
        eps = default_eps(x)
    if weight is not None and weight.dtype != x.dtype and _both_floating(x, weight):
        return _rms_norm_mixed(x, weight, eps, backend, mode, offset, in_place_backward)
    # (Without a backend, a comparison of constants tells that the native kernels run.)
    if (backend is not None or DEFAULT_CUDA_BACKEND != "native") and _pick_backend(
        x, backend
    ) == "triton":
        if triton_rms_norm is None:
            raise RuntimeError(
                f"rms_norm(backend='triton'): Triton can't be imported ({_TRITON_MISSING}); "
                "install a CUDA build of torch, which brings Triton"
            )
        return triton_rms_norm.rms_norm(x, weight, eps, mode, offset, in_place_backward)
    # The native kernels. The tests below are ordered by the calls that need fewest of them,
    # since a decode-sized call is host-bound and F.rms_norm's host time is the bar: under
    # torch.compile (Dynamo traces the op's own path, and cannot trace the torch._C calls;
    # or the mode's arithmetic, which only a traced call asks about), then inference mode
    # (the dispatcher skips Autograd kernels by itself), then calls with nothing for
    # autograd to record.
    if torch.compiler.is_compiling():
        if traced_as_arithmetic(x, weight, mode, offset):
            return rms_norm_arithmetic(x, weight, eps, mode, offset)
        return _RMS_NORM(x, weight, eps, mode, offset)
    if torch.is_inference_mode_enabled():
        return _RMS_NORM_EAGER(x, weight, eps, mode, offset)
    if _records_nothing(x, weight):
        with torch._C._AutoDispatchBelowAutograd():
            return _RMS_NORM_EAGER(x, weight, eps, mode, offset)
    if not _plain_eager_call(x, weight):
        return _RMS_NORM(x, weight, eps, mode, offset)
    if in_place_backward:
        engine_alone_holders()  # measured here, before any backward needs it
        y_in_place: Tensor = _EagerRmsNormInPlace.apply(x, weight, eps, mode, offset)
        return y_in_place
    y: Tensor = _EagerRmsNorm.apply(x, weight, eps, mode, offset)
    return y


_RMS_NORM_BACKWARD = torch.ops.hotloop.rms_norm_backward.default
_RMS_NORM_BACKWARD_IN_PLACE = torch.ops.hotloop.rms_norm_backward_.default


def _plain_eager_call(x: Tensor, weight: Tensor | None) -> bool:
    """Whether a call that needs gradients can take _EagerRmsNorm: plain tensors, called
    eagerly, with nothing that has to see the op's Autograd kernel (torch.compile or
    another tracer, a torch.func transform, forward-mode AD, a dispatch or torch-function
    mode)."""
    return (
        not torch.compiler.is_compiling()  # first: under Dynamo this ends the test
        and type(x) is Tensor
        and (weight is None or type(weight) is Tensor)
        and not torch._C._len_torch_dispatch_stack()
        and not torch._C._is_torch_function_mode_enabled()
        and not torch._C._are_functorch_transforms_active()
        and forward_ad._current_level < 0
    )


def _eager_forward(
    ctx: Any, x: Tensor, weight: Tensor | None, eps: float, mode: int, offset: float
) -> Tensor:
    """The forward of the eager Functions below: what their backward needs saved, and the
    forward op below autograd."""
    ctx.save_for_backward(x, weight)
    ctx.mode = (eps, mode, offset)
    with torch._C._AutoDispatchBelowAutograd():
        return _RMS_NORM_EAGER(x, weight, eps, mode, offset)


class _EagerRmsNorm(torch.autograd.Function):
    """What the op's Autograd kernel (hotloop.ops.autograd) records for an eager call that
    needs gradients, without the dispatcher's trips through Python around it: the op's
    Autograd kernel is a Python function the dispatcher enters for the forward, again for
    the forward op that Function calls, and for the backward op (about 70 us of a
    decode-sized forward+backward's 160 on an H100, against F.rms_norm's 93;
    benchmarks/NOTES.md). Both ops run below autograd, as that kernel runs them."""

    @staticmethod
    def forward(
        ctx: Any, x: Tensor, weight: Tensor | None, eps: float, mode: int, offset: float
    ) -> Tensor:
        return _eager_forward(ctx, x, weight, eps, mode, offset)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        return _eager_backward(ctx, grad)


def _eager_backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
    """The eager Functions' gradients: the backward op on what _eager_forward saved, below
    autograd where nothing records.

    With create_graph the backward op's Function records. Where Dynamo traces this backward
    (compiled autograd) the op is called as it is, a node of the graph: Dynamo before torch
    2.15 cannot trace the guard (it graph-breaks on it with a warning)."""
    x, weight = ctx.saved_tensors
    if torch.is_grad_enabled() or torch.compiler.is_compiling():
        grad_x, grad_weight = _RMS_NORM_BACKWARD(grad, x, weight, *ctx.mode)
    else:
        with torch._C._AutoDispatchBelowAutograd():
            grad_x, grad_weight = _RMS_NORM_BACKWARD(grad, x, weight, *ctx.mode)
    return grad_x, (grad_weight if weight is not None else None), None, None, None


class _EagerRmsNormInPlace(GradOverwritingFunction):
    """_EagerRmsNorm with the in-place backward: grad_x is written over the gradient received
    wherever only autograd's engine holds it (hotloop._grad_ownership), by the backward op's
    in-place twin; elsewhere the backward op runs as usual."""

    @staticmethod
    def forward(
        ctx: Any, x: Tensor, weight: Tensor | None, eps: float, mode: int, offset: float
    ) -> Tensor:
        GradOverwritingFunction.setup(ctx, True)
        return _eager_forward(ctx, x, weight, eps, mode, offset)

    @staticmethod
    def backward_writing(ctx: Any, grad: Tensor, writable: bool) -> tuple[Tensor | None, ...]:
        if not writable:
            return _eager_backward(ctx, grad)
        x, weight = ctx.saved_tensors
        # Below ADInplaceOrView: GradOverwritingFunction bumps grad's version after the write.
        with torch._C._AutoDispatchBelowADInplaceOrView():
            grad_weight = _RMS_NORM_BACKWARD_IN_PLACE(grad, x, weight, *ctx.mode)
        return grad, (grad_weight if weight is not None else None), None, None, None


def default_eps(x: Tensor) -> float:
    """torch's eps for ``eps=None``: that of the dtype it computes in, not x's own.

    (rms_norm_composite's opmath type: float32 for float16 and bfloat16 x. bfloat16's own,
    0.0078, would swamp the mean of squares of small activations.) A non-floating x gets
    0.0: the op refuses it with its own message, which under torch.compile comes from the
    fake kernel (raising here would surface as Dynamo's "Observed exception" instead).
    """
    if not x.is_floating_point():
        return 0.0
    return _EPS_FLOAT64 if x.dtype == torch.float64 else _EPS_FLOAT32


_EPS_FLOAT32 = torch.finfo(torch.float32).eps
_EPS_FLOAT64 = torch.finfo(torch.float64).eps


def _both_floating(x: Tensor, weight: Tensor) -> bool:
    return x.dtype in FLOATING_DTYPES and weight.dtype in FLOATING_DTYPES


def _rms_norm_mixed(
    x: Tensor,
    weight: Tensor,
    eps: float,
    backend: str | None,
    mode: int,
    offset: float,
    in_place_backward: bool,
) -> Tensor:
    """rms_norm for a weight whose dtype is not x's, computed as the mode's model computes it.

    torch (rms_norm_composite, 2.11 to 2.15) normalises x in float32 (float64 for float64
    x), multiplies by the weight in the promoted dtype and rounds once to x's dtype. The
    kernels do the same on x in that dtype; autograd through the casts then gives x's
    gradient in x's dtype and the weight's in the weight's (float32 master weights keep
    their precision). LlamaRMSNorm returns ``weight * x_hat.to(x.dtype)``, in the promoted
    dtype; GemmaRMSNorm multiplies by ``1 + weight.float()`` and rounds once to x's dtype.
    """
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    in_place = in_place_backward
    if mode == LLAMA:
        return weight * rms_norm(x, None, eps, backend, in_place_backward=in_place)
    if mode == GEMMA:
        y = rms_norm(
            x.to(acc),
            weight.to(acc),
            eps,
            backend,
            casting="gemma",
            offset=offset,
            in_place_backward=in_place,
        )
    elif torch.promote_types(acc, weight.dtype) == acc:
        y = rms_norm(x.to(acc), weight.to(acc), eps, backend, in_place_backward=in_place)
    else:  # a float64 weight with a narrower x: normalised in float32, weighted in float64
        y = rms_norm(x.to(acc), None, eps, backend, in_place_backward=in_place) * weight
    return y.to(x.dtype)


def fused_add_rms_norm(
    x: Tensor,
    residual: Tensor,
    weight: Tensor,
    eps: float = 1e-6,
    *,
    casting: str = "torch",
    offset: float = 0.0,
) -> None:
    """In place: ``residual += x``, then ``x = rms_norm(residual) * weight``.

    The inference step between two transformer blocks, in one pass over memory. It has no
    backward: call it under ``torch.no_grad()`` or ``torch.inference_mode()``. ``casting``
    and ``offset`` are :func:`rms_norm`'s: the op equals ``residual.add_(x);
    x.copy_(rms_norm(residual, weight, eps, casting=casting, offset=offset))``.
    """
    mode = casting_index("fused_add_rms_norm", casting, offset)
    if _autograd_has_nothing_to_do(x, residual, weight):
        _bump_versions_in_place("fused_add_rms_norm", ("x", x), ("residual", residual))
        with torch._C._AutoDispatchBelowADInplaceOrView():
            torch.ops.hotloop.fused_add_rms_norm.default(x, residual, weight, eps, mode, offset)
        return
    torch.ops.hotloop.fused_add_rms_norm.default(x, residual, weight, eps, mode, offset)


def rms_norm_fp8(
    x: Tensor,
    weight: Tensor,
    scale: Tensor,
    eps: float = 1e-6,
    *,
    casting: str = "torch",
    offset: float = 0.0,
) -> Tensor:
    """RMSNorm quantised to float8_e4m3fn with a static per-tensor scale, for FP8 GEMMs.

    ``out = e4m3(rms_norm(x) * weight / scale)``: the norm in float32 (float64 for
    float64 x), the division as a multiplication by ``1 / scale`` formed in float32, then
    rounded to nearest even and saturated to +-448. ``scale`` is a float32 tensor of one
    element on x's device (read there: no host synchronisation); ``out.float() * scale``
    dequantises. CUDA needs compute capability 8.9 or newer. Inference only: no backward.

    ``casting`` and ``offset`` are :func:`rms_norm`'s, in all four FP8 ops: ``y`` is the
    mode's before its rounding to x's dtype, which the quantisation replaces
    (``x_hat * weight`` for "torch", ``x_hat`` rounded to x's dtype times ``weight`` for
    "llama", ``x_hat * (offset + weight)`` for "gemma"; ``x_hat = x * rstd`` in float32).
    """
    mode = casting_index("rms_norm_fp8", casting, offset)
    return torch.ops.hotloop.rms_norm_fp8.default(x, weight, scale, eps, mode, offset)


def rms_norm_fp8_dynamic(
    x: Tensor,
    weight: Tensor,
    eps: float = 1e-6,
    scale_ub: Tensor | None = None,
    *,
    casting: str = "torch",
    offset: float = 0.0,
) -> tuple[Tensor, Tensor]:
    """RMSNorm quantised to float8_e4m3fn with one scale per row (per token).

    Returns ``(out, scales)``: ``scales`` is float32 of shape ``x.shape[:-1] + (1,)``,
    ``scales = max(min(max|y_row|, scale_ub) / 448, 1 / (448 * 512))`` with ``y`` the
    normalised row times ``weight``; the floor keeps a row of zeros from a zero scale.
    ``out = e4m3(y / scales)`` as in :func:`rms_norm_fp8`; values above ``scale_ub``
    saturate. ``out.float() * scales`` dequantises. ``casting`` and ``offset`` as in
    :func:`rms_norm_fp8`; the weight in ``max|y_row|`` is the one that multiplies
    (``offset + weight`` for "gemma"), and it is formed as ``rstd * max|x * weight|``, so
    "llama"'s rounding of ``x_hat`` stays out of the scale.
    """
    mode = casting_index("rms_norm_fp8_dynamic", casting, offset)
    out, scales = torch.ops.hotloop.rms_norm_fp8_dynamic.default(
        x, weight, eps, scale_ub, mode, offset
    )
    return out, scales


def fused_add_rms_norm_fp8(
    x: Tensor,
    residual: Tensor,
    weight: Tensor,
    scale: Tensor,
    eps: float = 1e-6,
    *,
    casting: str = "torch",
    offset: float = 0.0,
) -> Tensor:
    """In place ``residual += x``, then :func:`rms_norm_fp8` of the new residual.

    The step between two transformer blocks feeding an FP8 GEMM, in one pass over memory:
    equals ``residual.add_(x); rms_norm_fp8(residual, weight, scale, eps)``. x is only
    read. Call it under ``torch.no_grad()`` or ``torch.inference_mode()``. ``casting`` and
    ``offset`` as in :func:`rms_norm_fp8`.
    """
    mode = casting_index("fused_add_rms_norm_fp8", casting, offset)
    return torch.ops.hotloop.fused_add_rms_norm_fp8.default(
        x, residual, weight, scale, eps, mode, offset
    )


def fused_add_rms_norm_fp8_dynamic(
    x: Tensor,
    residual: Tensor,
    weight: Tensor,
    eps: float = 1e-6,
    scale_ub: Tensor | None = None,
    *,
    casting: str = "torch",
    offset: float = 0.0,
) -> tuple[Tensor, Tensor]:
    """In place ``residual += x``, then :func:`rms_norm_fp8_dynamic` of the new residual."""
    mode = casting_index("fused_add_rms_norm_fp8_dynamic", casting, offset)
    out, scales = torch.ops.hotloop.fused_add_rms_norm_fp8_dynamic.default(
        x, residual, weight, eps, scale_ub, mode, offset
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
    return not torch.compiler.is_compiling() and _records_nothing(*tensors)


def _records_nothing(*tensors: Tensor | None) -> bool:
    """_autograd_has_nothing_to_do for a caller that has ruled out torch.compile itself."""
    if torch.is_grad_enabled() and torch._C._any_requires_grad(*tensors):
        return False
    return not torch._C._are_functorch_transforms_active() and not _forward_ad_active()


def _forward_ad_active() -> bool:
    """Whether forward-mode AD may see the call: inside a dual level (torch.func.jvp,
    jacfwd and hessian enter one too) with forward grads enabled, which a custom
    Function's forward turns off for the calls it makes."""
    return forward_ad._current_level >= 0 and torch._C._is_fwd_grad_enabled()


def _dual_arguments(names: tuple[str, ...], args: tuple[Any, ...]) -> list[str]:
    """The names of the arguments that carry a forward-mode tangent."""
    return [
        name
        for name, a in zip(names, args)
        if isinstance(a, Tensor) and forward_ad.unpack_dual(a).tangent is not None
    ]


def _missing_tensor(op: str, name: str) -> RuntimeError:
    """The error for None given for a required tensor (the kernels' check_defined)."""
    return RuntimeError(
        f"{op}: expected a tensor for {name} but got None (or an undefined tensor); "
        f"{name} is required"
    )


def _refuse_none(op: str, *named: tuple[str, Tensor | None]) -> None:
    """For the Python kernels that run before the C++ ones and use their tensors first."""
    for name, t in named:
        if t is None:
            raise _missing_tensor(op, name)


def _bump_versions_in_place(op: str, *written: tuple[str, Tensor]) -> None:
    """What ADInplaceOrView does for torch's in-place ops before they write."""
    _refuse_none(op, *written)
    if not torch.is_inference_mode_enabled() and any(t.is_inference() for _, t in written):
        # torch's version counter raises this for its own ops; increment_version below
        # skips inference tensors instead.
        raise RuntimeError(
            f"{op}: Inplace update to inference tensor outside InferenceMode is "
            "not allowed. You can make a clone to get a normal tensor before doing inplace "
            "update. See https://github.com/pytorch/rfcs/pull/17 for more details."
        )
    torch.autograd.graph.increment_version([t for _, t in written])
