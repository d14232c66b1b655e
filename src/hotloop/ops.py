"""Python API of hotloop's operators, with their fake kernels and autograd formulas.

The C++/CUDA kernels register the ops (schemas in csrc/hotloop.cpp); this module adds
what the dispatcher needs from Python: fake (meta) kernels so that torch.compile and
torch.export trace the ops without running them, and backward formulas.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

try:
    from hotloop import triton_rms_norm
except ImportError as err:  # Triton ships with CUDA builds of torch only
    triton_rms_norm = None  # type: ignore[assignment]
    _TRITON_MISSING: ImportError | None = err

__all__ = ["fused_add_rms_norm", "mul", "muladd", "rms_norm"]

BACKENDS = ("native", "cuda", "triton")
# The backend `rms_norm` uses for CUDA tensors when none is named: the faster one in
# benchmarks/results/rms_norm.json.
DEFAULT_CUDA_BACKEND = "cuda"


def muladd(a: Tensor, b: Tensor, c: float) -> Tensor:
    """a * b + c, elementwise."""
    return torch.ops.hotloop.muladd.default(a, b, c)


def mul(a: Tensor, b: Tensor) -> Tensor:
    """a * b, elementwise."""
    return torch.ops.hotloop.mul.default(a, b)


def _check_floating(name: str, x: Tensor) -> None:
    if not x.is_floating_point():
        raise ValueError(
            f"{name}: expected a floating-point tensor (float16, bfloat16, float32, float64) "
            f"but got {x.dtype}"
        )


def _pick_backend(x: Tensor, backend: str | None) -> str:
    if backend is not None and backend not in BACKENDS:
        raise ValueError(f"rms_norm: backend must be one of {BACKENDS} or None, got {backend!r}")
    if backend is None:
        return DEFAULT_CUDA_BACKEND if x.is_cuda else "native"
    if backend == "cuda" and not x.is_cuda:
        raise ValueError(
            f"rms_norm(backend='cuda'): x is on {x.device}; pass a CUDA tensor, "
            "or backend=None to use the kernel for x's device"
        )
    return backend


def rms_norm(
    x: Tensor,
    weight: Tensor | None = None,
    eps: float | None = None,
    backend: str | None = None,
) -> Tensor:
    """RMSNorm over the last dimension, as ``torch.nn.functional.rms_norm(x, (H,), weight, eps)``.

    ``eps=None`` takes ``torch.finfo(x.dtype).eps`` like torch does. ``backend`` picks the
    kernels: "native" (C++ for x's device), "cuda" (the same, x must be on a GPU), "triton",
    or None for the fastest one available for x's device.
    """
    _check_floating("rms_norm", x)
    if eps is None:
        eps = torch.finfo(x.dtype).eps
    if _pick_backend(x, backend) == "triton":
        if triton_rms_norm is None:
            raise RuntimeError(
                f"rms_norm(backend='triton'): Triton can't be imported ({_TRITON_MISSING}); "
                "install a CUDA build of torch, which brings Triton"
            )
        return triton_rms_norm.rms_norm(x, weight, eps)
    return torch.ops.hotloop.rms_norm.default(x, weight, eps)


def fused_add_rms_norm(x: Tensor, residual: Tensor, weight: Tensor, eps: float = 1e-6) -> None:
    """In place: ``residual += x``, then ``x = rms_norm(residual) * weight``.

    The inference step between two transformer blocks, in one pass over memory.
    """
    torch.ops.hotloop.fused_add_rms_norm.default(x, residual, weight, eps)


def _check_same_shape(name: str, a: Tensor, b: Tensor) -> None:
    torch._check(
        a.shape == b.shape,
        lambda: f"{name}: a has shape {tuple(a.shape)} but b has shape {tuple(b.shape)}",
    )


@torch.library.register_fake("hotloop::muladd")
def _muladd_fake(a: Tensor, b: Tensor, c: float) -> Tensor:
    _check_same_shape("muladd", a, b)
    return torch.empty(a.shape, dtype=a.dtype, device=a.device)


@torch.library.register_fake("hotloop::mul")
def _mul_fake(a: Tensor, b: Tensor) -> Tensor:
    _check_same_shape("mul", a, b)
    return torch.empty(a.shape, dtype=a.dtype, device=a.device)


@torch.library.register_fake("hotloop::rms_norm")
def _rms_norm_fake(x: Tensor, weight: Tensor | None, eps: float) -> Tensor:
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


@torch.library.register_fake("hotloop::rms_norm_backward")
def _rms_norm_backward_fake(
    grad_out: Tensor, x: Tensor, weight: Tensor | None, eps: float
) -> tuple[Tensor, Tensor]:
    grad_x = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if weight is None:
        return grad_x, x.new_empty((0,))
    return grad_x, torch.empty(weight.shape, dtype=weight.dtype, device=weight.device)


@torch.library.register_fake("hotloop::fused_add_rms_norm")
def _fused_add_rms_norm_fake(x: Tensor, residual: Tensor, weight: Tensor, eps: float) -> None:
    return None


def _save_ab(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
    a, b = inputs[:2]
    ctx.save_for_backward(a, b)


def _mul_backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, Tensor | None]:
    a, b = ctx.saved_tensors
    grad_a = mul(grad, b) if ctx.needs_input_grad[0] else None
    grad_b = mul(grad, a) if ctx.needs_input_grad[1] else None
    return grad_a, grad_b


def _muladd_backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, Tensor | None, None]:
    return (*_mul_backward(ctx, grad), None)


def _rms_norm_setup(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
    x, weight, eps = inputs
    ctx.save_for_backward(x, weight)
    ctx.eps = eps


def _rms_norm_backward(ctx: Any, grad: Tensor) -> tuple[Tensor, Tensor | None, None]:
    x, weight = ctx.saved_tensors
    grad_x, grad_weight = torch.ops.hotloop.rms_norm_backward.default(grad, x, weight, ctx.eps)
    return grad_x, (grad_weight if weight is not None else None), None


def _no_double_backward(ctx: Any, *grads: Tensor) -> None:
    raise RuntimeError(
        "hotloop.rms_norm: the gradient of its gradient (double backward) is not implemented"
    )


torch.library.register_autograd("hotloop::mul", _mul_backward, setup_context=_save_ab)
torch.library.register_autograd("hotloop::muladd", _muladd_backward, setup_context=_save_ab)
torch.library.register_autograd(
    "hotloop::rms_norm", _rms_norm_backward, setup_context=_rms_norm_setup
)
# Without a formula autograd would pass silently through the backward op.
torch.library.register_autograd("hotloop::rms_norm_backward", _no_double_backward)
