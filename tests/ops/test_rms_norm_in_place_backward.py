"""rms_norm(..., in_place_backward=True) (issue 31) and its guard (hotloop._grad_ownership): a
backward may write over the gradient it receives only where autograd's engine alone holds it.

A Function whose backward doubles the gradient in place stands in for the kernels: the
cases below give it gradients that someone else still reads (a fan-out's other branch, the
caller, a hook), which an unguarded write corrupts, and fresh ones, which it may overwrite.
The Triton kernels' in-place backward runs in test_triton_rms_norm (IN_PLACE_CHECKS: in
Triton's interpreter on the CPU, on CUDA on a GPU).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from op_testing import opcheck, requires_cuda

import hotloop
from hotloop import _grad_ownership


class Doubling(_grad_ownership.GradOverwritingFunction):
    """y = 2 x; its backward writes 2 * grad over grad where it may, and says where it did."""

    written: list[bool] = []

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        _grad_ownership.GradOverwritingFunction.setup(ctx, True)
        return x * 2

    @staticmethod
    def backward_writing(ctx: Any, grad: torch.Tensor, writable: bool) -> torch.Tensor:
        Doubling.written.append(writable)
        if writable:
            grad.data.mul_(2)  # as a kernel writes: no version bump of its own
            return grad
        return grad * 2


def double(x: torch.Tensor) -> torch.Tensor:
    y: torch.Tensor = Doubling.apply(x)
    return y


def inputs() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return torch.randn(4, 8, generator=gen).requires_grad_(), torch.randn(8, 3, generator=gen)


def fan_out_through_a_leaf(x: torch.Tensor, proj: torch.Tensor) -> None:
    # The add hands the same gradient tensor to both of its inputs: x's own edge keeps it
    # while the doubling's backward runs.
    ((x + double(x)) @ proj).sum().backward()


def fan_out_through_a_product(x: torch.Tensor, proj: torch.Tensor) -> None:
    h = x * 3
    ((h + double(h)) @ proj).sum().backward()


def used_twice(x: torch.Tensor, proj: torch.Tensor) -> None:
    y = double(x)
    ((y + y) @ proj).sum().backward()


def saved_by_another_op(x: torch.Tensor, proj: torch.Tensor) -> None:
    y = double(x)
    ((y * y + y) @ proj).sum().backward()


def gradient_the_caller_holds(x: torch.Tensor, proj: torch.Tensor) -> None:
    dy = torch.ones(4, 8)
    double(x).backward(dy)
    assert torch.equal(dy, torch.ones(4, 8))


def gradient_a_hook_kept(x: torch.Tensor, proj: torch.Tensor) -> None:
    kept: list[torch.Tensor] = []
    y = double(x)
    y.register_hook(kept.append)
    (y @ proj).sum().backward()
    assert torch.equal(kept[0], torch.ones(4, 3) @ proj.t())


def retained_gradient(x: torch.Tensor, proj: torch.Tensor) -> None:
    y = double(x)
    y.retain_grad()
    (y @ proj).sum().backward()
    assert torch.equal(y.grad, torch.ones(4, 3) @ proj.t())


def fresh_gradient(x: torch.Tensor, proj: torch.Tensor) -> None:
    (double(x) @ proj).sum().backward()


def fresh_view_of_a_gradient(x: torch.Tensor, proj: torch.Tensor) -> None:
    # 3-d activations through a linear layer: its backward reshapes a fresh 2-d gradient,
    # whose base only the view holds.
    (double(x.view(2, 2, 8)) @ proj).sum().backward()


def view_sharing_its_base(x: torch.Tensor, proj: torch.Tensor) -> None:
    # The concatenation's backward hands both inputs views of one gradient: x's edge holds
    # the other view of the same memory.
    (torch.cat([double(x), x]) @ proj).sum().backward()


def expected_grad(step: Any) -> torch.Tensor:
    """x's gradient through the same step with a doubling that never writes in place."""
    x, proj = inputs()
    original = Doubling.backward_writing

    def out_of_place(ctx: Any, grad: torch.Tensor, writable: bool) -> torch.Tensor:
        return original(ctx, grad, False)

    Doubling.backward_writing = staticmethod(out_of_place)  # type: ignore[assignment]
    try:
        step(x, proj)
    finally:
        Doubling.backward_writing = staticmethod(original)  # type: ignore[assignment]
    assert x.grad is not None
    return x.grad


HELD_ELSEWHERE = [
    fan_out_through_a_leaf,
    fan_out_through_a_product,
    gradient_the_caller_holds,
    gradient_a_hook_kept,
]
HELD_BY_THE_ENGINE_ALONE = [
    fresh_gradient,
    fresh_view_of_a_gradient,
    used_twice,
    saved_by_another_op,
    retained_gradient,
]


@pytest.mark.parametrize(
    "step", [*HELD_ELSEWHERE, view_sharing_its_base, *HELD_BY_THE_ENGINE_ALONE]
)
def test_guarded_write_gives_the_out_of_place_gradients(step: Any) -> None:
    x, proj = inputs()
    Doubling.written.clear()
    step(x, proj)
    # It wrote in place exactly where only the engine held the gradient.
    assert Doubling.written == [step in HELD_BY_THE_ENGINE_ALONE]
    assert torch.equal(x.grad, expected_grad(step))


@pytest.mark.parametrize("step", HELD_ELSEWHERE)
def test_unguarded_write_corrupts_what_others_hold(
    step: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The reproducer without the guard: these steps do read the overwritten gradient again.
    monkeypatch.setattr(_grad_ownership, "held_by_engine_alone", lambda holders: True)
    x, proj = inputs()
    try:
        step(x, proj)
    except AssertionError:  # the caller's or the hook's copy changed
        return
    assert not torch.equal(x.grad, expected_grad(step))


def test_the_probe_measures_plain_gradients_and_views() -> None:
    # Without a view's baseline, every 3-d activation's gradient (a linear layer's backward
    # reshapes its 2-d product) would take the usual backward.
    assert sorted(_grad_ownership.engine_alone_holders()) == [3, 5]


def test_create_graph_never_writes_in_place() -> None:
    x, proj = inputs()
    Doubling.written.clear()
    (grad,) = torch.autograd.grad((double(x) @ proj).sum(), x, create_graph=True)
    assert Doubling.written == [False]
    assert torch.equal(grad, expected_grad(fresh_gradient))


def test_the_write_bumps_the_gradients_version() -> None:
    # The doubling writes through .data, as a kernel does, which bumps nothing: the bump is
    # the guard's. x's hook sees the tensor that was written over.
    x, proj = inputs()
    versions: list[int] = []
    x.register_hook(lambda g: versions.append(g._version))  # keeps no reference
    (double(x) @ proj).sum().backward()
    assert versions == [1]


# The native kernels' in-place backward (torch.ops.hotloop.rms_norm_backward_): rows of each
# CUDA backward kernel (vectors in registers; an odd row, the span kernel's; 3-d activations,
# whose gradient is a view; staged rows; the generic kernel), in each casting mode.
NATIVE_STEPS = [
    ((6, 64), torch.float32, "torch"),
    ((3, 1001), torch.float16, "llama"),
    ((2, 3, 4096), torch.bfloat16, "gemma"),
    ((2, 32768), torch.bfloat16, "torch"),
    ((2, 20001), torch.float32, "llama"),
]


def native_step(
    device: str,
    shape: tuple[int, ...],
    dtype: torch.dtype,
    in_place: bool,
    casting: str = "torch",
    fan_out: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, tuple[int, int], int]:
    """(x.grad, w.grad, the incoming gradient's (data_ptr, version), x.grad's version) of
    a training step through rms_norm on the native kernels."""
    gen = torch.Generator().manual_seed(0)
    offset = 1.0 if casting == "gemma" else 0.0
    x = torch.randn(shape, generator=gen).to(device, dtype).requires_grad_()
    w = (1 - offset + 0.1 * torch.randn(shape[-1], generator=gen)).to(device, dtype)
    w.requires_grad_()
    proj = torch.randn(shape[-1], 5, generator=gen).to(device, dtype)
    y = hotloop.rms_norm(
        x, w, 1e-6, backend="native", casting=casting, offset=offset, in_place_backward=in_place
    )
    seen: list[tuple[int, int]] = []
    y.register_hook(lambda g: seen.append((g.data_ptr(), g._version)))  # keeps no reference
    ((x + y if fan_out else y) @ proj).float().sum().backward()
    assert x.grad is not None
    assert w.grad is not None
    return x.grad, w.grad, seen[0], x.grad._version


@pytest.mark.parametrize(("shape", "dtype", "casting"), NATIVE_STEPS)
def test_native_backward_writes_over_a_fresh_gradient(
    device: str, shape: tuple[int, ...], dtype: torch.dtype, casting: str
) -> None:
    gx, gw, _, _ = native_step(device, shape, dtype, False, casting)
    ix, iw, (ptr, version), x_version = native_step(device, shape, dtype, True, casting)
    assert torch.equal(ix, gx)
    assert torch.equal(iw, gw)
    assert ix.data_ptr() == ptr, "grad_x was not written over the incoming gradient"
    assert x_version > version


def test_native_backward_keeps_what_others_hold(device: str) -> None:
    # x + rms_norm(x): the add hands x's edge the same tensor; it must keep its value.
    gx, gw, _, _ = native_step(device, (6, 64), torch.float32, False, fan_out=True)
    ix, iw, (ptr, _), _ = native_step(device, (6, 64), torch.float32, True, fan_out=True)
    assert torch.equal(ix, gx)
    assert torch.equal(iw, gw)
    assert ix.data_ptr() != ptr
    # A gradient the caller passed stays as it was, through the module too.
    norm = hotloop.RMSNorm(64, in_place_backward=True).to(device)
    x = torch.randn(4, 64, device=device, requires_grad=True)
    dy = torch.randn(4, 64, device=device)
    kept = dy.clone()
    norm(x).backward(dy)
    assert torch.equal(dy, kept)


# Rows off the vector boundary: the CUDA in-place op once took the scalar kernel for them and
# the out-of-place op the span kernel, which sum in different orders, so grad_x came out one
# rounding apart for some inputs (an H100: 4-20 % of 5 x 1001 bfloat16 inputs, every 16 x 8193
# float16 one tried; benchmarks/NOTES.md, run 92), which looked like a race.
@pytest.mark.parametrize(
    ("shape", "dtype"), [((5, 1001), torch.bfloat16), ((16, 8193), torch.float16)]
)
@pytest.mark.parametrize("casting", [0, 1, 2])
def test_in_place_backward_op_equals_the_backward_op(
    device: str, shape: tuple[int, int], dtype: torch.dtype, casting: int
) -> None:
    offset = 1.0 if casting == 2 else 0.0
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=gen).to(device, dtype)
    w = torch.randn(shape[-1], generator=gen).to(device, dtype)
    grad_out = torch.randn(shape, generator=gen).to(device, dtype)
    grad_x, grad_w = torch.ops.hotloop.rms_norm_backward(grad_out, x, w, 1e-6, casting, offset)
    written = grad_out.clone()
    got_w = torch.ops.hotloop.rms_norm_backward_(written, x, w, 1e-6, casting, offset)
    assert torch.equal(written, grad_x)
    assert torch.equal(got_w, grad_w)
    without_weight = torch.ops.hotloop.rms_norm_backward(grad_out, x, None, 1e-6)[0]
    assert torch.ops.hotloop.rms_norm_backward_(grad_out, x, None, 1e-6).shape == (0,)
    assert torch.equal(grad_out, without_weight)
    opcheck(
        torch.ops.hotloop.rms_norm_backward_.default,
        (torch.randn_like(x), x, w, 1e-6, casting, offset),
    )


@requires_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("hidden", [4096, 8193])
def test_in_place_backward_op_allocates_no_grad_x(hidden: int) -> None:
    # On rows on and off the vector boundary alike: the odd ones once computed grad_x in a
    # buffer of their own and copied it over grad_out.
    x = torch.randn(256, hidden, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(hidden, device="cuda", dtype=torch.bfloat16)
    grad_out = torch.randn_like(x)
    written = grad_out.clone()

    def peak(call: Any) -> int:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        kept = call()  # the results stay allocated, as a caller's would
        torch.cuda.synchronize()
        del kept
        return torch.cuda.max_memory_allocated() - base

    out_of_place = peak(lambda: torch.ops.hotloop.rms_norm_backward(grad_out, x, w, 1e-6))
    in_place = peak(lambda: torch.ops.hotloop.rms_norm_backward_(written, x, w, 1e-6))
    assert out_of_place - in_place >= x.numel() * x.element_size()


def test_in_place_backward_op_refuses_what_it_cannot_write(device: str) -> None:
    x = torch.randn(4, 8, device=device)
    grad_out = torch.randn(8, 4, device=device).t()
    with pytest.raises(RuntimeError, match=r"rms_norm_backward_: grad_x is written over grad_out"):
        torch.ops.hotloop.rms_norm_backward_(grad_out, x, None, 1e-6)
    with pytest.raises(RuntimeError, match=r"rms_norm_backward_: unsupported operation: .* x and"):
        torch.ops.hotloop.rms_norm_backward_(x, x, None, 1e-6)
