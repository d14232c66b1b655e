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


def test_native_kernels_refuse_it(device: str) -> None:
    x = torch.randn(2, 8, device=device, requires_grad=True)
    with pytest.raises(ValueError, match=r"in_place_backward=True\) needs backend='triton'"):
        hotloop.rms_norm(x, None, 1e-6, in_place_backward=True)
    with pytest.raises(ValueError, match=r"needs backend='triton' .* got backend=None"):
        hotloop.RMSNorm(8, in_place_backward=True)
