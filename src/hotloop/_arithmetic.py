"""The RMSNorm's arithmetic in torch ops, which torch.compile traces in place of hotloop's ops
by default, and torch.export where :func:`set_compile_arithmetic` asks for it (issue 29: the
compiled Llama step).

Inductor cannot fuse anything into a custom op: it calls the op's kernel as it is. The stock
models' norm is plain torch arithmetic, which Inductor fuses with its neighbours (the residual
add before it, the casts and the matmul's input after it), so a compiled model whose norms are
hotloop's ops is slower than the stock one although hotloop's norm alone is about as fast as
Inductor's or faster (H100, 4-layer Llama, hotloop's time over the stock model's: training
step 1.012, ``generate`` 1.075 with the op, 0.991 and 0.928 with the arithmetic;
benchmarks/NOTES.md, run 97). vLLM's answer for its own RMSNorm op is the same: under
torch.compile it hands the compiler the op's ``forward_native`` (the arithmetic) by default.
torch.export keeps the op by default: an exported program, and the AOTInductor package made
from it, runs hotloop's kernels (the C++ runner of examples/aoti relies on it).

The setting is read while torch.compile (or torch.export) traces hotloop.rms_norm, so the
compiled code is guarded on it: a call under another setting traces again rather than
reusing a graph made under this one. Eager calls never read it.

Shared by the native ops' Python API (hotloop.ops.api) and the Triton package's, which cannot
import each other (as hotloop._casting).
"""

from __future__ import annotations

from types import TracebackType

import torch
from torch import Tensor

from hotloop._casting import FLOATING_DTYPES, GEMMA, LLAMA, casting_takes

# One place for the setting (None: the default, torch.compile traces the arithmetic and
# torch.export the op); read by is_compile_arithmetic_enabled(), which Dynamo inlines:
# reading a module global while tracing installs a guard on its value.
_COMPILE_ARITHMETIC: bool | None = None


def _exporting() -> bool:
    """Whether torch.export is tracing. Its flag is read as a module attribute, which Dynamo
    guards on like the setting: ``torch.compiler.is_exporting()`` itself is folded to True
    by Dynamo in torch 2.8-2.11, under torch.compile too."""
    return bool(getattr(torch.compiler, "_is_exporting_flag", False))


def is_compile_arithmetic_enabled() -> bool:
    """Whether hotloop's RMSNorm is traced as its arithmetic (:func:`set_compile_arithmetic`):
    by the torch.export trace in progress, if any, else by torch.compile."""
    if _COMPILE_ARITHMETIC is None:
        return not _exporting()
    return _COMPILE_ARITHMETIC


class _PreviousSetting:
    """What set_compile_arithmetic returns: ``with`` restores the setting found before it."""

    def __init__(self, previous: bool | None) -> None:
        self.previous = previous

    def __enter__(self) -> None:
        return None

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        global _COMPILE_ARITHMETIC
        _COMPILE_ARITHMETIC = self.previous


def set_compile_arithmetic(enabled: bool | None) -> _PreviousSetting:
    """Whether torch.compile and torch.export see hotloop's RMSNorm as its arithmetic in torch
    ops (``True``), as hotloop's op (``False``), or the default (``None``): torch.compile the
    arithmetic, torch.export the op.

    As arithmetic, ``hotloop.rms_norm`` and ``hotloop.RMSNorm`` (both backends), when traced,
    compute the casting mode's formula (``"torch"``, ``"llama"``, ``"gemma"`` with its
    ``offset``, a weight of another dtype as eager calls take it) in torch ops, which Inductor
    fuses with the work around the norm; the gradients are those of that arithmetic. Compiled
    results are then Inductor's arithmetic, within the dtype's rounding of the kernels' but
    not bit for bit, and an exported program (and an AOTInductor package made from it) holds
    that arithmetic, not hotloop's ops. As the op, Inductor calls hotloop's kernels as they
    are and fuses nothing into them; the results are the eager ones bit for bit. Eager calls
    are not affected: they run hotloop's kernels either way. Inputs the ops refuse still
    reach the op, which refuses them with its own message.

    Like ``torch.set_grad_enabled``, it sets the value at once, process-wide, and as a
    context manager restores the previous value on exit::

        hotloop.set_compile_arithmetic(False)  # from here on: compiled code calls the op
        with hotloop.set_compile_arithmetic(True):  # for this block: export the arithmetic
            program = torch.export.export(model, (x,))

    The value is read when torch.compile traces, and the compiled code is guarded on it: a
    call made under another value traces again. ``fused_add_rms_norm`` and the FP8 ops
    always stay hotloop's ops: they write their inputs in place, and the checks that keep
    those writes sound (memory overlap, contiguity) are the op's, which traced arithmetic
    would skip.
    """
    global _COMPILE_ARITHMETIC
    if enabled is not None and not isinstance(enabled, bool):
        raise TypeError(
            f"set_compile_arithmetic: expected True, False or None (the default) but got "
            f"{enabled!r} ({type(enabled).__name__})"
        )
    previous = _COMPILE_ARITHMETIC
    _COMPILE_ARITHMETIC = enabled
    return _PreviousSetting(previous)


def traced_as_arithmetic(x: Tensor, weight: Tensor | None, casting: int, offset: float) -> bool:
    """Whether a call being traced by torch.compile or torch.export takes
    :func:`rms_norm_arithmetic`: the setting says so for this trace (is_compile_arithmetic_enabled)
    and the op would take these arguments. Anything the op refuses (a 0-dim or
    integer x, a weight of the wrong shape, dtype or device, an unknown casting, an offset
    outside "gemma") goes to the op, whose fake kernel refuses it with its own message,
    instead of broadcasting or computing another mode in the arithmetic."""
    if not is_compile_arithmetic_enabled():
        return False
    if not casting_takes(casting, offset):
        return False
    if x.dim() < 1 or x.dtype not in FLOATING_DTYPES:
        return False
    if weight is None:
        return True
    return (
        weight.dim() == 1
        and weight.dtype == x.dtype
        and weight.device == x.device
        and weight.shape[0] == x.shape[-1]
    )


def rms_norm_arithmetic(
    x: Tensor, weight: Tensor | None, eps: float, casting: int, offset: float
) -> Tensor:
    """The op ``hotloop::rms_norm(x, weight, eps, casting, offset)`` in torch ops, for a
    weight of x's dtype (or none): csrc/common/norm_casting.h's formulas, rstd in float32
    (float64 for float64 x). Autograd through it gives the op's gradients, Llama's rounding
    of the normalised value passing its gradient through as the op's backward does."""
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    xa = x.to(acc)
    x_hat = xa * torch.rsqrt(xa.pow(2).mean(-1, keepdim=True) + eps)
    if weight is None:  # every mode computes the same without a weight
        return x_hat.to(x.dtype)
    if casting == LLAMA:
        return weight * x_hat.to(x.dtype)
    if casting == GEMMA:
        return (x_hat * (offset + weight.to(acc))).to(x.dtype)
    return (x_hat * weight.to(acc)).to(x.dtype)
