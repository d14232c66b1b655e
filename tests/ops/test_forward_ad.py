"""Forward-mode AD: torch.func.jvp/jacfwd/hessian and torch.autograd.forward_ad dual tensors.

The differentiable ops give real tangents (their JVPs in closed form), checked against
torch's own ops and against finite differences (gradcheck with check_forward_ad); the
inference-only ops refuse a tangent, naming the op and the argument, instead of dropping it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.autograd.forward_ad as fwAD
import torch.nn.functional as F
from op_testing import TOLERANCES

import hotloop

EPS = 1e-5


def make(device: str, *shape: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    return torch.randn(*shape, device=device, dtype=dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("with_weight", [True, False], ids=["weight", "no_weight"])
def test_rms_norm_jvp_matches_torch(device: str, dtype: torch.dtype, with_weight: bool) -> None:
    x, t = make(device, 3, 5, 40, dtype=dtype), make(device, 3, 5, 40, dtype=dtype)
    w = make(device, 40, dtype=dtype) if with_weight else None
    w_t = make(device, 40, dtype=dtype) if with_weight else None
    primals = (x,) if w is None else (x, w)
    tangents = (t,) if w_t is None else (t, w_t)

    def ours(x: torch.Tensor, *w: torch.Tensor) -> torch.Tensor:
        return hotloop.rms_norm(x, w[0] if w else None, EPS)

    def reference(x: torch.Tensor, *w: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x.double(), (40,), w[0].double() if w else None, EPS)

    y_t = torch.func.jvp(ours, primals, tangents)[1]
    ref_t = torch.func.jvp(
        reference, tuple(p.double() for p in primals), tuple(v.double() for v in tangents)
    )[1]
    assert y_t.dtype == dtype
    assert y_t.abs().max() > 0
    torch.testing.assert_close(y_t.double(), ref_t, **TOLERANCES[dtype])


def test_dual_tensors_carry_tangents(device: str) -> None:
    a, b, ta, tb = (make(device, 4, 8) for _ in range(4))
    w, tw = make(device, 8), make(device, 8)
    with fwAD.dual_level():
        da, db, dw = fwAD.make_dual(a, ta), fwAD.make_dual(b, tb), fwAD.make_dual(w, tw)
        mul_t = fwAD.unpack_dual(hotloop.mul(da, db)).tangent
        muladd_t = fwAD.unpack_dual(hotloop.muladd(da, db, 2.0)).tangent
        norm_t = fwAD.unpack_dual(hotloop.rms_norm(da, dw, EPS)).tangent
        ref_t = fwAD.unpack_dual(F.rms_norm(da, (8,), dw, EPS)).tangent
    torch.testing.assert_close(mul_t, ta * b + a * tb)
    torch.testing.assert_close(muladd_t, ta * b + a * tb)
    torch.testing.assert_close(norm_t, ref_t)


def test_dual_tensors_under_no_grad(device: str) -> None:
    """Forward AD does not depend on grad mode; the no_grad fast path must not skip it."""
    x, t = make(device, 4, 8), make(device, 4, 8)
    with fwAD.dual_level(), torch.no_grad():
        ours = fwAD.unpack_dual(hotloop.rms_norm(fwAD.make_dual(x, t), None, EPS)).tangent
        ref = fwAD.unpack_dual(F.rms_norm(fwAD.make_dual(x, t), (8,), None, EPS)).tangent
    torch.testing.assert_close(ours, ref)


GRADCHECK_CASES: dict[str, tuple[Callable[..., Any], Callable[[str], tuple[torch.Tensor, ...]]]] = {
    "rms_norm": (lambda x, w: hotloop.rms_norm(x, w, EPS), lambda d: (make(d, 3, 8), make(d, 8))),
    "rms_norm_no_weight": (lambda x: hotloop.rms_norm(x, None, EPS), lambda d: (make(d, 2, 3, 8),)),
    "mul": (hotloop.mul, lambda d: (make(d, 3, 8), make(d, 3, 8))),
    "muladd": (lambda a, b: hotloop.muladd(a, b, 0.5), lambda d: (make(d, 3, 8), make(d, 3, 8))),
}


@pytest.mark.parametrize("case", list(GRADCHECK_CASES))
def test_gradcheck_forward_ad(device: str, case: str) -> None:
    fn, inputs = GRADCHECK_CASES[case]
    args = tuple(t.requires_grad_() for t in inputs(device))
    assert torch.autograd.gradcheck(fn, args, check_forward_ad=True)


@pytest.mark.parametrize("with_weight", [True, False], ids=["weight", "no_weight"])
def test_gradcheck_forward_ad_of_the_backward_op(device: str, with_weight: bool) -> None:
    """hessian = jacfwd(jacrev): the JVP of rms_norm_backward."""
    grad_out, x = make(device, 3, 8).requires_grad_(), make(device, 3, 8).requires_grad_()
    weight = (make(device, 8).requires_grad_(),) if with_weight else ()

    def backward(grad_out: torch.Tensor, x: torch.Tensor, *w: torch.Tensor) -> Any:
        grads = torch.ops.hotloop.rms_norm_backward(grad_out, x, w[0] if w else None, EPS)
        return grads if w else grads[0]

    assert torch.autograd.gradcheck(
        backward, (grad_out, x, *weight), check_forward_ad=True, check_backward_ad=False
    )


@pytest.mark.parametrize("with_weight", [True, False], ids=["weight", "no_weight"])
def test_hessian_and_jacfwd_match_torch(device: str, with_weight: bool) -> None:
    x = make(device, 8)
    w = make(device, 8) if with_weight else None

    def loss(norm: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[torch.Tensor], Any]:
        return lambda v: norm(v).pow(2).sum() + norm(v).sum()

    ours = loss(lambda v: hotloop.rms_norm(v, w, EPS))
    reference = loss(lambda v: F.rms_norm(v, (8,), w, EPS))
    torch.testing.assert_close(torch.func.hessian(ours)(x), torch.func.hessian(reference)(x))
    torch.testing.assert_close(
        torch.func.jacfwd(lambda v: hotloop.rms_norm(v, w, EPS))(x),
        torch.func.jacfwd(lambda v: F.rms_norm(v, (8,), w, EPS))(x),
    )


def test_jvp_of_grad_matches_torch(device: str) -> None:
    """A jvp under a grad: the forward's call below the grad level keeps its tangent."""
    x, t, w = make(device, 4, 8), make(device, 4, 8), make(device, 8)

    def grad_of(norm: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[torch.Tensor], Any]:
        return torch.func.grad(lambda v: norm(v).pow(2).sum())

    ours = torch.func.jvp(grad_of(lambda v: hotloop.rms_norm(v, w, EPS)), (x,), (t,))[1]
    ref = torch.func.jvp(grad_of(lambda v: F.rms_norm(v, (8,), w, EPS)), (x,), (t,))[1]
    torch.testing.assert_close(ours, ref)


def test_grad_of_grad_refuses_instead_of_dropping_the_graph(device: str) -> None:
    """The outer grad sees the inner one's call, so it reaches the backward op's formula
    (not implemented) rather than differentiating nothing."""
    x, w = make(device, 4, 8), make(device, 8)
    inner = torch.func.grad(lambda v: hotloop.rms_norm(v, w, EPS).pow(2).sum())
    with pytest.raises(RuntimeError, match="double backward"):
        torch.func.grad(lambda v: inner(v).sum())(x)


def fp8_scale(device: str) -> torch.Tensor:
    return torch.tensor(0.05, device=device)


INFERENCE_OPS: dict[str, tuple[Callable[[torch.Tensor, str], Any], str]] = {
    "fused_add_rms_norm": (
        lambda a, d: hotloop.fused_add_rms_norm(a, make(d, 4, 8, dtype=a.dtype), _w(a)),
        "x",
    ),
    "fused_add_rms_norm-residual": (
        lambda a, d: hotloop.fused_add_rms_norm(make(d, 4, 8, dtype=a.dtype), a, _w(a)),
        "residual",
    ),
    "rms_norm_fp8": (lambda a, d: hotloop.rms_norm_fp8(a, _w(a), fp8_scale(d)), "x"),
    "rms_norm_fp8-weight": (
        lambda a, d: hotloop.rms_norm_fp8(make(d, 4, 8, dtype=a.dtype), a[0], fp8_scale(d)),
        "weight",
    ),
    "rms_norm_fp8_dynamic": (lambda a, d: hotloop.rms_norm_fp8_dynamic(a, _w(a)), "x"),
    "fused_add_rms_norm_fp8": (
        lambda a, d: hotloop.fused_add_rms_norm_fp8(
            a, make(d, 4, 8, dtype=a.dtype), _w(a), fp8_scale(d)
        ),
        "x",
    ),
    "fused_add_rms_norm_fp8_dynamic": (
        lambda a, d: hotloop.fused_add_rms_norm_fp8_dynamic(make(d, 4, 8, dtype=a.dtype), a, _w(a)),
        "residual",
    ),
}


def _w(like: torch.Tensor) -> torch.Tensor:
    return torch.ones(8, device=like.device, dtype=like.dtype)


@pytest.mark.parametrize("how", ["jvp", "dual"])
@pytest.mark.parametrize("case", list(INFERENCE_OPS))
def test_inference_ops_refuse_tangents(device: str, case: str, how: str) -> None:
    fp8 = "fp8" in case and device == "cuda"
    if fp8 and torch.cuda.get_device_capability() < hotloop.ops.FP8_MIN_CAPABILITY:
        pytest.skip("FP8 ops need compute capability 8.9")
    call, argument = INFERENCE_OPS[case]
    op = case.split("-")[0]
    x, t = make(device, 4, 8, dtype=torch.float32), make(device, 4, 8, dtype=torch.float32)

    def run() -> None:
        if how == "jvp":
            torch.func.jvp(lambda a: (call(a.clone(), device), a)[1], (x,), (t,))
        else:
            with fwAD.dual_level():
                call(fwAD.make_dual(x.clone(), t), device)

    with torch.no_grad(), pytest.raises(RuntimeError, match=f"{op}: {argument} carries a forward"):
        run()
