"""The casting modes of rms_norm (issue 31): "llama" and "gemma" (with Gemma's offset 1) give
the bits of transformers' LlamaRMSNorm and GemmaRMSNorm, "torch" (the default) stays
torch.nn.RMSNorm's; backward and forward-mode AD follow the mode; the backward gives the
same bits twice under torch.use_deterministic_algorithms.

The references are the models' formulas written out (op_testing); where transformers is
installed, its own classes run too (test_transformers_classes_give_the_same_bits).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch
from op_testing import (
    assert_norm_grads_close,
    exact_square_sums,
    gemma_rms_norm,
    llama_rms_norm,
    opcheck,
    requires_compile,
    requires_cuda,
)

import hotloop

HALF_DTYPES = [torch.bfloat16, torch.float16]
# Native kernels: a short row, an odd one (the CUDA span and scalar kernels), the headline
# width, an odd row past it. Triton: powers of two, up to a looped row.
WIDTHS = {"native": [64, 1000, 4096, 8193], "triton": [64, 1024, 4096, 32768]}
BACKENDS = ["native", pytest.param("triton", marks=[pytest.mark.gpu, requires_cuda])]
OP_CASTING = {"torch": 0, "llama": 1, "gemma": 2}
EPS = 1e-6


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, device: str) -> str:
    if request.param == "triton" and device != "cuda":
        pytest.skip("Triton's kernels run on CUDA (the interpreter test checks them on the CPU)")
    return str(request.param)


def weight_like(
    hidden: int, dtype: torch.dtype, device: str, scale: float, seed: int
) -> torch.Tensor:
    gen = torch.Generator(device="cpu").manual_seed(seed)
    return (scale * torch.randn(hidden, generator=gen)).to(device=device, dtype=dtype)


def assert_same_bits(got: torch.Tensor, expected: torch.Tensor) -> None:
    assert got.dtype == expected.dtype
    assert got.shape == expected.shape
    differ = got.view(torch.int16) != expected.view(torch.int16)
    assert not differ.any(), (
        f"{int(differ.sum())} of {differ.numel()} elements differ, e.g. {got[differ][:4].tolist()} "
        f"against {expected[differ][:4].tolist()}"
    )


# (offset, the model's formula, its weight: Llama's multiplies, Gemma's is w in 1 + w)
MODEL_FORMULAS = {
    "llama": (0.0, llama_rms_norm, lambda w: 1 + w),
    "gemma": (1.0, gemma_rms_norm, lambda w: w),
}


@pytest.mark.parametrize("casting", list(MODEL_FORMULAS))
@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("width_index", range(4))
def test_casting_gives_the_models_bits(
    device: str, backend: str, casting: str, dtype: torch.dtype, width_index: int
) -> None:
    offset, formula, model_weight = MODEL_FORMULAS[casting]
    hidden = WIDTHS[backend][width_index]
    x = exact_square_sums(37, hidden, dtype, device, seed=hidden)
    weight = model_weight(weight_like(hidden, dtype, device, 0.3, seed=hidden + 1)).to(dtype)
    expected = formula(x, weight, EPS)
    got = hotloop.rms_norm(x, weight, EPS, backend=backend, casting=casting, offset=offset)
    assert_same_bits(got, expected)
    if casting == "llama":
        # The default rounds once, after the weight: on these inputs it differs, so the
        # bits above come from the mode.
        assert (hotloop.rms_norm(x, weight, EPS, backend=backend) != expected).any()


@pytest.mark.parametrize("casting", list(MODEL_FORMULAS))
@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("hidden", [8192, 12288, 16384, 32768])
def test_casting_on_rows_read_twice_from_l2(
    device: str, casting: str, dtype: torch.dtype, hidden: int
) -> None:
    # On an H200 16-bit rows of these widths (and 4096, above) take a kernel of their own that
    # reads x twice: each shape it compiles, in each mode.
    offset, formula, model_weight = MODEL_FORMULAS[casting]
    x = exact_square_sums(5, hidden, dtype, device, seed=hidden)
    weight = model_weight(weight_like(hidden, dtype, device, 0.3, seed=hidden + 1)).to(dtype)
    got = hotloop.rms_norm(x, weight, EPS, casting=casting, offset=offset)
    assert_same_bits(got, formula(x, weight, EPS))


@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_llama_casting_on_random_rows(device: str, backend: str, dtype: torch.dtype) -> None:
    # Rows of normal values: float32 sums depend on their order, so a row's rstd may differ
    # from the formula's in its last bit, which moves an element across a rounding boundary
    # about once in 2^15 (bfloat16) or 2^12 (float16). The default mode differs from Llama's
    # formula in about a quarter of the elements (issue 31).
    gen = torch.Generator(device="cpu").manual_seed(31)
    x = torch.randn(64, 4096, generator=gen).to(device=device, dtype=dtype)
    weight = 1 + weight_like(4096, dtype, device, 0.1, seed=32)
    expected = llama_rms_norm(x, weight, EPS)
    llama = hotloop.rms_norm(x, weight, EPS, backend=backend, casting="llama")
    default = hotloop.rms_norm(x, weight, EPS, backend=backend)
    assert (llama != expected).float().mean().item() < 2e-3
    assert (default != expected).float().mean().item() > 0.05


@pytest.mark.parametrize("casting", list(MODEL_FORMULAS))
def test_mixed_dtype_weight_gives_the_models_bits(device: str, casting: str) -> None:
    # float32 weights with bfloat16 activations: Llama's forward returns weight * x_hat
    # rounded to bfloat16, in float32; Gemma's applies 1 + weight.float() and rounds once.
    offset, formula, model_weight = MODEL_FORMULAS[casting]
    x = exact_square_sums(9, 1000, torch.bfloat16, device, seed=3)
    weight = model_weight(weight_like(1000, torch.float32, device, 0.3, seed=4))
    got = hotloop.rms_norm(x, weight, EPS, casting=casting, offset=offset)
    assert torch.equal(got, formula(x, weight, EPS))
    assert got.dtype == (torch.float32 if casting == "llama" else torch.bfloat16)


def casting_reference(
    casting: str, x: torch.Tensor, weight: torch.Tensor, eps: float, offset: float
) -> torch.Tensor:
    """The mode's formula in float64, differentiable; the only rounding kept is Llama's of
    the normalised value (its gradient passes through unchanged, as autograd's cast does)."""
    x64, w64 = x.double(), weight.double()
    xhat = x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + eps)
    if casting == "llama":
        return w64 * (xhat + (xhat.to(x.dtype).double() - xhat).detach())
    return xhat * (offset + w64)


@pytest.mark.parametrize("casting", list(OP_CASTING))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
# (2115, 12288), (531, 16384), (531, 32768) and (331, 65536): on an H200 the backward with its
# grad_weight accumulator in shared memory, the widest rows split over clusters of blocks (of
# other shapes in Llama's and Gemma's casting than in torch's)
@pytest.mark.parametrize(
    "shape",
    [(7, 1000), (300, 4096), (3, 20001), (2115, 12288), (531, 16384), (531, 32768), (331, 65536)],
)
def test_backward_matches_the_modes_reference(
    device: str, backend: str, casting: str, dtype: torch.dtype, shape: tuple[int, int]
) -> None:
    if device == "cpu" and shape[0] > 300:
        pytest.skip("a GPU kernel's shape; the CPU kernels take rows in chunks")
    offset = 1.0 if casting == "gemma" else 0.0
    gen = torch.Generator(device="cpu").manual_seed(shape[1])
    x = torch.randn(shape, generator=gen).to(device=device, dtype=dtype).requires_grad_()
    w = (1 - offset + 0.1 * torch.randn(shape[1], generator=gen)).to(device=device, dtype=dtype)
    w.requires_grad_()
    dy = torch.randn(shape, generator=gen).to(device=device, dtype=dtype)
    y = hotloop.rms_norm(x, w, EPS, backend=backend, casting=casting, offset=offset)
    grad_x, grad_w = torch.autograd.grad(y, (x, w), dy)
    ref_x, ref_w = torch.autograd.grad(
        casting_reference(casting, x, w, EPS, offset), (x, w), dy.double()
    )
    assert_norm_grads_close((grad_x, grad_w), (ref_x, ref_w), dtype)


@pytest.mark.parametrize("casting", list(OP_CASTING))
def test_gradcheck_with_forward_ad(device: str, casting: str) -> None:
    # float64: Llama's rounding is the identity there, Gemma's offset is checked throughout,
    # the backward op's forward-mode AD included (hessian = jacfwd(jacrev)).
    offset = 1.0 if casting == "gemma" else 0.0
    x = torch.randn(3, 9, dtype=torch.float64, device=device, requires_grad=True)
    w = torch.randn(9, dtype=torch.float64, device=device, requires_grad=True)
    g = torch.randn(3, 9, dtype=torch.float64, device=device, requires_grad=True)

    def norm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return hotloop.rms_norm(a, b, EPS, casting=casting, offset=offset)

    def norm_backward(*args: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        grads: tuple[torch.Tensor, torch.Tensor] = torch.ops.hotloop.rms_norm_backward(
            *args, EPS, OP_CASTING[casting], offset
        )
        return grads

    assert torch.autograd.gradcheck(norm, (x, w), check_forward_ad=True)
    assert torch.autograd.gradcheck(
        norm_backward, (g, x, w), check_forward_ad=True, check_backward_ad=False
    )


@pytest.mark.parametrize("casting", list(MODEL_FORMULAS))
def test_weight_tangent_gives_the_models_bits(device: str, casting: str) -> None:
    # d y / d weight is the value the weight multiplies: x_hat rounded to bfloat16 in Llama's
    # forward, x_hat in float32 in Gemma's. Both products are exact in float32, so the JVP
    # of the formula through torch's ops and the Function's jvp round alike.
    offset, formula, model_weight = MODEL_FORMULAS[casting]
    x = exact_square_sums(5, 1000, torch.bfloat16, device, seed=5)
    weight = model_weight(weight_like(1000, torch.bfloat16, device, 0.3, seed=6))
    tangent = weight_like(1000, torch.bfloat16, device, 1.0, seed=7)
    _, got = torch.func.jvp(
        lambda w: hotloop.rms_norm(x, w, EPS, casting=casting, offset=offset), (weight,), (tangent,)
    )
    _, expected = torch.func.jvp(lambda w: formula(x, w, EPS), (weight,), (tangent,))
    # (equal, not the same bits: where x is 0 the formula's tangent adds a +0 term)
    assert torch.equal(got, expected)


@contextmanager
def deterministic_algorithms() -> Iterator[None]:
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(was)


@pytest.mark.parametrize("casting", list(OP_CASTING))
# (2115, 12288): on an H200 the backward with its grad_weight accumulator in shared memory,
# two blocks an SM
@pytest.mark.parametrize("shape", [(4096, 1000), (2048, 4096), (33, 20001), (2115, 12288)])
def test_backward_is_deterministic(
    device: str, backend: str, casting: str, shape: tuple[int, int]
) -> None:
    # Enough rows that grad_weight is summed from many partial rows (CPU chunks, CUDA
    # blocks, Triton programs): those partials are added in a fixed order.
    offset = 1.0 if casting == "gemma" else 0.0
    x = torch.randn(shape, device=device, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(shape[1], device=device, dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(shape, device=device, dtype=torch.bfloat16)
    with deterministic_algorithms():
        runs = []
        for _ in range(2):
            y = hotloop.rms_norm(x, w, EPS, backend=backend, casting=casting, offset=offset)
            runs.append(torch.autograd.grad(y, (x, w), dy))
    for first, second in zip(*runs):
        assert torch.equal(first.view(torch.int16), second.view(torch.int16))


def test_unknown_casting_is_refused(device: str) -> None:
    x = torch.randn(2, 8, device=device)
    with pytest.raises(ValueError, match=r"casting must be one of \('torch', 'llama', 'gemma'\)"):
        hotloop.rms_norm(x, torch.ones(8, device=device), casting="mistral")
    with pytest.raises(ValueError, match=r"hotloop.RMSNorm: casting must be one of"):
        hotloop.RMSNorm(8, casting="t5")


def test_offset_needs_gemma_casting(device: str) -> None:
    x, w = torch.randn(2, 8, device=device), torch.ones(8, device=device)
    with pytest.raises(ValueError, match=r"offset=1.0 is Gemma's .* pass casting='gemma'"):
        hotloop.rms_norm(x, w, offset=1.0)
    with pytest.raises(ValueError, match=r"offset=1.0 is Gemma's .* casting is 'llama'"):
        hotloop.RMSNorm(8, casting="llama", offset=1.0)
    # The ops refuse it too (torch.ops callers pass the mode's index), in the kernels and
    # in the fake kernels alike.
    for x_in, w_in in ((x, w), (x.to("meta"), w.to("meta"))):
        with torch.no_grad():
            with pytest.raises(RuntimeError, match=r"offset 1 is Gemma's .* needs casting 2"):
                torch.ops.hotloop.rms_norm(x_in, w_in, 1e-6, 0, 1.0)
            with pytest.raises(
                RuntimeError, match=r"casting must be 0 \(torch\), 1 \(llama\) or 2"
            ):
                torch.ops.hotloop.rms_norm_backward(x_in, x_in, w_in, 1e-6, 3, 0.0)


@pytest.mark.parametrize(("casting", "offset"), [(1, 0.0), (2, 1.0)])
def test_opcheck_with_casting(device: str, casting: int, offset: float) -> None:
    x = torch.randn(3, 5, 40, device=device, requires_grad=True)
    w = torch.randn(40, device=device, requires_grad=True)
    opcheck(torch.ops.hotloop.rms_norm.default, (x, w, 1e-6, casting, offset))
    opcheck(
        torch.ops.hotloop.rms_norm_backward.default,
        (torch.randn_like(x), x.detach(), w.detach(), 1e-6, casting, offset),
    )


@requires_compile
def test_compiled_call_keeps_the_casting(device: str) -> None:
    x = exact_square_sums(4, 96, torch.bfloat16, device, seed=8)
    w = weight_like(96, torch.bfloat16, device, 0.3, seed=9)
    compiled = torch.compile(
        lambda a, b: hotloop.rms_norm(a, b, EPS, casting="gemma", offset=1.0),
        fullgraph=True,
        backend="aot_eager",
    )
    assert_same_bits(compiled(x, w), gemma_rms_norm(x, w, EPS))


@pytest.mark.parametrize(("casting", "offset"), [("llama", 0.0), ("gemma", 1.0)])
def test_vmap_over_weights_keeps_the_casting(device: str, casting: str, offset: float) -> None:
    # One weight per sample: the batching rule's own arithmetic, which must round where
    # the mode rounds, forward and backward.
    x = torch.randn(3, 5, 64, device=device, dtype=torch.bfloat16)
    w = 1 - offset + 0.3 * torch.randn(3, 64, device=device, dtype=torch.bfloat16)
    dy = torch.randn(3, 5, 64, device=device, dtype=torch.bfloat16)

    def norm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return hotloop.rms_norm(a, b, EPS, casting=casting, offset=offset)

    assert_same_bits(torch.vmap(norm)(x, w), torch.stack([norm(x[i], w[i]) for i in range(3)]))

    def grads(a: torch.Tensor, b: torch.Tensor, g: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return torch.func.vjp(norm, a, b)[1](g)

    batched = torch.vmap(grads)(x, w, dy)
    for i in range(3):
        for got, expected in zip(batched, grads(x[i], w[i], dy[i])):
            torch.testing.assert_close(got[i], expected, atol=2e-2, rtol=2e-2)


class LlamaRMSNorm(torch.nn.Module):
    """transformers' LlamaRMSNorm as from_module sees it: its name (set in stand_in), weight
    and variance_epsilon, and its forward."""

    def __init__(self, hidden: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(hidden))
        self.variance_epsilon = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return llama_rms_norm(x, self.weight, self.variance_epsilon)


class GemmaRMSNorm(torch.nn.Module):
    """transformers' GemmaRMSNorm: weight stored as w in (1 + w), eps."""

    def __init__(self, hidden: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(hidden))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return gemma_rms_norm(x, self.weight, self.eps)


def stand_in(cls: type[torch.nn.Module], qualified_name: str) -> type[torch.nn.Module]:
    """cls under one of transformers' class names, which from_module matches."""
    module, name = qualified_name.rsplit(".", 1)
    return type(name, (cls,), {"__module__": module, "__qualname__": name})


# (the class, the casting and offset from_module must pick)
STAND_INS = [
    (stand_in(LlamaRMSNorm, "transformers.models.llama.modeling_llama.LlamaRMSNorm"), "llama"),
    (stand_in(LlamaRMSNorm, "transformers.models.qwen3.modeling_qwen3.Qwen3RMSNorm"), "llama"),
    (stand_in(GemmaRMSNorm, "transformers.models.gemma.modeling_gemma.GemmaRMSNorm"), "gemma"),
    (stand_in(GemmaRMSNorm, "transformers.models.gemma3.modeling_gemma3.Gemma3RMSNorm"), "gemma"),
]


def transformers_classes() -> list[tuple[type[torch.nn.Module], str]]:
    pytest.importorskip("transformers")
    from transformers.models.gemma.modeling_gemma import GemmaRMSNorm as Gemma
    from transformers.models.llama.modeling_llama import LlamaRMSNorm as Llama

    return [(Llama, "llama"), (Gemma, "gemma")]


def check_swapped_bits(
    model_classes: list[tuple[type[torch.nn.Module], str]],
    hidden: int,
    dtype: torch.dtype,
    device: str,
) -> None:
    for model_class, casting in model_classes:
        model_norm = model_class(hidden, eps=1e-5).to(device=device, dtype=dtype)
        offset, _, model_weight = MODEL_FORMULAS[casting]
        with torch.no_grad():  # trained-looking weights, not the initial ones
            model_norm.weight.copy_(model_weight(weight_like(hidden, dtype, device, 0.3, hidden)))
        swapped = hotloop.RMSNorm.from_module(model_norm)
        assert (swapped.casting, swapped.offset) == (casting, offset)
        assert swapped.weight is model_norm.weight
        assert swapped.eps == 1e-5
        for x in (
            exact_square_sums(37, hidden, dtype, device, seed=7),
            torch.randn(2, 3, hidden, device=device, dtype=dtype),
        ):
            with torch.no_grad():
                got, expected = swapped(x), model_norm(x)
            if x.dim() == 2:
                assert_same_bits(got, expected)
            else:  # sums of squares in another order: a last-bit difference at most
                torch.testing.assert_close(got, expected, atol=0, rtol=2**-7)


@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("hidden", [96, 1000, 4096])
def test_from_module_picks_the_models_casting(device: str, dtype: torch.dtype, hidden: int) -> None:
    check_swapped_bits(STAND_INS, hidden, dtype, device)
    assert hotloop.RMSNorm.from_module(torch.nn.RMSNorm(hidden)).casting == "torch"
    own = hotloop.RMSNorm(hidden, casting="gemma", offset=1.0)
    converted = hotloop.RMSNorm.from_module(own)
    assert (converted.casting, converted.offset) == ("gemma", 1.0)


@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("hidden", [96, 1000, 4096])
def test_transformers_classes_give_the_same_bits(
    device: str, dtype: torch.dtype, hidden: int
) -> None:
    check_swapped_bits(transformers_classes(), hidden, dtype, device)


def test_module_shows_its_casting() -> None:
    assert "casting='gemma', offset=1.0" in repr(hotloop.RMSNorm(8, casting="gemma", offset=1.0))
    assert "casting" not in repr(hotloop.RMSNorm(8))


# Rows of each CUDA kernel of the fused and FP8 ops (bfloat16): vectors in registers (64,
# 4096), scalars in registers (an odd row), staged in shared memory (fused_add_rms_norm's
# 32768), the generic kernel (an odd row past the scalar kernels' 16384).
FUSED_WIDTHS = [64, 1001, 4096, 20001, 32768]


def halves(v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x and residual whose sum, rounded to the dtype, is v exactly."""
    return v * 0.5, v * 0.5


@pytest.mark.parametrize("casting", list(MODEL_FORMULAS))
@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("hidden", FUSED_WIDTHS)
def test_fused_add_rms_norm_gives_the_models_bits(
    device: str, casting: str, dtype: torch.dtype, hidden: int
) -> None:
    # residual += x, then x = the model's norm of the new residual, bit for bit.
    offset, formula, model_weight = MODEL_FORMULAS[casting]
    v = exact_square_sums(9, hidden, dtype, device, seed=hidden)
    x, residual = halves(v)
    weight = model_weight(weight_like(hidden, dtype, device, 0.3, seed=hidden + 1)).to(dtype)
    with torch.no_grad():
        hotloop.fused_add_rms_norm(x, residual, weight, EPS, casting=casting, offset=offset)
    assert_same_bits(residual, v)
    assert_same_bits(x, formula(v, weight, EPS))


def mode_y(v: torch.Tensor, weight: torch.Tensor, casting: str, offset: float) -> torch.Tensor:
    """The mode's y in float32 before its rounding to v's dtype, the FP8 ops' definition
    (csrc/rms_norm_fp8/rms_norm_fp8_common.h), with the rstd the models' formulas form."""
    vf = v.float()
    x_hat = vf * torch.rsqrt(vf.pow(2).mean(-1, keepdim=True) + EPS)
    if casting == "llama":
        return x_hat.to(v.dtype).float() * weight.float()
    return x_hat * (offset + weight.float())


def e4m3(q: torch.Tensor) -> torch.Tensor:
    """Rounded to nearest even and saturated to +-448, as the kernels quantise."""
    return q.clamp(-448.0, 448.0).to(torch.float8_e4m3fn)


FP8_OPS = [
    "rms_norm_fp8",
    "rms_norm_fp8_dynamic",
    "fused_add_rms_norm_fp8",
    "fused_add_rms_norm_fp8_dynamic",
]


def run_fp8(
    op: str, v: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, **mode: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, the scales that dequantise it) of the FP8 op on v (the fused ops: on halves of
    v, whose sum, stored into the residual, must be v)."""
    with torch.no_grad():
        if not op.startswith("fused_add"):
            if op.endswith("dynamic"):
                out, scales = hotloop.rms_norm_fp8_dynamic(v, weight, EPS, **mode)
                return out, scales
            return hotloop.rms_norm_fp8(v, weight, scale, EPS, **mode), scale
        x, residual = halves(v)
        if op.endswith("dynamic"):
            out, scales = hotloop.fused_add_rms_norm_fp8_dynamic(x, residual, weight, EPS, **mode)
        else:
            out, scales = (
                hotloop.fused_add_rms_norm_fp8(x, residual, weight, scale, EPS, **mode),
                scale,
            )
    assert_same_bits(residual, v)
    return out, scales


@pytest.mark.parametrize("op", FP8_OPS)
@pytest.mark.parametrize("casting", list(MODEL_FORMULAS))
@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("hidden", FUSED_WIDTHS[:4])
def test_fp8_ops_quantise_the_modes_y(
    device: str, op: str, casting: str, dtype: torch.dtype, hidden: int
) -> None:
    if device == "cuda" and torch.cuda.get_device_capability() < hotloop.ops.FP8_MIN_CAPABILITY:
        pytest.skip("the CUDA FP8 ops need compute capability 8.9 or newer")
    offset, _, model_weight = MODEL_FORMULAS[casting]
    v = exact_square_sums(9, hidden, dtype, device, seed=hidden)
    weight = model_weight(weight_like(hidden, dtype, device, 0.3, seed=hidden + 1)).to(dtype)
    scale = torch.full((1,), 2.0**-6, device=device)  # some values saturate
    out, scales = run_fp8(op, v, weight, scale, casting=casting, offset=offset)
    if op.endswith("dynamic"):
        # rstd * max|v * (the weight as it multiplies)|: Llama's rounding stays out of it.
        vf = v.float()
        rstd = torch.rsqrt(vf.pow(2).mean(-1, keepdim=True) + EPS)
        applied = weight.float() + offset if casting == "gemma" else weight.float()
        amax = rstd * (vf * applied).abs().amax(-1, keepdim=True)
        # (Divided by a tensor: torch's CUDA division by a Python number multiplies by its
        # reciprocal, which rounds differently.)
        expected = (amax / torch.full_like(amax, 448.0)).clamp(min=1.0 / (448.0 * 512.0))
        assert torch.equal(scales, expected)
    y = mode_y(v, weight, casting, offset)
    inv_scales = torch.ones_like(scales) / scales
    assert torch.equal(out.view(torch.uint8), e4m3(y * inv_scales).view(torch.uint8))
    if hidden >= 1001:
        # The default quantises another y from the same inputs (on short rows e4m3's coarse
        # steps can hide Llama's rounding): the bits above are the mode's.
        default, _ = run_fp8(op, v, weight, scale)
        assert not torch.equal(default.view(torch.uint8), out.view(torch.uint8))


FUSED_CALLS = {
    "fused_add_rms_norm": lambda x, w, scale, **mode: hotloop.fused_add_rms_norm(
        x, x.clone(), w, EPS, **mode
    ),
    "rms_norm_fp8": lambda x, w, scale, **mode: hotloop.rms_norm_fp8(x, w, scale, EPS, **mode),
    "rms_norm_fp8_dynamic": lambda x, w, scale, **mode: hotloop.rms_norm_fp8_dynamic(
        x, w, EPS, **mode
    ),
    "fused_add_rms_norm_fp8": lambda x, w, scale, **mode: hotloop.fused_add_rms_norm_fp8(
        x, x.clone(), w, scale, EPS, **mode
    ),
    "fused_add_rms_norm_fp8_dynamic": lambda x, w, scale, **mode: (
        hotloop.fused_add_rms_norm_fp8_dynamic(x, x.clone(), w, EPS, **mode)
    ),
}


@pytest.mark.parametrize("op", list(FUSED_CALLS))
def test_fused_ops_refuse_bad_modes_before_writing(op: str) -> None:
    x, w, scale = torch.randn(2, 8), torch.ones(8), torch.ones(1)
    kept = x.clone()
    with torch.no_grad():
        with pytest.raises(ValueError, match=rf"{op}: casting must be one of"):
            FUSED_CALLS[op](x, w, scale, casting="t5")
        with pytest.raises(ValueError, match=rf"{op}: offset=1.0 is Gemma's"):
            FUSED_CALLS[op](x, w, scale, casting="llama", offset=1.0)
        assert torch.equal(x, kept)
        # The ops' own check (torch.ops callers pass the mode's index), kernels and fake
        # kernels alike.
        for t in (x, x.to("meta")):
            with pytest.raises(RuntimeError, match=rf"{op}: offset 1 is Gemma's"):
                call_op(op, t, w.to(t.device), scale.to(t.device), 1, 1.0)
            with pytest.raises(RuntimeError, match=rf"{op}: casting must be 0 \(torch\)"):
                call_op(op, t, w.to(t.device), scale.to(t.device), 3, 0.0)
        assert torch.equal(x, kept)


def call_op(op: str, x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor, *mode: Any) -> Any:
    """torch.ops.hotloop.<op> on x (and a residual made up), with casting and offset."""
    fn = getattr(torch.ops.hotloop, op).default
    residual = x.clone() + 1
    if op == "fused_add_rms_norm":
        return fn(x, residual, w, EPS, *mode)
    head = (x, residual) if op.startswith("fused_add") else (x,)
    tail = (w, EPS, None) if op.endswith("dynamic") else (w, scale, EPS)
    return fn(*head, *tail, *mode)


@pytest.mark.parametrize("op", list(FUSED_CALLS))
@pytest.mark.parametrize(("casting", "offset"), [(1, 0.0), (2, 1.0)])
def test_opcheck_fused_ops_with_casting(device: str, op: str, casting: int, offset: float) -> None:
    if (
        device == "cuda"
        and "fp8" in op
        and (torch.cuda.get_device_capability() < hotloop.ops.FP8_MIN_CAPABILITY)
    ):
        pytest.skip("the CUDA FP8 ops need compute capability 8.9 or newer")
    x, w = torch.randn(3, 5, 40, device=device), torch.randn(40, device=device)
    scale = torch.full((1,), 0.05, device=device)
    fn = getattr(torch.ops.hotloop, op).default
    residual = torch.randn_like(x)
    if op == "fused_add_rms_norm":
        args: tuple[Any, ...] = (x, residual, w, EPS, casting, offset)
    else:
        head = (x, residual) if op.startswith("fused_add") else (x,)
        tail = (w, EPS, None) if op.endswith("dynamic") else (w, scale, EPS)
        args = (*head, *tail, casting, offset)
    opcheck(fn, args)
