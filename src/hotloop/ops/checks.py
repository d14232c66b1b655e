"""Input checks of the ops, shared by the fake kernels and the batching rules.

The checks of csrc/common/checks.h, with the same wording. Shape conditions go through
torch._check so that symbolic sizes under torch.compile become runtime asserts rather
than specialisations.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from hotloop.ops.api import FLOATING_DTYPES, _missing_tensor, _refuse_none


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
    _refuse_none(op, ("a", a), ("b", b))
    _check_same_device(op, "a", a, "b", b)
    _check_floating(op, "a", a)
    _check_same_dtype(op, "a", a, "b", b)
    _check_same_shape(op, "a", a, "b", b)


def _check_norm_input(op: str, name: str, x: Tensor) -> None:
    _refuse_none(op, (name, x))
    if x.dim() < 1:
        raise RuntimeError(
            f"{op}: expected {name} to have at least 1 dimension (the normalised one) "
            "but got a 0-dim tensor"
        )
    _check_floating(op, name, x)


def _check_norm_weight(op: str, weight: Tensor, x: Tensor, batched: bool = False) -> None:
    """weight: 1-D with x.size(-1) elements, x's dtype and device. ``batched``: weight
    holds one such row per sample of a vmap (its first dim), and x has the batch first."""
    _refuse_none(op, ("weight", weight))
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
    _refuse_none(op, ("grad_out", grad_out))
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
    _refuse_none(op, ("residual", residual))
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


def _check_scale_tensor(op: str, name: str, scale: Tensor | None, x: Tensor) -> None:
    """The static scale or scale_ub: one float32 element on x's device."""
    if scale is None:
        raise _missing_tensor(op, name)
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
    op: str, x: Tensor, weight: Tensor, scale: tuple[str, Tensor | None]
) -> None:
    """``scale``: ("scale", t) for the static ops (required) or ("scale_ub", t) for the
    dynamic ones (optional: None is skipped)."""
    _check_norm_input(op, "x", x)
    _check_norm_weight(op, weight, x)
    name, t = scale
    if name == "scale" or t is not None:
        _check_scale_tensor(op, name, t, x)


def _check_fp8_residual(
    op: str, x: Tensor, residual: Tensor, weight: Tensor, scale: Tensor | None
) -> None:
    """The fused FP8 ops' residual: like x, written in place, sharing no memory with inputs."""
    _refuse_none(op, ("residual", residual))
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
