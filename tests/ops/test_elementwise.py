"""muladd and mul: correctness, opcheck, autograd, compile, bad inputs."""

from __future__ import annotations

import pytest
import torch
from op_testing import TOLERANCES, opcheck, requires_compile, requires_cuda

import hotloop

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]


def sample_inputs(device: str, dtype: torch.dtype, requires_grad: bool = False) -> list[tuple]:
    def make(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device=device, dtype=dtype, requires_grad=requires_grad)

    transposed = make(33, 17).t()  # non-contiguous view
    return [
        (make(3), make(3), 1.5),
        (make(20, 7), make(20, 7), -0.25),
        (make(2, 3, 129), make(2, 3, 129), 0.0),
        (transposed, make(17, 33), 3.0),
        (make(4, 10)[:, ::3], make(4, 4), 2.0),
    ]


def muladd_reference(a: torch.Tensor, b: torch.Tensor, c: float) -> torch.Tensor:
    return (a.double() * b.double() + c).to(a.dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_muladd_and_mul_match_reference(device: str, dtype: torch.dtype) -> None:
    for a, b, c in sample_inputs(device, dtype):
        torch.testing.assert_close(
            hotloop.muladd(a, b, c), muladd_reference(a, b, c), **TOLERANCES[dtype]
        )
        torch.testing.assert_close(
            hotloop.mul(a, b), muladd_reference(a, b, 0.0), **TOLERANCES[dtype]
        )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_opcheck(device: str, dtype: torch.dtype) -> None:
    for a, b, c in sample_inputs(device, dtype, requires_grad=True)[:3]:
        opcheck(torch.ops.hotloop.muladd.default, (a, b, c))
        opcheck(torch.ops.hotloop.mul.default, (a, b))


def test_gradcheck(device: str) -> None:
    for a, b, c in sample_inputs(device, torch.float64, requires_grad=True)[:4]:
        assert torch.autograd.gradcheck(hotloop.muladd, (a, b, c))
        assert torch.autograd.gradcheck(hotloop.mul, (a, b))


def test_backward_calls_the_mul_op(device: str) -> None:
    a, b, _ = sample_inputs(device, torch.float32, requires_grad=True)[1]
    out = hotloop.muladd(a, b, 1.0)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        out.sum().backward()
    assert any(e.name == "hotloop::mul" for e in prof.events())
    torch.testing.assert_close(a.grad, b.detach())


@requires_compile
def test_compile_without_graph_breaks(device: str) -> None:
    def f(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return hotloop.muladd(a, b, 2.0).relu()

    compiled = torch.compile(f, fullgraph=True, dynamic=True)
    for n in (5, 17, 64):
        a, b = (torch.randn(3, n, device=device) for _ in range(2))
        torch.testing.assert_close(compiled(a, b), f(a, b))
    explanation = torch._dynamo.explain(f)(a, b)
    assert explanation.graph_break_count == 0


@pytest.mark.parametrize(
    ("a", "b", "message"),
    [
        (torch.randn(3, 4), torch.randn(4, 3), "shape"),
        (torch.randn(3), torch.randn(3, dtype=torch.float64), "dtype"),
        (torch.ones(3, dtype=torch.int64), torch.ones(3, dtype=torch.int64), "Long"),
    ],
)
def test_bad_inputs_raise_clear_errors(a: torch.Tensor, b: torch.Tensor, message: str) -> None:
    with pytest.raises((RuntimeError, ValueError), match=message):
        hotloop.muladd(a, b, 1.0)
    with pytest.raises((RuntimeError, ValueError), match=message):
        hotloop.mul(a, b)


@pytest.mark.gpu
@requires_cuda
def test_tensors_on_different_devices_raise() -> None:
    with pytest.raises(RuntimeError, match="cpu"):
        hotloop.muladd(torch.randn(3, device="cuda"), torch.randn(3), 1.0)


def test_empty_tensors(device: str) -> None:
    a = torch.randn(0, 5, device=device)
    assert hotloop.muladd(a, a, 1.0).shape == (0, 5)
