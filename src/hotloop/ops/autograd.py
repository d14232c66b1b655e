"""Autograd kernels of the differentiable ops.

torch.library.register_autograd would do for eager and torch.compile, but the
autograd.Function it generates has no setup_context, which torch.func (grad, vjp, vmap
of either) refuses. These kernels do what it does, with Functions torch.func can run.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch._functorch.utils import enable_single_level_autograd_function
from torch.autograd.forward_ad import _set_fwd_grad_enabled

from hotloop._casting import GEMMA, LLAMA
from hotloop.ops.api import _RMS_NORM, _forward_ad_active, triton_rms_norm

_LIB = torch.library.Library("hotloop", "IMPL")


# A single-level Function: the kind torch.func's own grad rule for autograd.Functions
# builds and applies. Applied inside an Autograd kernel it records on the tensors of the
# transform level that is running the kernel, as the C++ autograd kernels of torch's ops do.
# (torch.autograd.Function.apply would instead hand the Function to torch.func as a whole,
# through custom_function_call, which has no kernel below the transform running this one.)
class _AutogradFunction(torch.autograd.function._SingleLevelFunction):
    # What torch.autograd.Function adds and compiled autograd (torch.compile of a backward)
    # asks every Function node for: the key its compiled graphs are cached under. Without it
    # that backward failed with an AttributeError.
    @staticmethod
    def _compiled_autograd_key(ctx: Any) -> tuple[int]:
        return (ctx._autograd_function_id,)


def _below(op: Any, *args: Any) -> Any:
    """The op on the level below the Function calling it: its forward's computation.

    Outside torch.func the call reaches the op's kernels (apply turned grad modes off, so
    the Autograd kernel passes it on). Under a torch.func transform it must reach the
    next transform down with grad modes on, or that level would not see the call: a jvp
    under a grad would lose its tangents, a grad under a grad its graph. (torch.func does
    the same for autograd.Functions, in generate_single_level_function.) Each transform
    passes the call on with the grad modes it was entered with, so a transform entered
    under no_grad still records nothing.
    """
    if not torch._C._are_functorch_transforms_active():
        return op(*args)
    with torch._C._AutoDispatchBelowAutograd(), torch.enable_grad(), _set_fwd_grad_enabled(True):
        return op(*args)


def _register_autograd(
    name: str, function: type[_AutogradFunction], keys: tuple[str, ...] = ("Autograd",)
) -> None:
    op = getattr(torch.ops.hotloop, name).default

    def autograd_kernel(keyset: torch._C.DispatchKeySet, *args: Any) -> Any:
        # Inside a dual level the Function records too: its jvp gives the output's tangent,
        # which the call below autograd would silently drop.
        if (torch.is_grad_enabled() and torch._C._any_requires_grad(*args)) or (
            _forward_ad_active()
        ):
            apply = function.apply  # type: ignore[attr-defined]  # defined in C
            if not torch._C._are_functorch_transforms_active():
                return apply(*args)
            with enable_single_level_autograd_function():
                return apply(*args)
        with torch._C._AutoDispatchBelowAutograd():
            return op.redispatch(keyset & torch._C._after_autograd_keyset, *args)

    for key in keys:
        _LIB.impl(name, autograd_kernel, key, with_keyset=True)


# Forward-mode AD (torch.func.jvp/jacfwd/hessian, torch.autograd.forward_ad): each Function's
# jvp is its op's derivative in closed form, written in torch ops so that it is itself
# differentiable (hessian = jacfwd(jacrev): the JVP of the backward op) and batchable.
# The norms' tangents are computed in float32 (float64 for float64 x), like the kernels,
# and rounded once to the output's dtype. In the "llama" casting the weight multiplies
# x_hat rounded to x's dtype, a rounding whose derivative is taken as one (autograd's
# cast); in "gemma" it is offset + weight.


def _plus(a: Tensor | None, b: Tensor | None) -> Tensor | None:
    if a is None:
        return b
    return a if b is None else a + b


def _times(t: Tensor | None, factor: Tensor) -> Tensor | None:
    return None if t is None else t * factor


def _normalised(x: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """(rstd, x_hat) of x in its accumulation dtype: rstd = 1 / sqrt(mean(x^2) + eps)."""
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    x_acc = x.to(acc)
    rstd = torch.rsqrt(x_acc.pow(2).mean(-1, keepdim=True) + eps)
    return rstd, x_acc * rstd


def _x_hat_tangent(rstd: Tensor, x_hat: Tensor, x_t: Tensor | None) -> Tensor | None:
    """d x_hat = rstd * (x_t - x_hat * mean(x_hat * x_t)); d rstd = -rstd^2 * that mean."""
    if x_t is None:
        return None
    x_t = x_t.to(x_hat.dtype)
    return rstd * (x_t - x_hat * (x_hat * x_t).mean(-1, keepdim=True))


def _zeros_if_none(t: Tensor | None, like: Tensor) -> Tensor:
    return torch.zeros_like(like) if t is None else t.to(like.dtype)


def _rounded_in(casting: int, t: Tensor, dtype: torch.dtype) -> Tensor:
    """t rounded to dtype and back in the "llama" casting (the value its weight multiplies)."""
    return t.to(dtype).to(t.dtype) if casting == LLAMA else t


def _weight_as_applied(weight: Tensor, dtype: torch.dtype, casting: int, offset: float) -> Tensor:
    """The weight as it multiplies, in dtype: offset + weight in the "gemma" casting."""
    w = weight.to(dtype)
    return w + offset if casting == GEMMA else w


class _MulFunction(_AutogradFunction):
    @staticmethod
    def forward(a: Tensor, b: Tensor) -> Tensor:
        return _below(torch.ops.hotloop.mul.default, a, b)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
        ctx.save_for_backward(*inputs[:2])
        ctx.save_for_forward(*inputs[:2])

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, Tensor | None]:
        a, b = ctx.saved_tensors
        grad_a = torch.ops.hotloop.mul.default(grad, b) if ctx.needs_input_grad[0] else None
        grad_b = torch.ops.hotloop.mul.default(grad, a) if ctx.needs_input_grad[1] else None
        return grad_a, grad_b

    @staticmethod
    def jvp(ctx: Any, a_t: Tensor | None, b_t: Tensor | None, *_: Any) -> Tensor:
        a, b = ctx.saved_tensors
        return _zeros_if_none(_plus(_times(a_t, b), _times(b_t, a)), a)


class _MulAddFunction(_AutogradFunction):
    @staticmethod
    def forward(a: Tensor, b: Tensor, c: float) -> Tensor:
        return _below(torch.ops.hotloop.muladd.default, a, b, c)

    setup_context = _MulFunction.setup_context

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, Tensor | None, None]:
        return (*_MulFunction.backward(ctx, grad), None)

    jvp = _MulFunction.jvp  # c is a float: it has no tangent


def _rms_norm_jvp(
    x: Tensor,
    weight: Tensor | None,
    eps: float,
    casting: int,
    offset: float,
    x_t: Tensor | None,
    weight_t: Tensor | None,
) -> Tensor:
    """d(x_hat * w) = d x_hat * w + x_hat * d w."""
    rstd, x_hat = _normalised(x, eps)
    x_hat_t = _x_hat_tangent(rstd, x_hat, x_t)
    if weight is not None:
        x_hat_t = _times(x_hat_t, _weight_as_applied(weight, x_hat.dtype, casting, offset))
    y_t = _plus(x_hat_t, _times(weight_t, _rounded_in(casting, x_hat, x.dtype)))
    return _zeros_if_none(y_t, x)


def _rms_norm_backward_jvp(
    ctx: Any, grad_t: Tensor | None, x_t: Tensor | None, weight_t: Tensor | None, *_: None
) -> tuple[Tensor, Tensor]:
    """The tangents of grad_x = rstd * (u - x_hat * c), u = grad_out * w,
    c = mean(u * x_hat), and of grad_weight = sum over rows of grad_out * x_hat
    (x_hat rounded to x's dtype in the "llama" casting, w = offset + weight in "gemma")."""
    grad_out, x, weight = ctx.saved_tensors
    casting, offset = ctx.casting, ctx.offset
    rstd, x_hat = _normalised(x, ctx.eps)
    acc = x_hat.dtype
    g = grad_out.to(acc)
    w = _weight_as_applied(weight, acc, casting, offset) if weight is not None else None
    u = g if w is None else _rounded_in(casting, g * w, x.dtype)
    c = (u * x_hat).mean(-1, keepdim=True)
    x_hat_t = _x_hat_tangent(rstd, x_hat, x_t)
    rstd_t = None if x_t is None else -rstd.pow(2) * (x_hat * x_t.to(acc)).mean(-1, keepdim=True)
    g_t = None if grad_t is None else grad_t.to(acc)
    u_t = _plus(g_t if w is None else _times(g_t, w), _times(weight_t, g))
    c_t = _plus(_times(u_t, x_hat), _times(x_hat_t, u))
    c_t = None if c_t is None else c_t.mean(-1, keepdim=True)
    grad_x_t = _plus(
        _times(rstd_t, u - x_hat * c),
        _times(_plus(_plus(u_t, _times(x_hat_t, -c)), _times(c_t, -x_hat)), rstd),
    )
    if weight is None:
        grad_weight_t = torch.zeros((0,), dtype=x.dtype, device=x.device)
    else:
        per_row = _plus(_times(g_t, _rounded_in(casting, x_hat, x.dtype)), _times(x_hat_t, g))
        rows = tuple(range(x.dim() - 1))
        grad_weight_t = _zeros_if_none(
            None if per_row is None else per_row.sum(rows) if rows else per_row, weight
        )
    return _zeros_if_none(grad_x_t, x), grad_weight_t


def _save_mode(ctx: Any, eps: float, casting: int = 0, offset: float = 0.0) -> None:
    """The non-tensor arguments of a norm op, on ctx. The dispatcher leaves out trailing
    arguments that equal their schema's defaults, so casting and offset may be missing."""
    ctx.eps, ctx.casting, ctx.offset = eps, casting, offset


def _rms_norm_functions(
    forward_op: Any, backward_op: Any
) -> tuple[type[_AutogradFunction], type[_AutogradFunction]]:
    """The Functions of an RMSNorm op and of its backward op: hotloop's C++ pair, or the
    Triton pair (the same formulas; only the kernels differ)."""

    class RmsNorm(_AutogradFunction):
        @staticmethod
        def forward(x: Tensor, weight: Tensor | None, *mode: Any) -> Tensor:
            return _below(forward_op, x, weight, *mode)

        @staticmethod
        def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
            x, weight, *mode = inputs
            _save_mode(ctx, *mode)
            ctx.save_for_backward(x, weight)
            ctx.save_for_forward(x, weight)

        @staticmethod
        def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
            x, weight = ctx.saved_tensors
            grad_x, grad_weight = backward_op(grad, x, weight, ctx.eps, ctx.casting, ctx.offset)
            return grad_x, (grad_weight if weight is not None else None), None, None, None

        @staticmethod
        def jvp(ctx: Any, x_t: Tensor | None, weight_t: Tensor | None, *_: None) -> Tensor:
            x, weight = ctx.saved_tensors
            return _rms_norm_jvp(x, weight, ctx.eps, ctx.casting, ctx.offset, x_t, weight_t)

    class RmsNormBackward(_AutogradFunction):
        """Without a formula autograd would pass silently through the backward op."""

        @staticmethod
        def forward(
            grad_out: Tensor, x: Tensor, weight: Tensor | None, *mode: Any
        ) -> tuple[Tensor, Tensor]:
            return _below(backward_op, grad_out, x, weight, *mode)

        @staticmethod
        def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
            grad_out, x, weight, *mode = inputs
            _save_mode(ctx, *mode)
            ctx.save_for_forward(grad_out, x, weight)

        @staticmethod
        def backward(ctx: Any, *grads: Tensor) -> None:
            raise RuntimeError(
                "hotloop.rms_norm: the gradient of its gradient (double backward) is not "
                "implemented"
            )

        jvp = staticmethod(_rms_norm_backward_jvp)

    return RmsNorm, RmsNormBackward


_register_autograd("mul", _MulFunction)
_register_autograd("muladd", _MulAddFunction)
_RmsNormFunction, _RmsNormBackwardFunction = _rms_norm_functions(
    _RMS_NORM, torch.ops.hotloop.rms_norm_backward.default
)
_register_autograd("rms_norm", _RmsNormFunction)
_register_autograd("rms_norm_backward", _RmsNormBackwardFunction)

if triton_rms_norm is not None:
    # The Triton ops are torch.library custom ops, whose own Autograd kernel has no jvp: it
    # passed dual tensors below autograd and dropped their tangents. These kernels, on the
    # backend keys the Triton ops run on (CPU under TRITON_INTERPRET), take precedence over
    # that alias-key kernel and give the Triton ops the C++ ops' formulas.
    _TritonFunction, _TritonBackwardFunction = _rms_norm_functions(
        torch.ops.hotloop.rms_norm_triton.default,
        torch.ops.hotloop.rms_norm_triton_backward.default,
    )
    _register_autograd("rms_norm_triton", _TritonFunction, ("AutogradCUDA", "AutogradCPU"))
    _register_autograd(
        "rms_norm_triton_backward", _TritonBackwardFunction, ("AutogradCUDA", "AutogradCPU")
    )
