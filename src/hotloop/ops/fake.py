"""Fake (meta) kernels: what torch.compile and torch.export trace instead of the kernels."""

from __future__ import annotations

import torch
from torch import Tensor

from hotloop._casting import check_casting
from hotloop.ops.api import FP8_DTYPE
from hotloop.ops.checks import (
    _check_elementwise_inputs,
    _check_fp8_residual,
    _check_fused_add_rms_norm_inputs,
    _check_rms_norm_backward_inputs,
    _check_rms_norm_fp8_inputs,
    _check_rms_norm_inputs,
)


def _fp8_outputs(x: Tensor, dynamic: bool) -> tuple[Tensor, Tensor | None]:
    out = torch.empty(x.shape, dtype=FP8_DTYPE, device=x.device)
    if not dynamic:
        return out, None
    return out, torch.empty((*x.shape[:-1], 1), dtype=torch.float32, device=x.device)


@torch.library.register_fake("hotloop::muladd")
def _muladd_fake(a: Tensor, b: Tensor, c: float) -> Tensor:
    _check_elementwise_inputs("muladd", a, b)
    return torch.empty(a.shape, dtype=a.dtype, device=a.device)


@torch.library.register_fake("hotloop::mul")
def _mul_fake(a: Tensor, b: Tensor) -> Tensor:
    _check_elementwise_inputs("mul", a, b)
    return torch.empty(a.shape, dtype=a.dtype, device=a.device)


@torch.library.register_fake("hotloop::rms_norm")
def _rms_norm_fake(
    x: Tensor, weight: Tensor | None, eps: float, casting: int = 0, offset: float = 0.0
) -> Tensor:
    check_casting("rms_norm", casting, offset)  # first, as the kernels check
    _check_rms_norm_inputs("rms_norm", x, weight)
    # x's memory format (channels_last, a transpose), as torch's own norms keep it.
    return torch.empty_like(x, memory_format=torch.preserve_format)


@torch.library.register_fake("hotloop::rms_norm_backward")
def _rms_norm_backward_fake(
    grad_out: Tensor,
    x: Tensor,
    weight: Tensor | None,
    eps: float,
    casting: int = 0,
    offset: float = 0.0,
) -> tuple[Tensor, Tensor]:
    check_casting("rms_norm_backward", casting, offset)
    _check_rms_norm_backward_inputs("rms_norm_backward", grad_out, x, weight)
    grad_x = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if weight is None:
        return grad_x, x.new_empty((0,))
    return grad_x, torch.empty(weight.shape, dtype=weight.dtype, device=weight.device)


@torch.library.register_fake("hotloop::rms_norm_backward_")
def _rms_norm_backward_in_place_fake(
    grad_out: Tensor,
    x: Tensor,
    weight: Tensor | None,
    eps: float,
    casting: int = 0,
    offset: float = 0.0,
) -> Tensor:
    check_casting("rms_norm_backward_", casting, offset)
    _check_rms_norm_backward_inputs("rms_norm_backward_", grad_out, x, weight)
    if weight is None:
        return x.new_empty((0,))
    return torch.empty(weight.shape, dtype=weight.dtype, device=weight.device)


@torch.library.register_fake("hotloop::fused_add_rms_norm")
def _fused_add_rms_norm_fake(
    x: Tensor,
    residual: Tensor,
    weight: Tensor,
    eps: float,
    casting: int = 0,
    offset: float = 0.0,
) -> None:
    check_casting("fused_add_rms_norm", casting, offset)
    _check_fused_add_rms_norm_inputs(x, residual, weight)


@torch.library.register_fake("hotloop::rms_norm_fp8")
def _rms_norm_fp8_fake(
    x: Tensor, weight: Tensor, scale: Tensor, eps: float, casting: int = 0, offset: float = 0.0
) -> Tensor:
    check_casting("rms_norm_fp8", casting, offset)
    _check_rms_norm_fp8_inputs("rms_norm_fp8", x, weight, ("scale", scale))
    return _fp8_outputs(x, dynamic=False)[0]


@torch.library.register_fake("hotloop::rms_norm_fp8_dynamic")
def _rms_norm_fp8_dynamic_fake(
    x: Tensor,
    weight: Tensor,
    eps: float,
    scale_ub: Tensor | None = None,
    casting: int = 0,
    offset: float = 0.0,
) -> tuple[Tensor, Tensor | None]:
    check_casting("rms_norm_fp8_dynamic", casting, offset)
    _check_rms_norm_fp8_inputs("rms_norm_fp8_dynamic", x, weight, ("scale_ub", scale_ub))
    return _fp8_outputs(x, dynamic=True)


@torch.library.register_fake("hotloop::fused_add_rms_norm_fp8")
def _fused_add_rms_norm_fp8_fake(
    x: Tensor,
    residual: Tensor,
    weight: Tensor,
    scale: Tensor,
    eps: float,
    casting: int = 0,
    offset: float = 0.0,
) -> Tensor:
    op = "fused_add_rms_norm_fp8"
    check_casting(op, casting, offset)
    _check_rms_norm_fp8_inputs(op, x, weight, ("scale", scale))
    _check_fp8_residual(op, x, residual, weight, scale)
    return _fp8_outputs(x, dynamic=False)[0]


@torch.library.register_fake("hotloop::fused_add_rms_norm_fp8_dynamic")
def _fused_add_rms_norm_fp8_dynamic_fake(
    x: Tensor,
    residual: Tensor,
    weight: Tensor,
    eps: float,
    scale_ub: Tensor | None = None,
    casting: int = 0,
    offset: float = 0.0,
) -> tuple[Tensor, Tensor | None]:
    op = "fused_add_rms_norm_fp8_dynamic"
    check_casting(op, casting, offset)
    _check_rms_norm_fp8_inputs(op, x, weight, ("scale_ub", scale_ub))
    _check_fp8_residual(op, x, residual, weight, scale_ub)
    return _fp8_outputs(x, dynamic=True)
