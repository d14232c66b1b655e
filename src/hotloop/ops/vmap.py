"""Batching rules (torch.library.register_vmap), so that torch.vmap never loops per sample.

Batching rules: each gets the tensors with their batch dims (in_dims) and moves the
batch to the front. The C++ kernels already take any number of leading dims, so with
one weight for all samples a batch is just more rows. A batched weight (one per sample)
is not something the kernels take: those cases compute in float32 (float64) from
hotloop's weightless norm and torch ops, rounding where the casting mode rounds, as the
kernels do.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from hotloop._casting import CASTINGS, GEMMA, LLAMA, check_casting
from hotloop.ops.api import (
    _RMS_NORM,
    _refuse_none,
    fused_add_rms_norm,
    fused_add_rms_norm_fp8,
    fused_add_rms_norm_fp8_dynamic,
    mul,
    muladd,
    rms_norm_fp8,
    rms_norm_fp8_dynamic,
)
from hotloop.ops.checks import (
    _check_floating,
    _check_no_overlap,
    _check_norm_weight,
    _check_same_device,
    _check_same_dtype,
    _check_same_shape,
)


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


def _rms_norm_batched_weight(
    x: Tensor, weight: Tensor, eps: float, casting: int = 0, offset: float = 0.0
) -> Tensor:
    normed = torch.ops.hotloop.rms_norm.default(x.to(_accumulation_dtype(x.dtype)), None, eps)
    weighted = _llama_rounded(normed, x.dtype, casting) * _weight_rows(weight, x, casting, offset)
    return weighted.to(x.dtype)


def _llama_rounded(t: Tensor, dtype: torch.dtype, casting: int) -> Tensor:
    """t rounded to dtype and back in the "llama" casting (the value its weight multiplies)."""
    return t.to(dtype).to(t.dtype) if casting == LLAMA else t


def _weight_rows(weight: Tensor, x: Tensor, casting: int, offset: float) -> Tensor:
    """A (B, H) weight as it multiplies x's rows, in the accumulation dtype (offset + weight
    in the "gemma" casting)."""
    w = _per_row(weight, x).to(_accumulation_dtype(x.dtype))
    return w + offset if casting == GEMMA else w


def _sum_rows(t: Tensor) -> Tensor:
    """(B, ..., H) -> (B, H): the sum over every row of each sample."""
    row_dims = tuple(range(1, t.dim() - 1))
    return t.sum(row_dims) if row_dims else t


@torch.library.register_vmap("hotloop::muladd")
def _muladd_vmap(
    info: Any, in_dims: Sequence[int | None], a: Tensor, b: Tensor, c: float
) -> tuple[Tensor, int]:
    _refuse_none("muladd", ("a", a), ("b", b))
    a_dim, b_dim, _ = in_dims
    a, b = _batch_first(a, a_dim, info.batch_size), _batch_first(b, b_dim, info.batch_size)
    return muladd(a, b, c), 0


@torch.library.register_vmap("hotloop::mul")
def _mul_vmap(info: Any, in_dims: Sequence[int | None], a: Tensor, b: Tensor) -> tuple[Tensor, int]:
    _refuse_none("mul", ("a", a), ("b", b))
    a_dim, b_dim = in_dims
    a, b = _batch_first(a, a_dim, info.batch_size), _batch_first(b, b_dim, info.batch_size)
    return mul(a, b), 0


@torch.library.register_vmap("hotloop::rms_norm")
def _rms_norm_vmap(
    info: Any,
    in_dims: Sequence[int | None],
    x: Tensor,
    weight: Tensor | None,
    eps: float,
    casting: int = 0,
    offset: float = 0.0,
) -> tuple[Tensor, int]:
    check_casting("rms_norm", casting, offset)
    _refuse_none("rms_norm", ("x", x))
    x_dim, weight_dim = in_dims[:2]
    x = _batch_first(x, x_dim, info.batch_size)
    # The kernels would take a batch of 0-d samples as one row: every sample is checked
    # as eager checks it, before the batch becomes rows.
    _check_batched_norm_input("rms_norm", x)
    if weight is None or weight_dim is None:
        return _RMS_NORM(x, weight, eps, casting, offset), 0
    weight = weight.movedim(weight_dim, 0)
    _check_norm_weight("rms_norm", weight, x, batched=True)
    return _rms_norm_batched_weight(x, weight, eps, casting, offset), 0


@torch.library.register_vmap("hotloop::rms_norm_backward")
def _rms_norm_backward_vmap(
    info: Any,
    in_dims: Sequence[int | None],
    grad_out: Tensor,
    x: Tensor,
    weight: Tensor | None,
    eps: float,
    casting: int = 0,
    offset: float = 0.0,
) -> tuple[tuple[Tensor, Tensor], tuple[int, int | None]]:
    grad_dim, x_dim, weight_dim = in_dims[:3]
    op = "rms_norm_backward"
    check_casting(op, casting, offset)
    _refuse_none(op, ("grad_out", grad_out), ("x", x))
    grad_out = _batch_first(grad_out, grad_dim, info.batch_size)
    x = _batch_first(x, x_dim, info.batch_size)
    _check_batched_norm_input(op, x)
    backward = torch.ops.hotloop.rms_norm_backward.default
    if weight is None:
        grad_x, no_grad_weight = backward(grad_out, x, None, eps, casting, offset)
        return (grad_x, no_grad_weight), (0, None)
    # Each sample's weight gradient is a sum over that sample's rows only, which the
    # kernel (one sum over all rows) does not give: it is computed here.
    if weight_dim is None:
        grad_x, _ = backward(grad_out, x, weight, eps, casting, offset)
        weight_rows = weight.expand(info.batch_size, *weight.shape)
    else:
        weight_rows = weight.movedim(weight_dim, 0)
        _check_same_device(op, "x", x, "grad_out", grad_out)
        _check_same_dtype(op, "x", x, "grad_out", grad_out)
        _check_same_shape(op, "x", x, "grad_out", grad_out)
        _check_norm_weight(op, weight_rows, x, batched=True)
    acc = _accumulation_dtype(x.dtype)
    x_acc, grad_acc = x.to(acc), grad_out.to(acc)
    rstd = torch.rsqrt(x_acc.pow(2).mean(-1, keepdim=True) + eps)
    x_hat = x_acc * rstd
    grad_weight = _sum_rows(grad_acc * _llama_rounded(x_hat, x.dtype, casting)).to(weight.dtype)
    if weight_dim is not None:
        # grad_x = rstd * (g - x_hat * mean(g * x_hat)), g = grad_out * weight (rounded to
        # x's dtype in "llama", as autograd's product of two such tensors is)
        g = _llama_rounded(
            grad_acc * _weight_rows(weight_rows, x, casting, offset), x.dtype, casting
        )
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
    casting: int = 0,
    offset: float = 0.0,
) -> tuple[None, None]:
    check_casting("fused_add_rms_norm", casting, offset)
    _refuse_none("fused_add_rms_norm", ("x", x), ("residual", residual), ("weight", weight))
    x_dim, residual_dim, weight_dim = in_dims[:3]
    name = CASTINGS[casting]
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
    op = "fused_add_rms_norm"
    x_rows, residual_rows = x.movedim(x_dim, 0), residual.movedim(residual_dim, 0)
    weight_rows = weight if weight_dim is None else weight.movedim(weight_dim, 0)
    _check_batched_norm_input(op, x_rows)
    # Before any contiguous copy below, which would hide memory the samples share. The
    # whole batch is checked, as torch's in-place ops check what their kernels get.
    _check_no_overlap(op, "x", x_rows, "residual", residual_rows)
    _check_no_overlap(op, "x", x_rows, "weight", weight_rows)
    _check_no_overlap(op, "residual", residual_rows, "weight", weight_rows)
    if weight_dim is not None:
        _check_same_device(op, "x", x_rows, "residual", residual_rows)
        _check_same_dtype(op, "x", x_rows, "residual", residual_rows)
        _check_same_shape(op, "x", x_rows, "residual", residual_rows)
        _check_norm_weight(op, weight_rows, x_rows, batched=True)
        # The op's definition, unfused: residual += x rounded to the dtype (torch's add_
        # adds in float32 too), then the norm of that rounded residual.
        residual_rows.add_(x_rows)
        x_rows.copy_(_rms_norm_batched_weight(residual_rows, weight_rows, eps, casting, offset))
        return None, None
    if x_rows.is_contiguous() and residual_rows.is_contiguous():
        fused_add_rms_norm(x_rows, residual_rows, weight, eps, casting=name, offset=offset)
        return None, None
    # The kernel writes contiguous memory only; a batch dim that is not the outermost
    # one gets contiguous copies, written back afterwards.
    x_copy, residual_copy = x_rows.contiguous(), residual_rows.contiguous()
    fused_add_rms_norm(x_copy, residual_copy, weight, eps, casting=name, offset=offset)
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
    info: Any,
    in_dims: Sequence[int | None],
    x: Tensor,
    weight: Tensor,
    scale: Tensor,
    eps: float,
    casting: int = 0,
    offset: float = 0.0,
) -> tuple[Tensor, int]:
    check_casting("rms_norm_fp8", casting, offset)
    _refuse_none("rms_norm_fp8", ("x", x), ("weight", weight), ("scale", scale))
    _refuse_batched("rms_norm_fp8", in_dims[1:3], ("weight", "scale"))
    x = _batch_first(x, in_dims[0], info.batch_size)
    _check_batched_norm_input("rms_norm_fp8", x)
    return rms_norm_fp8(x, weight, scale, eps, casting=CASTINGS[casting], offset=offset), 0


@torch.library.register_vmap("hotloop::rms_norm_fp8_dynamic")
def _rms_norm_fp8_dynamic_vmap(
    info: Any,
    in_dims: Sequence[int | None],
    x: Tensor,
    weight: Tensor,
    eps: float,
    scale_ub: Tensor | None = None,
    casting: int = 0,
    offset: float = 0.0,
) -> tuple[tuple[Tensor, Tensor], tuple[int, int]]:
    check_casting("rms_norm_fp8_dynamic", casting, offset)
    in_dims = _padded(in_dims, 4)
    _refuse_none("rms_norm_fp8_dynamic", ("x", x), ("weight", weight))
    _refuse_batched("rms_norm_fp8_dynamic", (in_dims[1], in_dims[3]), ("weight", "scale_ub"))
    x = _batch_first(x, in_dims[0], info.batch_size)
    _check_batched_norm_input("rms_norm_fp8_dynamic", x)
    name = CASTINGS[casting]
    return rms_norm_fp8_dynamic(x, weight, eps, scale_ub, casting=name, offset=offset), (0, 0)


def _fused_fp8_rows(
    op: str,
    info: Any,
    in_dims: Sequence[int | None],
    x: Tensor,
    residual: Tensor,
    read: Sequence[tuple[str, Tensor | None]],
) -> tuple[Tensor, Tensor]:
    """x and residual with the batch first; residual must be batched (it is written), and
    neither x nor the tensors in ``read`` (weight, scale) may share its memory."""
    _refuse_none(op, ("x", x), ("residual", residual), *(r for r in read if r[0] != "scale_ub"))
    if in_dims[1] is None:
        raise RuntimeError(
            f"vmap: {op} writes residual in place, so it must be batched, but it is not while "
            "x is: every sample would write its own result into the same memory. Give residual "
            "a batch dimension (e.g. residual.expand(B, *residual.shape).clone()) before vmap"
        )
    x_rows = _batch_first(x, in_dims[0], info.batch_size)
    residual_rows = residual.movedim(in_dims[1], 0)
    _check_batched_norm_input(op, x_rows)
    # Before _run_fused_fp8's contiguous copy, which would hide memory they share.
    for name, t in (("x", x_rows), *read):
        if t is not None:
            _check_no_overlap(op, "residual", residual_rows, name, t)
    return x_rows, residual_rows


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
    casting: int = 0,
    offset: float = 0.0,
) -> tuple[Tensor, int]:
    op = "fused_add_rms_norm_fp8"
    check_casting(op, casting, offset)
    _refuse_batched(op, in_dims[2:4], ("weight", "scale"))
    read = (("weight", weight), ("scale", scale))
    x_rows, residual_rows = _fused_fp8_rows(op, info, in_dims, x, residual, read)
    name = CASTINGS[casting]
    out = _run_fused_fp8(
        residual_rows,
        lambda r: fused_add_rms_norm_fp8(
            x_rows, r, weight, scale, eps, casting=name, offset=offset
        ),
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
    casting: int = 0,
    offset: float = 0.0,
) -> tuple[tuple[Tensor, Tensor], tuple[int, int]]:
    op = "fused_add_rms_norm_fp8_dynamic"
    check_casting(op, casting, offset)
    in_dims = _padded(in_dims, 5)
    _refuse_batched(op, (in_dims[2], in_dims[4]), ("weight", "scale_ub"))
    read = (("weight", weight), ("scale_ub", scale_ub))
    x_rows, residual_rows = _fused_fp8_rows(op, info, in_dims, x, residual, read)
    name = CASTINGS[casting]
    outputs = _run_fused_fp8(
        residual_rows,
        lambda r: fused_add_rms_norm_fp8_dynamic(
            x_rows, r, weight, eps, scale_ub, casting=name, offset=offset
        ),
    )
    return outputs, (0, 0)
