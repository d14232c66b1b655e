"""The Triton RMSNorm as custom ops (``torch.library.triton_op``: torch.compile sees the
kernels themselves), with their checks and fake kernels, and the Python API. Their autograd
(backward and forward-mode AD) is hotloop.ops.autograd's, the same as the C++ ops'.
"""

from typing import Any, Callable, Optional

import torch

from hotloop._arithmetic import rms_norm_arithmetic, traced_as_arithmetic
from hotloop._casting import FLOATING_DTYPES, check_casting
from hotloop._grad_ownership import GradOverwritingFunction, engine_alone_holders
from hotloop.triton_rms_norm.kernels import interpreting
from hotloop.triton_rms_norm.launch import Relaunch, backward_rows, forward_rows


def _check_defined(op: str, name: str, t: Optional[torch.Tensor]) -> None:
    if t is None:
        raise ValueError(
            f"{op}(backend='triton'): expected a tensor for {name} but got None; {name} is required"
        )


def _check_inputs(op: str, x: torch.Tensor, weight: Optional[torch.Tensor]) -> None:
    _check_defined(op, "x", x)
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
    if x.dtype not in FLOATING_DTYPES:
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


def define_op(name: str) -> Callable[[Callable[..., Any]], Any]:
    """``torch.library.triton_op``, or under the interpreter a custom op with the same
    body as its fake kernel (``wrap_triton`` can't trace interpreted kernels)."""

    def register(fn: Callable[..., Any]) -> Any:
        if not interpreting():
            return torch.library.triton_op(name, mutates_args=())(fn)
        op = torch.library.custom_op(name, mutates_args=())(fn)
        op.register_fake(fn)
        return op

    return register


def _as_rows(t: torch.Tensor, n_cols: int) -> torch.Tensor:
    """t as a 2-d (rows, n_cols) tensor with unit column stride (a view where possible)."""
    rows = t.reshape(-1, n_cols)
    if rows.stride(1) != 1:
        rows = rows.contiguous()
    return rows


# Eager launches already made, by _eager_key: a call with the same key launches the same
# compiled kernel with the same settings and scalars on its own tensors. The key holds
# everything the checks and the launch settings read, so a hit needs neither (they passed
# for the key); at decode sizes they and Triton's launch path cost more host time than the
# kernel takes on the GPU (benchmarks/NOTES.md, host time of the Triton backend).
# Forward: the Relaunch; backward: it with the shape and dtype of its grad_weight partials.
_EAGER_FORWARDS: dict[tuple[Any, ...], Relaunch] = {}
_EAGER_BACKWARDS: dict[tuple[Any, ...], tuple[Relaunch, tuple[int, ...], torch.dtype]] = {}
# Decode loops see one key per batch size; past this many (a sweep of shapes) a table
# starts again rather than grow.
_EAGER_KEYS_MAX = 4096


def _eager_key(
    tensors: tuple[torch.Tensor, ...],
    weight: Optional[torch.Tensor],
    *scalars: Any,
) -> Optional[tuple[Any, ...]]:
    """What selects an eager launch: shapes, dtypes, devices and 16-byte alignment of
    contiguous tensors and weight (outputs are new, so aligned), and the scalars. None
    for other layouts, which take the full path every call."""
    key: list[Any] = list(scalars)
    for t in (*tensors, weight) if weight is not None else tensors:
        if not t.is_contiguous():
            return None
        key += (t.shape, t.dtype, t.device, t.data_ptr() % 16 == 0)
    key.append(weight is None)
    return tuple(key)


def _remember(table: dict[tuple[Any, ...], Any], key: tuple[Any, ...], launch: Any) -> None:
    if len(table) >= _EAGER_KEYS_MAX:
        table.clear()
    table[key] = launch


def _forward(
    x: torch.Tensor,
    weight: Optional[torch.Tensor],
    eps: float,
    casting: int,
    offset: float,
    eager: bool = False,
) -> torch.Tensor:
    key = _eager_key((x,), weight, eps, casting, offset) if eager else None
    relaunch = _EAGER_FORWARDS.get(key) if key is not None else None
    if relaunch is not None:
        y = torch.empty_like(x)
        relaunch(x, x if weight is None else weight, y)
        return y
    check_casting("rms_norm", casting, offset)
    _check_inputs("rms_norm", x, weight)
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if x.numel() == 0:
        return y
    n_cols = x.shape[-1]
    w = weight.reshape(-1).contiguous() if weight is not None else None
    relaunch = forward_rows(
        _as_rows(x, n_cols),
        w,
        y.view(-1, n_cols),
        eps,
        eager=eager,
        casting=casting,
        offset=offset,
    )
    if key is not None and relaunch is not None:
        _remember(_EAGER_FORWARDS, key, relaunch)
    return y


@define_op("hotloop::rms_norm_triton")
def _rms_norm_triton(
    x: torch.Tensor,
    weight: Optional[torch.Tensor],
    eps: float,
    casting: int = 0,
    offset: float = 0.0,
) -> torch.Tensor:
    return _forward(x, weight, eps, casting, offset)


def _grad_weight(partials: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """grad_weight from the kernels' [programs, H] float partial sums, in weight's dtype.
    A decode-sized grid is one program, whose partial row is already the sum: taking it as
    it is saves the reduction's launch, which at (1, H) costs more host time than the
    kernel (benchmarks/NOTES.md, host time of the Triton backend)."""
    total = partials[0] if partials.shape[0] == 1 else partials.sum(0)
    return total.to(weight.dtype).view(weight.shape)


def _backward_grads(
    grad_out: torch.Tensor,
    x: torch.Tensor,
    weight: Optional[torch.Tensor],
    eps: float,
    casting: int,
    offset: float,
    eager: bool = False,
    grad_x: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``grad_x``: where to write it (contiguous, x's shape and dtype; grad_out itself for
    the in-place backward: the kernels read each tile of grad_out before they write it).
    """
    in_place = grad_x is grad_out
    key = (
        _eager_key((grad_out, x), weight, eps, casting, offset, in_place)
        if eager and (grad_x is None or in_place)
        else None
    )
    plan = _EAGER_BACKWARDS.get(key) if key is not None else None
    if plan is not None:
        launch_again, partials_shape, acc_dtype = plan
        if grad_x is None:
            grad_x = torch.empty_like(x)
        if weight is None:
            launch_again(grad_out, x, x, grad_x, grad_x)
            return grad_x, torch.empty((0,), dtype=x.dtype, device=x.device)
        partials = torch.empty(partials_shape, dtype=acc_dtype, device=x.device)
        launch_again(grad_out, x, weight, grad_x, partials)
        return grad_x, _grad_weight(partials, weight)
    check_casting("rms_norm_backward", casting, offset)
    _check_defined("rms_norm_backward", "grad_out", grad_out)
    _check_inputs("rms_norm_backward", x, weight)
    if grad_out.shape != x.shape or grad_out.dtype != x.dtype or grad_out.device != x.device:
        raise ValueError(
            "rms_norm_backward(backend='triton'): grad_out is "
            f"{grad_out.dtype}{list(grad_out.shape)} on {grad_out.device} but x is "
            f"{x.dtype}{list(x.shape)} on {x.device} (expected the same shape, dtype, device)"
        )
    if grad_x is None:
        grad_x = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if weight is None:
        grad_weight = torch.empty((0,), dtype=x.dtype, device=x.device)
    elif x.numel() == 0:
        return grad_x, torch.zeros(weight.shape, dtype=weight.dtype, device=weight.device)
    if x.numel() == 0:
        return grad_x, grad_weight

    n_cols = x.shape[-1]
    w = weight.reshape(-1).contiguous() if weight is not None else None
    dw_partial, relaunch = backward_rows(
        _as_rows(grad_out, n_cols),
        _as_rows(x, n_cols),
        w,
        grad_x.view(-1, n_cols),
        eps,
        eager=eager,
        casting=casting,
        offset=offset,
    )
    if key is not None and relaunch is not None:
        written = dw_partial if dw_partial is not None else grad_x
        _remember(_EAGER_BACKWARDS, key, (relaunch, tuple(written.shape), written.dtype))
    if weight is not None and dw_partial is not None:
        grad_weight = _grad_weight(dw_partial, weight)
    return grad_x, grad_weight


@define_op("hotloop::rms_norm_triton_backward")
def _rms_norm_triton_backward(
    grad_out: torch.Tensor,
    x: torch.Tensor,
    weight: Optional[torch.Tensor],
    eps: float,
    casting: int = 0,
    offset: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    return _backward_grads(grad_out, x, weight, eps, casting, offset)


# ------------------------------------------------------------------------ eager calls


def _eager_call(x: torch.Tensor, weight: Optional[torch.Tensor]) -> bool:
    """Whether a call runs eagerly on plain tensors with nothing that has to see the op
    (torch.compile or another tracer, a torch.func transform, a dispatch or torch-function
    mode such as a FakeTensorMode or a profiler's, forward-mode AD, whose tangent the op's
    Autograd kernel gives)."""
    return (
        not torch.compiler.is_compiling()  # first: under Dynamo this ends the test
        and type(x) is torch.Tensor
        and (weight is None or type(weight) is torch.Tensor)
        and not torch._C._len_torch_dispatch_stack()
        and not torch._C._is_torch_function_mode_enabled()
        and not torch._C._are_functorch_transforms_active()
        and torch.autograd.forward_ad._current_level < 0
    )


def _plain_eager_call(x: torch.Tensor, weight: Optional[torch.Tensor]) -> bool:
    """Whether a call can skip the dispatcher and launch the kernels itself: an eager call
    on CUDA tensors. Then the op's own path adds only host time: its autograd and custom-op
    wrappers and Triton's argument binding (about 60-90 us a call at (1, 4096) on an H200,
    against a 5 us kernel; benchmarks/NOTES.md, run 67)."""
    return x.is_cuda and _eager_call(x, weight)


class _EagerRMSNorm(GradOverwritingFunction):
    """The ops' forward and backward for eager calls that need gradients (what the op's
    Autograd kernel, hotloop.ops.autograd's, gives it, without the dispatcher around it),
    and the in-place backward: with ``in_place_backward``, grad_x is written over the
    gradient received wherever only autograd's engine holds it (hotloop._grad_ownership)."""

    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        weight: Optional[torch.Tensor],
        eps: float,
        casting: int,
        offset: float,
        in_place_backward: bool,
    ) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        ctx.eps, ctx.casting, ctx.offset = eps, casting, offset
        GradOverwritingFunction.setup(ctx, in_place_backward)
        # (Under the interpreter a CPU x comes here for the in-place backward: it launches
        # through Triton's own path.)
        return _forward(x, weight, eps, casting, offset, eager=x.is_cuda)

    @staticmethod
    def backward_writing(
        ctx: Any, grad_out: torch.Tensor, writable: bool
    ) -> tuple[Optional[torch.Tensor], ...]:
        x, weight = ctx.saved_tensors
        if torch.compiler.is_compiling():
            # Dynamo traces this backward (compiled autograd): the backward op, which it
            # traces, rather than the launch below, which it cannot (writable is False here).
            grad_x, grad_weight = rms_norm_backward(
                grad_out, x, weight, ctx.eps, ctx.casting, ctx.offset
            )
        else:
            grad_x, grad_weight = _backward_grads(
                grad_out,
                x,
                weight,
                ctx.eps,
                ctx.casting,
                ctx.offset,
                eager=x.is_cuda,
                grad_x=grad_out if writable else None,
            )
        return grad_x, (grad_weight if weight is not None else None), None, None, None, None


# ------------------------------------------------------------------------ Python API


def rms_norm(
    x: torch.Tensor,
    weight: Optional[torch.Tensor] = None,
    eps: Optional[float] = None,
    casting: int = 0,
    offset: float = 0.0,
    in_place_backward: bool = False,
) -> torch.Tensor:
    """``F.rms_norm(x, (x.size(-1),), weight, eps)`` through the Triton kernels.

    ``eps=None`` means the epsilon of the dtype the norm is computed in (float32, float64
    for float64 x), as in ``F.rms_norm``. ``casting`` and ``offset`` are the ops' (the index
    of a mode of hotloop._casting.CASTINGS: 0 torch, 1 llama, 2 gemma; hotloop.rms_norm
    takes the names). Differentiable in ``x`` and ``weight``; traced by torch.compile
    without a graph break. ``in_place_backward``: an eager backward writes grad_x over the
    gradient it receives where only autograd's engine holds it (hotloop._grad_ownership),
    one x-sized buffer less; compiled and transformed calls take the usual backward.
    """
    if eps is None:
        acc = torch.float64 if x.dtype == torch.float64 else torch.float32
        eps = torch.finfo(acc).eps if x.is_floating_point() else 0.0
    if in_place_backward and _eager_call(x, weight) and _needs_grad(x, weight):
        engine_alone_holders()  # measured here, before any backward needs it
        y: torch.Tensor = _EagerRMSNorm.apply(x, weight, eps, casting, offset, True)
        return y
    if _plain_eager_call(x, weight):
        if _needs_grad(x, weight):
            y = _EagerRMSNorm.apply(x, weight, eps, casting, offset, False)
            return y
        return _forward(x, weight, eps, casting, offset, eager=True)
    # (A traced call: a device the kernels can't take reaches the op, which refuses it.)
    if (
        torch.compiler.is_compiling()
        and (x.is_cuda or interpreting())
        and traced_as_arithmetic(x, weight, casting, offset)
    ):
        return rms_norm_arithmetic(x, weight, eps, casting, offset)
    y = torch.ops.hotloop.rms_norm_triton(x, weight, eps, casting, offset)
    return y


def _needs_grad(x: torch.Tensor, weight: Optional[torch.Tensor]) -> bool:
    return torch.is_grad_enabled() and (
        x.requires_grad or (weight is not None and weight.requires_grad)
    )


def rms_norm_backward(
    grad_out: torch.Tensor,
    x: torch.Tensor,
    weight: Optional[torch.Tensor],
    eps: float,
    casting: int = 0,
    offset: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(grad_x, grad_weight) of :func:`rms_norm`; grad_weight is ``(0,)`` without weight."""
    grads: tuple[torch.Tensor, torch.Tensor] = torch.ops.hotloop.rms_norm_triton_backward(
        grad_out, x, weight, eps, casting, offset
    )
    return grads
