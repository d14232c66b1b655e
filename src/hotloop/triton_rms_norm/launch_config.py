"""Launch settings of the Triton RMSNorm, as data: how a row of H elements is held in
registers, the tuned settings of the fused kernels by row shape, and the rules for the
shapes the tuning run did not cover.

The tables come from benchmarks/tune_triton_rms_norm.py; its winners are copied here by
hand, with the run that chose them.
"""

import functools
from dataclasses import dataclass
from typing import Optional, TypeVar

import triton

# Widest rows (register blocks, BLOCK_N + BLOCK_TAIL) that one program holds in
# registers; wider rows take the looped kernels.
MAX_FUSED_BLOCK = 16384
# Column block of the looped kernels, and the warps of the looped forward: on 32 warps (4
# elements a thread; 8 before) it ran 1.3-1.4x faster on rows of up to 80 KB and 1.02-1.07x
# on rows of 128 and 256 KB, on an H100 (bf16 and float32, benchmarks/NOTES.md, run 63).
LOOPED_BLOCK = 4096
LOOPED_FWD_WARPS = 32
# Rows under this fraction of their power of two (8193 of 16384) are held as half of it
# plus a tail block (see row_blocks); the smallest tail block.
_WIDE_FILL = 0.75
_MIN_TAIL_BLOCK = 16
# Elements a row-tile of the forward should hold for narrow rows (several rows a program).
_TILE_ELEMENTS = 4096
# Where BWD_CONFIG doesn't say: warps of the persistent backward per SM, and elements a
# row-tile should hold for narrow rows.
_BWD_WARPS_PER_SM = 32
_BWD_SMALL_TILE = 2048
# Backward tiles above this many elements reload w in every iteration.
RELOAD_W_TILE = 8192
# Widest load or store of one thread.
VECTOR_BYTES = 16


@dataclass(frozen=True)
class FwdConfig:
    """Launch settings of the fused forward: rows per program and warps."""

    block_m: int
    num_warps: int


@dataclass(frozen=True)
class BwdConfig:
    """Launch settings of the fused persistent backward (see kernels.rms_norm_bwd_kernel)."""

    block_m: int
    num_warps: int
    programs_per_sm: int
    prefetch: bool = False
    loop_stages: int = 1


# A table's key: (BLOCK_N, BLOCK_TAIL, rows start on 16-byte boundaries).
RowShape = tuple[int, int, bool]

# Launch settings by row shape, the fastest of benchmarks/tune_triton_rms_norm.py on an
# H100 (bf16, 268 MB tensors, torch 2.11, Triton 3.6; results in
# benchmarks/results/tune_triton_rms_norm*.json). Aligned rows, loaded as 16-byte vectors,
# are fastest with one or two programs an SM that prefetch their next tile; unaligned rows
# (such as 4095, 8193) take scalar loads and prefer more programs without prefetching.
# Cases the sweep did not cover take fwd_config's and bwd_config's rules.
FWD_CONFIG: dict[RowShape, FwdConfig] = {
    (512, 0, True): FwdConfig(2, 4),
    (1024, 0, True): FwdConfig(2, 8),
    (2048, 0, True): FwdConfig(1, 8),
    (4096, 0, True): FwdConfig(1, 16),
    (8192, 0, True): FwdConfig(2, 16),
    (16384, 0, True): FwdConfig(1, 16),
    (1024, 0, False): FwdConfig(4, 4),
    (2048, 0, False): FwdConfig(4, 4),
    (4096, 0, False): FwdConfig(2, 4),
    (8192, 16, False): FwdConfig(1, 8),
}
BWD_CONFIG: dict[RowShape, BwdConfig] = {
    (512, 0, True): BwdConfig(8, 4, 2, prefetch=True),
    (1024, 0, True): BwdConfig(4, 4, 2, prefetch=True),
    (2048, 0, True): BwdConfig(4, 8, 1, prefetch=True),
    (4096, 0, True): BwdConfig(2, 8, 1, prefetch=True),
    (8192, 0, True): BwdConfig(1, 16, 1, prefetch=True),
    (16384, 0, True): BwdConfig(1, 16, 1),
    (1024, 0, False): BwdConfig(2, 4, 8, prefetch=True),
    (2048, 0, False): BwdConfig(2, 8, 2),
    (4096, 0, False): BwdConfig(1, 4, 2),
    (8192, 16, False): BwdConfig(1, 8, 2),
}


# Cached: every launch asks (a pure function of its arguments).
@functools.cache
def row_blocks(n_cols: int) -> tuple[int, int]:
    """(BLOCK_N, BLOCK_TAIL): the register blocks that hold a row of n_cols elements.

    One power-of-two block where that wastes little; rows under _WIDE_FILL of their
    power of two are held as half of it plus a small tail block (8193 as 8192 + 16,
    5000 as 4096 + 1024), which keeps registers and threads on real columns.
    """
    block: int = triton.next_power_of_2(n_cols)
    if n_cols >= _WIDE_FILL * block:
        return block, 0
    head = block // 2
    tail: int = max(_MIN_TAIL_BLOCK, triton.next_power_of_2(n_cols - head))
    return (head, tail) if head + tail < block else (block, 0)


def fused(n_cols: int) -> bool:
    """Whether rows of n_cols elements take the fused (one row in registers) kernels."""
    return sum(row_blocks(n_cols)) <= MAX_FUSED_BLOCK


def row_alignment(element_size: int, n_cols: int, *row_strides: object) -> int:
    """ALIGN of the fused kernels: the largest power of two, up to one 16-byte vector of
    elements, that divides n_cols and every row stride. A stride that is not a plain int
    (symbolic under torch.compile) counts as 1, so that tracing adds no guard."""
    align = VECTOR_BYTES // element_size
    for n in (n_cols, *row_strides):
        if not isinstance(n, int):
            return 1
        while n % align:
            align //= 2
    return align


_Config = TypeVar("_Config", FwdConfig, BwdConfig)


def _swept(table: dict[RowShape, _Config], n_cols: int, aligned: bool) -> Optional[_Config]:
    """The sweep's settings for rows of n_cols elements: those of the same blocks and
    alignment, else of the same blocks aligned (a wide unaligned row still needs the
    warps of its width), else None."""
    block_n, block_tail = row_blocks(n_cols)
    return table.get((block_n, block_tail, aligned), table.get((block_n, block_tail, True)))


def _pow2_at_most(n: int) -> int:
    return 1 << (max(1, n).bit_length() - 1)


def _warps_for(elements: int, per_thread: int) -> int:
    """Warps (4 to 16) that give each thread about per_thread of the elements."""
    warps: int = triton.next_power_of_2(triton.cdiv(elements, 32 * per_thread))
    return min(16, max(4, warps))


# Cached: every launch asks (a pure function of its arguments).
@functools.cache
def fwd_config(n_cols: int, aligned: bool = True) -> FwdConfig:
    """Settings of the fused forward for rows of n_cols elements (``aligned``: they start
    on 16-byte boundaries, see row_alignment): from FWD_CONFIG where the sweep covered
    the case, else narrow rows packed to about _TILE_ELEMENTS elements
    a program, 8 to 16 elements a thread."""
    swept = _swept(FWD_CONFIG, n_cols, aligned)
    if swept is not None:
        return swept
    width = sum(row_blocks(n_cols))
    block_m = min(128, _pow2_at_most(_TILE_ELEMENTS // width))
    return FwdConfig(block_m, _warps_for(block_m * width, 16))


# Cached: every launch asks (a pure function of its arguments).
@functools.cache
def bwd_config(n_cols: int, aligned: bool = True) -> BwdConfig:
    """Settings of the fused backward, as fwd_config's: from BWD_CONFIG where the sweep
    covered the case, else tiles of about _BWD_SMALL_TILE elements, 8 to 16 elements a thread, on 4
    warps where that is enough (the row reductions stay inside few warps), and programs
    for _BWD_WARPS_PER_SM warps an SM."""
    swept = _swept(BWD_CONFIG, n_cols, aligned)
    if swept is not None:
        return swept
    width = sum(row_blocks(n_cols))
    block_m = min(128, _pow2_at_most(_BWD_SMALL_TILE // width))
    num_warps = _warps_for(block_m * width, 16)
    return BwdConfig(block_m, num_warps, max(1, _BWD_WARPS_PER_SM // num_warps))
