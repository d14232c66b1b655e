"""The CUDA ops inside a captured CUDA graph: decode loops replay graphs to skip the host's
per-call cost, so every op (forward, backward, in place) must capture and then compute
on whatever data the static inputs hold at replay time."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from op_testing import TOLERANCES, requires_cuda

import hotloop

pytestmark = [pytest.mark.gpu, requires_cuda]

# (rows, hidden): the vector kernels, the register-resident scalar kernels (odd H), the
# generic ones (rows wider than the register kernels).
SHAPES = [(8, 4096), (3, 4095), (2, 20000)]


def capture(fn: Callable[[], object]) -> torch.cuda.CUDAGraph:
    """fn captured after a warm-up on a side stream, as torch.cuda.graphs recommends."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


# The leaves' gradient accumulators were made on the default stream, and capture runs the
# backward on the capture stream: torch warns that this may cost a synchronisation, which
# is what capture needs anyway (torch.cuda.graphs' own examples warm up the same way).
@pytest.mark.filterwarnings("ignore:The AccumulateGrad node's stream does not match")
@pytest.mark.parametrize("backend", ["native", "triton"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_rms_norm_forward_and_backward_replay(shape: tuple[int, int], backend: str) -> None:
    dtype = torch.bfloat16
    x = torch.randn(shape, device="cuda", dtype=dtype, requires_grad=True)
    w = torch.randn(shape[-1], device="cuda", dtype=dtype, requires_grad=True)
    dy = torch.randn(shape, device="cuda", dtype=dtype)
    out: dict[str, torch.Tensor] = {}

    def step() -> None:
        y = hotloop.rms_norm(x, w, 1e-6, backend=backend)
        out["y"] = y
        out["dx"], out["dw"] = torch.autograd.grad(y, (x, w), dy)

    graph = capture(step)
    for _ in range(3):  # new data each replay: the graph must not have baked in the first
        with torch.no_grad():
            x.copy_(torch.randn_like(x))
            w.copy_(torch.randn_like(w))
            dy.copy_(torch.randn_like(dy))
        graph.replay()
        x64, w64 = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
        y64 = torch.nn.functional.rms_norm(x64, (shape[-1],), w64, 1e-6)
        dx64, dw64 = torch.autograd.grad(y64, (x64, w64), dy.double())
        torch.testing.assert_close(out["y"].double(), y64, **TOLERANCES[dtype])
        torch.testing.assert_close(out["dx"].double(), dx64, **TOLERANCES[dtype])
        # dw sums over every row: its bf16 rounding is relative to the sum's size.
        scale = dw64.abs().max().item()
        assert (out["dw"].double() - dw64).abs().max().item() <= 2e-2 * scale


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_fused_add_rms_norm_replay(shape: tuple[int, int]) -> None:
    dtype = torch.bfloat16
    x = torch.empty(shape, device="cuda", dtype=dtype)
    residual = torch.empty_like(x)
    w = torch.randn(shape[-1], device="cuda", dtype=dtype)

    def step() -> None:
        with torch.inference_mode():
            hotloop.fused_add_rms_norm(x, residual, w, 1e-6)

    graph = capture(step)
    for _ in range(3):
        x.copy_(torch.randn_like(x))
        residual.copy_(torch.randn_like(residual))
        ref_residual = (x.double() + residual.double()).to(dtype)
        ref_y = torch.nn.functional.rms_norm(ref_residual.double(), (shape[-1],), w.double(), 1e-6)
        graph.replay()
        torch.testing.assert_close(residual, ref_residual, atol=0, rtol=0)
        torch.testing.assert_close(x.double(), ref_y, **TOLERANCES[dtype])
