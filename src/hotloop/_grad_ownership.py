"""Whether a backward may write over the gradient it receives: only where autograd's engine
alone holds that tensor, so that nothing reads it after the write.

Others hold a gradient in two ways, and each shows in its own count:
- from C++, as a Tensor: a fan-out's other edge (``x + f(x)``: the add's backward hands the
  same tensor to both inputs, and x's input buffer keeps it while f's backward runs), the
  caller's ``backward(dy)`` (the graph root keeps dy), a node that saved it. They raise the
  TensorImpl's use count (``Tensor._use_count``, which torch.utils.swap_tensors reads too);
- from Python, through the tensor's one Python object: a hook that kept it, an upstream
  Python backward that stored what it returned. They raise that object's reference count,
  which C++ does not see, as the use count does not see Python's.
A view shares the memory through another TensorImpl: the storage's use count shows it. A
gradient that is itself a view (a linear layer's backward on 3-d activations hands back its
2-d product reshaped) is held through its base too: that base's use and reference counts,
then, must show no holder besides the view.

The counts a gradient held by the engine alone has, when the backward below reads them, are
measured once by a probe, a Function with the same backward, on a gradient made fresh for it
(a plain one, and a view of a fresh base). A backward writes in place only where every count
is at most the probe's of its kind, it is not building a graph of itself (``create_graph``),
and the gradient is a plain contiguous tensor.
"""

from __future__ import annotations

import sys
from typing import Any

import torch
from torch import Tensor

Holders = tuple[int, ...]


def _holders(grad: Tensor) -> Holders:
    """(TensorImpl use count, storage use count, Python reference count) of grad, and where
    grad is a view, its base's TensorImpl use count and Python reference count."""
    storage = grad.untyped_storage()
    counts = (grad._use_count(), torch._C._storage_Use_Count(storage._cdata), sys.getrefcount(grad))
    base = grad._base  # the root of a view of a view too
    if base is None:
        return counts
    return (*counts, base._use_count(), sys.getrefcount(base))


class GradOverwritingFunction(torch.autograd.Function):
    """An autograd Function whose backward may write over the gradient it receives.

    Subclasses call ``GradOverwritingFunction.setup(ctx, write_over_grad)`` in ``forward``
    (whether they would; their callers call engine_alone_holders() first, outside any
    backward) and define
    ``backward_writing(ctx, grad, writable)``, which may write its gradient into ``grad``
    and return it where ``writable``. This backward then bumps grad's version counter, as
    torch's in-place ops do, so that a later reader that saved it refuses to run.
    """

    @staticmethod
    def setup(ctx: Any, write_over_grad: bool, probe: bool = False) -> None:
        ctx.write_over_grad, ctx.probe = write_over_grad, probe

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Any:
        # create_graph: the graph of the backward may read grad again, and once_differentiable
        # below hides the grad mode that says so.
        ctx.building_graph = torch.is_grad_enabled()
        return _backward_once(ctx, grad)


@torch.autograd.function.once_differentiable
def _backward_once(ctx: Any, grad: Tensor) -> Any:
    # Counted first, here for every subclass and the probe alike: the Python count depends
    # on the frames above. (Only where asked: it costs a few microseconds.) Not where Dynamo
    # traces this backward (compiled autograd): the counts would be the tracer's, not the
    # engine's, and it cannot trace sys.getrefcount; the usual backward runs there.
    counted = (ctx.write_over_grad or ctx.probe) and not torch.compiler.is_compiling()
    holders = ctx.holders = _holders(grad) if counted else None
    writable = (
        ctx.write_over_grad
        and holders is not None
        and not ctx.building_graph
        and type(grad) is torch.Tensor
        and grad.layout == torch.strided
        and grad.is_contiguous()
        and held_by_engine_alone(holders)
    )
    grads = ctx._forward_cls.backward_writing(ctx, grad, writable)
    if writable:
        torch.autograd.graph.increment_version(grad)
    return grads


class _Probe(GradOverwritingFunction):
    seen: list[Holders] = []

    @staticmethod
    def forward(ctx: Any, t: Tensor) -> Tensor:
        GradOverwritingFunction.setup(ctx, False, probe=True)
        return t.clone()

    @staticmethod
    def backward_writing(ctx: Any, grad: Tensor, writable: bool) -> Tensor:
        _Probe.seen.append(ctx.holders)  # as GradOverwritingFunction.backward counted them
        return grad


_ALONE: dict[int, Holders] = {}


def engine_alone_holders() -> dict[int, Holders]:
    """The counts of a gradient held by the engine alone, by their number (3 for a plain
    gradient, 5 for a view), measured once (the first call): the probe's plain gradient
    comes fresh from a product's backward, made for it alone; its view, from a product of
    3-d by 1-d, whose backward reshapes a fresh 2-d gradient."""
    if not _ALONE:
        with torch.enable_grad(), torch.autograd.set_detect_anomaly(False):
            (_Probe.apply(torch.zeros(2, requires_grad=True)) * 2).sum().backward()
            probe_input = torch.zeros(2, 3, 4, requires_grad=True)
            (_Probe.apply(probe_input) @ torch.ones(4)).sum().backward()
        plain, view = _Probe.seen
        _Probe.seen.clear()
        _ALONE[len(plain)] = plain
        # Only a view's counts stand for views: were this gradient plain (another torch's
        # backward), its storage might be shared, and its counts no baseline for plain ones.
        if len(view) > len(plain):
            _ALONE[len(view)] = view
    return _ALONE


def held_by_engine_alone(holders: Holders) -> bool:
    """Whether a gradient with these counts has no holder besides the engine."""
    alone = engine_alone_holders().get(len(holders))
    return alone is not None and all(count <= most for count, most in zip(holders, alone))
