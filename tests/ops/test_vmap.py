"""torch.vmap over the ops runs their batching rules, and matches a loop over the batch.

Every test turns off functorch's per-sample fallback (it raises instead of looping) and
makes warnings errors, so a missing batching rule fails rather than running slowly.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, Callable

import pytest
import torch
from op_testing import TOLERANCES

import hotloop

B = 3
TOL = TOLERANCES[torch.float64]
pytestmark = pytest.mark.filterwarnings("error")


@pytest.fixture(autouse=True)
def no_vmap_fallback() -> Iterator[None]:
    previous = torch._C._functorch._is_vmap_fallback_enabled()
    torch._C._functorch._set_vmap_fallback_enabled(False)
    yield
    torch._C._functorch._set_vmap_fallback_enabled(previous)


def batched(shape: Sequence[int], bdim: int | None, device: str) -> torch.Tensor:
    """A float64 tensor of `shape` per sample, with the batch (B) at `bdim`."""
    if bdim is None:
        return torch.randn(*shape, device=device, dtype=torch.float64)
    return torch.randn(B, *shape, device=device, dtype=torch.float64).movedim(0, bdim)


def loop(
    f: Callable[..., Any], args: Sequence[Any], in_dims: Sequence[int | None], out_dim: int = 0
) -> Any:
    """What vmap must equal: f per sample, the results stacked at out_dim."""
    per_sample = [
        f(*(a if d is None else a.select(d, i) for a, d in zip(args, in_dims))) for i in range(B)
    ]
    if isinstance(per_sample[0], tuple):
        return tuple(torch.stack(outs, out_dim) for outs in zip(*per_sample))
    return torch.stack(per_sample, out_dim)


def test_fallback_is_off_in_these_tests() -> None:
    """The fixture works: an op without a batching rule raises instead of looping."""
    with pytest.raises(RuntimeError, match="fallback"):
        torch.vmap(torch.ops.aten._foobar)(torch.ones(B))


# muladd / mul: (in_dims of a and b)
ELEMENTWISE_DIMS = [(0, 0), (1, 0), (None, 2), (2, None)]


@pytest.mark.parametrize("in_dims", ELEMENTWISE_DIMS, ids=str)
def test_muladd_and_mul(device: str, in_dims: tuple[int | None, int | None]) -> None:
    a, b = (batched((4, 5), d, device) for d in in_dims)
    for f in (lambda a, b: hotloop.muladd(a, b, 0.5), hotloop.mul):
        got = torch.vmap(f, in_dims=in_dims)(a, b)
        torch.testing.assert_close(got, loop(f, (a, b), in_dims), **TOL)


# rms_norm: (in_dims of x and weight, the per-sample shape of x)
RMS_NORM_CASES = [
    ((0, None), (4, 6)),
    ((1, None), (4, 6)),
    ((2, None), (4, 6)),  # the batch in the last, normalised position of the storage
    ((0, 0), (4, 6)),  # one weight per sample
    ((1, 1), (2, 3, 6)),
    ((None, 0), (4, 6)),  # only the weight is batched
    ((0, 0), (6,)),  # one row per sample
]


def rms_norm_case_id(case: Any) -> str:
    return f"dims{case[0]}-x{case[1]}".replace(" ", "")


@pytest.mark.parametrize(
    ("in_dims", "shape"), RMS_NORM_CASES, ids=map(rms_norm_case_id, RMS_NORM_CASES)
)
def test_rms_norm(device: str, in_dims: tuple, shape: tuple[int, ...]) -> None:
    x, w = batched(shape, in_dims[0], device), batched(shape[-1:], in_dims[1], device)

    def f(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return hotloop.rms_norm(x, w, 1e-6)

    torch.testing.assert_close(
        torch.vmap(f, in_dims=in_dims)(x, w), loop(f, (x, w), in_dims), **TOL
    )


def test_rms_norm_without_weight_and_out_dims(device: str) -> None:
    x = batched((4, 6), 1, device)

    def f(x: torch.Tensor) -> torch.Tensor:
        return hotloop.rms_norm(x, None, 1e-6)

    got = torch.vmap(f, in_dims=1, out_dims=2)(x)
    assert got.shape == (4, 6, B)
    torch.testing.assert_close(got, loop(f, (x,), (1,), out_dim=2), **TOL)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_batched_weight_low_precision(device: str, dtype: torch.dtype) -> None:
    x = batched((4, 40), 0, device).to(dtype)
    w = (batched((40,), 0, device) + 1).to(dtype)

    def f(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return hotloop.rms_norm(x, w, 1e-6)

    got = torch.vmap(f)(x, w)
    assert got.dtype == dtype
    torch.testing.assert_close(got, loop(f, (x, w), (0, 0)), **TOLERANCES[dtype])


def test_nested_vmap(device: str) -> None:
    x = batched((5, 4, 6), 0, device)  # B x 5 samples of (4, 6)
    w = batched((6,), 0, device)

    def f(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return hotloop.rms_norm(x, w, 1e-6)

    got = torch.vmap(torch.vmap(f, in_dims=(0, None)), in_dims=(0, 0))(x, w)
    expected = torch.stack([torch.stack([f(xij, w[i]) for xij in x[i]]) for i in range(B)])
    torch.testing.assert_close(got, expected, **TOL)
    muladd = torch.vmap(torch.vmap(lambda a, b: hotloop.muladd(a, b, 1.0)), in_dims=(1, None))
    a, b = batched((5, 4), 1, device), batched((5, 4), None, device)
    torch.testing.assert_close(muladd(a, b), a.movedim(1, 0) * b + 1.0, **TOL)


@pytest.mark.parametrize("weight_dim", [None, 0], ids=["shared-weight", "batched-weight"])
@pytest.mark.parametrize("weight", [True, False], ids=["weight", "no-weight"])
def test_rms_norm_backward(device: str, weight: bool, weight_dim: int | None) -> None:
    if not weight and weight_dim is not None:
        pytest.skip("no weight to batch")
    g, x = batched((4, 6), 0, device), batched((4, 6), 1, device)
    w = batched((6,), weight_dim, device) if weight else None
    in_dims = (0, 1, weight_dim if weight else None)

    def f(g: torch.Tensor, x: torch.Tensor, w: torch.Tensor | None) -> tuple:
        return torch.ops.hotloop.rms_norm_backward(g, x, w, 1e-6)

    grad_x, grad_w = torch.vmap(f, in_dims=in_dims)(g, x, w)
    expected_x, expected_w = loop(f, (g, x, w), in_dims)
    torch.testing.assert_close(grad_x, expected_x, **TOL)
    if weight:  # one weight gradient per sample: the sum over that sample's rows only
        torch.testing.assert_close(grad_w, expected_w, **TOL)
    else:
        assert grad_w.numel() == 0


@pytest.mark.parametrize("weight_dim", [None, 0], ids=["shared-weight", "batched-weight"])
def test_grad_and_vjp_under_vmap(device: str, weight_dim: int | None) -> None:
    x, w = batched((4, 6), 1, device), batched((6,), weight_dim, device)

    def loss(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return hotloop.rms_norm(x, w, 1e-6).pow(3).sum()

    in_dims = (1, weight_dim)
    grad = torch.func.grad(loss, argnums=(0, 1))
    got = torch.vmap(grad, in_dims=in_dims)(x, w)
    for g, e in zip(got, loop(grad, (x, w), in_dims)):
        torch.testing.assert_close(g, e, **TOL)

    cotangent = batched((4, 6), 0, device)

    def vjp(x: torch.Tensor, w: torch.Tensor, ct: torch.Tensor) -> tuple:
        return torch.func.vjp(lambda x, w: hotloop.rms_norm(x, w, 1e-6), x, w)[1](ct)

    got = torch.vmap(vjp, in_dims=(*in_dims, 0))(x, w, cotangent)
    for g, e in zip(got, loop(vjp, (x, w, cotangent), (*in_dims, 0))):
        torch.testing.assert_close(g, e, **TOL)


def test_grad_of_vmap_matches_autograd(device: str) -> None:
    x, w = batched((4, 6), 0, device), batched((6,), 0, device)

    def loss(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return torch.vmap(lambda x, w: hotloop.rms_norm(x, w, 1e-6))(x, w).pow(2).sum()

    got = torch.func.grad(loss, argnums=(0, 1))(x, w)
    leaves = [x.clone().requires_grad_(), w.clone().requires_grad_()]
    sum(
        hotloop.rms_norm(leaves[0][i], leaves[1][i], 1e-6).pow(2).sum() for i in range(B)
    ).backward()
    for g, leaf in zip(got, leaves):
        torch.testing.assert_close(g, leaf.grad, **TOL)


def test_torch_func_grad_without_vmap(device: str) -> None:
    x, w = batched((4, 6), None, device), batched((6,), None, device)
    got = torch.func.grad(lambda x: hotloop.rms_norm(x, w, 1e-6).sum())(x)
    leaf = x.clone().requires_grad_()
    hotloop.rms_norm(leaf, w, 1e-6).sum().backward()
    torch.testing.assert_close(got, leaf.grad, **TOL)
    jacobian = torch.func.jacrev(lambda a: hotloop.muladd(a, w, 1.0))(w)
    torch.testing.assert_close(jacobian, torch.diag(w), **TOL)


# fused_add_rms_norm writes in place: under vmap it writes each sample's slice.
@pytest.mark.parametrize(
    "in_dims", [(0, 0, None), (1, 0, None), (0, 1, 0)], ids=["dims0", "x-dim1", "batched-weight"]
)
def test_fused_add_rms_norm_in_place(device: str, in_dims: tuple) -> None:
    x, residual = batched((4, 8), in_dims[0], device), batched((4, 8), in_dims[1], device)
    w = batched((8,), in_dims[2], device) + 2
    expected_x, expected_residual = x.clone(), residual.clone()
    for i in range(B):
        # per sample, on contiguous copies written back (the op takes contiguous tensors)
        xi, ri = expected_x.select(in_dims[0], i), expected_residual.select(in_dims[1], i)
        wi = w if in_dims[2] is None else w.select(in_dims[2], i)
        xc, rc = xi.contiguous(), ri.contiguous()
        hotloop.fused_add_rms_norm(xc, rc, wi, 1e-6)
        xi.copy_(xc)
        ri.copy_(rc)

    def f(x: torch.Tensor, r: torch.Tensor, w: torch.Tensor) -> None:
        hotloop.fused_add_rms_norm(x, r, w, 1e-6)

    torch.vmap(f, in_dims=in_dims, out_dims=None)(x, residual, w)
    torch.testing.assert_close(residual, expected_residual, **TOL)
    torch.testing.assert_close(x, expected_x, **TOL)


@pytest.mark.parametrize("in_dims", [(None, 0, None), (0, None, None), (None, None, 0)], ids=str)
def test_fused_add_rms_norm_refuses_writing_an_unbatched_tensor(in_dims: tuple) -> None:
    x, residual = batched((4, 8), in_dims[0], "cpu"), batched((4, 8), in_dims[1], "cpu")
    w = batched((8,), in_dims[2], "cpu")

    def f(x: torch.Tensor, r: torch.Tensor, w: torch.Tensor) -> None:
        hotloop.fused_add_rms_norm(x, r, w, 1e-6)

    with pytest.raises(RuntimeError, match="must be batched"):
        torch.vmap(f, in_dims=in_dims, out_dims=None)(x, residual, w)


def test_bad_batched_weight_is_refused() -> None:
    x, w = batched((4, 6), 0, "cpu"), batched((5,), 0, "cpu")
    with pytest.raises(RuntimeError, match="weight has 5 elements but x's last dim is 6"):
        torch.vmap(lambda x, w: hotloop.rms_norm(x, w, 1e-6))(x, w)


# Every batching rule checks each sample as eager checks it (issue 27): the kernels take
# any number of leading dims, so a batch of 0-d samples would otherwise be normalised as one
# row, across the batch.
ZERO_DIM = "expected x to have at least 1 dimension"
SCALE = torch.tensor(0.05)


def _fused(x: torch.Tensor) -> None:
    hotloop.fused_add_rms_norm(x, x.clone(), torch.ones(()), 1e-6)


ZERO_DIM_SAMPLES: dict[str, Callable[[torch.Tensor], Any]] = {
    "rms_norm": lambda s: hotloop.rms_norm(s, None, 1e-6),
    "rms_norm-weight": lambda s: hotloop.rms_norm(s, torch.ones(()), 1e-6),
    "rms_norm_backward": lambda s: torch.ops.hotloop.rms_norm_backward(s, s, None, 1e-6),
    "rms_norm_backward-weight": lambda s: torch.ops.hotloop.rms_norm_backward(
        s, s, torch.ones(()), 1e-6
    ),
    "grad": torch.func.grad(lambda s: hotloop.rms_norm(s, None, 1e-6).sum()),
    "rms_norm_fp8": lambda s: hotloop.rms_norm_fp8(s, torch.ones(()), SCALE),
    "rms_norm_fp8_dynamic": lambda s: hotloop.rms_norm_fp8_dynamic(s, torch.ones(())),
}


@pytest.mark.parametrize("case", list(ZERO_DIM_SAMPLES))
def test_zero_dim_samples_are_refused(case: str) -> None:
    samples = torch.tensor([1.0, 2.0, 3.0, 4.0])
    call = ZERO_DIM_SAMPLES[case]
    with pytest.raises(RuntimeError, match=ZERO_DIM):
        call(samples[0])  # eager
    with pytest.raises(RuntimeError, match=ZERO_DIM):
        torch.vmap(call)(samples)


@pytest.mark.parametrize(
    "op", ["fused_add_rms_norm", "fused_add_rms_norm_fp8", "fused_add_rms_norm_fp8_dynamic"]
)
def test_zero_dim_samples_of_the_in_place_ops_are_refused(op: str) -> None:
    calls: dict[str, Callable[[torch.Tensor, torch.Tensor], Any]] = {
        "fused_add_rms_norm": lambda x, r: hotloop.fused_add_rms_norm(x, r, torch.ones(()), 1e-6),
        "fused_add_rms_norm_fp8": lambda x, r: hotloop.fused_add_rms_norm_fp8(
            x, r, torch.ones(()), SCALE
        ),
        "fused_add_rms_norm_fp8_dynamic": lambda x, r: hotloop.fused_add_rms_norm_fp8_dynamic(
            x, r, torch.ones(())
        )[0],
    }
    x, residual = torch.tensor([1.0, 2.0, 3.0, 4.0]), torch.tensor([0.5, 0.5, 0.5, 0.5])
    with pytest.raises(RuntimeError, match=ZERO_DIM):
        calls[op](x[0].clone(), residual[0].clone())  # eager
    before = residual.clone()
    with pytest.raises(RuntimeError, match=ZERO_DIM):
        torch.vmap(calls[op], out_dims=None if op == "fused_add_rms_norm" else 0)(x, residual)
    assert torch.equal(residual, before)  # refused before writing


# The in-place ops' batching rules check aliasing as eager does (issue 27): the contiguous
# copies they make for a batch dim that is not the outermost would otherwise hide it.
SHARED = "refer to a single memory location"


def test_fused_add_rms_norm_refuses_x_and_residual_sharing_memory() -> None:
    b = torch.randn(8, 3)
    one = b[:, 0].contiguous()
    with pytest.raises(RuntimeError, match=SHARED):
        hotloop.fused_add_rms_norm(one, one, torch.ones(8), 1e-6)  # eager
    before = b.clone()

    def f(a: torch.Tensor, r: torch.Tensor) -> None:
        hotloop.fused_add_rms_norm(a, r, torch.ones(8), 1e-6)

    for in_dims in [(1, 1), (0, 0)]:
        shared = b if in_dims == (1, 1) else b.t().contiguous()
        with pytest.raises(RuntimeError, match=SHARED):
            torch.vmap(f, in_dims=in_dims, out_dims=None)(shared, shared)
    assert torch.equal(b, before)


@pytest.mark.parametrize("weight_dim", [None, 0], ids=["one-weight", "batched-weight"])
def test_fused_add_rms_norm_refuses_a_weight_aliasing_residual(weight_dim: int | None) -> None:
    x, residual = torch.randn(B, 8), torch.randn(B, 8)
    weight = residual if weight_dim == 0 else residual[0]

    def f(x: torch.Tensor, r: torch.Tensor, w: torch.Tensor) -> None:
        hotloop.fused_add_rms_norm(x, r, w, 1e-6)

    with pytest.raises(RuntimeError, match=SHARED):
        torch.vmap(f, in_dims=(0, 0, weight_dim), out_dims=None)(x, residual, weight)


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize("shared", ["x", "weight", "scale"])
def test_fused_fp8_refuses_memory_shared_with_residual(dynamic: bool, shared: str) -> None:
    if dynamic and shared == "scale":
        shared = "scale_ub"
    b = torch.randn(8, B).abs() + 0.5
    x = b if shared == "x" else torch.randn(8, B)
    weight = b[:, 0] if shared == "weight" else torch.ones(8)
    scale = b[0, :1] if shared in ("scale", "scale_ub") else torch.tensor([0.05])

    def f(x: torch.Tensor, r: torch.Tensor) -> Any:
        if dynamic:
            return hotloop.fused_add_rms_norm_fp8_dynamic(x, r, weight, 1e-6, scale)[0]
        return hotloop.fused_add_rms_norm_fp8(x, r, weight, scale, 1e-6)

    before = b.clone()
    with pytest.raises(RuntimeError, match=f"(?s){SHARED}.*{shared}|{shared}.*{SHARED}"):
        torch.vmap(f, in_dims=(1, 1))(x, b)
    assert torch.equal(b, before)
