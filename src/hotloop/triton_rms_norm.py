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
scheme of Liger-Kernel and Unsloth). A row is held in registers as one power-of-two
block, or, where that would be mostly padding, as half of it plus a small tail block
(8193 as 8192 + 16). Rows wider than one program holds (``MAX_FUSED_BLOCK``) take a
looped path (forward: two passes over each row, the second from L2; backward: a per-row
statistics kernel, then a column-blocked kernel that writes ``grad_x`` and the dw
partials, which reads x and dy twice).

Inputs must be CUDA tensors, except under ``TRITON_INTERPRET=1`` (Triton's
interpreter, which reads the variable when this module is imported), where CPU tensors
run through the interpreter so that the kernels can be tested on a machine without a GPU.

This module imports on a machine without a GPU; kernels compile at their first call.
"""

from typing import Any, Callable, NamedTuple, Optional

import torch
import triton
import triton.language as tl
from triton.runtime.jit import JITFunction

__all__ = [
    "BwdConfig",
    "FwdConfig",
    "backward_rows",
    "forward_rows",
    "interpreting",
    "rms_norm",
    "rms_norm_backward",
    "row_alignment",
]

# Widest rows (register blocks, BLOCK_N + BLOCK_TAIL) that one program holds in
# registers; wider rows take the looped kernels.
MAX_FUSED_BLOCK = 16384
# Column block of the looped kernels.
LOOPED_BLOCK = 4096
# Rows under this fraction of their power of two (8193 of 16384) are held as half of it
# plus a tail block (see row_blocks); the smallest tail block.
_WIDE_FILL = 0.75
_MIN_TAIL_BLOCK = 16
# Elements a row-tile of the forward should hold for narrow rows (several rows a program).
_TILE_ELEMENTS = 4096
# Where _BWD_CONFIG doesn't say: warps of the persistent backward per SM, and elements a
# row-tile should hold for narrow rows.
_BWD_WARPS_PER_SM = 32
_BWD_SMALL_TILE = 2048
# Backward tiles above this many elements reload w in every iteration.
_RELOAD_W_TILE = 8192
# Widest load or store of one thread.
_VECTOR_BYTES = 16


class FwdConfig(NamedTuple):
    """Launch settings of the fused forward: rows per program and warps."""

    block_m: int
    num_warps: int


class BwdConfig(NamedTuple):
    """Launch settings of the fused persistent backward (see _rms_norm_bwd_kernel)."""

    block_m: int
    num_warps: int
    programs_per_sm: int
    prefetch: bool = False
    loop_stages: int = 1


# Launch settings by (BLOCK_N, BLOCK_TAIL, rows start on 16-byte boundaries), the fastest
# of benchmarks/tune_triton_rms_norm.py on an H100 (bf16, 268 MB tensors, torch 2.11,
# Triton 3.6; results in benchmarks/results/tune_triton_rms_norm*.json). Aligned rows,
# loaded as 16-byte vectors, are fastest with one or two programs an SM that prefetch
# their next tile; unaligned rows (such as 4095, 8193) take scalar loads and prefer more
# programs without prefetching. Cases the sweep did not cover take fwd_config's and
# bwd_config's rules.
_FWD_CONFIG = {
    (512, 0, True): FwdConfig(2, 4),
    (1024, 0, True): FwdConfig(2, 8),
    (2048, 0, True): FwdConfig(1, 8),
    (4096, 0, True): FwdConfig(1, 16),
    (8192, 0, True): FwdConfig(2, 16),
    (16384, 0, True): FwdConfig(1, 16),
    (1024, 0, False): FwdConfig(4, 4),
    (4096, 0, False): FwdConfig(2, 4),
    (8192, 16, False): FwdConfig(1, 8),
}
_BWD_CONFIG = {
    (512, 0, True): BwdConfig(8, 4, 2, prefetch=True),
    (1024, 0, True): BwdConfig(4, 4, 2, prefetch=True),
    (2048, 0, True): BwdConfig(4, 8, 1, prefetch=True),
    (4096, 0, True): BwdConfig(2, 8, 1, prefetch=True),
    (8192, 0, True): BwdConfig(1, 16, 1, prefetch=True),
    (16384, 0, True): BwdConfig(1, 16, 1),
    (1024, 0, False): BwdConfig(2, 4, 8, prefetch=True),
    (4096, 0, False): BwdConfig(1, 4, 2),
    (8192, 16, False): BwdConfig(1, 8, 2),
}

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
def _multiple_of(n, ALIGN: tl.constexpr):
    # n, known to the compiler as a multiple of ALIGN (the host checked that it is one).
    # Triton specialises integer arguments on multiples of 16 only; rows of, say, 1000
    # bfloat16 elements start 16-byte aligned too, and with this their loads are 16-byte
    # vectors instead of scalars. (tl.multiple_of does not take scalar arguments.)
    if ALIGN > 1:
        return (n // ALIGN) * ALIGN
    else:
        return n


@triton.jit
def _load_tile(P, rows, row_mask, stride_row, cols, n_cols):
    # The [rows, cols] tile of a matrix with unit column stride; zeros outside it.
    mask = row_mask[:, None] & (cols < n_cols)[None, :]
    return tl.load(P + rows[:, None] * stride_row + cols[None, :], mask=mask, other=0.0)


@triton.jit
def _store_tile(P, rows, row_mask, stride_row, cols, n_cols, v):
    mask = row_mask[:, None] & (cols < n_cols)[None, :]
    tl.store(P + rows[:, None] * stride_row + cols[None, :], v.to(P.dtype.element_ty), mask=mask)


@triton.jit
def _load_weight(W, cols, n_cols, FP64: tl.constexpr):
    return _to_acc(tl.load(W + cols, mask=cols < n_cols, other=0.0), FP64)


@triton.jit
def _store_normed(
    Y,
    W,
    rows,
    row_mask,
    stride_y_row,
    cols,
    n_cols,
    x,
    rstd,
    HAS_WEIGHT: tl.constexpr,
    FP64: tl.constexpr,
):
    y = x * rstd[:, None]
    if HAS_WEIGHT:
        y = y * _load_weight(W, cols, n_cols, FP64)[None, :]
    _store_tile(Y, rows, row_mask, stride_y_row, cols, n_cols, y)


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
    BLOCK_TAIL: tl.constexpr,
    ALIGN: tl.constexpr,
):
    # One program normalises BLOCK_M whole rows, held in registers as a block of
    # BLOCK_N columns and, where BLOCK_TAIL > 0, a tail block of BLOCK_TAIL columns after it
    # (BLOCK_N + BLOCK_TAIL >= n_cols).
    n_cols = _multiple_of(n_cols, ALIGN)
    stride_x_row = _multiple_of(stride_x_row, ALIGN)
    stride_y_row = _multiple_of(stride_y_row, ALIGN)
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_mask = rows < n_rows
    cols = tl.arange(0, BLOCK_N)
    x = _to_acc(_load_tile(X, rows, row_mask, stride_x_row, cols, n_cols), FP64)
    sum_sq = tl.sum(x * x, axis=1)
    if BLOCK_TAIL > 0:
        tail = BLOCK_N + tl.arange(0, BLOCK_TAIL)
        x_tail = _to_acc(_load_tile(X, rows, row_mask, stride_x_row, tail, n_cols), FP64)
        sum_sq += tl.sum(x_tail * x_tail, axis=1)
    rstd = _rsqrt(sum_sq / n_cols + eps, FP64)
    _store_normed(Y, W, rows, row_mask, stride_y_row, cols, n_cols, x, rstd, HAS_WEIGHT, FP64)
    if BLOCK_TAIL > 0:
        _store_normed(
            Y, W, rows, row_mask, stride_y_row, tail, n_cols, x_tail, rstd, HAS_WEIGHT, FP64
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
    # One program per row, for rows wider than MAX_FUSED_BLOCK: a pass for the mean
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
            y = y * _load_weight(W, cols, n_cols, FP64)
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
    BLOCK_TAIL: tl.constexpr,
    RELOAD_W: tl.constexpr,
    PREFETCH: tl.constexpr,
    LOOP_STAGES: tl.constexpr,
    ALIGN: tl.constexpr,
):
    # Persistent backward: program p of P takes row tiles p, p + P, p + 2P, ...
    # (columns as in the forward: a block and an optional tail block). With g = dy * w,
    #   dx = rstd * (g - x * c),  c = mean(g * x) * rstd^2,  dw += sum_rows(dy * x * rstd);
    # the two row sums are independent, so their reductions overlap. The dw share stays
    # in registers until the end (one partial row per program), as a whole
    # [BLOCK_M, BLOCK_N] tile summed over its rows once: a cross-row (cross-warp)
    # reduction in every iteration costs more than the loads.
    # PREFETCH loads the next tile's x and dy before working on this one, so that a
    # program always has loads in flight; LOOP_STAGES > 1 asks Triton's pipeliner instead.
    n_cols = _multiple_of(n_cols, ALIGN)
    stride_dy_row = _multiple_of(stride_dy_row, ALIGN)
    stride_x_row = _multiple_of(stride_x_row, ALIGN)
    stride_dx_row = _multiple_of(stride_dx_row, ALIGN)
    pid = tl.program_id(0)
    step = tl.num_programs(0) * BLOCK_M
    cols = tl.arange(0, BLOCK_N)
    # RELOAD_W: wide rows load w in every iteration (from L1/L2) instead of holding it in
    # registers, which would spill.
    if HAS_WEIGHT and not RELOAD_W:
        w = _load_weight(W, cols, n_cols, FP64)
    dw_acc = _to_acc(tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32), FP64)
    if BLOCK_TAIL > 0:
        tail = BLOCK_N + tl.arange(0, BLOCK_TAIL)
        if HAS_WEIGHT:
            w_tail = _load_weight(W, tail, n_cols, FP64)
        dw_tail = _to_acc(tl.zeros([BLOCK_M, BLOCK_TAIL], dtype=tl.float32), FP64)
    if PREFETCH:
        rows = (pid * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
        x_next = _load_tile(X, rows, rows < n_rows, stride_x_row, cols, n_cols)
        dy_next = _load_tile(DY, rows, rows < n_rows, stride_dy_row, cols, n_cols)
        if BLOCK_TAIL > 0:
            x_tail_next = _load_tile(X, rows, rows < n_rows, stride_x_row, tail, n_cols)
            dy_tail_next = _load_tile(DY, rows, rows < n_rows, stride_dy_row, tail, n_cols)
    for start in tl.range(pid * BLOCK_M, n_rows, step, num_stages=LOOP_STAGES):
        rows = (start + tl.arange(0, BLOCK_M)).to(tl.int64)
        row_mask = rows < n_rows
        if PREFETCH:
            x = x_next
            dy = dy_next
            next_rows = rows + step
            x_next = _load_tile(X, next_rows, next_rows < n_rows, stride_x_row, cols, n_cols)
            dy_next = _load_tile(DY, next_rows, next_rows < n_rows, stride_dy_row, cols, n_cols)
            if BLOCK_TAIL > 0:
                x_tail = x_tail_next
                dy_tail = dy_tail_next
                x_tail_next = _load_tile(
                    X, next_rows, next_rows < n_rows, stride_x_row, tail, n_cols
                )
                dy_tail_next = _load_tile(
                    DY, next_rows, next_rows < n_rows, stride_dy_row, tail, n_cols
                )
        else:
            x = _load_tile(X, rows, row_mask, stride_x_row, cols, n_cols)
            dy = _load_tile(DY, rows, row_mask, stride_dy_row, cols, n_cols)
            if BLOCK_TAIL > 0:
                x_tail = _load_tile(X, rows, row_mask, stride_x_row, tail, n_cols)
                dy_tail = _load_tile(DY, rows, row_mask, stride_dy_row, tail, n_cols)
        x = _to_acc(x, FP64)
        dy = _to_acc(dy, FP64)
        if HAS_WEIGHT and RELOAD_W:
            w = _load_weight(W, cols, n_cols, FP64)
        if HAS_WEIGHT:  # noqa: SIM108 (w exists only when HAS_WEIGHT)
            g = dy * w[None, :]
        else:
            g = dy
        sum_sq = tl.sum(x * x, axis=1)
        sum_gx = tl.sum(g * x, axis=1)
        if BLOCK_TAIL > 0:
            x_tail = _to_acc(x_tail, FP64)
            dy_tail = _to_acc(dy_tail, FP64)
            if HAS_WEIGHT:  # noqa: SIM108
                g_tail = dy_tail * w_tail[None, :]
            else:
                g_tail = dy_tail
            sum_sq += tl.sum(x_tail * x_tail, axis=1)
            sum_gx += tl.sum(g_tail * x_tail, axis=1)
        rstd = _rsqrt(sum_sq / n_cols + eps, FP64)
        c = sum_gx / n_cols * rstd * rstd
        dx = (g - x * c[:, None]) * rstd[:, None]
        _store_tile(DX, rows, row_mask, stride_dx_row, cols, n_cols, dx)
        if HAS_WEIGHT:
            dw_acc += dy * x * rstd[:, None]
        if BLOCK_TAIL > 0:
            dx_tail = (g_tail - x_tail * c[:, None]) * rstd[:, None]
            _store_tile(DX, rows, row_mask, stride_dx_row, tail, n_cols, dx_tail)
            if HAS_WEIGHT:
                dw_tail += dy_tail * x_tail * rstd[:, None]
    if HAS_WEIGHT:
        dw_row = DW_PARTIAL + pid.to(tl.int64) * n_cols
        tl.store(dw_row + cols, tl.sum(dw_acc, axis=0), mask=cols < n_cols)
        if BLOCK_TAIL > 0:
            tl.store(dw_row + tail, tl.sum(dw_tail, axis=0), mask=tail < n_cols)


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
    # coef = mean(g * x) * rstd^2, so that dx = rstd * (g - coef * x).
    row = tl.program_id(0).to(tl.int64)
    sum_sq = _to_acc(tl.zeros([BLOCK_N], dtype=tl.float32), FP64)
    sum_gx = _to_acc(tl.zeros([BLOCK_N], dtype=tl.float32), FP64)
    for start in range(0, n_cols, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        col_mask = cols < n_cols
        x = _to_acc(tl.load(X + row * stride_x_row + cols, mask=col_mask, other=0.0), FP64)
        g = _to_acc(tl.load(DY + row * stride_dy_row + cols, mask=col_mask, other=0.0), FP64)
        if HAS_WEIGHT:
            g = g * _load_weight(W, cols, n_cols, FP64)
        sum_sq += x * x
        sum_gx += g * x
    rstd = _rsqrt(tl.sum(sum_sq, axis=0) / n_cols + eps, FP64)
    coef = tl.sum(sum_gx, axis=0) / n_cols * rstd * rstd
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
        w = _load_weight(W, cols, n_cols, FP64)
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
        dx = (g - coef * x) * rstd
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


def row_blocks(n_cols: int) -> tuple[int, int]:
    """(BLOCK_N, BLOCK_TAIL): the register blocks that hold a row of n_cols elements.

    One power-of-two block where that wastes little; rows under _WIDE_FILL of their
    power of two are held as half of it plus a small tail block (8193 as 8192 + 16,
    5000 as 4096 + 1024), which keeps registers and threads on real columns.
    """
    block = triton.next_power_of_2(n_cols)
    if n_cols >= _WIDE_FILL * block:
        return block, 0
    head = block // 2
    tail = max(_MIN_TAIL_BLOCK, triton.next_power_of_2(n_cols - head))
    return (head, tail) if head + tail < block else (block, 0)


def fused(n_cols: int) -> bool:
    """Whether rows of n_cols elements take the fused (one row in registers) kernels."""
    return sum(row_blocks(n_cols)) <= MAX_FUSED_BLOCK


def row_alignment(element_size: int, n_cols: int, *row_strides: Any) -> int:
    """ALIGN of the fused kernels: the largest power of two, up to one 16-byte vector of
    elements, that divides n_cols and every row stride. A stride that is not a plain int
    (symbolic under torch.compile) counts as 1, so that tracing adds no guard."""
    align = _VECTOR_BYTES // element_size
    for n in (n_cols, *row_strides):
        if not isinstance(n, int):
            return 1
        while n % align:
            align //= 2
    return align


def _alignment(width: int, *matrices: torch.Tensor) -> tuple[int, bool]:
    """(ALIGN, whether rows start on 16-byte boundaries) for (rows, width) matrices of one
    dtype."""
    element_size = matrices[0].element_size()
    align = row_alignment(element_size, width, *(m.stride(0) for m in matrices))
    return align, align * element_size == _VECTOR_BYTES


def _swept(table: dict[tuple[int, int, bool], Any], n_cols: int, aligned: bool) -> Any:
    """The sweep's settings for rows of n_cols elements: those of the same blocks and
    alignment, else of the same blocks aligned (a wide unaligned row still needs the
    warps of its width), else None."""
    block_n, block_tail = row_blocks(n_cols)
    return table.get((block_n, block_tail, aligned), table.get((block_n, block_tail, True)))


def _pow2_at_most(n: int) -> int:
    return 1 << (max(1, n).bit_length() - 1)


def _warps_for(elements: int, per_thread: int) -> int:
    """Warps (4 to 16) that give each thread about per_thread of the elements."""
    return min(16, max(4, triton.next_power_of_2(triton.cdiv(elements, 32 * per_thread))))


def fwd_config(n_cols: int, aligned: bool = True) -> FwdConfig:
    """Settings of the fused forward for rows of n_cols elements (``aligned``: they start
    on 16-byte boundaries, see row_alignment): from _FWD_CONFIG where the sweep covered
    the case, else narrow rows packed to about _TILE_ELEMENTS elements
    a program, 8 to 16 elements a thread."""
    swept = _swept(_FWD_CONFIG, n_cols, aligned)
    if swept is not None:
        return swept
    width = sum(row_blocks(n_cols))
    block_m = min(128, _pow2_at_most(_TILE_ELEMENTS // width))
    return FwdConfig(block_m, _warps_for(block_m * width, 16))


def bwd_config(n_cols: int, aligned: bool = True) -> BwdConfig:
    """Settings of the fused backward, as fwd_config's: from _BWD_CONFIG where the sweep
    covered the case, else tiles of about _BWD_SMALL_TILE elements, 8 to 16 elements a thread, on 4
    warps where that is enough (the row reductions stay inside few warps), and programs
    for _BWD_WARPS_PER_SM warps an SM."""
    swept = _swept(_BWD_CONFIG, n_cols, aligned)
    if swept is not None:
        return swept
    width = sum(row_blocks(n_cols))
    block_m = min(128, _pow2_at_most(_BWD_SMALL_TILE // width))
    num_warps = _warps_for(block_m * width, 16)
    return BwdConfig(block_m, num_warps, max(1, _BWD_WARPS_PER_SM // num_warps))


def _sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of the device; under the interpreter a small number, so
    that a few persistent programs still exercise the dw reduction."""
    if device.type != "cuda":
        return 2
    return torch.cuda.get_device_properties(device).multi_processor_count


def _persistent_programs(device: torch.device, per_sm: int, work_items: Any) -> int:
    """Programs of a persistent kernel: per_sm on every SM, fewer when there are fewer
    work items (row tiles) than that.

    The count is a plain int even when torch.compile traces with a symbolic row count
    (then it is not capped): the [programs, H] partials and their reduction get a static
    shape instead of a nest of symbolic ceil-divisions.
    """
    programs = _sm_count(device) * per_sm
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


def forward_rows(
    x: torch.Tensor,
    weight: Optional[torch.Tensor],
    y: torch.Tensor,
    eps: float,
    config: Optional[FwdConfig] = None,
) -> None:
    """Launch the forward on 2-d (rows, H) tensors with unit column stride: y = RMSNorm(x).

    ``config`` overrides the launch settings of the fused kernel (benchmarks/
    tune_triton_rms_norm.py sweeps them); by default they come from fwd_config.
    """
    n_rows, n_cols = x.shape
    has_weight = weight is not None
    fp64 = x.dtype == torch.float64
    width = _static(n_cols)
    if fused(width):
        block_n, block_tail = row_blocks(width)
        align, aligned = _alignment(width, x, y)
        config = config or fwd_config(width, aligned)
        _launch(
            _rms_norm_fwd_kernel,
            (triton.cdiv(n_rows, config.block_m),),
            x,
            weight if has_weight else x,  # never read when HAS_WEIGHT is False
            y,
            n_rows,
            n_cols,
            x.stride(0),
            y.stride(0),
            eps,
            HAS_WEIGHT=has_weight,
            FP64=fp64,
            BLOCK_M=config.block_m,
            BLOCK_N=block_n,
            BLOCK_TAIL=block_tail,
            ALIGN=align,
            num_warps=config.num_warps,
        )
    else:
        _launch(
            _rms_norm_fwd_looped_kernel,
            (n_rows,),
            x,
            weight if has_weight else x,
            y,
            n_cols,
            x.stride(0),
            y.stride(0),
            eps,
            HAS_WEIGHT=has_weight,
            FP64=fp64,
            BLOCK_N=LOOPED_BLOCK,
            num_warps=8,
        )


def backward_rows(
    grad_out: torch.Tensor,
    x: torch.Tensor,
    weight: Optional[torch.Tensor],
    grad_x: torch.Tensor,
    eps: float,
    config: Optional[BwdConfig] = None,
) -> Optional[torch.Tensor]:
    """Launch the backward on 2-d (rows, H) tensors with unit column stride: writes grad_x
    and returns the [programs, H] partial sums of grad_weight (None without weight).

    ``config`` overrides the launch settings of the fused kernel, as in forward_rows.
    """
    n_rows, n_cols = x.shape
    has_weight = weight is not None
    fp64 = x.dtype == torch.float64
    acc_dtype = torch.float64 if fp64 else torch.float32
    width = _static(n_cols)
    if fused(width):
        block_n, block_tail = row_blocks(width)
        align, aligned = _alignment(width, grad_out, x, grad_x)
        config = config or bwd_config(width, aligned)
        programs = _persistent_programs(
            x.device, config.programs_per_sm, triton.cdiv(n_rows, config.block_m)
        )
        dw_partial = torch.empty(
            (programs, n_cols) if has_weight else (0,), dtype=acc_dtype, device=x.device
        )
        _launch(
            _rms_norm_bwd_kernel,
            (programs,),
            grad_out,
            x,
            weight if has_weight else x,
            grad_x,
            dw_partial if has_weight else grad_x,  # never written when HAS_WEIGHT is False
            n_rows,
            n_cols,
            grad_out.stride(0),
            x.stride(0),
            grad_x.stride(0),
            eps,
            HAS_WEIGHT=has_weight,
            FP64=fp64,
            BLOCK_M=config.block_m,
            BLOCK_N=block_n,
            BLOCK_TAIL=block_tail,
            RELOAD_W=config.block_m * block_n > _RELOAD_W_TILE,
            PREFETCH=config.prefetch,
            LOOP_STAGES=config.loop_stages,
            ALIGN=align,
            num_warps=config.num_warps,
        )
    else:
        rstd = torch.empty((n_rows,), dtype=acc_dtype, device=x.device)
        coef = torch.empty((n_rows,), dtype=acc_dtype, device=x.device)
        _launch(
            _rms_norm_bwd_row_stats_kernel,
            (n_rows,),
            grad_out,
            x,
            weight if has_weight else x,
            rstd,
            coef,
            n_cols,
            grad_out.stride(0),
            x.stride(0),
            eps,
            HAS_WEIGHT=has_weight,
            FP64=fp64,
            BLOCK_N=LOOPED_BLOCK,
            num_warps=16,
        )
        col_blocks = triton.cdiv(n_cols, LOOPED_BLOCK)
        # About two programs an SM in all, each (row set, column block) one of them.
        row_sets = min(n_rows, max(1, triton.cdiv(2 * _sm_count(x.device), col_blocks)))
        dw_partial = torch.empty(
            (row_sets, n_cols) if has_weight else (0,), dtype=acc_dtype, device=x.device
        )
        _launch(
            _rms_norm_bwd_looped_kernel,
            (row_sets, col_blocks),
            grad_out,
            x,
            weight if has_weight else x,
            rstd,
            coef,
            grad_x,
            dw_partial if has_weight else grad_x,
            n_rows,
            n_cols,
            grad_out.stride(0),
            x.stride(0),
            grad_x.stride(0),
            HAS_WEIGHT=has_weight,
            FP64=fp64,
            BLOCK_N=LOOPED_BLOCK,
            num_warps=16,
        )
    return dw_partial if has_weight else None


@_define_op("hotloop::rms_norm_triton")
def _rms_norm_triton(x: torch.Tensor, weight: Optional[torch.Tensor], eps: float) -> torch.Tensor:
    _check_inputs("rms_norm", x, weight)
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if x.numel() == 0:
        return y
    n_cols = x.shape[-1]
    w = weight.reshape(-1).contiguous() if weight is not None else None
    forward_rows(_as_rows(x, n_cols), w, y.view(-1, n_cols), eps)
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
    w = weight.reshape(-1).contiguous() if weight is not None else None
    dw_partial = backward_rows(
        _as_rows(grad_out, n_cols), _as_rows(x, n_cols), w, grad_x.view(-1, n_cols), eps
    )
    if weight is not None and dw_partial is not None:
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
