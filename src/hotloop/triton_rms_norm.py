"""RMSNorm in Triton, registered as custom ops that torch.compile traces into.

Two ops, both made with ``torch.library.triton_op`` so that torch.compile sees the
Triton kernels themselves (``wrap_triton``) instead of an opaque call:

* ``hotloop::rms_norm_triton(Tensor x, Tensor? weight, float eps) -> Tensor``
* ``hotloop::rms_norm_triton_backward(Tensor grad_out, Tensor x, Tensor? weight,
  float eps) -> (Tensor grad_x, Tensor grad_weight)``; ``grad_weight`` is an empty
  ``(0,)`` tensor when ``weight`` is None, as for the C++ ``hotloop::rms_norm_backward``.

Semantics are those of ``torch.nn.functional.rms_norm(x, (x.size(-1),), weight, eps)``
and of the C++ ops: the mean of squares, the normalisation and the multiplication by
the weight happen in float32 (float64 for float64 inputs) and the result is rounded
once. The backward recomputes ``rstd`` from ``x``.

The weight gradient is reduced without a second pass over ``x``: the backward runs a
fixed number of persistent programs (a few per SM), which stride over the row tiles, and
each accumulates its share of ``sum_rows(grad_out * x_hat)`` in float32 registers while it
computes ``grad_x``. The ``[num_programs, H]`` partials are summed afterwards (the
scheme of Liger-Kernel and Unsloth). Rows wider than one program holds in registers
(``MAX_FUSED_FWD_BLOCK``, ``MAX_FUSED_BWD_BLOCK``), or wider than 8192 and mostly
padding in their power-of-two block (8193 in 16384), take a looped path
(forward: two passes over each row, the second from L2; backward: a per-row statistics
kernel, then a column-blocked kernel that writes ``grad_x`` and the dw partials, which
reads x and dy twice).

Inputs must be CUDA tensors, except under ``TRITON_INTERPRET=1`` (Triton's
interpreter, which reads the variable when this module is imported), where CPU tensors
run through the interpreter so that the kernels can be tested on a machine without a GPU.

This module imports on a machine without a GPU; kernels compile at their first call.
"""

from typing import Any, Callable, Optional

import torch
import triton
import triton.language as tl
from triton.runtime.jit import JITFunction

__all__ = ["interpreting", "rms_norm", "rms_norm_backward"]

# Widest rows (as a power of two) that one program holds in registers; wider rows take
# the looped kernels. See _fwd_tile and _bwd_tile for where the limits come from.
MAX_FUSED_FWD_BLOCK = 16384
MAX_FUSED_BWD_BLOCK = 16384
# Column block of the looped kernels.
LOOPED_BLOCK = 4096
# Rows wider than 8192 whose power-of-two block would be mostly padding (n_cols under
# this fraction of it, e.g. 8193 in 16384) take the looped kernels even where they fit,
# with narrower column blocks (H100, 8193: forward 0.446 -> 0.228 ms with 1024, backward
# 0.88 -> 0.70 ms with 2048).
_WIDE_FILL = 0.75
_PADDED_FWD_BLOCK = 1024
_PADDED_BWD_BLOCK = 2048
# Elements a row-tile should hold for narrow rows (several rows per program).
_TILE_ELEMENTS = 4096
# Warps of the persistent backward per SM (programs = SMs * this / num_warps) where
# _BWD_CONFIG doesn't say.
_BWD_WARPS_PER_SM = 32
# (BLOCK_M, num_warps, programs per SM) of the fused backward by BLOCK_N, the fastest
# of a sweep on an H100 (bf16, 268 MB tensors); narrower rows: tiles of _BWD_SMALL_TILE
# elements on 4 warps.
_BWD_CONFIG = {
    512: (2, 4, 8),
    1024: (4, 4, 8),
    2048: (2, 4, 8),
    4096: (1, 16, 2),
    8192: (2, 16, 1),
    16384: (1, 16, 2),
}
_BWD_SMALL_TILE = 2048
# Backward tiles above this many elements reload w in every iteration.
_RELOAD_W_TILE = 8192

_SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


# --------------------------------------------------------------------------- kernels


@triton.jit
def _to_acc(v, FP64: tl.constexpr):
    # Accumulation type: float32, or float64 for float64 inputs.
    if FP64:
        return v.to(tl.float64)
    else:
        return v.to(tl.float32)


@triton.jit
def _rsqrt(v, FP64: tl.constexpr):
    # tl.rsqrt is float32-only; float64 takes an IEEE sqrt and a division. The cast first:
    # under torch.compile, Inductor may pass eps as a float64 scalar, which would promote
    # everything downstream (and break loop-carried accumulators) in a float32 kernel.
    v = _to_acc(v, FP64)
    if FP64:
        return 1.0 / tl.sqrt(v)
    else:
        return tl.rsqrt(v)


@triton.jit
def _rms_norm_fwd_kernel(
    X,
    W,
    Y,
    n_rows,
    n_cols,
    stride_x_row,
    stride_y_row,
    eps,
    HAS_WEIGHT: tl.constexpr,
    FP64: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    # One program normalises BLOCK_M whole rows (BLOCK_N >= n_cols).
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < n_cols
    mask = (rows < n_rows)[:, None] & col_mask[None, :]
    x = tl.load(X + rows[:, None] * stride_x_row + cols[None, :], mask=mask, other=0.0)
    x = _to_acc(x, FP64)
    mean_sq = tl.sum(x * x, axis=1) / n_cols
    rstd = _rsqrt(mean_sq + eps, FP64)
    y = x * rstd[:, None]
    if HAS_WEIGHT:
        w = _to_acc(tl.load(W + cols, mask=col_mask, other=0.0), FP64)
        y = y * w[None, :]
    tl.store(
        Y + rows[:, None] * stride_y_row + cols[None, :],
        y.to(Y.dtype.element_ty),
        mask=mask,
    )


@triton.jit
def _rms_norm_fwd_looped_kernel(
    X,
    W,
    Y,
    n_cols,
    stride_x_row,
    stride_y_row,
    eps,
    HAS_WEIGHT: tl.constexpr,
    FP64: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    # One program per row, for rows wider than MAX_FUSED_FWD_BLOCK: a pass for the mean
    # of squares, then a pass that writes y (the row is still in L2 by then).
    row = tl.program_id(0).to(tl.int64)
    x_row = X + row * stride_x_row
    y_row = Y + row * stride_y_row
    acc = _to_acc(tl.zeros([BLOCK_N], dtype=tl.float32), FP64)
    for start in range(0, n_cols, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        x = _to_acc(tl.load(x_row + cols, mask=cols < n_cols, other=0.0), FP64)
        acc += x * x
    rstd = _rsqrt(tl.sum(acc, axis=0) / n_cols + eps, FP64)
    for start in range(0, n_cols, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        col_mask = cols < n_cols
        y = _to_acc(tl.load(x_row + cols, mask=col_mask, other=0.0), FP64) * rstd
        if HAS_WEIGHT:
            y = y * _to_acc(tl.load(W + cols, mask=col_mask, other=0.0), FP64)
        tl.store(y_row + cols, y.to(Y.dtype.element_ty), mask=col_mask)


@triton.jit
def _rms_norm_bwd_kernel(
    DY,
    X,
    W,
    DX,
    DW_PARTIAL,
    n_rows,
    n_cols,
    stride_dy_row,
    stride_x_row,
    stride_dx_row,
    eps,
    HAS_WEIGHT: tl.constexpr,
    FP64: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    RELOAD_W: tl.constexpr,
):
    # Persistent backward: program p of P takes row tiles p, p + P, p + 2P, ...
    # With x_hat = x * rstd and g = dy * w,
    #   dx = rstd * (g - x_hat * mean(g * x_hat)),  dw += sum_rows(dy * x_hat),
    # the dw share staying in registers until the end (one partial row per program).
    # dw_acc is a whole [BLOCK_M, BLOCK_N] tile, summed over its rows once at the end: a
    # cross-row (cross-warp) reduction in every iteration costs more than the loads.
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < n_cols
    # RELOAD_W: wide rows load w in every iteration (from L1/L2) instead of holding it in
    # registers, which would spill.
    if HAS_WEIGHT and not RELOAD_W:
        w = _to_acc(tl.load(W + cols, mask=col_mask, other=0.0), FP64)
    dw_acc = _to_acc(tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32), FP64)
    for start in range(pid * BLOCK_M, n_rows, tl.num_programs(0) * BLOCK_M):
        rows = start + tl.arange(0, BLOCK_M)
        mask = (rows < n_rows)[:, None] & col_mask[None, :]
        rows = rows.to(tl.int64)
        x = tl.load(X + rows[:, None] * stride_x_row + cols[None, :], mask=mask, other=0.0)
        x = _to_acc(x, FP64)
        dy = tl.load(DY + rows[:, None] * stride_dy_row + cols[None, :], mask=mask, other=0.0)
        dy = _to_acc(dy, FP64)
        rstd = _rsqrt(tl.sum(x * x, axis=1) / n_cols + eps, FP64)
        x_hat = x * rstd[:, None]
        if HAS_WEIGHT and RELOAD_W:
            w = _to_acc(tl.load(W + cols, mask=col_mask, other=0.0), FP64)
        if HAS_WEIGHT:  # noqa: SIM108 (w exists only when HAS_WEIGHT)
            g = dy * w[None, :]
        else:
            g = dy
        mean_g_xhat = tl.sum(g * x_hat, axis=1) / n_cols
        dx = (g - x_hat * mean_g_xhat[:, None]) * rstd[:, None]
        tl.store(
            DX + rows[:, None] * stride_dx_row + cols[None, :],
            dx.to(DX.dtype.element_ty),
            mask=mask,
        )
        if HAS_WEIGHT:
            dw_acc += _to_acc(dy * x_hat, FP64)
    if HAS_WEIGHT:
        dw = _to_acc(tl.sum(dw_acc, axis=0), FP64)
        tl.store(DW_PARTIAL + pid.to(tl.int64) * n_cols + cols, dw, mask=col_mask)


@triton.jit
def _rms_norm_bwd_row_stats_kernel(
    DY,
    X,
    W,
    RSTD,
    COEF,
    n_cols,
    stride_dy_row,
    stride_x_row,
    eps,
    HAS_WEIGHT: tl.constexpr,
    FP64: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    # Looped backward, step 1, one program per row: rstd and
    # coef = rstd^3 * mean(g * x), so that dx = rstd * g - coef * x.
    row = tl.program_id(0).to(tl.int64)
    sum_sq = _to_acc(tl.zeros([BLOCK_N], dtype=tl.float32), FP64)
    sum_gx = _to_acc(tl.zeros([BLOCK_N], dtype=tl.float32), FP64)
    for start in range(0, n_cols, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        col_mask = cols < n_cols
        x = _to_acc(tl.load(X + row * stride_x_row + cols, mask=col_mask, other=0.0), FP64)
        g = _to_acc(tl.load(DY + row * stride_dy_row + cols, mask=col_mask, other=0.0), FP64)
        if HAS_WEIGHT:
            g = g * _to_acc(tl.load(W + cols, mask=col_mask, other=0.0), FP64)
        sum_sq += x * x
        sum_gx += g * x
    rstd = _rsqrt(tl.sum(sum_sq, axis=0) / n_cols + eps, FP64)
    coef = rstd * rstd * rstd * (tl.sum(sum_gx, axis=0) / n_cols)
    tl.store(RSTD + row, rstd)
    tl.store(COEF + row, coef)


@triton.jit
def _rms_norm_bwd_looped_kernel(
    DY,
    X,
    W,
    RSTD,
    COEF,
    DX,
    DW_PARTIAL,
    n_rows,
    n_cols,
    stride_dy_row,
    stride_x_row,
    stride_dx_row,
    HAS_WEIGHT: tl.constexpr,
    FP64: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    # Looped backward, step 2: program (m, n) takes rows m, m + M, m + 2M, ... of the
    # column block n; it writes dx there and keeps its dw share in registers.
    pid_m = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < n_cols
    if HAS_WEIGHT:
        w = _to_acc(tl.load(W + cols, mask=col_mask, other=0.0), FP64)
    dw_acc = _to_acc(tl.zeros([BLOCK_N], dtype=tl.float32), FP64)
    for row in range(pid_m.to(tl.int64), n_rows, tl.num_programs(0)):
        x = _to_acc(tl.load(X + row * stride_x_row + cols, mask=col_mask, other=0.0), FP64)
        dy = _to_acc(tl.load(DY + row * stride_dy_row + cols, mask=col_mask, other=0.0), FP64)
        rstd = tl.load(RSTD + row)
        coef = tl.load(COEF + row)
        if HAS_WEIGHT:  # noqa: SIM108 (w exists only when HAS_WEIGHT)
            g = dy * w
        else:
            g = dy
        dx = rstd * g - coef * x
        tl.store(DX + row * stride_dx_row + cols, dx.to(DX.dtype.element_ty), mask=col_mask)
        if HAS_WEIGHT:
            dw_acc += _to_acc(dy * x * rstd, FP64)
    if HAS_WEIGHT:
        tl.store(DW_PARTIAL + pid_m.to(tl.int64) * n_cols + cols, dw_acc, mask=col_mask)


# --------------------------------------------------------------------- launch settings


def interpreting() -> bool:
    """Whether the kernels run in Triton's interpreter (``TRITON_INTERPRET=1`` was set
    when this module was imported: ``triton.jit`` reads it at decoration time)."""
    return _INTERPRETING


_INTERPRETING = not isinstance(_rms_norm_fwd_kernel, JITFunction)


def _fwd_tile(n_cols: int) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps) of the fused forward for rows of n_cols elements.

    Narrow rows are packed BLOCK_M to a program so that each program moves about
    _TILE_ELEMENTS elements; 8 to 16 elements a thread (ptxas for sm_90: no spills up
    to BLOCK_N = 16384 with 16 warps).
    """
    block_n = triton.next_power_of_2(n_cols)
    block_m = max(1, min(128, _TILE_ELEMENTS // block_n))
    tile = block_m * block_n
    num_warps = 4 if tile <= 1024 else 8 if tile <= 4096 else 16
    return block_m, block_n, num_warps


def _bwd_tile(n_cols: int) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps) of the fused persistent backward.

    The backward holds x, dy, w and the dw share of a tile at once. Settings from
    _BWD_CONFIG (a sweep on an H100, bf16: 4 warps for narrow rows, which keeps the
    row reductions inside few warps). At BLOCK_N = 16384 ptxas for sm_90 spills a little
    even with w reloaded per iteration (_RELOAD_W_TILE), yet the fused kernel beats the
    looped one there (H100, bf16, 8192 x 16384: 0.35 against 0.48 ms); wider rows loop.
    """
    block_n = triton.next_power_of_2(n_cols)
    if block_n in _BWD_CONFIG:
        block_m, num_warps, _ = _BWD_CONFIG[block_n]
    else:
        block_m, num_warps = max(1, min(128, _BWD_SMALL_TILE // block_n)), 4
    return block_m, block_n, num_warps


def _fused(n_cols: int, max_block: int) -> bool:
    """Whether rows of n_cols elements take the fused (one row in registers) kernels."""
    block_n = triton.next_power_of_2(n_cols)
    return block_n <= max_block and (block_n <= 8192 or n_cols >= _WIDE_FILL * block_n)


def _looped_block(n_cols: int, max_block: int, padded_block: int) -> int:
    """Column block of the looped kernels: narrower for rows that the fused kernels
    refused only for their padding (see _WIDE_FILL)."""
    return padded_block if triton.next_power_of_2(n_cols) <= max_block else LOOPED_BLOCK


def _num_persistent_programs(
    device: torch.device,
    num_warps: int,
    work_items: Any = None,
    programs: Optional[int] = None,
    per_sm: Optional[int] = None,
) -> int:
    """Programs of the persistent backward: as many as fit on the GPU at once, fewer when
    there are fewer work items (row tiles) than that.

    The count is a plain int even when torch.compile traces with a symbolic row count
    (then it is not capped): the [programs, H] partials and their reduction get a static
    shape instead of a nest of symbolic ceil-divisions.
    """
    if programs is None:
        if device.type == "cuda":
            sm_count = torch.cuda.get_device_properties(device).multi_processor_count
            # 64 registers a thread (see _bwd_tile): an SM's 65536 registers hold 32 warps.
            if per_sm is None:
                per_sm = max(1, _BWD_WARPS_PER_SM // num_warps)
            programs = sm_count * per_sm
        else:
            programs = 4  # the interpreter: a few programs, to exercise the reduction
    if isinstance(work_items, int):
        programs = max(1, min(programs, work_items))
    return programs


def _check_inputs(op: str, x: torch.Tensor, weight: Optional[torch.Tensor]) -> None:
    if x.device.type != "cuda" and not interpreting():
        raise ValueError(
            f"{op}(backend='triton'): x is on {x.device.type}; the Triton kernels need a "
            "CUDA tensor (or TRITON_INTERPRET=1 set before importing hotloop, for the "
            "interpreter)"
        )
    if x.dim() < 1:
        raise ValueError(
            f"{op}(backend='triton'): expected x to have at least 1 dimension (the "
            "normalised one) but got a 0-dim tensor"
        )
    if x.dtype not in _SUPPORTED_DTYPES:
        raise ValueError(
            f"{op}(backend='triton'): expected a floating-point tensor (float16, bfloat16, "
            f"float32, float64) but got {x.dtype} for x"
        )
    if weight is not None:
        if weight.device != x.device:
            raise ValueError(
                f"{op}(backend='triton'): x is on {x.device} but weight is on {weight.device}"
            )
        if weight.dtype != x.dtype:
            raise ValueError(
                f"{op}(backend='triton'): x is {x.dtype} but weight is {weight.dtype} "
                "(expected the same dtype)"
            )
        if weight.numel() != x.shape[-1]:
            raise ValueError(
                f"{op}(backend='triton'): weight has {weight.numel()} elements but x's last "
                f"dim is {x.shape[-1]}"
            )


def _launch(kernel: Any, grid: tuple[Any, ...], *args: Any, **kwargs: Any) -> None:
    """Launch a kernel so that torch.compile sees it (``wrap_triton``).

    Under the interpreter, ``wrap_triton`` hands the kernel back unwrapped, so the ops are
    plain custom ops there (see _define_op) whose fake kernel is this same function body:
    with fake tensors, nothing is launched.
    """
    if _INTERPRETING:
        from torch._subclasses.fake_tensor import is_fake

        if any(is_fake(a) for a in args if isinstance(a, torch.Tensor)):
            return
        kernel[grid](*args, **kwargs)
    else:
        torch.library.wrap_triton(kernel)[grid](*args, **kwargs)


def _define_op(name: str) -> Callable[[Callable[..., Any]], Any]:
    """``torch.library.triton_op``, or under the interpreter a custom op with the same
    body as its fake kernel (``wrap_triton`` can't trace interpreted kernels)."""

    def register(fn: Callable[..., Any]) -> Any:
        if not _INTERPRETING:
            return torch.library.triton_op(name, mutates_args=())(fn)
        op = torch.library.custom_op(name, mutates_args=())(fn)
        op.register_fake(fn)
        return op

    return register


def _static(size: Any) -> int:
    """A size as a plain int. The hidden size picks the kernels' block shapes (constexprs),
    so under torch.compile with dynamic shapes it is specialised (guarded) rather than
    carried symbolically; leading dims stay dynamic."""
    return int(size)


def _as_rows(t: torch.Tensor, n_cols: int) -> torch.Tensor:
    """t as a 2-d (rows, n_cols) tensor with unit column stride (a view where possible)."""
    rows = t.reshape(-1, n_cols)
    if rows.stride(1) != 1:
        rows = rows.contiguous()
    return rows


# ------------------------------------------------------------------------------ ops


@_define_op("hotloop::rms_norm_triton")
def _rms_norm_triton(x: torch.Tensor, weight: Optional[torch.Tensor], eps: float) -> torch.Tensor:
    _check_inputs("rms_norm", x, weight)
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if x.numel() == 0:
        return y
    n_cols = x.shape[-1]
    x2 = _as_rows(x, n_cols)
    y2 = y.view(-1, n_cols)
    n_rows = x2.shape[0]
    w = weight.reshape(-1).contiguous() if weight is not None else None
    has_weight = w is not None
    fp64 = x.dtype == torch.float64
    if _fused(_static(n_cols), MAX_FUSED_FWD_BLOCK):
        block_m, block_n, num_warps = _fwd_tile(_static(n_cols))
        _launch(
            _rms_norm_fwd_kernel,
            (triton.cdiv(n_rows, block_m),),
            x2,
            w if has_weight else x2,  # never read when HAS_WEIGHT is False
            y2,
            n_rows,
            n_cols,
            x2.stride(0),
            y2.stride(0),
            eps,
            HAS_WEIGHT=has_weight,
            FP64=fp64,
            BLOCK_M=block_m,
            BLOCK_N=block_n,
            num_warps=num_warps,
        )
    else:
        _launch(
            _rms_norm_fwd_looped_kernel,
            (n_rows,),
            x2,
            w if has_weight else x2,
            y2,
            n_cols,
            x2.stride(0),
            y2.stride(0),
            eps,
            HAS_WEIGHT=has_weight,
            FP64=fp64,
            BLOCK_N=_looped_block(_static(n_cols), MAX_FUSED_FWD_BLOCK, _PADDED_FWD_BLOCK),
            num_warps=8,
        )
    return y


@_define_op("hotloop::rms_norm_triton_backward")
def _rms_norm_triton_backward(
    grad_out: torch.Tensor, x: torch.Tensor, weight: Optional[torch.Tensor], eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    _check_inputs("rms_norm_backward", x, weight)
    if grad_out.shape != x.shape or grad_out.dtype != x.dtype or grad_out.device != x.device:
        raise ValueError(
            "rms_norm_backward(backend='triton'): grad_out is "
            f"{grad_out.dtype}{list(grad_out.shape)} on {grad_out.device} but x is "
            f"{x.dtype}{list(x.shape)} on {x.device} (expected the same shape, dtype, device)"
        )
    grad_x = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if weight is None:
        grad_weight = torch.empty((0,), dtype=x.dtype, device=x.device)
    elif x.numel() == 0:
        return grad_x, torch.zeros(weight.shape, dtype=weight.dtype, device=weight.device)
    if x.numel() == 0:
        return grad_x, grad_weight

    n_cols = x.shape[-1]
    x2 = _as_rows(x, n_cols)
    dy2 = _as_rows(grad_out, n_cols)
    dx2 = grad_x.view(-1, n_cols)
    n_rows = x2.shape[0]
    w = weight.reshape(-1).contiguous() if weight is not None else None
    has_weight = w is not None
    fp64 = x.dtype == torch.float64
    acc_dtype = torch.float64 if fp64 else torch.float32

    if _fused(_static(n_cols), MAX_FUSED_BWD_BLOCK):
        block_m, block_n, num_warps = _bwd_tile(_static(n_cols))
        per_sm = _BWD_CONFIG[block_n][2] if block_n in _BWD_CONFIG else None
        programs = _num_persistent_programs(
            x.device, num_warps, triton.cdiv(n_rows, block_m), per_sm=per_sm
        )
        dw_partial = torch.empty(
            (programs, n_cols) if has_weight else (0,), dtype=acc_dtype, device=x.device
        )
        _launch(
            _rms_norm_bwd_kernel,
            (programs,),
            dy2,
            x2,
            w if has_weight else x2,
            dx2,
            dw_partial if has_weight else dx2,  # never written when HAS_WEIGHT is False
            n_rows,
            n_cols,
            dy2.stride(0),
            x2.stride(0),
            dx2.stride(0),
            eps,
            HAS_WEIGHT=has_weight,
            FP64=fp64,
            BLOCK_M=block_m,
            BLOCK_N=block_n,
            RELOAD_W=block_m * block_n > _RELOAD_W_TILE,
            num_warps=num_warps,
        )
    else:
        looped_block = _looped_block(_static(n_cols), MAX_FUSED_BWD_BLOCK, _PADDED_BWD_BLOCK)
        rstd = torch.empty((n_rows,), dtype=acc_dtype, device=x.device)
        coef = torch.empty((n_rows,), dtype=acc_dtype, device=x.device)
        _launch(
            _rms_norm_bwd_row_stats_kernel,
            (n_rows,),
            dy2,
            x2,
            w if has_weight else x2,
            rstd,
            coef,
            n_cols,
            dy2.stride(0),
            x2.stride(0),
            eps,
            HAS_WEIGHT=has_weight,
            FP64=fp64,
            BLOCK_N=looped_block,
            num_warps=16,
        )
        col_blocks = triton.cdiv(n_cols, looped_block)
        # About two programs an SM in all, each (row set, column block) one of them.
        programs = max(1, triton.cdiv(2 * _num_persistent_programs(x.device, 32), col_blocks))
        programs = _num_persistent_programs(x.device, 32, n_rows, programs)
        dw_partial = torch.empty(
            (programs, n_cols) if has_weight else (0,), dtype=acc_dtype, device=x.device
        )
        _launch(
            _rms_norm_bwd_looped_kernel,
            (programs, col_blocks),
            dy2,
            x2,
            w if has_weight else x2,
            rstd,
            coef,
            dx2,
            dw_partial if has_weight else dx2,
            n_rows,
            n_cols,
            dy2.stride(0),
            x2.stride(0),
            dx2.stride(0),
            HAS_WEIGHT=has_weight,
            FP64=fp64,
            BLOCK_N=looped_block,
            num_warps=16,
        )
    if weight is not None:
        grad_weight = dw_partial.sum(0).to(weight.dtype).view(weight.shape)
    return grad_x, grad_weight


def _setup_context(ctx, inputs, output):
    x, weight, eps = inputs
    ctx.save_for_backward(x, weight)
    ctx.eps = eps


def _backward(ctx, grad_out):
    x, weight = ctx.saved_tensors
    grad_x, grad_weight = torch.ops.hotloop.rms_norm_triton_backward(grad_out, x, weight, ctx.eps)
    return grad_x, (grad_weight if weight is not None else None), None


torch.library.register_autograd("hotloop::rms_norm_triton", _backward, setup_context=_setup_context)


# ------------------------------------------------------------------------ Python API


def rms_norm(
    x: torch.Tensor, weight: Optional[torch.Tensor] = None, eps: Optional[float] = None
) -> torch.Tensor:
    """``F.rms_norm(x, (x.size(-1),), weight, eps)`` through the Triton kernels.

    ``eps=None`` means ``torch.finfo(x.dtype).eps``, as in ``F.rms_norm``. Differentiable
    in ``x`` and ``weight``; traced by torch.compile without a graph break.
    """
    if eps is None:
        eps = torch.finfo(x.dtype).eps if x.is_floating_point() else 0.0
    return torch.ops.hotloop.rms_norm_triton(x, weight, eps)


def rms_norm_backward(
    grad_out: torch.Tensor, x: torch.Tensor, weight: Optional[torch.Tensor], eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(grad_x, grad_weight) of :func:`rms_norm`; grad_weight is ``(0,)`` without weight."""
    return torch.ops.hotloop.rms_norm_triton_backward(grad_out, x, weight, eps)
