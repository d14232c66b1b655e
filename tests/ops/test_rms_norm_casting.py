"""The casting modes of the rms_norm ops (``int casting``, ``float offset``;
csrc/common/norm_casting.h): 1 gives the bits of transformers' LlamaRMSNorm, 2 with offset 1
those of GemmaRMSNorm, 0 (the default) stays torch.nn.RMSNorm's; the backward op follows
the mode and gives the same bits twice under torch.use_deterministic_algorithms.

The references are the models' formulas written out (op_testing). The Python API
(``hotloop.rms_norm(casting=...)``, ``RMSNorm.from_module``) does not pass the mode yet.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch
from op_testing import TOLERANCES, exact_square_sums, gemma_rms_norm, llama_rms_norm

CASTING = {"torch": 0, "llama": 1, "gemma": 2}
HALF_DTYPES = [torch.bfloat16, torch.float16]
# A short row, an odd one (the CUDA span and scalar kernels), the headline width, an odd
# row past it.
WIDTHS = [64, 1000, 4096, 8193]
EPS = 1e-6


def norm(x: torch.Tensor, w: torch.Tensor, casting: str, offset: float = 0.0) -> torch.Tensor:
    with torch.no_grad():
        y: torch.Tensor = torch.ops.hotloop.rms_norm.default(x, w, EPS, CASTING[casting], offset)
    return y


def weight_like(hidden: int, dtype: torch.dtype, device: str, seed: int) -> torch.Tensor:
    gen = torch.Generator(device="cpu").manual_seed(seed)
    return torch.randn(hidden, generator=gen).to(device=device, dtype=dtype)


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
    "llama": (0.0, llama_rms_norm, lambda w: 1 + 0.1 * w),
    "gemma": (1.0, gemma_rms_norm, lambda w: 0.3 * w),
}


@pytest.mark.parametrize("casting", list(MODEL_FORMULAS))
@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("hidden", WIDTHS)
def test_casting_gives_the_models_bits(
    device: str, casting: str, dtype: torch.dtype, hidden: int
) -> None:
    offset, formula, model_weight = MODEL_FORMULAS[casting]
    x = exact_square_sums(37, hidden, dtype, device, seed=hidden)
    weight = model_weight(weight_like(hidden, dtype, device, seed=hidden + 1)).to(dtype)
    expected = formula(x, weight, EPS)
    assert_same_bits(norm(x, weight, casting, offset), expected)
    if casting == "llama":
        # The default rounds once, after the weight: on these inputs it differs, so the
        # bits above come from the mode.
        assert (norm(x, weight, "torch") != expected).any()


@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_llama_casting_on_random_rows(device: str, dtype: torch.dtype) -> None:
    # Rows of normal values: float32 sums depend on their order, so a row's rstd may differ
    # from the formula's in its last bit, which moves an element across a rounding boundary
    # about once in 2^15 (bfloat16) or 2^12 (float16). The default differs from Llama's
    # formula in about a quarter of the elements (issue 31).
    gen = torch.Generator(device="cpu").manual_seed(31)
    x = torch.randn(64, 4096, generator=gen).to(device=device, dtype=dtype)
    weight = (1 + 0.1 * weight_like(4096, dtype, device, seed=32)).to(dtype)
    expected = llama_rms_norm(x, weight, EPS)
    assert (norm(x, weight, "llama") != expected).float().mean().item() < 2e-3
    assert (norm(x, weight, "torch") != expected).float().mean().item() > 0.05


def casting_reference(
    casting: str, x: torch.Tensor, weight: torch.Tensor, offset: float
) -> torch.Tensor:
    """The mode's formula in float64, differentiable; the only rounding kept is Llama's of
    the normalised value (its gradient passes through unchanged, as autograd's cast does)."""
    x64, w64 = x.double(), weight.double()
    xhat = x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + EPS)
    if casting == "llama":
        return w64 * (xhat + (xhat.to(x.dtype).double() - xhat).detach())
    return xhat * (offset + w64)


@pytest.mark.parametrize("casting", list(CASTING))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("shape", [(7, 1000), (300, 4096), (3, 20001)])
def test_backward_matches_the_modes_reference(
    device: str, casting: str, dtype: torch.dtype, shape: tuple[int, int]
) -> None:
    offset = 1.0 if casting == "gemma" else 0.0
    gen = torch.Generator(device="cpu").manual_seed(shape[1])
    x = torch.randn(shape, generator=gen).to(device=device, dtype=dtype)
    w = (1 - offset + 0.1 * torch.randn(shape[1], generator=gen)).to(device=device, dtype=dtype)
    dy = torch.randn(shape, generator=gen).to(device=device, dtype=dtype)
    grad_x, grad_w = torch.ops.hotloop.rms_norm_backward.default(
        dy, x, w, EPS, CASTING[casting], offset
    )
    x64, w64 = x.double().requires_grad_(), w.double().requires_grad_()
    y64 = casting_reference(casting, x64.to(dtype), w64.to(dtype), offset)
    ref_x, ref_w = torch.autograd.grad(y64, (x64, w64), dy.double())
    tol = TOLERANCES[dtype]
    torch.testing.assert_close(grad_x, ref_x.to(dtype), atol=8 * tol["atol"], rtol=4 * tol["rtol"])
    # grad_weight sums a product over every row: its error grows with their count.
    scale = ref_w.abs().max().item()
    torch.testing.assert_close(
        grad_w, ref_w.to(dtype), atol=4 * tol["rtol"] * scale, rtol=4 * tol["rtol"]
    )


@contextmanager
def deterministic_algorithms() -> Iterator[None]:
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(was)


@pytest.mark.parametrize("casting", list(CASTING))
@pytest.mark.parametrize("shape", [(4096, 1000), (2048, 4096), (33, 20001)])
def test_backward_is_deterministic(device: str, casting: str, shape: tuple[int, int]) -> None:
    # Enough rows that grad_weight is summed from many partial rows (CPU chunks, CUDA
    # blocks): those partials are added in a fixed order.
    offset = 1.0 if casting == "gemma" else 0.0
    x = torch.randn(shape, device=device, dtype=torch.bfloat16)
    w = torch.randn(shape[1], device=device, dtype=torch.bfloat16)
    dy = torch.randn(shape, device=device, dtype=torch.bfloat16)
    with deterministic_algorithms():
        runs = [
            torch.ops.hotloop.rms_norm_backward.default(dy, x, w, EPS, CASTING[casting], offset)
            for _ in range(2)
        ]
    for first, second in zip(*runs):
        assert torch.equal(first.view(torch.int16), second.view(torch.int16))


def test_the_ops_refuse_a_bad_mode(device: str) -> None:
    x, w = torch.randn(2, 8, device=device), torch.ones(8, device=device)
    with torch.no_grad():
        with pytest.raises(RuntimeError, match=r"offset 1 is Gemma's .* needs casting 2"):
            torch.ops.hotloop.rms_norm.default(x, w, 1e-6, 0, 1.0)
        with pytest.raises(RuntimeError, match=r"casting must be 0 \(torch\), 1 \(llama\) or 2"):
            torch.ops.hotloop.rms_norm_backward.default(x, x, w, 1e-6, 3, 0.0)
