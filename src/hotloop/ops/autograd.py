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

from hotloop.ops.api import _RMS_NORM, mul, muladd

_LIB = torch.library.Library("hotloop", "IMPL")


# A single-level Function: the kind torch.func's own grad rule for autograd.Functions
# builds and applies. Applied inside an Autograd kernel it records on the tensors of the
# transform level that is running the kernel, as the C++ autograd kernels of torch's ops do.
# (torch.autograd.Function.apply would instead hand the Function to torch.func as a whole,
# through custom_function_call, which has no kernel below the transform running this one.)
_AutogradFunction = torch.autograd.function._SingleLevelFunction


def _register_autograd(name: str, function: type[_AutogradFunction]) -> None:
    op = getattr(torch.ops.hotloop, name).default

    def autograd_kernel(keyset: torch._C.DispatchKeySet, *args: Any) -> Any:
        if torch.is_grad_enabled() and torch._C._any_requires_grad(*args):
            apply = function.apply  # type: ignore[attr-defined]  # defined in C
            if not torch._C._are_functorch_transforms_active():
                return apply(*args)
            with enable_single_level_autograd_function():
                return apply(*args)
        with torch._C._AutoDispatchBelowAutograd():
            return op.redispatch(keyset & torch._C._after_autograd_keyset, *args)

    _LIB.impl(name, autograd_kernel, "Autograd", with_keyset=True)


class _MulFunction(_AutogradFunction):
    @staticmethod
    def forward(a: Tensor, b: Tensor) -> Tensor:
        return mul(a, b)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
        ctx.save_for_backward(*inputs[:2])

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, Tensor | None]:
        a, b = ctx.saved_tensors
        grad_a = mul(grad, b) if ctx.needs_input_grad[0] else None
        grad_b = mul(grad, a) if ctx.needs_input_grad[1] else None
        return grad_a, grad_b


class _MulAddFunction(_AutogradFunction):
    @staticmethod
    def forward(a: Tensor, b: Tensor, c: float) -> Tensor:
        return muladd(a, b, c)

    setup_context = _MulFunction.setup_context

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, Tensor | None, None]:
        return (*_MulFunction.backward(ctx, grad), None)


class _RmsNormFunction(_AutogradFunction):
    @staticmethod
    def forward(x: Tensor, weight: Tensor | None, eps: float) -> Tensor:
        return _RMS_NORM(x, weight, eps)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
        x, weight, eps = inputs
        ctx.save_for_backward(x, weight)
        ctx.eps = eps

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, Tensor | None, None]:
        x, weight = ctx.saved_tensors
        grad_x, grad_weight = torch.ops.hotloop.rms_norm_backward.default(grad, x, weight, ctx.eps)
        return grad_x, (grad_weight if weight is not None else None), None


class _RmsNormBackwardFunction(_AutogradFunction):
    """Without a formula autograd would pass silently through the backward op."""

    @staticmethod
    def forward(
        grad_out: Tensor, x: Tensor, weight: Tensor | None, eps: float
    ) -> tuple[Tensor, Tensor]:
        return torch.ops.hotloop.rms_norm_backward.default(grad_out, x, weight, eps)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        pass

    @staticmethod
    def backward(ctx: Any, *grads: Tensor) -> None:
        raise RuntimeError(
            "hotloop.rms_norm: the gradient of its gradient (double backward) is not implemented"
        )


_register_autograd("mul", _MulFunction)
_register_autograd("muladd", _MulAddFunction)
_register_autograd("rms_norm", _RmsNormFunction)
_register_autograd("rms_norm_backward", _RmsNormBackwardFunction)
