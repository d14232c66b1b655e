"""The Triton kernels of RMSNorm: a fused forward and backward that hold whole rows in
registers, and looped ones for rows wider than ``launch_config.MAX_FUSED_BLOCK``.

The launch settings (block shapes, warps, programs) come from ``launch_config``; the host
code that picks and launches them is ``launch``.
"""

import triton
import triton.language as tl
from triton.runtime.jit import JITFunction


@triton.jit
def _to_acc(v, FP64: tl.constexpr):
    # Accumulation type: float32, or float64 for float64 inputs.
    if FP64:
        return v.to(tl.float64)
    else:
        return v.to(tl.float32)


@triton.jit
def _eps(eps, eps_lo, FP64: tl.constexpr):
    # Triton passes a Python float as float32: float64 kernels get eps as float32(eps) plus
    # the float32 rest (eps_lo, see launch.eps_parts), which add up to eps within 2^-48.
    if FP64:
        return tl.cast(eps, tl.float64) + tl.cast(eps_lo, tl.float64)
    else:
        return eps


@triton.jit
def _rsqrt(v, FP64: tl.constexpr):
    # tl.rsqrt is float32-only; float64 takes a sqrt and a division. The cast first:
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


# CASTING (a constexpr; hotloop.ops.CASTINGS names them, csrc/common/norm_casting.h says
# what each computes): 0 rounds once, after the weight (torch.nn.RMSNorm); 1 rounds x * rstd
# to the dtype before the weight (transformers' LlamaRMSNorm); 2 multiplies by
# (offset + weight), formed in float32 (GemmaRMSNorm).
LLAMA: tl.constexpr = tl.constexpr(1)
GEMMA: tl.constexpr = tl.constexpr(2)


@triton.jit
def _load_weight(W, cols, n_cols, offset, FP64: tl.constexpr, CASTING: tl.constexpr):
    # The weight as it multiplies: offset + weight in GEMMA.
    w = _to_acc(tl.load(W + cols, mask=cols < n_cols, other=0.0), FP64)
    if CASTING == GEMMA and FP64:
        w = tl.cast(offset, tl.float64) + w
    elif CASTING == GEMMA:
        w = tl.cast(offset, tl.float32) + w
    return w


@triton.jit
def _llama_rounded(v, P, CASTING: tl.constexpr):
    # v rounded to P's dtype and back in LLAMA (the value its weight multiplies), else v.
    if CASTING == LLAMA and P.dtype.element_ty == tl.bfloat16 and PAIRED_BF16_ROUNDING:
        return _bf16_rounded(v)
    elif CASTING == LLAMA:
        return v.to(P.dtype.element_ty).to(v.dtype)
    else:
        return v


# Whether the kernels run in Triton's interpreter (``TRITON_INTERPRET=1`` was set when this
# module was imported: ``triton.jit`` reads it at decoration time), where _bf16_rounded's
# inline PTX cannot run.
_INTERPRETING = not isinstance(_to_acc, JITFunction)
PAIRED_BF16_ROUNDING: tl.constexpr = tl.constexpr(not _INTERPRETING)


@triton.jit
def _bf16_rounded(v):
    # float32 v rounded to bfloat16 (to nearest even) and back, two elements a conversion:
    # ptxas turns Triton's one-element round trip (cvt.rn.bf16.f32, then back) into
    # F2F.BF16.F32, which sm_90 issues on its slow conversion pipe (LLAMA's headline
    # backward: 32 of them a tile), and cvt.rn.bf16x2.f32 into F2FP.BF16.F32.PACK_AB, as
    # its stores are. The pair's first element lands in the upper half, already a float32's
    # bits; the second, shifted up.
    return tl.inline_asm_elementwise(
        "{ .reg .b32 t; cvt.rn.bf16x2.f32 t, $2, $3; and.b32 $0, t, 0xffff0000; "
        "shl.b32 $1, t, 16; }",
        "=r,=r,r,r",
        [v],
        dtype=tl.float32,
        is_pure=True,
        pack=2,
    )


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
    offset,
    HAS_WEIGHT: tl.constexpr,
    FP64: tl.constexpr,
    CASTING: tl.constexpr,
):
    y = x * rstd[:, None]
    if HAS_WEIGHT:
        y = _llama_rounded(y, Y, CASTING)
        y = y * _load_weight(W, cols, n_cols, offset, FP64, CASTING)[None, :]
    _store_tile(Y, rows, row_mask, stride_y_row, cols, n_cols, y)


@triton.jit
def rms_norm_fwd_kernel(
    X,
    W,
    Y,
    n_rows,
    n_cols,
    stride_x_row,
    stride_y_row,
    eps,
    eps_lo,
    offset,
    HAS_WEIGHT: tl.constexpr,
    FP64: tl.constexpr,
    CASTING: tl.constexpr,
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
    rstd = _rsqrt(sum_sq / n_cols + _eps(eps, eps_lo, FP64), FP64)
    _store_normed(
        Y, W, rows, row_mask, stride_y_row, cols, n_cols, x, rstd, offset, HAS_WEIGHT, FP64, CASTING
    )
    if BLOCK_TAIL > 0:
        _store_normed(
            Y,
            W,
            rows,
            row_mask,
            stride_y_row,
            tail,
            n_cols,
            x_tail,
            rstd,
            offset,
            HAS_WEIGHT,
            FP64,
            CASTING,
        )


@triton.jit
def rms_norm_fwd_looped_kernel(
    X,
    W,
    Y,
    n_cols,
    stride_x_row,
    stride_y_row,
    eps,
    eps_lo,
    offset,
    HAS_WEIGHT: tl.constexpr,
    FP64: tl.constexpr,
    CASTING: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    # One program per row, for rows wider than MAX_FUSED_BLOCK: a pass for the mean
    # of squares, then a pass that writes y, reading the row again from L2. The second
    # pass walks the row backwards, so it first reads the blocks the first pass read last,
    # which L2 is likeliest to still hold: on an H100, 4-8 % more bandwidth on rows of 128
    # and 256 KB, and within 1.2 % on rows of up to 80 KB (benchmarks/NOTES.md, run 63).
    row = tl.program_id(0).to(tl.int64)
    x_row = X + row * stride_x_row
    y_row = Y + row * stride_y_row
    acc = _to_acc(tl.zeros([BLOCK_N], dtype=tl.float32), FP64)
    for start in range(0, n_cols, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        x = _to_acc(tl.load(x_row + cols, mask=cols < n_cols, other=0.0), FP64)
        acc += x * x
    rstd = _rsqrt(tl.sum(acc, axis=0) / n_cols + _eps(eps, eps_lo, FP64), FP64)
    n_blocks = tl.cdiv(n_cols, BLOCK_N)
    for i in range(0, n_blocks):
        cols = (n_blocks - 1 - i) * BLOCK_N + tl.arange(0, BLOCK_N)
        col_mask = cols < n_cols
        y = _to_acc(tl.load(x_row + cols, mask=col_mask, other=0.0), FP64) * rstd
        if HAS_WEIGHT:
            y = _llama_rounded(y, Y, CASTING) * _load_weight(W, cols, n_cols, offset, FP64, CASTING)
        tl.store(y_row + cols, y.to(Y.dtype.element_ty), mask=col_mask)


@triton.jit
def rms_norm_bwd_kernel(
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
    eps_lo,
    offset,
    HAS_WEIGHT: tl.constexpr,
    FP64: tl.constexpr,
    CASTING: tl.constexpr,
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
        w = _load_weight(W, cols, n_cols, offset, FP64, CASTING)
    dw_acc = _to_acc(tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32), FP64)
    if BLOCK_TAIL > 0:
        tail = BLOCK_N + tl.arange(0, BLOCK_TAIL)
        if HAS_WEIGHT:
            w_tail = _load_weight(W, tail, n_cols, offset, FP64, CASTING)
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
            w = _load_weight(W, cols, n_cols, offset, FP64, CASTING)
        if HAS_WEIGHT:  # noqa: SIM108 (w exists only when HAS_WEIGHT)
            # LLAMA: autograd's product of two dtype tensors, rounded.
            g = _llama_rounded(dy * w[None, :], DY, CASTING)
        else:
            g = dy
        sum_sq = tl.sum(x * x, axis=1)
        sum_gx = tl.sum(g * x, axis=1)
        if BLOCK_TAIL > 0:
            x_tail = _to_acc(x_tail, FP64)
            dy_tail = _to_acc(dy_tail, FP64)
            if HAS_WEIGHT:
                g_tail = _llama_rounded(dy_tail * w_tail[None, :], DY, CASTING)
            else:
                g_tail = dy_tail
            sum_sq += tl.sum(x_tail * x_tail, axis=1)
            sum_gx += tl.sum(g_tail * x_tail, axis=1)
        rstd = _rsqrt(sum_sq / n_cols + _eps(eps, eps_lo, FP64), FP64)
        c = sum_gx / n_cols * rstd * rstd
        dx = (g - x * c[:, None]) * rstd[:, None]
        _store_tile(DX, rows, row_mask, stride_dx_row, cols, n_cols, dx)
        if HAS_WEIGHT and CASTING == LLAMA:
            dw_acc += dy * _llama_rounded(x * rstd[:, None], X, CASTING)
        elif HAS_WEIGHT:
            dw_acc += dy * x * rstd[:, None]
        if BLOCK_TAIL > 0:
            dx_tail = (g_tail - x_tail * c[:, None]) * rstd[:, None]
            _store_tile(DX, rows, row_mask, stride_dx_row, tail, n_cols, dx_tail)
            if HAS_WEIGHT and CASTING == LLAMA:
                dw_tail += dy_tail * _llama_rounded(x_tail * rstd[:, None], X, CASTING)
            elif HAS_WEIGHT:
                dw_tail += dy_tail * x_tail * rstd[:, None]
    if HAS_WEIGHT:
        dw_row = DW_PARTIAL + pid.to(tl.int64) * n_cols
        tl.store(dw_row + cols, tl.sum(dw_acc, axis=0), mask=cols < n_cols)
        if BLOCK_TAIL > 0:
            tl.store(dw_row + tail, tl.sum(dw_tail, axis=0), mask=tail < n_cols)


@triton.jit
def rms_norm_bwd_row_stats_kernel(
    DY,
    X,
    W,
    RSTD,
    COEF,
    n_cols,
    stride_dy_row,
    stride_x_row,
    eps,
    eps_lo,
    offset,
    HAS_WEIGHT: tl.constexpr,
    FP64: tl.constexpr,
    CASTING: tl.constexpr,
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
            g = _llama_rounded(
                g * _load_weight(W, cols, n_cols, offset, FP64, CASTING), DY, CASTING
            )
        sum_sq += x * x
        sum_gx += g * x
    rstd = _rsqrt(tl.sum(sum_sq, axis=0) / n_cols + _eps(eps, eps_lo, FP64), FP64)
    coef = tl.sum(sum_gx, axis=0) / n_cols * rstd * rstd
    tl.store(RSTD + row, rstd)
    tl.store(COEF + row, coef)


@triton.jit
def rms_norm_bwd_looped_kernel(
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
    offset,
    HAS_WEIGHT: tl.constexpr,
    FP64: tl.constexpr,
    CASTING: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    # Looped backward, step 2: program (m, n) takes rows m, m + M, m + 2M, ... of the
    # column block n; it writes dx there and keeps its dw share in registers.
    pid_m = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < n_cols
    if HAS_WEIGHT:
        w = _load_weight(W, cols, n_cols, offset, FP64, CASTING)
    dw_acc = _to_acc(tl.zeros([BLOCK_N], dtype=tl.float32), FP64)
    for row in range(pid_m.to(tl.int64), n_rows, tl.num_programs(0)):
        x = _to_acc(tl.load(X + row * stride_x_row + cols, mask=col_mask, other=0.0), FP64)
        dy = _to_acc(tl.load(DY + row * stride_dy_row + cols, mask=col_mask, other=0.0), FP64)
        rstd = tl.load(RSTD + row)
        coef = tl.load(COEF + row)
        if HAS_WEIGHT:  # noqa: SIM108 (w exists only when HAS_WEIGHT)
            g = _llama_rounded(dy * w, DY, CASTING)
        else:
            g = dy
        dx = (g - coef * x) * rstd
        tl.store(DX + row * stride_dx_row + cols, dx.to(DX.dtype.element_ty), mask=col_mask)
        if HAS_WEIGHT:
            dw_acc += _to_acc(dy * _llama_rounded(x * rstd, X, CASTING), FP64)
    if HAS_WEIGHT:
        tl.store(DW_PARTIAL + pid_m.to(tl.int64) * n_cols + cols, dw_acc, mask=col_mask)


def interpreting() -> bool:
    """Whether the kernels run in Triton's interpreter (``TRITON_INTERPRET=1`` was set
    when this module was imported: ``triton.jit`` reads it at decoration time)."""
    return _INTERPRETING
