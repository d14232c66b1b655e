"""hotloop.set_compile_arithmetic (issue 29, the compiled Llama step): torch.compile traces
rms_norm and RMSNorm as their casting mode's arithmetic in torch ops, which Inductor fuses,
unless the setting is False; torch.export traces hotloop's op unless it is True.

Graphs are read with a Dynamo backend that records the graph Dynamo hands it and the forward
and backward graphs AOTAutograd makes of it, then runs them as they are (aot_eager's way).
Results under the setting are compared with the op's own, eagerly, within the dtype's
rounding: the arithmetic is not the kernels' bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from op_testing import (
    TOLERANCES,
    assert_norm_grads_close,
    exact_square_sums,
    gemma_rms_norm,
    llama_rms_norm,
    requires_compile,
    requires_cuda,
)
from torch._dynamo.backends.common import aot_autograd
from torch._dynamo.backends.debugging import boxed_nop

import hotloop
from hotloop._arithmetic import traced_as_arithmetic

pytestmark = requires_compile

EPS = 1e-6
# (device, backend): the Triton kernels run on CUDA only.
TARGETS = [
    pytest.param("cpu", "native", id="cpu-native"),
    pytest.param("cuda", "native", id="cuda-native", marks=[pytest.mark.gpu, requires_cuda]),
    pytest.param("cuda", "triton", id="cuda-triton", marks=[pytest.mark.gpu, requires_cuda]),
]
# (casting, offset): every mode, Gemma's with its offset of 1 and with another one.
MODES = [("torch", 0.0), ("llama", 0.0), ("gemma", 1.0), ("gemma", 0.5)]
# The weight: none (every mode computes the same), x's dtype, or a wider one (float32 master
# weights for 16-bit x, float64 for float32 x), which rms_norm takes through its casts.
WEIGHTS = ["none", "same", "wider"]
WIDER = {torch.bfloat16: torch.float32, torch.float16: torch.float32, torch.float32: torch.float64}


@pytest.fixture(autouse=True)
def default_setting() -> Iterator[None]:
    """Every test starts from the default and leaves it behind, whatever it asserts, with
    Dynamo's caches empty (the parametrised tests compile one function's code many times)."""
    torch._dynamo.reset()
    with hotloop.set_compile_arithmetic(None):
        yield


def hotloop_targets(gm: torch.fx.GraphModule) -> list[str]:
    """The calls of a graph that run hotloop's kernels: its ops (an overload, or the packet
    Dynamo may record), and the Triton kernels that AOTAutograd traces the Triton op into."""
    targets = [str(node.target) for node in gm.graph.nodes if node.op == "call_function"]
    return [t for t in targets if t.startswith("hotloop.") or "triton_kernel_wrapper" in t]


class GraphRecorder:
    """A Dynamo backend that keeps Dynamo's graph and AOTAutograd's forward and backward
    graphs (``graphs``, in that order) and runs them uncompiled."""

    def __init__(self) -> None:
        self.graphs: list[torch.fx.GraphModule] = []
        self.compiles = 0

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        self.compiles += 1
        self.graphs.append(gm)
        return aot_autograd(fw_compiler=self._keep, bw_compiler=self._keep)(gm, example_inputs)

    def _keep(self, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        self.graphs.append(gm)
        return boxed_nop(gm, example_inputs)

    def hotloop_targets(self) -> list[str]:
        return [t for gm in self.graphs for t in hotloop_targets(gm)]


def norm_inputs(
    device: str, dtype: torch.dtype, weight: str, offset: float, shape: tuple[int, ...] = (6, 200)
) -> tuple[torch.Tensor, torch.Tensor | None]:
    gen = torch.Generator(device="cpu").manual_seed(shape[-1])
    x = torch.randn(shape, generator=gen).to(device=device, dtype=dtype).requires_grad_()
    if weight == "none":
        return x, None
    w_dtype = dtype if weight == "same" else WIDER[dtype]
    w = 1 - offset + 0.3 * torch.randn(shape[-1], generator=gen)
    return x, w.to(device=device, dtype=w_dtype).requires_grad_()


def forward_and_grads(
    norm: Callable[..., torch.Tensor], x: torch.Tensor, w: torch.Tensor | None
) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    y = norm(x, w)
    gen = torch.Generator(device="cpu").manual_seed(7)
    dy = torch.randn(y.shape, generator=gen).to(device=y.device, dtype=y.dtype)
    inputs = (x,) if w is None else (x, w)
    return y, torch.autograd.grad(y, inputs, dy)


@pytest.mark.parametrize(("device", "backend"), TARGETS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("weight", WEIGHTS)
@pytest.mark.parametrize(("casting", "offset"), MODES)
def test_compiled_arithmetic_matches_the_op(
    device: str, backend: str, dtype: torch.dtype, weight: str, casting: str, offset: float
) -> None:
    if weight == "none" and (casting, offset) != MODES[0]:
        pytest.skip("without a weight every mode computes the same: run once, as 'torch'")
    x, w = norm_inputs(device, dtype, weight, offset)

    def norm(a: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
        return hotloop.rms_norm(a, b, EPS, backend, casting=casting, offset=offset)

    recorder = GraphRecorder()
    compiled = torch.compile(norm, backend=recorder, fullgraph=True)
    with hotloop.set_compile_arithmetic(True):
        got, got_grads = forward_and_grads(compiled, x, w)
    # Dynamo's graph, AOTAutograd's forward and backward: none runs hotloop's kernels.
    assert len(recorder.graphs) == 3
    assert recorder.hotloop_targets() == []

    expected, expected_grads = forward_and_grads(norm, x, w)  # eager: the kernels
    assert got.dtype == expected.dtype
    torch.testing.assert_close(got, expected, **TOLERANCES[dtype])
    if w is None:
        torch.testing.assert_close(got_grads[0], expected_grads[0], **TOLERANCES[dtype])
    else:
        assert got_grads[1].dtype == w.dtype
        assert_norm_grads_close(got_grads, expected_grads, dtype)  # type: ignore[arg-type]


def torch_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """torch.nn.RMSNorm's composite (rms_norm_composite), written out: F.rms_norm may run a
    fused kernel on CUDA, whose arithmetic is not the one the modes name."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(x.dtype)


# The formulas the modes reproduce, by name (the models' own, as op_testing writes them).
FORMULAS: dict[str, Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]] = {
    "torch": torch_rms_norm,
    "llama": llama_rms_norm,
    "gemma": gemma_rms_norm,
}


@pytest.mark.parametrize(("device", "backend"), TARGETS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("casting", list(FORMULAS))
def test_arithmetic_gives_the_modes_bits(
    device: str, backend: str, dtype: torch.dtype, casting: str
) -> None:
    # Rows whose sums of squares are exact: every order of summation gives one rstd, so the
    # arithmetic, run as it is traced (aot_eager), must round where the mode's model rounds,
    # bit for bit, as the kernels do. The modes differ in the last bit on these rows, which
    # a comparison within tolerance would not see.
    offset = 1.0 if casting == "gemma" else 0.0
    x = exact_square_sums(37, 96, dtype, device, seed=5)
    w = (1 + torch.randn(96, generator=torch.Generator().manual_seed(6)) * 0.3).to(device, dtype)
    compiled = torch.compile(
        lambda a, b: hotloop.rms_norm(a, b, EPS, backend, casting=casting, offset=offset),
        backend="aot_eager",
        fullgraph=True,
    )
    with hotloop.set_compile_arithmetic(True):
        got = compiled(x, w)
    expected = FORMULAS[casting](x, w, EPS)
    assert torch.equal(got, expected)
    others = [FORMULAS[c](x, w, EPS) for c in ("torch", "llama") if c != casting]
    assert all(not torch.equal(got, other) for other in others)


@pytest.mark.parametrize(("device", "backend"), TARGETS)
def test_compile_traces_the_arithmetic_unless_told(device: str, backend: str) -> None:
    x, w = norm_inputs(device, torch.bfloat16, "same", 0.0)
    recorder = GraphRecorder()
    compiled = torch.compile(
        lambda a, b: hotloop.rms_norm(a, b, EPS, backend, casting="llama"),
        backend=recorder,
        fullgraph=True,
    )
    compiled(x, w).sum().backward()
    assert recorder.graphs
    assert recorder.hotloop_targets() == []
    torch._dynamo.reset()
    recorder.graphs.clear()
    with hotloop.set_compile_arithmetic(False):
        compiled(x, w).sum().backward()
    if backend == "triton":
        # Dynamo's graph need not name the Triton op (torch.library.triton_op): AOTAutograd
        # traces it into its kernels, which the forward and backward graphs call.
        targets = recorder.hotloop_targets()
        assert any("triton_kernel_wrapper" in t for t in targets), targets
    else:
        assert "hotloop.rms_norm.default" in hotloop_targets(recorder.graphs[0])


@pytest.mark.parametrize(("device", "backend"), TARGETS)
def test_changing_the_setting_traces_again(device: str, backend: str) -> None:
    # The setting is read while Dynamo traces, which guards on it: a call under the other
    # value must not reuse the graph made under this one. Each value's graph is then reused.
    x, w = norm_inputs(device, torch.bfloat16, "same", 0.0)
    recorder = GraphRecorder()
    compiled = torch.compile(
        lambda a, b: hotloop.rms_norm(a, b, EPS, backend), backend=recorder, fullgraph=True
    )
    with torch.no_grad():
        with hotloop.set_compile_arithmetic(False):
            compiled(x, w)
        assert recorder.compiles == 1
        assert hotloop_targets(recorder.graphs[-1])
        compiled(x, w)
        assert recorder.compiles == 2
        assert not hotloop_targets(recorder.graphs[-1])
        with hotloop.set_compile_arithmetic(False):
            compiled(x, w)
        compiled(x, w)
    assert recorder.compiles == 2


def test_module_and_dynamic_shapes_under_inductor() -> None:
    # A norm between two elementwise steps, as in a decoder layer (residual add, the
    # norm, the next layer's input): by default Inductor's code calls no hotloop op; one
    # dynamic graph serves other row counts.
    from torch._inductor.utils import run_and_get_code

    norm = hotloop.RMSNorm(64, eps=EPS, casting="llama", dtype=torch.bfloat16)
    with torch.no_grad():
        norm.weight.normal_(1.0, 0.2)

    def block(h: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
        return norm(h + r) * 2

    compiled = torch.compile(block, fullgraph=True, dynamic=True)
    for rows in (5, 9):
        h, r = (torch.randn(rows, 64, dtype=torch.bfloat16) for _ in range(2))
        got, codes = run_and_get_code(compiled, h, r)
        assert not any("torch.ops.hotloop" in code for code in codes)
        torch.testing.assert_close(got, block(h, r), **TOLERANCES[torch.bfloat16])
    torch._dynamo.reset()
    with hotloop.set_compile_arithmetic(False):
        _, codes = run_and_get_code(compiled, h, r)
    assert any("torch.ops.hotloop.rms_norm" in code for code in codes)


def test_eager_calls_run_the_kernels_either_way() -> None:
    x, w = norm_inputs("cpu", torch.bfloat16, "same", 0.0)
    with torch.no_grad():
        default = hotloop.rms_norm(x, w, EPS, casting="llama")
        for setting in (True, False):
            with hotloop.set_compile_arithmetic(setting):
                assert torch.equal(hotloop.rms_norm(x, w, EPS, casting="llama"), default)


class Norm(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = hotloop.RMSNorm(40, eps=EPS, casting="gemma", offset=1.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x)


@pytest.mark.parametrize("strict", [False, True], ids=["non_strict", "strict"])
def test_export_keeps_the_op_unless_asked(strict: bool) -> None:
    # AOTInductor packages and the C++ runner (examples/aoti) rely on the default. A
    # torch.compile before and after the export traces the arithmetic: the export's flag is
    # read per trace.
    x = torch.randn(3, 40)
    recorder = GraphRecorder()
    compiled = torch.compile(Norm(), backend=recorder, fullgraph=True)
    with torch.no_grad():
        compiled(x)
    program = torch.export.export(Norm(), (x,), strict=strict)
    assert hotloop_targets(program.graph_module) == ["hotloop.rms_norm.default"]
    with torch.no_grad():
        compiled(x + 1)
    assert recorder.graphs
    assert recorder.hotloop_targets() == []
    with hotloop.set_compile_arithmetic(False):
        program = torch.export.export(Norm(), (x,), strict=strict)
    assert hotloop_targets(program.graph_module) == ["hotloop.rms_norm.default"]
    with hotloop.set_compile_arithmetic(True):
        program = torch.export.export(Norm(), (x,), strict=strict)
    assert hotloop_targets(program.graph_module) == []
    torch.testing.assert_close(program.module()(x), Norm()(x), **TOLERANCES[torch.float32])


# Inputs the op refuses: under the setting they reach the op, whose fake kernel refuses them
# with its own words, rather than broadcasting (a 1-element weight) or computing anyway.
REFUSED = [
    pytest.param(lambda: (torch.randn(4, 8), torch.ones(1)), "weight has 1 elements", id="shape"),
    pytest.param(
        lambda: (torch.randn(4, 8), torch.ones(2, 8)), "weight must be 1-D", id="2-d weight"
    ),
    pytest.param(
        lambda: (torch.randn(4, 8), torch.ones(8, device="meta")), "is on meta", id="device"
    ),
    pytest.param(lambda: (torch.ones(4, 8, dtype=torch.int32), None), "int32", id="integer x"),
    pytest.param(lambda: (torch.tensor(2.0), None), "0-dim", id="0-dim x"),
]


@pytest.mark.parametrize(("make", "message"), REFUSED)
def test_refused_inputs_reach_the_op(
    make: Callable[[], tuple[torch.Tensor, torch.Tensor | None]], message: str
) -> None:
    x, w = make()
    recorder = GraphRecorder()
    compiled = torch.compile(
        lambda a, b: hotloop.rms_norm(a, b, EPS), backend=recorder, fullgraph=True
    )
    with hotloop.set_compile_arithmetic(True), pytest.raises(Exception, match=message):
        compiled(x, w)


@pytest.mark.skipif(
    hotloop.ops.api.triton_rms_norm is None, reason="Triton can't be imported with this torch"
)
def test_triton_backend_on_the_cpu_reaches_the_op() -> None:
    # The arithmetic would compute on any device; the Triton op refuses a CPU tensor.
    if hotloop.ops.api.triton_rms_norm.interpreting():
        pytest.skip("TRITON_INTERPRET runs CPU tensors")
    compiled = torch.compile(
        lambda a: hotloop.rms_norm(a, None, EPS, "triton"), backend="aot_eager", fullgraph=True
    )
    with hotloop.set_compile_arithmetic(True), pytest.raises(Exception, match="CUDA tensor"):
        compiled(torch.randn(4, 8))


@pytest.mark.parametrize(("casting", "offset"), [(3, 0.0), (-1, 0.0), (0, 1.0), (1, 0.5)])
def test_modes_the_ops_refuse_are_left_to_them(casting: int, offset: float) -> None:
    # The Triton package's rms_norm takes the mode's index as it comes: one the ops refuse
    # must reach them rather than compute as some other mode.
    x = torch.randn(4, 8)
    with hotloop.set_compile_arithmetic(True):
        assert traced_as_arithmetic(x, None, 2, 1.0)
        assert not traced_as_arithmetic(x, None, casting, offset)


def test_setting_is_a_bool_or_none_and_restores() -> None:
    # Outside a trace the answer is torch.compile's: the arithmetic, unless set False.
    assert hotloop.is_compile_arithmetic_enabled() is True
    with hotloop.set_compile_arithmetic(False):
        assert hotloop.is_compile_arithmetic_enabled() is False
        with hotloop.set_compile_arithmetic(True):
            assert hotloop.is_compile_arithmetic_enabled() is True
        assert hotloop.is_compile_arithmetic_enabled() is False
        with hotloop.set_compile_arithmetic(None):
            assert hotloop.is_compile_arithmetic_enabled() is True
        assert hotloop.is_compile_arithmetic_enabled() is False
    assert hotloop.is_compile_arithmetic_enabled() is True
    hotloop.set_compile_arithmetic(False)  # without `with`: from here on
    assert hotloop.is_compile_arithmetic_enabled() is False
    with pytest.raises(TypeError, match=r"expected True, False or None .* but got 'yes'"):
        hotloop.set_compile_arithmetic("yes")  # type: ignore[arg-type]
    assert hotloop.is_compile_arithmetic_enabled() is False
