"""The FP8 norms: rms_norm_fp8, rms_norm_fp8_dynamic and their fused_add_ twins.

Correctness is judged on the dequantised output against a float64 reference: the norm in
float64, divided by the scale, clamped to +-448, *not* rounded. A correctly rounded output is
within half an e4m3 ulp of that; the kernels compute the norm in float32 (the GPU's rsqrtf
is within 2 float32 ulps), which can move a value lying within a few float32 ulps of a
rounding midpoint to the other neighbour. So each element may be off by one e4m3 ulp of its
binade (2^-3 relative for normal values, 2^-9 for subnormals), and no more. A blanket relative
tolerance of 2^-3 would let subnormal and zero outputs be anything. The conversion itself is
checked bit for bit on inputs whose norm float32 computes exactly.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

import pytest
import torch
from op_testing import TOLERANCES, opcheck, requires_compile, requires_cuda

import hotloop
from hotloop.__main__ import describe_ops, ops_for_capability
from hotloop.ops import E4M3_MAX, FP8_DTYPE, FP8_OPS, MIN_DYNAMIC_SCALE

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
# Every kernel path on a GPU: one element, odd sizes (register-resident scalars, each of
# their variants: 7, 1001, 2047, 4095, 8193), aligned rows of one to four vectors per thread,
# and past those (20000: re-read from L2 where aligned, else generic).
HIDDEN_SIZES = [1, 7, 64, 1001, 2047, 4095, 4096, 8193, 16384, 20000]

requires_fp8_gpu = pytest.mark.skipif(
    not torch.cuda.is_available()
    or torch.cuda.get_device_capability() < hotloop.ops.FP8_MIN_CAPABILITY,
    reason="needs a CUDA GPU of compute capability 8.9 or newer",
)
# The CUDA kernels need an FP8-capable GPU: on an older one every op refuses (tested below).
FP8_DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, requires_fp8_gpu])]


@pytest.fixture(params=FP8_DEVICES)
def device(request: pytest.FixtureRequest) -> str:
    return request.param


@dataclass(frozen=True)
class Fp8Op:
    """One of the four ops, called in a uniform way."""

    name: str
    fused: bool
    dynamic: bool

    def __call__(
        self,
        x: torch.Tensor,
        weight: torch.Tensor,
        eps: float,
        scale: torch.Tensor | None = None,
        residual: torch.Tensor | None = None,
        scale_ub: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(out, the scale that dequantises it: per tensor or per row)."""
        assert (residual is not None) == self.fused
        if self.dynamic:
            if self.fused:
                return hotloop.fused_add_rms_norm_fp8_dynamic(x, residual, weight, eps, scale_ub)
            return hotloop.rms_norm_fp8_dynamic(x, weight, eps, scale_ub)
        assert scale is not None
        if self.fused:
            return hotloop.fused_add_rms_norm_fp8(x, residual, weight, scale, eps), scale
        return hotloop.rms_norm_fp8(x, weight, scale, eps), scale

    def args(
        self, x: torch.Tensor, weight: torch.Tensor, eps: float, scale: torch.Tensor
    ) -> tuple[Any, ...]:
        """Arguments of the raw op (torch.ops.hotloop.<name>.default), residual made up."""
        residual = torch.randn(x.shape, dtype=x.dtype, device=x.device)
        head = (x, residual) if self.fused else (x,)
        tail = (weight, eps, None) if self.dynamic else (weight, scale, eps)
        return (*head, *tail)

    @property
    def op(self) -> Any:
        return getattr(torch.ops.hotloop, self.name).default


OPS = [
    pytest.param(Fp8Op("rms_norm_fp8", fused=False, dynamic=False), id="static"),
    pytest.param(Fp8Op("rms_norm_fp8_dynamic", fused=False, dynamic=True), id="dynamic"),
    pytest.param(Fp8Op("fused_add_rms_norm_fp8", fused=True, dynamic=False), id="fused-static"),
    pytest.param(
        Fp8Op("fused_add_rms_norm_fp8_dynamic", fused=True, dynamic=True), id="fused-dynamic"
    ),
]
DYNAMIC_OPS = [p for p in OPS if p.values[0].dynamic]


class Sample(NamedTuple):
    id: str
    x: torch.Tensor
    weight: torch.Tensor
    eps: float


def sample_inputs(device: str, dtype: torch.dtype) -> list[Sample]:
    """Rows of every hidden size with a weight, then shapes and layouts every kernel takes."""
    gen = torch.Generator().manual_seed(0)

    def make(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, dtype=torch.float64).to(device, dtype)

    samples = [Sample(f"5x{h}", make(5, h), make(h) * 0.5 + 1, 1e-6) for h in HIDDEN_SIZES]
    return [
        *samples,
        Sample("leading-dims", make(2, 3, 5, 40), make(40), 1e-5),
        Sample("many-short-rows", make(300, 24), make(24), 1e-6),
        Sample("one-dim", make(10), make(10), 1e-6),
        Sample("transposed", make(40, 6).t(), make(40), 1e-3),
        Sample("unaligned-rows", make(4, 4097)[:, 1:], make(4096), 1e-6),
        Sample("row-stride", make(6, 100)[1:5, :33], make(33), 1e-6),
        Sample("large-values", make(3, 256) * 1e3, make(256) * 50, 1e-6),
    ]


def static_scale(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """A calibrated-looking scale: about the output's largest value over 448, so that the
    e4m3 range is used (and its top values saturate)."""
    amax = weight.double().abs().max() * x.size(-1) ** 0.5
    return (amax / E4M3_MAX / 2).float().reshape(1).to(x.device)


def norm_reference(v: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    v64 = v.double()
    return v64 * torch.rsqrt(v64.pow(2).mean(-1, keepdim=True) + eps) * weight.double()


def dynamic_scales_reference(y: torch.Tensor, scale_ub: torch.Tensor | None) -> torch.Tensor:
    amax = y.abs().amax(-1, keepdim=True)
    if scale_ub is not None:
        amax = amax.clamp(max=scale_ub.double().item())
    return (amax / E4M3_MAX).clamp(min=MIN_DYNAMIC_SCALE)


def e4m3_ulp(q: torch.Tensor) -> torch.Tensor:
    """The spacing of e4m3 values in the binade of each |q| (float64)."""
    exponent = torch.floor(torch.log2(q.abs().clamp(min=2.0**-6)))
    return torch.exp2(exponent - 3)


def assert_within_one_ulp(got: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    """got: float8_e4m3fn; expected: the float64 value it quantises (already / scale)."""
    assert got.dtype == FP8_DTYPE, what
    target = expected.clamp(-E4M3_MAX, E4M3_MAX)
    error = (got.double() - target).abs()
    excess = error - e4m3_ulp(target)
    if excess.numel() and excess.max() > 0:
        worst = int(excess.argmax())
        raise AssertionError(
            f"{what}: {int((excess > 0).sum())} of {excess.numel()} elements are more than one "
            f"e4m3 ulp off; worst: got {got.double().flatten()[worst].item()}, expected "
            f"{target.flatten()[worst].item()} (unrounded)"
        )


def check_against_reference(
    op: Fp8Op, sample: Sample, scale_ub: torch.Tensor | None = None, what: str = ""
) -> None:
    x, weight, eps = sample.x, sample.weight, sample.eps
    what = f"{op.name} {sample.id} {x.dtype}{what}"
    residual = torch.randn_like(x).contiguous() if op.fused else None
    v = x
    if residual is not None:
        v = (x.double() + residual.double()).to(x.dtype)  # the rounded new residual
    scale = None if op.dynamic else static_scale(v, weight)
    out, scales = op(x, weight, eps, scale=scale, residual=residual, scale_ub=scale_ub)
    assert out.shape == x.shape, what
    assert out.is_contiguous(), what
    if residual is not None:
        torch.testing.assert_close(residual, v, **TOLERANCES[x.dtype], msg=what)
    y = norm_reference(v, weight, eps)
    if op.dynamic:
        assert scales.shape == (*x.shape[:-1], 1), what
        assert scales.dtype == torch.float32, what
        expected_scales = dynamic_scales_reference(y, scale_ub)
        torch.testing.assert_close(scales.double(), expected_scales, rtol=1e-5, atol=0, msg=what)
    assert_within_one_ulp(out, y / scales.double(), what)


# ------------------------------------------------------------------------ correctness


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", OPS)
def test_matches_float64_reference(device: str, op: Fp8Op, dtype: torch.dtype) -> None:
    for sample in sample_inputs(device, dtype):
        check_against_reference(op, sample)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float64])
@pytest.mark.parametrize("row_vectors", [2048, 2049, 4096, 8192])
@pytest.mark.parametrize("op", OPS)
def test_wide_rows_in_turn(device: str, op: Fp8Op, row_vectors: int, dtype: torch.dtype) -> None:
    # On an H100 or an H200 aligned rows past the vector kernel (2049 and 4096 16-byte
    # vectors), and the fused ops' rows whose vector blocks leave an SM one block (2048), are
    # re-read from L2; the unfused ops' on three blocks of 512 threads an SM (2049), two of 768
    # (4096) or, for rows whose two blocks would leave the L2, one of 1024 (8192). More rows
    # than fit on those GPUs at once, so each block takes several rows in turn.
    hidden = row_vectors * 16 // torch.empty((), dtype=dtype).element_size()
    rows = 400 if row_vectors <= 4096 else 200
    gen = torch.Generator().manual_seed(row_vectors)
    x = torch.randn(rows, hidden, generator=gen, dtype=torch.float64).to(device, dtype)
    weight = (torch.rand(hidden, generator=gen, dtype=torch.float64) + 0.5).to(device, dtype)
    check_against_reference(op, Sample(f"{rows}x{hidden}", x, weight, 1e-6))


# Float32 values and their e4m3 bits: ties to even, the subnormal range, carries into the
# exponent, and what saturates.
CONVERSION_CASES = [
    (1.0, 0x38),
    (1.0625, 0x38),  # halfway between 1 and 1.125: to the even mantissa (1.0)
    (1.1875, 0x3A),  # halfway between 1.125 and 1.25: to 1.25
    (1.0625 + 2**-20, 0x39),  # just above halfway: up
    (2**-9, 0x01),  # smallest subnormal
    (2**-10, 0x00),  # half of it: to even (zero)
    (3 * 2**-10, 0x02),  # 1.5 subnormal units: to 2
    (2**-6 - 2**-11, 0x08),  # rounds up out of the subnormals into 2^-6
    (15.5, 0x58),  # halfway between 15 (odd mantissa) and 16: to 16, a carry into the exponent
    (-0.0, 0x80),
    (-3.25, 0xC5),  # -3.25 = -1.625 * 2: exact
    (440.0, 0x7E),  # halfway between 416 and 448: to 448 (mantissa 110 is even)
    (448.0, 0x7E),
    (460.0, 0x7E),  # would round to 448
    (470.0, 0x7E),  # would round to 480, past the largest finite value: saturates
    (1e6, 0x7E),
    (-1e6, 0xFE),
    (float("inf"), 0x7E),
    (float("-inf"), 0xFE),
]


def test_conversion_rounds_to_nearest_even_and_saturates(device: str) -> None:
    """x = ones, eps = 0: the norm is exactly 1, so out = e4m3(weight / scale) for scale 1."""
    values = torch.tensor([v for v, _ in CONVERSION_CASES] + [1.0] * 13, dtype=torch.float32)
    expected = [bits for _, bits in CONVERSION_CASES]
    x = torch.ones(2, values.numel(), device=device)  # 32 columns: the norm's mean is exact
    scale = torch.ones(1, device=device)
    # The premise: the norm of ones is exactly 1 (on GPUs: rsqrtf(1.0) == 1.0, which CUDA
    # documents only to 2 ulps). Were it not, the ties below would move for that reason.
    norm = hotloop.rms_norm(x, None, 0.0)
    if not bool((norm == 1).all()):
        pytest.skip(f"the norm of ones is not exactly 1 on {device}: ties can't be placed")
    out = hotloop.rms_norm_fp8(x, values.to(device), scale, 0.0)
    got = out.view(torch.uint8)[:, : len(expected)].cpu()
    for row in got:
        mismatches = [
            f"{v}: got {hex(g)}, expected {hex(e)}"
            for (v, e), g in zip(CONVERSION_CASES, row.tolist())
            if g != e
        ]
        assert not mismatches, mismatches
    # torch's own conversion agrees wherever no saturation is involved (compared as bytes:
    # torch 2.9 can't index float8 tensors)
    in_range = values.abs() < E4M3_MAX
    torch.testing.assert_close(
        out[0].cpu().view(torch.uint8)[in_range], values.to(FP8_DTYPE).view(torch.uint8)[in_range]
    )


def test_nan_stays_nan(device: str) -> None:
    x = torch.ones(1, 32, device=device)
    weight = torch.ones(32, device=device)
    weight[3] = float("nan")
    out = hotloop.rms_norm_fp8(x, weight, torch.ones(1, device=device), 0.0)
    assert out.float().isnan().tolist()[0] == [j == 3 for j in range(32)]


@pytest.mark.parametrize("op", OPS)
def test_saturates_at_448(device: str, op: Fp8Op) -> None:
    """A scale (or scale_ub) far too small for the values: they saturate to +-448."""
    x = torch.randn(4, 64, device=device)
    weight = torch.ones(64, device=device)
    tiny = torch.full((1,), 1e-3, device=device)
    residual = torch.zeros_like(x) if op.fused else None
    out, _ = op(x, weight, 1e-6, scale=tiny, residual=residual, scale_ub=tiny)
    y = norm_reference(x, weight, 1e-6)
    large = y.abs() > 1e-3 * E4M3_MAX  # past the largest value either scale represents
    assert large.any()
    torch.testing.assert_close(out.float()[large], (y.sign() * E4M3_MAX).float()[large])
    assert out.float().abs().max() == E4M3_MAX


@pytest.mark.parametrize("op", DYNAMIC_OPS)
def test_scale_ub_bounds_the_row_scales(device: str, op: Fp8Op) -> None:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(6, 256, generator=gen).to(device)
    x[0] *= 1e-3  # a row whose own scale is below the bound: unaffected
    weight = (torch.rand(256, generator=gen) + 0.5).to(device)
    scale_ub = torch.tensor(2.0, device=device)
    residual = torch.zeros_like(x) if op.fused else None
    out, scales = op(x, weight, 1e-6, residual=residual, scale_ub=scale_ub)
    y = norm_reference(x, weight, 1e-6)
    expected_scales = dynamic_scales_reference(y, scale_ub)
    assert (expected_scales[1:] == 2.0 / E4M3_MAX).all()
    torch.testing.assert_close(scales.double(), expected_scales, rtol=1e-6, atol=0)
    assert_within_one_ulp(out, y / expected_scales, f"{op.name} scale_ub")
    for sample in sample_inputs(device, torch.bfloat16)[3:5]:
        check_against_reference(op, sample, scale_ub.reshape(1), " with scale_ub")


@pytest.mark.parametrize("op", OPS)
def test_rows_of_zeros(device: str, op: Fp8Op) -> None:
    """A zero row has a zero norm; its dynamic scale is the floor, never 0 (no 0 / 0)."""
    x = torch.zeros(3, 48, device=device)
    x[1] = torch.randn(48, device=device)
    residual = torch.zeros_like(x) if op.fused else None
    weight, scale = torch.ones(48, device=device), torch.ones(1, device=device)
    out, scales = op(x, weight, 1e-6, scale=scale, residual=residual)
    assert (out.float()[[0, 2]] == 0).all()
    assert not out.float().isnan().any()
    if op.dynamic:
        assert scales[0].item() == scales[2].item() == torch.tensor(MIN_DYNAMIC_SCALE).item()
        assert scales[1].item() > MIN_DYNAMIC_SCALE


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("shape", [(0, 16), (4, 0), (2, 0, 8)], ids=str)
def test_empty_inputs(device: str, op: Fp8Op, shape: tuple[int, ...]) -> None:
    x = torch.randn(shape, device=device)
    residual = torch.zeros_like(x) if op.fused else None
    weight, scale = torch.ones(shape[-1], device=device), torch.ones(1, device=device)
    out, scales = op(x, weight, 1e-6, scale=scale, residual=residual)
    assert out.shape == shape
    assert out.dtype == FP8_DTYPE
    if op.dynamic:
        assert scales.shape == (*shape[:-1], 1)
        # rows of no elements: the floor, like rows of zeros
        assert (scales == torch.tensor(MIN_DYNAMIC_SCALE)).all()


def test_scalar_scale_of_shape_one_or_none(device: str) -> None:
    x = torch.randn(3, 16, device=device)
    weight = torch.ones(16, device=device)
    as_vector = hotloop.rms_norm_fp8(x, weight, torch.full((1,), 0.01, device=device))
    as_scalar = hotloop.rms_norm_fp8(x, weight, torch.tensor(0.01, device=device))
    assert torch.equal(as_vector.view(torch.uint8), as_scalar.view(torch.uint8))


@pytest.mark.parametrize("op", [p for p in OPS if p.values[0].fused])
def test_fused_equals_add_then_norm(device: str, op: Fp8Op) -> None:
    """The fused op is residual.add_(x) followed by the unfused op, bit for bit on CPU."""
    x = torch.randn(5, 96, device=device, dtype=torch.bfloat16)
    residual = torch.randn_like(x)
    weight = torch.rand(96, device=device, dtype=torch.bfloat16) + 0.5
    scale = torch.full((1,), 0.02, device=device)
    expected_residual = residual.clone().add_(x)
    unfused = Fp8Op(op.name.removeprefix("fused_add_"), fused=False, dynamic=op.dynamic)
    expected_out, expected_scales = unfused(expected_residual, weight, 1e-6, scale=scale)
    out, scales = op(x, weight, 1e-6, scale=scale, residual=residual)
    assert torch.equal(residual, expected_residual)
    if device == "cpu":
        assert torch.equal(out.view(torch.uint8), expected_out.view(torch.uint8))
        assert torch.equal(scales, expected_scales)
    else:
        assert_within_one_ulp(out, expected_out.double(), op.name)


# ------------------------------------------------------------------------ CUDA vs CPU


@requires_cuda
@requires_fp8_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", OPS)
def test_cuda_matches_cpu_kernel(op: Fp8Op, dtype: torch.dtype) -> None:
    """The CUDA kernels against the CPU one: the same formula in float32, so the same bits
    except where the sum of squares (another order) or rsqrtf moves a value across a
    rounding midpoint: one e4m3 ulp at most, on a small fraction of the elements."""
    for sample in sample_inputs("cuda", dtype):
        what = f"{op.name} {sample.id} {dtype}"
        scale = static_scale(sample.x, sample.weight)
        residual = torch.randn_like(sample.x).contiguous() if op.fused else None
        cpu_residual = None if residual is None else residual.cpu()
        out, scales = op(sample.x, sample.weight, sample.eps, scale, residual)
        cpu_out, cpu_scales = op(
            sample.x.cpu(), sample.weight.cpu(), sample.eps, scale.cpu(), cpu_residual
        )
        if residual is not None:
            assert torch.equal(residual.cpu(), cpu_residual), what
        torch.testing.assert_close(scales.cpu(), cpu_scales, rtol=2e-6, atol=0, msg=what)
        assert_within_one_ulp(out.cpu(), cpu_out.double(), what)
        differ = (out.cpu().view(torch.uint8) != cpu_out.view(torch.uint8)).double().mean()
        assert differ <= 0.01, f"{what}: {differ:.2%} of the elements differ from the CPU's"


@requires_cuda
@pytest.mark.gpu
def test_cuda_ops_say_what_gpu_they_need_or_run() -> None:
    x = torch.randn(2, 8, device="cuda")

    def call() -> torch.Tensor:
        return hotloop.rms_norm_fp8(x, torch.ones(8, device="cuda"), torch.ones(1, device="cuda"))

    if torch.cuda.get_device_capability() >= hotloop.ops.FP8_MIN_CAPABILITY:
        assert call().dtype == FP8_DTYPE
    else:
        with pytest.raises(RuntimeError, match=r"compute capability \d\.\d, but the FP8 ops need"):
            call()


# ------------------------------------------------------------------------ dispatcher


@pytest.mark.parametrize("op", OPS)
def test_opcheck(device: str, op: Fp8Op) -> None:
    for sample in (
        sample_inputs(device, torch.bfloat16)[1:3] + sample_inputs(device, torch.float32)[-4:-2]
    ):
        scale = static_scale(sample.x, sample.weight)
        opcheck(op.op, op.args(sample.x, sample.weight, sample.eps, scale))
    if op.dynamic:
        x = torch.randn(3, 40, device=device)
        head = (x, torch.randn_like(x)) if op.fused else (x,)
        ub = torch.ones(1, device=device)
        opcheck(op.op, (*head, torch.rand(40, device=device), 1e-6, ub))


@pytest.mark.parametrize("op", OPS)
@requires_compile
def test_compile_dynamic_shapes_without_graph_breaks(device: str, op: Fp8Op) -> None:
    weight = torch.rand(48, device=device, dtype=torch.bfloat16) + 0.5
    scale = torch.full((1,), 0.01, device=device)

    def f(x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out, scales = op(x * 2, weight, 1e-6, scale=scale, residual=residual if op.fused else None)
        return out.float() * scales, residual + 1

    compiled = torch.compile(f, fullgraph=True, dynamic=True)
    for rows in (3, 11, 40):
        x = torch.randn(rows, 48, device=device, dtype=torch.bfloat16)
        residual = torch.randn_like(x)
        eager_residual = residual.clone()
        got = compiled(x, residual)
        expected = f(x, eager_residual)
        torch.testing.assert_close(residual, eager_residual)
        torch.testing.assert_close(got, expected, rtol=2**-3, atol=2**-9 * 0.01)
    assert torch._dynamo.explain(f)(x, residual).graph_break_count == 0


@pytest.mark.parametrize("op", OPS)
def test_export(device: str, op: Fp8Op) -> None:
    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(16, 16)
            self.weight = torch.nn.Parameter(torch.rand(16) + 0.5, requires_grad=False)
            self.register_buffer("scale", torch.full((1,), 0.01))

        def forward(self, x: torch.Tensor, residual: torch.Tensor) -> Any:
            h = self.linear(x)
            out, scales = op(
                h, self.weight, 1e-6, scale=self.scale, residual=residual if op.fused else None
            )
            return out, scales, residual

    block = Block().to(device)
    x, residual = torch.randn(4, 16, device=device), torch.randn(4, 16, device=device)
    with torch.no_grad():
        exported = torch.export.export(block, (x, residual.clone()))
        assert f"hotloop.{op.name}" in str(exported.graph)
        got = exported.module()(x, got_residual := residual.clone())
        expected = block(x, expected_residual := residual.clone())
    assert torch.equal(got[0].view(torch.uint8), expected[0].view(torch.uint8))
    torch.testing.assert_close(got[1:], expected[1:])
    torch.testing.assert_close(got_residual, expected_residual)


# ------------------------------------------------------------------------ vmap


@pytest.fixture
def no_vmap_fallback() -> Iterator[None]:
    """functorch's per-sample fallback off: a missing batching rule raises, not loops."""
    previous = torch._C._functorch._is_vmap_fallback_enabled()
    torch._C._functorch._set_vmap_fallback_enabled(False)
    yield
    torch._C._functorch._set_vmap_fallback_enabled(previous)


@pytest.mark.usefixtures("no_vmap_fallback")
@pytest.mark.parametrize(("x_dim", "residual_dim"), [(0, 1), (1, 0), (None, 0)], ids=str)
@pytest.mark.parametrize("op", OPS)
def test_vmap_matches_a_loop(device: str, op: Fp8Op, x_dim: int | None, residual_dim: int) -> None:
    """Batched x (and residual, the batch dim outermost or not): the same bytes as a loop."""
    if x_dim is None and not op.fused:
        pytest.skip("nothing batched")
    batch = 3
    x = torch.randn(batch, 4, 16, device=device)
    x = x[0] if x_dim is None else x.movedim(0, x_dim)
    residual = torch.randn(batch, 4, 16, device=device).movedim(0, residual_dim)
    weight = torch.rand(16, device=device) + 0.5
    scale = torch.full((1,), 0.01, device=device)
    expected_residual = residual.clone()
    expected = []
    for i in range(batch):
        xi = x if x_dim is None else x.select(x_dim, i)
        ri = expected_residual.select(residual_dim, i)
        copy = ri.contiguous()
        out, scales = op(xi, weight, 1e-6, scale=scale, residual=copy if op.fused else None)
        ri.copy_(copy)
        expected.append((out.view(torch.uint8), scales))

    def f(x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out, scales = op(x, weight, 1e-6, scale=scale, residual=residual if op.fused else None)
        return out, scales

    in_dims = (x_dim, residual_dim) if op.fused else (x_dim, None)
    out, scales = torch.vmap(f, in_dims=in_dims)(x, residual)
    assert torch.equal(out.view(torch.uint8), torch.stack([e[0] for e in expected]))
    if op.dynamic:
        assert torch.equal(scales, torch.stack([e[1] for e in expected]))
    if op.fused:
        assert torch.equal(residual, expected_residual)


@pytest.mark.usefixtures("no_vmap_fallback")
@pytest.mark.parametrize("op", OPS)
def test_vmap_refuses_what_the_kernels_do_not_take(op: Fp8Op) -> None:
    x = torch.randn(3, 4, 8)
    weights = torch.rand(3, 8)

    def with_weight(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        residual = torch.zeros_like(x) if op.fused else None
        return op(x, weight, 1e-6, scale=torch.ones(1), residual=residual)[0]

    with pytest.raises(RuntimeError, match="weight is batched"):
        torch.vmap(with_weight)(x, weights)
    if op.fused:
        weight = torch.rand(8)

        def unbatched_residual(x: torch.Tensor) -> torch.Tensor:
            return op(x, weight, 1e-6, scale=torch.ones(1), residual=torch.zeros(4, 8))[0]

        with pytest.raises(RuntimeError, match="residual in place, so it must be batched"):
            torch.vmap(unbatched_residual)(x)


# ------------------------------------------------------------------------ bad inputs


def make_call(op: Fp8Op, **overrides: Any) -> Callable[[], Any]:
    """A call of `op` on good CPU inputs with some replaced."""
    inputs: dict[str, Any] = {
        "x": torch.randn(4, 8),
        "weight": torch.rand(8),
        "eps": 1e-6,
        "scale": torch.ones(1),
        "residual": torch.randn(4, 8) if op.fused else None,
        "scale_ub": None,
    }
    inputs.update(overrides)
    return lambda: op(**inputs)


BAD_INPUTS = [
    ("x", torch.ones(4, 8, dtype=torch.int64), "expected a floating-point tensor"),
    ("x", torch.tensor(1.0), "0-dim"),
    ("weight", torch.rand(7), "weight has 7 elements but x's last dim is 8"),
    ("weight", torch.rand(2, 4), "weight must be 1-D"),
    ("weight", torch.rand(8, dtype=torch.float64), "same dtype"),
]
STATIC_BAD_INPUTS = [
    ("scale", torch.ones(2), r"scale must hold one element \(shape \[\] or \[1\]\)"),
    ("scale", torch.ones(1, 1), "scale must hold one element"),
    ("scale", torch.ones(1, dtype=torch.float64), "scale must be a float32 tensor"),
    ("scale", torch.ones(1, dtype=torch.bfloat16), "scale must be a float32 tensor"),
]
DYNAMIC_BAD_INPUTS = [
    ("scale_ub", torch.ones(3), "scale_ub must hold one element"),
    ("scale_ub", torch.ones(1, dtype=torch.float16), "scale_ub must be a float32 tensor"),
]
FUSED_BAD_INPUTS = [
    ("residual", torch.randn(4, 9), "residual has shape"),
    ("residual", torch.randn(8, 4).t(), "must be contiguous"),
    ("residual", torch.randn(4, 8, dtype=torch.float64), "same dtype"),
]


@pytest.mark.parametrize("on_meta", [False, True], ids=["real", "meta"])
@pytest.mark.parametrize("op", OPS)
def test_bad_inputs(op: Fp8Op, on_meta: bool) -> None:
    """The real kernels and the fake ones (all-meta tensors) refuse the same inputs."""
    cases = BAD_INPUTS + (DYNAMIC_BAD_INPUTS if op.dynamic else STATIC_BAD_INPUTS)
    cases += FUSED_BAD_INPUTS if op.fused else []
    for name, value, message in cases:
        call = make_call(op, **{name: value})
        if on_meta:
            meta_inputs = {
                "x": torch.randn(4, 8, device="meta"),
                "weight": torch.rand(8, device="meta"),
                "eps": 1e-6,
                "scale": torch.ones(1, device="meta"),
                "residual": torch.randn(4, 8, device="meta") if op.fused else None,
                "scale_ub": None,
            }
            meta_inputs[name] = value.to("meta")
            call = lambda inputs=meta_inputs: op(**inputs)  # noqa: E731
        with pytest.raises(RuntimeError, match=message):
            call()


@pytest.mark.parametrize("op", OPS)
def test_inputs_on_two_devices_are_refused(op: Fp8Op) -> None:
    name = "scale_ub" if op.dynamic else "scale"
    with pytest.raises(RuntimeError, match=f"x is on cpu but {name} is on meta"):
        make_call(op, **{name: torch.ones(1, device="meta")})()


@pytest.mark.parametrize("op", [p for p in OPS if p.values[0].fused])
def test_fused_refuses_overlapping_residual(op: Fp8Op) -> None:
    rows = torch.randn(5, 8)
    residual = torch.randn(4, 8)
    for overrides in (
        {"x": rows[:4], "residual": rows[1:]},  # x overlaps residual
        {"residual": residual, "weight": residual[2]},  # weight is a row of residual
    ):
        before = overrides["residual"].clone()
        with pytest.raises(RuntimeError, match="refer to a single memory location"):
            make_call(op, **overrides)()
        torch.testing.assert_close(overrides["residual"], before, rtol=0, atol=0)


# ------------------------------------------------------------------------ inference only


@pytest.mark.parametrize("op", OPS)
def test_refuses_inputs_that_require_grad(op: Fp8Op) -> None:
    weight = torch.rand(8, requires_grad=True)
    with pytest.raises(RuntimeError, match="weight requires grad, but the op is an inference op"):
        make_call(op, weight=weight)()
    with torch.no_grad():
        make_call(op, weight=weight)()
    with torch.inference_mode():
        make_call(op, weight=weight)()


@pytest.mark.parametrize("op", [p for p in OPS if p.values[0].fused])
def test_fused_bumps_the_residual_version_only(op: Fp8Op) -> None:
    x, residual = torch.randn(4, 8), torch.randn(4, 8)
    versions = x._version, residual._version
    make_call(op, x=x, residual=residual)()
    assert (x._version, residual._version) == (versions[0], versions[1] + 1)
    leaf = torch.randn(4, 8, requires_grad=True)
    with pytest.raises(RuntimeError, match="a leaf Variable that requires grad"):
        make_call(op, residual=leaf)()
    with torch.inference_mode():
        frozen = torch.randn(4, 8)
    with pytest.raises(RuntimeError, match="Inplace update to inference tensor outside"):
        make_call(op, residual=frozen)()


# ------------------------------------------------------------------------ python -m hotloop


@pytest.mark.parametrize(
    ("capability", "runs_fp8"),
    [((8, 0), False), ((8, 6), False), ((8, 9), True), ((9, 0), True), ((12, 0), True)],
)
def test_which_ops_a_gpu_runs(capability: tuple[int, int], runs_fp8: bool) -> None:
    runs, refused = ops_for_capability(capability)
    assert "rms_norm" in runs
    assert set(FP8_OPS) <= set(runs if runs_fp8 else refused)
    line = describe_ops(capability)
    if runs_fp8:
        assert line.startswith(f"all {len(hotloop.ops.__all__)} run on it")
    else:
        assert f"need compute capability 8.9 or newer, this GPU has {capability[0]}." in line
