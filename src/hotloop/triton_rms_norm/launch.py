"""Host side of the Triton RMSNorm: pick the launch settings for 2-d (rows, H) tensors and
launch the kernels, through ``wrap_triton`` so that torch.compile traces into them.

``forward_rows`` and ``backward_rows`` take a ``config`` that overrides the tuned
settings: benchmarks/tune_triton_rms_norm.py sweeps them through these two functions.
"""

import ctypes
import functools
from typing import Any, Callable, Optional

import torch
import triton

from hotloop.triton_rms_norm.kernels import (
    interpreting,
    rms_norm_bwd_kernel,
    rms_norm_bwd_looped_kernel,
    rms_norm_bwd_row_stats_kernel,
    rms_norm_fwd_kernel,
    rms_norm_fwd_looped_kernel,
)
from hotloop.triton_rms_norm.launch_config import (
    LOOPED_BLOCK,
    LOOPED_FWD_WARPS,
    RELOAD_W_TILE,
    VECTOR_BYTES,
    BwdConfig,
    FwdConfig,
    bwd_config,
    fused,
    fwd_config,
    row_alignment,
    row_blocks,
)


def _alignment(width: int, *matrices: torch.Tensor) -> tuple[int, bool]:
    """(ALIGN, whether rows start on 16-byte boundaries) for (rows, width) matrices of one
    dtype."""
    element_size = matrices[0].element_size()
    align = row_alignment(element_size, width, *(m.stride(0) for m in matrices))
    return align, align * element_size == VECTOR_BYTES


@functools.cache
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


# A launch made again with other tensors: the same compiled kernel, grid and scalar
# arguments, given tensors of the same kind (dtype, 16-byte alignment) in the same order.
Relaunch = Callable[..., None]

# Kernels compiled by Triton for eager launches (see _launch_eager), by what Triton
# specialises a launch on, with the constexpr arguments that follow the positional ones.
_COMPILED: dict[tuple[Any, ...], tuple[Any, tuple[Any, ...]]] = {}


def _specialisation(arg: Any) -> Any:
    """What Triton compiles a kernel for, of one positional argument: a tensor's dtype and
    whether its address is a multiple of 16; an int's type (32 or 64 bits), whether it is
    1 and whether it is a multiple of 16; a float is always passed as float32."""
    if isinstance(arg, torch.Tensor):
        return arg.dtype, arg.data_ptr() % 16 == 0
    if isinstance(arg, int):
        return arg == 1, arg % 16 == 0, -(2**31) <= arg < 2**31
    return type(arg)


def _launch_eager(kernel: Any, grid: tuple[Any, ...], *args: Any, **kwargs: Any) -> Relaunch:
    """Launch a kernel from an eager call, calling the compiled kernel that Triton made for
    the same specialisation directly, and return the launch as a Relaunch.

    Triton's own launch binds and specialises every argument in Python on every call
    (tens of microseconds, more than a decode-sized kernel takes). The key here holds
    everything that selects a compiled kernel (the device, the constexpr and launch
    arguments, and each positional argument's specialisation, at least as finely as
    Triton splits them), so a hit is the kernel Triton would launch; the compiled
    kernel's launcher calls Triton's launch hooks (a profiler's) as Triton's own launch
    does. A miss takes Triton's own path, which compiles.
    """
    key = (kernel, args[0].device.index, tuple(kwargs.items()), *map(_specialisation, args))
    hit = _COMPILED.get(key)
    if hit is None:
        compiled = kernel[grid](*args, **kwargs)
        # The compiled kernel takes every argument of the kernel's signature in order:
        # the positional ones, then the constexprs passed by name.
        tail = tuple(kwargs[name] for name in kernel.arg_names[len(args) :])
        _COMPILED[key] = (compiled, tail)
        runner = compiled[(*grid, 1, 1)[:3]]
    else:
        compiled, tail = hit
        runner = compiled[(*grid, 1, 1)[:3]]
        runner(*args, *tail)
    # The kernels take their tensors first.
    tensors = next(i for i, arg in enumerate(args) if not isinstance(arg, torch.Tensor))
    scalars = (*args[tensors:], *tail)

    def relaunch(*same_kind_tensors: torch.Tensor) -> None:
        runner(*same_kind_tensors, *scalars)

    return relaunch


def _launch(kernel: Any, grid: tuple[Any, ...], *args: Any, **kwargs: Any) -> None:
    """Launch a kernel so that torch.compile sees it (``wrap_triton``).

    Under the interpreter, ``wrap_triton`` hands the kernel back unwrapped, so the ops are
    plain custom ops there (see op.define_op) whose fake kernel is this same function body:
    with fake tensors, nothing is launched.
    """
    if interpreting():
        from torch._subclasses.fake_tensor import is_fake

        if any(is_fake(a) for a in args if isinstance(a, torch.Tensor)):
            return
        kernel[grid](*args, **kwargs)
    else:
        torch.library.wrap_triton(kernel)[grid](*args, **kwargs)


def _static(size: Any) -> int:
    """A size as a plain int. The hidden size picks the kernels' block shapes (constexprs),
    so under torch.compile with dynamic shapes it is specialised (guarded) rather than
    carried symbolically; leading dims stay dynamic."""
    return int(size)


def eps_parts(eps: float) -> tuple[float, float]:
    """eps as float32(eps) and the float32 rest, for kernels whose float arguments Triton
    passes as float32: the float64 kernels add them up again (within 2^-48 of eps rather
    than float32's 2.5e-9 at eps = 1e-6, which float64 gradients that cancel magnify)."""
    high = ctypes.c_float(eps).value
    return high, eps - high


def _weighted_casting(casting: int, has_weight: bool) -> int:
    """The kernels' CASTING: without a weight every mode computes the same, so all share
    the kernels compiled for 0."""
    return casting if has_weight else 0


def forward_rows(
    x: torch.Tensor,
    weight: Optional[torch.Tensor],
    y: torch.Tensor,
    eps: float,
    config: Optional[FwdConfig] = None,
    eager: bool = False,
    casting: int = 0,
    offset: float = 0.0,
) -> Optional[Relaunch]:
    """Launch the forward on 2-d (rows, H) tensors with unit column stride: y = RMSNorm(x).

    ``config`` overrides the launch settings of the fused kernel (benchmarks/
    tune_triton_rms_norm.py sweeps them); by default they come from fwd_config. ``eager``:
    the caller runs eagerly on real CUDA tensors (no tracing), so launches may skip
    ``wrap_triton`` and Triton's binding (see _launch_eager). ``casting`` and ``offset``
    are the op's (kernels.py's CASTING). An eager launch is returned as a Relaunch that
    takes (x, weight or x, y).
    """
    launch = _launch_eager if eager else _launch
    n_rows, n_cols = x.shape
    has_weight = weight is not None
    casting = _weighted_casting(casting, has_weight)
    fp64 = x.dtype == torch.float64
    width = _static(n_cols)
    if fused(width):
        block_n, block_tail = row_blocks(width)
        align, aligned = _alignment(width, x, y)
        config = config or fwd_config(width, aligned)
        return launch(
            rms_norm_fwd_kernel,
            (triton.cdiv(n_rows, config.block_m),),
            x,
            weight if has_weight else x,  # never read when HAS_WEIGHT is False
            y,
            n_rows,
            n_cols,
            x.stride(0),
            y.stride(0),
            *eps_parts(eps),
            offset,
            HAS_WEIGHT=has_weight,
            FP64=fp64,
            CASTING=casting,
            BLOCK_M=config.block_m,
            BLOCK_N=block_n,
            BLOCK_TAIL=block_tail,
            ALIGN=align,
            num_warps=config.num_warps,
        )
    else:
        return launch(
            rms_norm_fwd_looped_kernel,
            (n_rows,),
            x,
            weight if has_weight else x,
            y,
            n_cols,
            x.stride(0),
            y.stride(0),
            *eps_parts(eps),
            offset,
            HAS_WEIGHT=has_weight,
            FP64=fp64,
            CASTING=casting,
            BLOCK_N=LOOPED_BLOCK,
            num_warps=LOOPED_FWD_WARPS,
        )


def backward_rows(
    grad_out: torch.Tensor,
    x: torch.Tensor,
    weight: Optional[torch.Tensor],
    grad_x: torch.Tensor,
    eps: float,
    config: Optional[BwdConfig] = None,
    eager: bool = False,
    casting: int = 0,
    offset: float = 0.0,
) -> tuple[Optional[torch.Tensor], Optional[Relaunch]]:
    """Launch the backward on 2-d (rows, H) tensors with unit column stride: writes grad_x
    and returns the [programs, H] partial sums of grad_weight (None without weight), and the
    launch as a Relaunch where it is one eager launch (the fused kernel's), taking
    (grad_out, x, weight or x, grad_x, partials or grad_x), partials shaped as those returned.

    ``config``, ``eager``, ``casting`` and ``offset`` as in forward_rows.
    """
    launch = _launch_eager if eager else _launch
    n_rows, n_cols = x.shape
    has_weight = weight is not None
    casting = _weighted_casting(casting, has_weight)
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
        relaunch = launch(
            rms_norm_bwd_kernel,
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
            *eps_parts(eps),
            offset,
            HAS_WEIGHT=has_weight,
            FP64=fp64,
            CASTING=casting,
            BLOCK_M=config.block_m,
            BLOCK_N=block_n,
            BLOCK_TAIL=block_tail,
            RELOAD_W=config.block_m * block_n > RELOAD_W_TILE,
            PREFETCH=config.prefetch,
            LOOP_STAGES=config.loop_stages,
            ALIGN=align,
            num_warps=config.num_warps,
        )
    else:
        relaunch = None
        rstd = torch.empty((n_rows,), dtype=acc_dtype, device=x.device)
        coef = torch.empty((n_rows,), dtype=acc_dtype, device=x.device)
        launch(
            rms_norm_bwd_row_stats_kernel,
            (n_rows,),
            grad_out,
            x,
            weight if has_weight else x,
            rstd,
            coef,
            n_cols,
            grad_out.stride(0),
            x.stride(0),
            *eps_parts(eps),
            offset,
            HAS_WEIGHT=has_weight,
            FP64=fp64,
            CASTING=casting,
            BLOCK_N=LOOPED_BLOCK,
            num_warps=16,
        )
        col_blocks = triton.cdiv(n_cols, LOOPED_BLOCK)
        # About two programs an SM in all, each (row set, column block) one of them.
        row_sets = min(n_rows, max(1, triton.cdiv(2 * _sm_count(x.device), col_blocks)))
        dw_partial = torch.empty(
            (row_sets, n_cols) if has_weight else (0,), dtype=acc_dtype, device=x.device
        )
        launch(
            rms_norm_bwd_looped_kernel,
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
            offset,
            HAS_WEIGHT=has_weight,
            FP64=fp64,
            CASTING=casting,
            BLOCK_N=LOOPED_BLOCK,
            num_warps=16,
        )
    return (dw_partial if has_weight else None), relaunch
