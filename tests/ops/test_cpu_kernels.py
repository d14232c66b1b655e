"""The vectorized CPU kernels: row tails, unaligned and strided data, every dtype, every ISA.

The kernels load 16 float (8 double) lanes at a time, sum in blocks of 64 vectors and
finish a row through a zero-padded buffer; these cases sit on each of those edges and
compare with float64. ``HOTLOOP_CPU_ISA`` caps the instruction set in a fresh process, so
that the baseline (SSE2), AVX2 and AVX-512 variants all run here and must agree bit for bit.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from op_testing import TOLERANCES

import hotloop

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
# Under one vector; one and two vectors and one past (16 float lanes, 8 double); a block of
# 64 vectors (1024 floats) and past it; the odd widths of the GPU tests.
HIDDEN_SIZES = [1, 7, 8, 9, 16, 17, 31, 33, 1024, 1041, 4095, 8193]
ROWS = 3
EPS = 1e-6
ISA_OUTPUTS = Path(__file__).resolve().parent / "cpu_isa_outputs.py"


@pytest.fixture(autouse=True)
def _seeded() -> None:
    # The same data in every run: a failure can be rerun.
    torch.manual_seed(0)


def make(*shape: int, dtype: torch.dtype, offset: int = 0) -> torch.Tensor:
    """A contiguous tensor whose data starts `offset` elements into its storage."""
    n = 1
    for size in shape:
        n *= size
    flat = torch.randn(n + offset, dtype=torch.float64).to(dtype)
    return flat[offset:].view(shape)


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x64 = x.double()
    return x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + eps) * weight.double()


def layouts(hidden: int, dtype: torch.dtype) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """(x, weight) laid out every way the kernels must take: aligned, shifted by one
    element (no vector load is aligned), and non-contiguous x."""
    return {
        "aligned": (make(ROWS, hidden, dtype=dtype), make(hidden, dtype=dtype) * 0.5 + 1),
        "offset-1": (
            make(ROWS, hidden, dtype=dtype, offset=1),
            make(hidden, dtype=dtype, offset=1) * 0.5 + 1,
        ),
        "strided": (make(ROWS, 2 * hidden, dtype=dtype)[:, ::2], make(hidden, dtype=dtype) + 1),
    }


@pytest.mark.parametrize("hidden", HIDDEN_SIZES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_forward(dtype: torch.dtype, hidden: int) -> None:
    for layout, (x, weight) in layouts(hidden, dtype).items():
        expected = rms_norm_reference(x, weight, EPS).to(dtype)
        torch.testing.assert_close(
            hotloop.rms_norm(x, weight, EPS), expected, **TOLERANCES[dtype], msg=layout
        )
        unweighted = rms_norm_reference(x, torch.ones_like(weight), EPS).to(dtype)
        torch.testing.assert_close(
            hotloop.rms_norm(x, None, EPS), unweighted, **TOLERANCES[dtype], msg=layout
        )


@pytest.mark.parametrize("hidden", HIDDEN_SIZES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_backward(dtype: torch.dtype, hidden: int) -> None:
    tol = TOLERANCES[dtype]
    if dtype in (torch.float16, torch.bfloat16):
        # the weight gradient sums a rounded term of every row
        tol = {"atol": 8 * tol["atol"], "rtol": 4 * tol["rtol"]}
    for layout, (x, weight) in layouts(hidden, dtype).items():
        grad_out = make(ROWS, hidden, dtype=dtype, offset=1)
        grad_x, grad_weight = torch.ops.hotloop.rms_norm_backward.default(grad_out, x, weight, EPS)
        x64 = x.double().requires_grad_()
        w64 = weight.double().requires_grad_()
        rms_norm_reference(x64, w64, EPS).backward(grad_out.double())
        # grad_x = rstd * g * w - x * rstd^3 * sum(g * w * x) / H. Where the two terms cancel
        # (H = 1, where grad_x is g * w * rstd * eps / (x^2 + eps)), the float32 and float16
        # kernels keep the rounding error of the terms, not of their difference: the
        # absolute tolerance scales with the terms (|rstd * g * w| reaches 700 at |x| = 1e-3).
        rstd = torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True) + EPS)
        terms = (rstd * grad_out.double() * weight.double()).abs().max().item()
        torch.testing.assert_close(
            grad_x,
            x64.grad.to(dtype),
            atol=tol["atol"] * max(1.0, terms),
            rtol=tol["rtol"],
            msg=lambda m, layout=layout: f"{layout}: {m}",
        )
        torch.testing.assert_close(grad_weight, w64.grad.to(dtype), **tol, msg=layout)


@pytest.mark.parametrize("hidden", HIDDEN_SIZES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_add_rms_norm(dtype: torch.dtype, hidden: int) -> None:
    # In place, so x and residual must be contiguous: offsets are the layouts to try.
    for offset in (0, 1):
        x = make(ROWS, hidden, dtype=dtype, offset=offset)
        residual = make(ROWS, hidden, dtype=dtype, offset=offset)
        weight = make(hidden, dtype=dtype, offset=offset) * 0.5 + 1
        summed = (x.double() + residual.double()).to(dtype)
        expected_x = rms_norm_reference(summed, weight, EPS).to(dtype)
        hotloop.fused_add_rms_norm(x, residual, weight, EPS)
        torch.testing.assert_close(residual, summed, **TOLERANCES[dtype], msg=f"offset {offset}")
        torch.testing.assert_close(x, expected_x, **TOLERANCES[dtype], msg=f"offset {offset}")


@pytest.mark.parametrize("numel", [1, 15, 16, 17, 32769, 65536 + 5])
@pytest.mark.parametrize("dtype", DTYPES)
def test_muladd_and_mul(dtype: torch.dtype, numel: int) -> None:
    # 32769 and 65541 elements: more than one parallel task (32768 elements), each with a tail.
    a = make(numel, dtype=dtype, offset=1)
    b = make(2 * numel, dtype=dtype)[::2]
    product = a.double() * b.double()
    torch.testing.assert_close(hotloop.muladd(a, b, 0.5), (product + 0.5).to(dtype))
    torch.testing.assert_close(hotloop.mul(a, b), product.to(dtype))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_16_bit_rounding_matches_torch(dtype: torch.dtype) -> None:
    # Products of random values over a wide range of magnitudes: ties (the float32 product
    # of two 16-bit values is exact), overflow to infinity, subnormals, NaN from inf * 0.
    # The kernels' float-to-16-bit conversion must round exactly as torch's.
    gen = torch.Generator().manual_seed(0)
    n = 1 << 16
    scale = torch.exp2(torch.randint(-80, 80, (2, n), generator=gen).float())
    a, b = (torch.randn(2, n, generator=gen) * scale).to(dtype)
    a[:4] = torch.tensor([float("inf"), 0.0, float("nan"), -0.0])
    b[:4] = torch.tensor([0.0, float("inf"), 1.0, 1.0])
    expected = (a.float() * b.float()).to(dtype)
    torch.testing.assert_close(hotloop.mul(a, b), expected, rtol=0, atol=0, equal_nan=True)


def run_isa_outputs(out: Path, isa: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, HOTLOOP_CPU_ISA=isa)
    # The subprocess imports the hotloop under test, wherever it was imported from here.
    package_parent = str(Path(hotloop.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join([package_parent, env.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, str(ISA_OUTPUTS), str(out)], env=env, capture_output=True, text=True
    )


def test_every_instruction_set_gives_the_same_bits(tmp_path: Path) -> None:
    # The tests above run the widest variant this CPU has; capped, the narrower ones must
    # give exactly its results (same lanes, same order of sums, no fused multiply-add).
    outputs = {}
    for isa in ("baseline", "avx2", "avx512"):
        done = run_isa_outputs(tmp_path / f"{isa}.pt", isa)
        assert done.returncode == 0, done.stderr
        outputs[isa] = torch.load(tmp_path / f"{isa}.pt")
    assert outputs["baseline"]
    for isa in ("avx2", "avx512"):
        assert outputs[isa].keys() == outputs["baseline"].keys()
        for name, tensor in outputs["baseline"].items():
            assert torch.equal(outputs[isa][name], tensor), f"{isa} differs from baseline: {name}"


def test_unknown_instruction_set_is_refused(tmp_path: Path) -> None:
    done = run_isa_outputs(tmp_path / "out.pt", "avx1024")
    assert done.returncode != 0
    assert "HOTLOOP_CPU_ISA must be baseline, avx2 or avx512, got 'avx1024'" in done.stderr
