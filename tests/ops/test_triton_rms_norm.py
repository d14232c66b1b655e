"""The Triton RMSNorm (hotloop.triton_rms_norm): correctness, opcheck, gradcheck, compile.

GPU tests carry the `gpu` marker and skip without CUDA. Without a GPU the kernels still
run, in Triton's interpreter: `test_kernels_in_triton_interpreter` starts a Python with
TRITON_INTERPRET=1 (Triton reads it when the kernels are defined, so it can't be
switched on inside this process) and runs the same checks there on CPU tensors.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from op_testing import (
    BLOCK_GRAD_TOLERANCE,
    COMPILED_AUTOGRAD_CHECK,
    RELATIVE_TOLERANCES,
    TOLERANCES,
    OpRecorder,
    opcheck,
    requires_compile,
    requires_cuda,
    rms_norm_samples,
)
from torch.autograd import DeviceType
from torch.fx.experimental.symbolic_shapes import ShapeEnv

pytest.importorskip("triton", reason="Triton ships with CUDA builds of torch only")

import hotloop
from hotloop import triton_rms_norm

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
# Every kernel path: one element, odd sizes (each unaligned row shape with settings of its
# own: 2047, 4095, 8193), narrow rows packed several to a program, one under and one over a
# power of two, the widest register-resident forward and backward rows (8192, 16384) and
# rows wider than both (looped kernels).
HIDDEN_SIZES = [1, 7, 64, 1000, 2047, 4095, 8192, 8193, 16384, 20000]


def sample_inputs(
    device: str, dtype: torch.dtype, requires_grad: bool = False
) -> list[tuple[torch.Tensor, torch.Tensor | None, float]]:
    return rms_norm_samples(device, dtype, HIDDEN_SIZES, requires_grad)


def reference(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """RMSNorm in float64 (differentiable)."""
    x64 = x.double()
    y = x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + eps)
    return y if weight is None else y * weight.double()


def assert_near(
    got: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype, what: str, terms: float = 0.0
) -> None:
    """`terms`: the largest term of a sum that ref is the result of, where they cancel."""
    assert got.shape == ref.shape, what
    assert torch.isfinite(got).all(), f"{what}: non-finite values"
    if ref.numel() == 0:
        return
    scale = max(ref.abs().max().item(), terms, 1.0)
    err = (got.double() - ref).abs().max().item() / scale
    assert err <= RELATIVE_TOLERANCES[dtype], f"{what}: max error {err:.3g} of max |ref| ({dtype})"


def is_power_of_2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


@pytest.mark.parametrize(
    "hidden",
    [
        1,
        7,
        33,
        100,
        512,
        1000,
        1024,
        2047,
        4095,
        4096,
        5000,
        8192,
        8193,
        12000,
        16383,
        16384,
        16385,
        20000,
    ],
)
def test_launch_settings_fit_every_width(hidden: int) -> None:
    # Triton refuses block shapes that aren't powers of two, and a thread that holds more
    # than 64 elements of a tile spills: check what every width would be launched with.
    block_n, block_tail = triton_rms_norm.row_blocks(hidden)
    assert is_power_of_2(block_n)
    assert block_tail == 0 or is_power_of_2(block_tail)
    assert block_n + block_tail >= hidden
    assert block_n + block_tail < 2 * hidden or block_n + block_tail <= 16
    if not triton_rms_norm.fused(hidden):
        assert block_n + block_tail > triton_rms_norm.MAX_FUSED_BLOCK
        return
    configs = [
        make(hidden, aligned)
        for make in (triton_rms_norm.fwd_config, triton_rms_norm.bwd_config)
        for aligned in (True, False)
    ]
    for config in configs:
        assert is_power_of_2(config.block_m)
        assert config.num_warps in (1, 2, 4, 8, 16, 32)
        assert config.block_m * (block_n + block_tail) / (32 * config.num_warps) <= 64, config


def test_row_alignment_is_what_divides_every_row() -> None:
    # ALIGN tells the kernels that rows start at multiples of it: it must divide the
    # width and every row stride, and is capped at one 16-byte vector.
    align = triton_rms_norm.row_alignment
    assert align(2, 4096, 4096, 4096) == 8  # bf16: 8 elements are 16 bytes
    assert align(2, 1000, 1000) == 8  # beyond Triton's own multiples of 16
    assert align(4, 1000, 1000) == 4
    assert align(8, 1000, 1000) == 2
    assert align(2, 4095, 4095) == 1
    assert align(2, 1000, 1002) == 2  # a strided view
    symbolic = ShapeEnv().create_unbacked_symint()  # a stride while torch.compile traces
    assert align(2, 1000, symbolic) == 1  # no guard on it, and no claim


# ------------------------------------------------------------------------------ GPU


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.gpu
@requires_cuda
def test_forward_matches_reference(dtype: torch.dtype) -> None:
    for x, weight, eps in sample_inputs("cuda", dtype):
        out = triton_rms_norm.rms_norm(x, weight, eps)
        assert out.dtype == x.dtype
        assert_near(out, reference(x, weight, eps), dtype, f"y of {tuple(x.shape)}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.gpu
@requires_cuda
def test_backward_matches_reference(dtype: torch.dtype) -> None:
    for x, weight, eps in sample_inputs("cuda", dtype, requires_grad=True):
        inputs = (x,) if weight is None else (x, weight)
        out = triton_rms_norm.rms_norm(x, weight, eps)
        grad_out = torch.randn_like(out)
        got = torch.autograd.grad(out, inputs, grad_out)
        expected = torch.autograd.grad(reference(x, weight, eps), inputs, grad_out.double())
        # grad_x = rstd * g * w - x * (...): at H = 1 the two cancel, leaving the rounding
        # error of terms of size |rstd * g * w|.
        x64 = x.detach().double()
        rstd = torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + eps)
        w64 = 1.0 if weight is None else weight.detach().double()
        terms = (rstd * grad_out.double() * w64).abs().max().item() if x.numel() else 0.0
        for name, g, e in zip(("grad_x", "grad_weight"), got, expected):
            assert g.dtype == dtype
            where = f"{name} of {tuple(x.shape)}"
            assert_near(g, e, dtype, where, terms if name == "grad_x" else 0.0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.gpu
@requires_cuda
def test_matches_torch_and_the_native_backend(dtype: torch.dtype) -> None:
    x = torch.randn(8, 128, 4096, device="cuda", dtype=dtype)
    weight = torch.rand(4096, device="cuda", dtype=dtype)
    out = hotloop.rms_norm(x, weight, backend="triton")  # eps=None: torch's default
    tol = TOLERANCES[dtype]
    torch.testing.assert_close(out, F.rms_norm(x, (4096,), weight), **tol)
    torch.testing.assert_close(out, hotloop.rms_norm(x, weight, backend="native"), **tol)


@pytest.mark.gpu
@requires_cuda
def test_default_eps_for_bfloat16_is_torchs() -> None:
    """eps=None is float32's epsilon for bfloat16 x, as in torch, not bfloat16's 0.0078."""
    x = (1e-2 * torch.randn(4, 256, device="cuda")).bfloat16()
    for out in (hotloop.rms_norm(x, backend="triton"), triton_rms_norm.rms_norm(x)):
        torch.testing.assert_close(out, F.rms_norm(x, (256,)), atol=0.0, rtol=2**-8)


@pytest.mark.gpu
@requires_cuda
def test_weight_gradient_over_many_rows() -> None:
    # Many more rows than persistent programs: every program reduces a long chunk.
    x = torch.randn(65536, 512, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    weight = torch.randn(512, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    grad_out = torch.randn_like(x)
    got = torch.autograd.grad(triton_rms_norm.rms_norm(x, weight, 1e-6), weight, grad_out)[0]
    expected = torch.autograd.grad(reference(x, weight, 1e-6), weight, grad_out.double())[0]
    assert_near(got, expected, torch.bfloat16, "grad_weight")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.gpu
@requires_cuda
def test_opcheck(dtype: torch.dtype) -> None:
    for x, weight, eps in sample_inputs("cuda", dtype, requires_grad=True):
        opcheck(torch.ops.hotloop.rms_norm_triton.default, (x, weight, eps))
        grad_out = torch.randn_like(x.detach())
        args = (grad_out, x.detach(), None if weight is None else weight.detach(), eps)
        opcheck(torch.ops.hotloop.rms_norm_triton_backward.default, args)


@pytest.mark.gpu
@requires_cuda
def test_gradcheck() -> None:
    for h in (1, 7, 33, 20000):
        rows = 2 if h > 1000 else 4
        x = torch.randn(rows, h, device="cuda", dtype=torch.float64, requires_grad=True)
        weight = torch.randn(h, device="cuda", dtype=torch.float64, requires_grad=True)
        torch.autograd.gradcheck(
            lambda a, b: triton_rms_norm.rms_norm(a, b, 1e-6), (x, weight), fast_mode=h > 1000
        )
        torch.autograd.gradcheck(
            lambda a: triton_rms_norm.rms_norm(a, None, 1e-6), (x,), fast_mode=h > 1000
        )


@pytest.mark.gpu
@requires_cuda
@requires_compile
def test_compile_traces_into_the_kernels() -> None:
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()

    def block(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return triton_rms_norm.rms_norm(x * 2, weight, 1e-6) + 1

    x = torch.randn(4, 16, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    weight = torch.randn(256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    explained = torch._dynamo.explain(block)(x, weight)
    assert explained.graph_break_count == 0, explained.break_reasons

    compiled = torch.compile(block, fullgraph=True, dynamic=True)
    # The op, not its arithmetic (torch.compile's default; test_compile_arithmetic.py).
    with hotloop.set_compile_arithmetic(False):
        out, codes = run_and_get_code(compiled, x, weight)
        # Inductor launched the user kernel itself: the op was decomposed, not called opaquely.
        assert any("rms_norm_fwd_kernel" in code for code in codes)
        torch.testing.assert_close(out, block(x, weight), **TOLERANCES[torch.bfloat16])

        grad_out = torch.randn_like(out)
        got = torch.autograd.grad(out, (x, weight), grad_out)
        expected = torch.autograd.grad(block(x, weight), (x, weight), grad_out)
        for g, e in zip(got, expected):
            torch.testing.assert_close(g, e, **BLOCK_GRAD_TOLERANCE)

        # Other leading sizes reuse the dynamic graph.
        for shape in [(3, 7, 256), (1, 1, 256)]:
            x2 = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
            expected = block(x2, weight)
            torch.testing.assert_close(compiled(x2, weight), expected, **TOLERANCES[torch.bfloat16])


def test_eager_launch_keys_split_what_triton_compiles_apart() -> None:
    # Eager launches reuse the kernel Triton compiled for a key (launch._specialisation of
    # each argument): two arguments that Triton would compile differently must never share
    # a key. Ints: 1 (a constant), multiples of 16, and 64-bit values; tensors: dtype and
    # 16-byte alignment; floats always go as float32.
    from hotloop.triton_rms_norm.launch import _specialisation

    ints = [1, 2, 16, 17, 32, 2**31 - 16, 2**31, 2**40]
    keys = {n: _specialisation(n) for n in ints}
    assert keys[1] != keys[2]
    assert keys[16] != keys[17]
    assert keys[2] == keys[17]
    assert keys[16] == keys[32]
    assert keys[2**31 - 16] != keys[2**31]
    assert keys[2**31] == keys[2**40]
    base = torch.zeros(64, dtype=torch.float32)
    assert _specialisation(base) != _specialisation(base[1:])
    assert _specialisation(base) != _specialisation(base.to(torch.float16))
    assert _specialisation(base) == _specialisation(base[4:])
    assert _specialisation(1e-6) == _specialisation(0.5)


@pytest.mark.gpu
@requires_cuda
def test_eager_calls_launch_what_the_op_launches() -> None:
    # Eager calls skip the dispatcher and Triton's argument binding (launch._launch_eager),
    # so each must find the kernel Triton compiled for its own specialisation. The calls
    # alternate between what Triton compiles apart: one row and many (an int of 1), rows
    # on and off 16-byte boundaries, dtypes, with and without a weight. Each must equal
    # the op's output (Triton's own launch) bit for bit; the second round hits the cache.
    torch.manual_seed(0)
    cases = []
    for dtype in (torch.bfloat16, torch.float32):
        flat = torch.randn(40 * 1024 + 8, device="cuda", dtype=dtype)
        for rows, hidden, offset in [
            (1, 1024, 0),
            (37, 1024, 0),
            (32, 1024, 1),
            (1, 1024, 1),
            (16, 1000, 0),
            (16, 1000, 3),
        ]:
            x = flat[offset : offset + rows * hidden].view(rows, hidden)
            for weight in (None, torch.randn(hidden, device="cuda", dtype=dtype)):
                cases.append((x, weight))
    for _ in range(2):
        for x, weight in cases:
            got = triton_rms_norm.rms_norm(x, weight, 1e-6)
            expected = torch.ops.hotloop.rms_norm_triton(x, weight, 1e-6)
            assert torch.equal(got, expected), (x.shape, x.dtype, x.data_ptr() % 16)
            assert_near(got, reference(x, weight, 1e-6), x.dtype, f"y of {tuple(x.shape)}")


@pytest.mark.gpu
@requires_cuda
def test_a_repeated_eager_forward_launches_for_its_own_arguments() -> None:
    # A repeated eager forward reuses the launch of an earlier call with the same key
    # (op._eager_forward_key) and skips the checks: every argument the launch or the checks
    # read must be in the key. Each call below repeats an earlier one but for one
    # argument, so a key without it would launch the earlier call's kernel or scalars.
    torch.manual_seed(0)
    x = torch.randn(4, 1024, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(1024, device="cuda", dtype=torch.bfloat16)
    flat = torch.randn(4 * 1024 + 8, device="cuda", dtype=torch.bfloat16)
    variants = [
        (x, w, 1e-6, 0, 0.0),
        (x, w, 0.5, 0, 0.0),  # eps
        (x, w, 1e-6, 1, 0.0),  # casting
        (x, w, 1e-6, 2, 1.0),  # offset
        (x, None, 1e-6, 0, 0.0),  # no weight
        (x[:1], w, 1e-6, 0, 0.0),  # one row: an int of 1 that Triton compiles apart
        (flat[1 : 1 + 4096].view(4, 1024), w, 1e-6, 0, 0.0),  # x off 16-byte boundaries
        (x, flat[1:1025], 1e-6, 0, 0.0),  # weight off 16-byte boundaries
        (x.float(), w.float(), 1e-6, 0, 0.0),  # dtype
        (x.t().contiguous().t(), w, 1e-6, 0, 0.0),  # not contiguous: the full path
    ]
    for _ in range(2):  # the second round repeats every key
        for args in variants:
            got = triton_rms_norm.rms_norm(*args)
            expected = torch.ops.hotloop.rms_norm_triton(*args)
            assert torch.equal(got, expected), args[1:]
            # The backward too (and the in-place one, a key of its own).
            x_, w_, rest = args[0], args[1], args[2:]
            expected_grads = torch.ops.hotloop.rms_norm_triton_backward(
                torch.ones_like(x_), x_, w_, *rest
            )
            for in_place in (False, True):
                leaves = [t.detach().requires_grad_() for t in (x_, w_) if t is not None]
                y = triton_rms_norm.rms_norm(
                    leaves[0], leaves[1] if w_ is not None else None, *rest, in_place
                )
                y.backward(torch.ones_like(y))
                for leaf, grad in zip(leaves, expected_grads):
                    assert torch.equal(leaf.grad, grad), (args[1:], in_place)
    # The checks still run for what differs from a key that passed them.
    with pytest.raises(ValueError, match="weight has 1023 elements"):
        triton_rms_norm.rms_norm(x, w[:1023].contiguous(), 1e-6)
    with pytest.raises(ValueError, match="but weight is on cpu"):
        triton_rms_norm.rms_norm(x, w.cpu(), 1e-6)


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize(
    ("rows", "dtype", "kernels"),
    [
        (1, torch.float32, 1),  # one program: its partial row is grad_weight
        (1, torch.bfloat16, 2),  # and a cast to the weight's dtype
        (4096, torch.bfloat16, 3),  # many programs: the partials' sum, then the cast
    ],
)
def test_backward_kernels_a_call(rows: int, dtype: torch.dtype, kernels: int) -> None:
    # At decode sizes the host time is the launches': a one-program grid's grad_weight
    # must not take a reduction over its single partial row.
    x = torch.randn(rows, 1024, device="cuda", dtype=dtype)
    w = torch.randn(1024, device="cuda", dtype=dtype)
    g = torch.randn_like(x)
    x.requires_grad_()
    w.requires_grad_()
    expected = torch.ops.hotloop.rms_norm_triton_backward(g, x.detach(), w.detach(), 1e-6)
    for _ in range(2):  # the second call takes the eager launch cache
        y = triton_rms_norm.rms_norm(x, w, 1e-6)
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            y.backward(g)
            torch.cuda.synchronize()
        launched = [e.name for e in prof.events() if e.device_type == DeviceType.CUDA]
        assert len(launched) == kernels, launched
        assert torch.equal(x.grad, expected[0])
        assert torch.equal(w.grad, expected[1])
        x.grad = w.grad = None


@pytest.mark.gpu
@requires_cuda
def test_dispatch_modes_see_the_op() -> None:
    # The eager shortcut is for plain calls only: a dispatch mode (FakeTensorMode, a
    # tracer, a profiler's) must still see hotloop's op, not the kernels' own tensors.
    x = torch.randn(4, 256, device="cuda", requires_grad=True)
    weight = torch.randn(256, device="cuda", requires_grad=True)
    with OpRecorder() as recorder:
        out = triton_rms_norm.rms_norm(x, weight, 1e-6)
        out.sum().backward()
    assert "hotloop.rms_norm_triton.default" in recorder.ops
    assert "hotloop.rms_norm_triton_backward.default" in recorder.ops


@pytest.mark.gpu
@requires_cuda
def test_empty_inputs() -> None:
    x = torch.randn(0, 16, device="cuda", requires_grad=True)
    weight = torch.randn(16, device="cuda", requires_grad=True)
    out = triton_rms_norm.rms_norm(x, weight, 1e-6)
    assert out.shape == (0, 16)
    grad_x, grad_w = torch.autograd.grad(out, (x, weight), torch.randn_like(out))
    assert grad_x.shape == (0, 16)
    assert torch.equal(grad_w, torch.zeros_like(weight))


@pytest.mark.gpu
@requires_cuda
def test_bad_inputs() -> None:
    x = torch.randn(4, 16, device="cuda")
    with pytest.raises(ValueError, match="weight has 15 elements but x's last dim is 16"):
        triton_rms_norm.rms_norm(x, torch.randn(15, device="cuda"), 1e-6)
    with pytest.raises(ValueError, match=r"x is torch.float32 but weight is torch.float16"):
        triton_rms_norm.rms_norm(x, torch.randn(16, device="cuda", dtype=torch.float16), 1e-6)
    with pytest.raises(ValueError, match="but weight is on cpu"):
        triton_rms_norm.rms_norm(x, torch.randn(16), 1e-6)
    with pytest.raises(ValueError, match="expected a floating-point tensor"):
        triton_rms_norm.rms_norm(torch.ones(4, 16, device="cuda", dtype=torch.int32), None, 1e-6)
    with pytest.raises(ValueError, match="0-dim"):
        triton_rms_norm.rms_norm(torch.tensor(1.0, device="cuda"), None, 1e-6)


# ------------------------------------------------------------------------------ CPU


@pytest.mark.skipif(triton_rms_norm.interpreting(), reason="TRITON_INTERPRET runs CPU tensors")
def test_cpu_tensor_is_refused() -> None:
    with pytest.raises(ValueError, match=r"x is on cpu; the Triton kernels need a CUDA tensor"):
        triton_rms_norm.rms_norm(torch.randn(2, 8), None, 1e-6)


# Runs in a fresh Python with TRITON_INTERPRET=1, on CPU tensors. Kept to small shapes
# (the interpreter runs each program in NumPy), but every kernel path is exercised.
INTERPRETER_SCRIPT = textwrap.dedent(
    """
    import torch
    import hotloop
    from hotloop import triton_rms_norm as trn

    assert trn.interpreting()
    torch.manual_seed(0)
    TOL = __RELATIVE_TOLERANCES__

    def reference(x, w, eps):
        x64 = x.double()
        y = x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + eps)
        return y if w is None else y * w.double()

    def near(got, ref, dtype, what):
        err = (got.double() - ref).abs().max().item() / max(ref.abs().max().item(), 1.0)
        assert err <= TOL[dtype], f"{what}: error {err:.3g}"

    cases = [((3, 1), True), ((2, 3, 7), True), ((40, 24), True), ((3, 2047), True),
             ((3, 4095), False), ((2, 8193), True), ((2, 20000), True), ((2, 20000), False)]
    for dtype in (torch.bfloat16, torch.float32, torch.float64):
        for shape, with_weight in cases:
            x = torch.randn(shape, dtype=dtype, requires_grad=True)
            w = torch.randn(shape[-1], dtype=dtype, requires_grad=True) if with_weight else None
            y = trn.rms_norm(x, w, 1e-6)
            near(y, reference(x, w, 1e-6), dtype, f"y {dtype} {shape}")
            dy = torch.randn_like(y)
            inputs = (x,) if w is None else (x, w)
            got = torch.autograd.grad(y, inputs, dy)
            ref = torch.autograd.grad(reference(x, w, 1e-6), inputs, dy.double())
            for g, r in zip(got, ref):
                near(g, r, dtype, f"grad {dtype} {shape}")

    # Every variant of the backward that a launch setting can pick (prefetching, the
    # pipeliner, several rows a tile), on a split row (33 = 32 + a tail block of 16).
    x = torch.randn(9, 33, dtype=torch.float32)
    w = torch.randn(33, dtype=torch.float32)
    dy = torch.randn_like(x)
    xr, wr = x.double().requires_grad_(), w.double().requires_grad_()
    ref = torch.autograd.grad(reference(xr, wr, 1e-6), (xr, wr), dy.double())
    assert trn.row_blocks(33) == (32, 16)
    for config in (trn.BwdConfig(1, 4, 2, prefetch=True), trn.BwdConfig(2, 4, 1, prefetch=True),
                   trn.BwdConfig(4, 4, 1, loop_stages=2), trn.BwdConfig(2, 4, 3)):
        dx = torch.empty_like(x)
        dw = trn.backward_rows(dy, x, w, dx, 1e-6, config)[0].sum(0)
        near(dx, ref[0], torch.float32, f"dx {config}")
        near(dw, ref[1], torch.float32, f"dw {config}")
        y = torch.empty_like(x)
        trn.forward_rows(x, w, y, 1e-6, trn.FwdConfig(config.block_m, 4))
        near(y, reference(x, w, 1e-6), torch.float32, f"y {config.block_m} rows a program")

    # Non-contiguous input, and the Python API's backend switch.
    x = torch.randn(24, 10, dtype=torch.float32).t()
    near(hotloop.rms_norm(x, None, 1e-6, backend="triton"), reference(x, None, 1e-6),
         torch.float32, "transposed")

    x = torch.randn(3, 5, 7, requires_grad=True)
    w = torch.randn(7, requires_grad=True)
    torch.library.opcheck(torch.ops.hotloop.rms_norm_triton.default, (x, w, 1e-6))
    torch.library.opcheck(torch.ops.hotloop.rms_norm_triton.default, (x, None, 1e-6))
    torch.library.opcheck(torch.ops.hotloop.rms_norm_triton_backward.default,
                          (torch.randn(3, 5, 7), x.detach(), w.detach(), 1e-6))

    xd = torch.randn(3, 9, dtype=torch.float64, requires_grad=True)
    wd = torch.randn(9, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: trn.rms_norm(a, b, 1e-6), (xd, wd))
    __FORWARD_AD_CHECKS__
    __IN_PLACE_CHECKS__

    explained = torch._dynamo.explain(lambda a, b: trn.rms_norm(a, b, 1e-6) * 2)(x, w)
    assert explained.graph_break_count == 0, explained.break_reasons

    # The casting modes (CASTING 1 llama, 2 gemma with offset 1) through the ops, fused and
    # looped rows, against the models' formulas on inputs whose sums of squares are exact.
    # float16 only: the interpreter rounds bfloat16 stores toward zero (the default's
    # kernels differ from torch there too); the GPU run checks bfloat16.
    def llama(x, w, eps):
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
        return w * h.to(x.dtype)

    def gemma(x, w, eps):
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
        return (h * (1.0 + w.float())).type_as(x)

    for hidden in (64, 1024, 32768):
        x = (torch.randint(-16, 17, (3, hidden)).float() / 8).half()
        w = (1 + 0.1 * torch.randn(hidden)).half()
        for casting, offset, weight, formula in ((1, 0.0, w, llama), (2, 1.0, w - 1, gemma)):
            y = trn.rms_norm(x, weight, 1e-6, casting, offset)
            assert torch.equal(y, formula(x, weight, 1e-6)), (casting, hidden)
            # The backward against the mode's formula in float64, Llama's rounding of the
            # normalised value kept (its gradient passes through it, as autograd's cast's).
            dy = torch.randn(3, hidden).half()
            dx, dw = trn.rms_norm_backward(dy, x, weight, 1e-6, casting, offset)
            xr, wr = x.double().requires_grad_(), weight.double().requires_grad_()
            xhat = xr * torch.rsqrt(xr.pow(2).mean(-1, keepdim=True) + 1e-6)
            if casting == 1:
                ref = wr * (xhat + (xhat.half().double() - xhat).detach())
            else:
                ref = xhat * (offset + wr)
            ref_dx, ref_dw = torch.autograd.grad(ref, (xr, wr), dy.double())
            near(dx, ref_dx, torch.float16, f"dx casting {casting} {hidden}")
            near(dw, ref_dw, torch.float16, f"dw casting {casting} {hidden}")
    print("interpreter checks passed")
    """
)


# Forward-mode AD of the Triton ops (issue 27): real tangents, not dropped ones. Run in the
# interpreter above and, in the GPU test below, on CUDA tensors (DEVICE).
FORWARD_AD_CHECKS = """
import torch.nn.functional as F
xd = torch.randn(3, 9, dtype=torch.float64, device=DEVICE, requires_grad=True)
wd = torch.randn(9, dtype=torch.float64, device=DEVICE, requires_grad=True)
assert torch.autograd.gradcheck(
    lambda a, b: trn.rms_norm(a, b, 1e-6), (xd, wd), check_forward_ad=True
)
gd = torch.randn(3, 9, dtype=torch.float64, device=DEVICE, requires_grad=True)
assert torch.autograd.gradcheck(
    lambda g, a, b: trn.rms_norm_backward(g, a, b, 1e-6), (gd, xd, wd),
    check_forward_ad=True, check_backward_ad=False,
)
x, t = xd.detach(), torch.randn_like(xd)
w = wd.detach()
got = torch.func.jvp(lambda v: hotloop.rms_norm(v, w, 1e-6, backend="triton"), (x,), (t,))[1]
ref = torch.func.jvp(lambda v: F.rms_norm(v, (9,), w, 1e-6), (x,), (t,))[1]
torch.testing.assert_close(got, ref)
hessian = torch.func.hessian(lambda v: hotloop.rms_norm(v, w, 1e-6, backend="triton").pow(2).sum())
reference = torch.func.hessian(lambda v: F.rms_norm(v, (9,), w, 1e-6).pow(2).sum())
import warnings
with warnings.catch_warnings():
    # The Triton ops have no batching rules yet: jacfwd's vmap loops over the samples
    # (correct, slower), and says so.
    warnings.filterwarnings("ignore", "There is a performance drop", UserWarning)
    torch.testing.assert_close(hessian(x[0]), reference(x[0]))
print("forward AD checks passed")
"""


# The in-place backward (rms_norm(..., in_place_backward=True), issue 31): grad_x written over
# the gradient received where autograd's engine alone holds it (the kernels read each tile
# before they write it), the usual backward where anything else does. Run in the interpreter
# above and, in the GPU test below, on CUDA tensors (DEVICE).
IN_PLACE_CHECKS = (
    COMPILED_AUTOGRAD_CHECK
    + """
def in_place_step(shape, dtype, in_place, fan_out=False, casting="torch"):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=gen).to(DEVICE, dtype).requires_grad_()
    w = (1 + 0.1 * torch.randn(shape[-1], generator=gen)).to(DEVICE, dtype).requires_grad_()
    proj = torch.randn(shape[-1], 5, generator=gen).to(DEVICE, dtype)
    y = hotloop.rms_norm(x, w, 1e-6, backend="triton", casting=casting,
                         in_place_backward=in_place)
    seen = []
    y.register_hook(lambda g: seen.append((g.data_ptr(), g._version)))  # keeps no reference
    ((x + y if fan_out else y) @ proj).float().sum().backward()
    return x.grad, w.grad, seen[0], x.grad._version

def check_in_place():  # a function: its names stay out of the script around it
    # A fresh gradient (the projection's): written over, in fused and looped rows, and its
    # version bumped.
    # (3-d: the projection's backward hands back a view of its 2-d product.)
    for shape, dtype, casting in (((6, 64), torch.float32, "torch"),
                                  ((3, 1000), torch.float16, "llama"),
                                  ((2, 3, 64), torch.bfloat16, "torch"),
                                  ((2, 40000), torch.float32, "torch")):
        gx, gw, _, _ = in_place_step(shape, dtype, False, casting=casting)
        ix, iw, (ptr, version), x_version = in_place_step(shape, dtype, True, casting=casting)
        assert torch.equal(ix, gx) and torch.equal(iw, gw), (shape, casting)
        assert ix.data_ptr() == ptr, "grad_x was not written over the incoming gradient"
        assert x_version > version
    # x + rms_norm(x): the add hands x's edge the same tensor; it must keep its value.
    gx, gw, _, _ = in_place_step((6, 64), torch.float32, False, fan_out=True)
    ix, iw, (ptr, _), _ = in_place_step((6, 64), torch.float32, True, fan_out=True)
    assert torch.equal(ix, gx) and torch.equal(iw, gw)
    assert ix.data_ptr() != ptr
    # A gradient the caller passed stays as it was.
    x = torch.randn(4, 64, device=DEVICE, requires_grad=True)
    dy = torch.randn(4, 64, device=DEVICE)
    kept = dy.clone()
    hotloop.rms_norm(x, None, 1e-6, backend="triton", in_place_backward=True).backward(dy)
    assert torch.equal(dy, kept)
    print("in-place backward checks passed")


check_in_place()
# torch.compile of the eager Function's backward (compiled autograd), in place and not.
for in_place in (False, True):
    check_compiled_autograd(
        lambda x, w: hotloop.rms_norm(
            x, w, 1e-6, backend="triton", in_place_backward=in_place
        ),
        DEVICE,
    )
print("compiled autograd checks passed")
"""
)


def version_tuple(version: str) -> tuple[int, int]:
    major, minor = version.split(".")[:2]
    return int(major), int(minor)


def interpreter_broken() -> bool:
    # Triton < 3.7's interpreter turns a program id into a one-element array, which
    # NumPy >= 2.3 refuses to use as a range() bound (seen with torch 2.11's Triton 3.6).
    import numpy
    import triton

    return version_tuple(triton.__version__) < (3, 7) and version_tuple(numpy.__version__) >= (2, 3)


@pytest.mark.skipif(
    torch.cuda.is_available(), reason="stands in for a GPU; the real kernels run on this one"
)
@pytest.mark.skipif(interpreter_broken(), reason="this Triton's interpreter fails with this NumPy")
def test_kernels_in_triton_interpreter(tmp_path: Path) -> None:
    script = tmp_path / "interpret_rms_norm.py"
    # The tolerance table is op_testing's (the fresh Python imports torch, not the test helpers).
    forward_ad = f'DEVICE = "cpu"\n{FORWARD_AD_CHECKS}'
    script.write_text(
        INTERPRETER_SCRIPT.replace("__RELATIVE_TOLERANCES__", repr(RELATIVE_TOLERANCES))
        .replace("__FORWARD_AD_CHECKS__", forward_ad)
        .replace("__IN_PLACE_CHECKS__", IN_PLACE_CHECKS)
    )
    # The child imports hotloop from wherever this process did (source tree or wheel).
    hotloop_root = str(Path(hotloop.__file__).resolve().parent.parent)
    env = dict(os.environ, TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="")
    env["PYTHONPATH"] = os.pathsep.join([hotloop_root, env.get("PYTHONPATH", "")]).rstrip(
        os.pathsep
    )
    proc = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr[-6000:]}"
    assert "forward AD checks passed" in proc.stdout
    assert "in-place backward checks passed" in proc.stdout
    assert "compiled autograd checks passed" in proc.stdout
    assert "interpreter checks passed" in proc.stdout


@pytest.mark.gpu
@requires_cuda
def test_forward_ad_on_cuda(capsys: pytest.CaptureFixture[str]) -> None:
    exec(
        FORWARD_AD_CHECKS,
        {"torch": torch, "hotloop": hotloop, "trn": triton_rms_norm, "DEVICE": "cuda"},
    )
    assert "forward AD checks passed" in capsys.readouterr().out


@pytest.mark.gpu
@requires_cuda
def test_in_place_backward_on_cuda(capsys: pytest.CaptureFixture[str]) -> None:
    exec(IN_PLACE_CHECKS, {"torch": torch, "hotloop": hotloop, "DEVICE": "cuda"})
    out = capsys.readouterr().out
    assert "in-place backward checks passed" in out
    assert "compiled autograd checks passed" in out


@pytest.mark.parametrize("eps", [1e-6, 1e-5, 0.1, 1e-12, 0.0, 3.0])
def test_eps_parts_add_up_to_eps_in_float64(eps: float) -> None:
    """The float64 kernels rebuild eps from two arguments that Triton passes as float32:
    float32(eps) and the rest, which add up to eps within float32 squared (2^-48)."""
    from hotloop.triton_rms_norm.launch import eps_parts

    high, low = eps_parts(eps)
    assert high == torch.tensor(eps, dtype=torch.float32).item()
    low32 = torch.tensor(low, dtype=torch.float32).item()  # what the kernel receives
    assert abs(high + low32 - eps) <= 2.0**-48 * abs(eps)
