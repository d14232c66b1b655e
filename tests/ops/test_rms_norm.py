"""rms_norm, its backward, fused_add_rms_norm and hotloop.RMSNorm."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from op_testing import (
    RELATIVE_TOLERANCES,
    TOLERANCES,
    OpRecorder,
    check_compiled_autograd,
    opcheck,
    requires_compile,
    requires_cuda,
    rms_norm_samples,
)

import hotloop

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
# Hidden sizes that hit every kernel path on GPUs: tiny, odd, not a multiple of the vector
# width (register-resident scalars, each of their variants: 7, 1001, 2047, 4095, 8193; the
# forward's span kernel from 256 on, float32's backward too), long aligned rows (the backward's
# four-vector kernel: 12288), aligned rows past the register-resident limit (staged in
# shared memory: the backward at 20000 and 40000, the forward at 40000 and float32's at
# 20000; split over a cluster of blocks on sm_90: the 16-bit forward and backward at
# 65536, float32's forward at 40000, float32's backward over four blocks at 32768), and long
# odd rows (the generic kernels: 20001).
HIDDEN_SIZES = [1, 7, 64, 1001, 2047, 4095, 8193, 12288, 20000, 20001, 32768, 40000, 65536]


def sample_inputs(device: str, dtype: torch.dtype, requires_grad: bool = False) -> list[tuple]:
    return rms_norm_samples(device, dtype, HIDDEN_SIZES, requires_grad)


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    x64 = x.double()
    y = x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + eps)
    return (y if weight is None else y * weight.double()).to(x.dtype)


def assert_forward_with_and_without_weight(x: torch.Tensor, weight: torch.Tensor) -> None:
    for w in (weight, None):
        expected = rms_norm_reference(x, w, 1e-6)
        torch.testing.assert_close(hotloop.rms_norm(x, w, 1e-6), expected, **TOLERANCES[x.dtype])


@pytest.mark.parametrize("dtype", DTYPES)
def test_forward_matches_reference(device: str, dtype: torch.dtype) -> None:
    for x, weight, eps in sample_inputs(device, dtype):
        out = hotloop.rms_norm(x, weight, eps)
        assert out.shape == x.shape
        assert out.dtype == x.dtype
        torch.testing.assert_close(out, rms_norm_reference(x, weight, eps), **TOLERANCES[dtype])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("row_vectors", [1025, 1536, 2048, 2049, 4096, 4097])
def test_forward_rows_of_many_threads(device: str, dtype: torch.dtype, row_vectors: int) -> None:
    # On an H100 aligned rows of 1025-2048 16-byte vectors take two vectors a thread on
    # 513-1024 threads (1025 on 544: threads with two vectors, one, or none) and rows of
    # 2049-4096 four on 544-1024; on an H200 four on up to 512 and eight on up to 512. 4097
    # is past both: rows staged in shared memory. 300 rows: more than one block on every SM.
    hidden = row_vectors * 16 // torch.empty((), dtype=dtype).element_size()
    gen = torch.Generator(device=device).manual_seed(row_vectors)
    x = torch.randn(300, hidden, device=device, dtype=dtype, generator=gen)
    weight = torch.rand(hidden, device=device, dtype=dtype, generator=gen) + 0.5
    torch.testing.assert_close(
        hotloop.rms_norm(x, weight, 1e-6),
        rms_norm_reference(x, weight, 1e-6),
        **TOLERANCES[dtype],
    )


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("hidden", [4096, 8192, 12288, 16384, 32768])
@pytest.mark.parametrize("rows", [1, 3, 301])
def test_forward_rows_read_twice_from_l2(
    device: str, dtype: torch.dtype, hidden: int, rows: int
) -> None:
    # On an H200 16-bit rows of these widths (on an H100 8192 and 32768) run one row a block of
    # 256-1024 threads with two to four vectors each, x read twice (rms_norm_l2_reread_kernel);
    # 301 rows are more blocks than fit at once.
    gen = torch.Generator(device=device).manual_seed(hidden + rows)
    x = torch.randn(rows, hidden, device=device, dtype=dtype, generator=gen)
    weight = torch.rand(hidden, device=device, dtype=dtype, generator=gen) + 0.5
    assert_forward_with_and_without_weight(x, weight)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
# On an H200 the span's vectors a thread depend on its width: 1025, 2047, 4095 and 8193 take
# three, 3001, 6001 and 16377 (the widest) four
@pytest.mark.parametrize("hidden", [257, 1001, 1025, 2047, 3001, 4095, 6001, 8193, 16377])
def test_forward_rows_off_the_vector_boundary(device: str, dtype: torch.dtype, hidden: int) -> None:
    # Odd widths put consecutive rows at every offset from the 16-byte boundary; 3000 rows
    # are more than a GPU keeps resident, so blocks loop over rows. The offset view gives
    # x and y different offsets from the boundary.
    gen = torch.Generator(device=device).manual_seed(hidden)
    base = torch.randn(3000 * hidden + 1, device=device, dtype=dtype, generator=gen)
    weight = torch.rand(hidden, device=device, dtype=dtype, generator=gen) + 0.5
    for x in (base[:-1].view(3000, hidden), base[1:].view(3000, hidden)):
        assert_forward_with_and_without_weight(x, weight)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("hidden", [257, 1001, 2047, 3001, 4095, 6001])
@pytest.mark.parametrize("rows", [5, 8, 3003])
def test_forward_odd_rows_keep_to_themselves(
    device: str, dtype: torch.dtype, hidden: int, rows: int
) -> None:
    # Aligned x and y with an odd width: neighbouring rows share 16-byte vectors, and the
    # last row's last vector is cut by the tensor's end. 3003 rows are more than a GPU keeps
    # resident. Row 4 holds an inf: its neighbours must not see it.
    gen = torch.Generator(device=device).manual_seed(hidden + rows)
    x = torch.randn(rows, hidden, device=device, dtype=dtype, generator=gen)
    x[4, hidden // 2] = float("inf")
    weight = torch.rand(hidden, device=device, dtype=dtype, generator=gen) + 0.5
    finite = torch.ones(rows, dtype=torch.bool, device=device)
    finite[4] = False
    for w in (weight, None):
        got = hotloop.rms_norm(x, w, 1e-6)
        expected = rms_norm_reference(x, w, 1e-6)
        torch.testing.assert_close(got[finite], expected[finite], **TOLERANCES[dtype])
        assert not torch.isfinite(got[4]).all()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_forward_matches_torch(device: str, dtype: torch.dtype) -> None:
    x = torch.randn(6, 300, device=device, dtype=dtype)
    weight = torch.rand(300, device=device, dtype=dtype)
    expected = F.rms_norm(x, (300,), weight)  # eps=None: torch's default, as hotloop's
    torch.testing.assert_close(hotloop.rms_norm(x, weight), expected, **TOLERANCES[dtype])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_default_eps_is_torchs_for_16_bit_inputs(device: str, dtype: torch.dtype) -> None:
    """eps=None is float32's epsilon for 16-bit x, as in torch: the dtype the norm is
    computed in. bfloat16's own (0.0078) would swamp the mean square of small activations."""
    x = (1e-2 * torch.randn(4, 64, device=device)).to(dtype)
    expected = F.rms_norm(x, (64,))
    tolerance = {"atol": 0.0, "rtol": torch.finfo(dtype).eps}
    torch.testing.assert_close(hotloop.rms_norm(x), expected, **tolerance)
    module = hotloop.RMSNorm(64, elementwise_affine=False, device=device)
    torch.testing.assert_close(module(x), expected, **tolerance)


def rms_norm_backward_reference(
    grad_out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor | None, eps: float
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(grad_x, grad_weight) in float64."""
    x64 = x.detach().double().requires_grad_()
    w64 = None if weight is None else weight.detach().double().requires_grad_()
    out64 = x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + eps)
    (out64 if w64 is None else out64 * w64).backward(grad_out.double())
    return x64.grad, None if w64 is None else w64.grad


def backward_tolerance(dtype: torch.dtype) -> dict[str, float]:
    return {"atol": 8 * TOLERANCES[dtype]["atol"], "rtol": 4 * TOLERANCES[dtype]["rtol"]}


def random_backward_inputs(
    device: str, dtype: torch.dtype, rows: int, hidden: int, seed: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x and grad_out of random aligned rows, and a weight in [0.5, 1.5)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(rows, hidden, device=device, dtype=dtype, generator=gen)
    grad_out = torch.randn(rows, hidden, device=device, dtype=dtype, generator=gen)
    weight = torch.rand(hidden, device=device, dtype=dtype, generator=gen) + 0.5
    return x, grad_out, weight


def check_grad_x_of_random_rows(
    device: str, dtype: torch.dtype, rows: int, hidden: int, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The backward op on random aligned rows with a weight: grad_x checked against the float64
    reference; returns grad_weight and its reference, for the caller's own comparison."""
    x, grad_out, weight = random_backward_inputs(device, dtype, rows, hidden, seed)
    grad_x, grad_w = torch.ops.hotloop.rms_norm_backward(grad_out, x, weight, 1e-6)
    expected_x, expected_w = rms_norm_backward_reference(grad_out, x, weight, 1e-6)
    torch.testing.assert_close(grad_x, expected_x.to(dtype), **backward_tolerance(dtype))
    return grad_w, expected_w


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
# 16377: the widest 16-bit span the staged span kernel takes (2048 vectors on 1024 threads)
@pytest.mark.parametrize("hidden", [257, 1001, 2047, 4095, 8193, 16377])
@pytest.mark.parametrize("rows", [9, 3000])
def test_backward_rows_off_the_vector_boundary(
    device: str, dtype: torch.dtype, hidden: int, rows: int
) -> None:
    # Odd widths put consecutive rows at every offset from the 16-byte boundary. With 3000
    # rows, more than a GPU keeps resident, each block's grad_weight accumulator takes many
    # rows; 9 rows give blocks one row each. The offset views give x and grad_out different
    # offsets from the boundary. Row 4 of grad_out is inf: its neighbours, which share 16-byte
    # vectors with it, must not see it.
    if device == "cpu" and rows > 9:
        pytest.skip("CPU kernels take rows in chunks, not a resident grid of blocks")
    gen = torch.Generator(device=device).manual_seed(hidden + rows)
    base = torch.randn(rows * hidden + 1, device=device, dtype=dtype, generator=gen)
    clean_base = torch.randn(rows * hidden + 1, device=device, dtype=dtype, generator=gen)
    weight = torch.rand(hidden, device=device, dtype=dtype, generator=gen) + 0.5
    tol = backward_tolerance(dtype)
    finite = torch.ones(rows, dtype=torch.bool, device=device)
    finite[4] = False
    for x_at, grad_at in ((0, 0), (1, 1), (1, 0)):
        x = base[x_at : x_at + rows * hidden].view(rows, hidden)
        clean = clean_base[grad_at : grad_at + rows * hidden].view(rows, hidden)
        with_inf = clean_base.clone()[grad_at : grad_at + rows * hidden].view(rows, hidden)
        with_inf[4] = float("inf")
        for w in (weight, None):
            grad_x, grad_w = torch.ops.hotloop.rms_norm_backward(clean, x, w, 1e-6)
            expected_x, expected_w = rms_norm_backward_reference(clean, x, w, 1e-6)
            torch.testing.assert_close(grad_x, expected_x.to(dtype), **tol)
            if w is not None:
                torch.testing.assert_close(grad_w, expected_w.to(dtype), **tol)
            grad_x = torch.ops.hotloop.rms_norm_backward(with_inf, x, w, 1e-6)[0]
            torch.testing.assert_close(grad_x[finite], expected_x[finite].to(dtype), **tol)
            assert not torch.isfinite(grad_x[4]).any()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("hidden", [512, 1024, 1536, 2048, 3072, 4096])
def test_backward_many_aligned_rows_a_block(device: str, dtype: torch.dtype, hidden: int) -> None:
    # 4003 rows are more than the vector backward's resident row slots at these widths (on an
    # H100 or H200: 3168 at bfloat16 512), so every block takes several rows in turn: the
    # bfloat16 and float32 kernels of rows up to 64 threads load each next row while they work
    # on this one, and a wrong next row, or a load that lands late, shows in grad_x and in the
    # grad_weight summed over all rows. On an H100, rows of 32-128 threads that fill every
    # thread's vectors and fill the block share it (bfloat16 4096, float16 2048 and 4096: four
    # and eight a block): 4003, a prime, leaves rows past the end in the last block.
    grad_w, expected_w = check_grad_x_of_random_rows(device, dtype, 4003, hidden, seed=hidden)
    # grad_weight sums 4003 rows: compare it to its largest value, not element by element
    scale = expected_w.abs().max()
    assert (grad_w.double() - expected_w).abs().max() <= RELATIVE_TOLERANCES[dtype] * scale


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("hidden", [12288, 16384, 32768, 65536])
def test_backward_grad_weight_summed_in_shared_memory(
    device: str, dtype: torch.dtype, hidden: int
) -> None:
    # On an H200 16-bit rows of these widths with at least two rows for each block keep the
    # grad_weight accumulator in shared memory (rms_norm_backward_shared_dw_kernel), blocks
    # looping over rows, the widest rows split over a cluster of blocks that exchange their row
    # sums; 2115 rows leave some blocks (clusters) a row more than others. In place too: grad_x
    # over grad_out.
    if device == "cpu":
        pytest.skip("a GPU kernel's shape; the CPU kernels take rows in chunks")
    x, grad_out, weight = random_backward_inputs(device, dtype, 2115, hidden, seed=hidden)
    tol = backward_tolerance(dtype)
    for w in (weight, None):
        expected_x, expected_w = rms_norm_backward_reference(grad_out, x, w, 1e-6)
        grad_x, grad_w = torch.ops.hotloop.rms_norm_backward(grad_out, x, w, 1e-6)
        torch.testing.assert_close(grad_x, expected_x.to(dtype), **tol)
        in_place = grad_out.clone()
        grad_w_in_place = torch.ops.hotloop.rms_norm_backward_(in_place, x, w, 1e-6)
        assert torch.equal(in_place, grad_x)
        if w is not None:
            # grad_weight sums 2115 rows: compare it to its largest value
            scale = expected_w.abs().max()
            assert (grad_w.double() - expected_w).abs().max() <= RELATIVE_TOLERANCES[dtype] * scale
            assert torch.equal(grad_w_in_place, grad_w)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("hidden", [64, 512, 4096, 8192])
@pytest.mark.parametrize("rows", [1, 2, 3, 7, 16])
def test_backward_few_rows(device: str, dtype: torch.dtype, hidden: int, rows: int) -> None:
    # Decode-sized rows: up to two passes of one block take the rows in turn and write
    # grad_weight themselves, more go to a block each and the partial rows' sum; 64 and 512
    # put several rows in a block at once.
    grad_w, expected_w = check_grad_x_of_random_rows(device, dtype, rows, hidden, hidden + rows)
    torch.testing.assert_close(grad_w, expected_w.to(dtype), **backward_tolerance(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_backward_matches_reference(device: str, dtype: torch.dtype) -> None:
    # Fresh random inputs each run; a failure names the seed and the sample to rerun it.
    seed = torch.seed()
    for x, weight, eps in sample_inputs(device, dtype, requires_grad=True):
        grad_out = torch.randn_like(x)
        hotloop.rms_norm(x, weight, eps).backward(grad_out)
        leaves = [x] if weight is None else [x, weight]
        got = [t.grad for t in leaves]
        copies = [t.detach().double().requires_grad_() for t in leaves]
        ref_weight = copies[1] if weight is not None else None
        out64 = copies[0] * torch.rsqrt(copies[0].pow(2).mean(-1, keepdim=True) + eps)
        (out64 if ref_weight is None else out64 * ref_weight).backward(grad_out.double())
        tol = TOLERANCES[dtype]
        if dtype in (torch.float16, torch.bfloat16):
            # the weight gradient sums over every row; allow for the rounding of each term
            tol = {"atol": 8 * tol["atol"], "rtol": 4 * tol["rtol"]}
        sample = (
            f"x {tuple(x.shape)} strides {x.stride()}, weight {weight is not None}, eps {eps} "
            f"(torch.manual_seed({seed}))"
        )
        # grad_x = rstd * g * w - x * (...): at H = 1 the two cancel, leaving the rounding
        # error of terms of size |rstd * g * w| (seen on an H200: 4e-5 off 1.35 in float32).
        x64 = copies[0].detach()
        rstd = torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + eps)
        w64 = 1.0 if weight is None else copies[1].detach()
        terms = (rstd * grad_out.double() * w64).abs().max().item() if x.numel() else 0.0
        for name, grad, copy in zip(("grad_x", "grad_weight"), got, copies):
            scaled = dict(tol, atol=tol["atol"] * max(terms, 1.0)) if name == "grad_x" else tol
            torch.testing.assert_close(
                grad,
                copy.grad.to(dtype),
                **scaled,
                msg=lambda m, at=f"{name} of {sample}": f"{at}: {m}",
            )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_opcheck(device: str, dtype: torch.dtype) -> None:
    for x, weight, eps in sample_inputs(device, dtype, requires_grad=True)[1:7:2]:
        opcheck(torch.ops.hotloop.rms_norm.default, (x, weight, eps))
        # the backward op has no derivative of its own: check it on plain tensors
        grad_out = torch.randn_like(x).detach()
        plain_weight = None if weight is None else weight.detach()
        opcheck(
            torch.ops.hotloop.rms_norm_backward.default, (grad_out, x.detach(), plain_weight, eps)
        )


def test_gradcheck(device: str) -> None:
    for x, weight, eps in sample_inputs(device, torch.float64, requires_grad=True)[1:]:
        if x.numel() > 1000:
            continue  # gradcheck is quadratic in the number of elements
        assert torch.autograd.gradcheck(lambda x, w, e=eps: hotloop.rms_norm(x, w, e), (x, weight))


def test_double_backward_is_refused() -> None:
    x = torch.randn(3, 8, dtype=torch.float64, requires_grad=True)
    (grad_x,) = torch.autograd.grad(hotloop.rms_norm(x).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="double backward"):
        grad_x.sum().backward()


@requires_compile
def test_compile_dynamic_shapes_without_graph_breaks(device: str) -> None:
    norm = hotloop.RMSNorm(48, eps=1e-6, device=device)

    def f(x: torch.Tensor) -> torch.Tensor:
        return norm(x * 2).sum(-1)

    compiled = torch.compile(f, fullgraph=True, dynamic=True)
    for rows in (3, 11, 40):
        x = torch.randn(rows, 48, device=device, requires_grad=True)
        out = compiled(x)
        torch.testing.assert_close(out, f(x))
        out.sum().backward()
    assert torch._dynamo.explain(f)(x).graph_break_count == 0


# Calls whose backward compiled autograd takes: the eager Function of hotloop.rms_norm (with
# and without the in-place backward), and the ops' Autograd kernels, which run where a call
# goes to the op itself.
COMPILED_AUTOGRAD_CALLS = {
    "rms_norm": lambda x, w: hotloop.rms_norm(x, w, 1e-6),
    "rms_norm in place": lambda x, w: hotloop.rms_norm(x, w, 1e-6, in_place_backward=True),
    "the rms_norm op": lambda x, w: torch.ops.hotloop.rms_norm(x, w, 1e-6),
    "muladd": lambda x, w: hotloop.muladd(x, w.expand_as(x), 2.0),
}


@requires_compile
@pytest.mark.parametrize("call", COMPILED_AUTOGRAD_CALLS)
def test_compiled_autograd_gives_the_eager_gradients(device: str, call: str) -> None:
    check_compiled_autograd(COMPILED_AUTOGRAD_CALLS[call], device)


def test_export(device: str) -> None:
    module = torch.nn.Sequential(torch.nn.Linear(16, 16), hotloop.RMSNorm(16)).to(device)
    x = torch.randn(4, 16, device=device)
    exported = torch.export.export(module, (x,))
    assert "hotloop.rms_norm" in str(exported.graph)
    torch.testing.assert_close(exported.module()(x), module(x))


def fused_reference(x, residual, weight, eps):
    summed = (x.double() + residual.double()).to(x.dtype)
    return rms_norm_reference(summed, weight, eps), summed


def check_fused_rows(device: str, dtype: torch.dtype, rows: int, row_vectors: int) -> None:
    """fused_add_rms_norm on `rows` aligned rows of `row_vectors` 16-byte vectors."""
    hidden = row_vectors * 16 // torch.empty((), dtype=dtype).element_size()
    gen = torch.Generator(device=device).manual_seed(row_vectors)
    x = torch.randn(rows, hidden, device=device, dtype=dtype, generator=gen)
    residual = torch.randn(rows, hidden, device=device, dtype=dtype, generator=gen)
    weight = torch.rand(hidden, device=device, dtype=dtype, generator=gen) + 0.5
    expected_x, expected_residual = fused_reference(x, residual, weight, 1e-6)
    hotloop.fused_add_rms_norm(x, residual, weight, 1e-6)
    torch.testing.assert_close(residual, expected_residual, **TOLERANCES[dtype])
    # one rounding more: the residual is rounded to dtype before or after the norm
    tol = {k: 2 * v for k, v in TOLERANCES[dtype].items()}
    torch.testing.assert_close(x, expected_x, **tol)


@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_add_rms_norm(device: str, dtype: torch.dtype) -> None:
    for hidden in HIDDEN_SIZES:
        x = torch.randn(5, hidden, device=device, dtype=dtype)
        residual = torch.randn(5, hidden, device=device, dtype=dtype)
        weight = torch.rand(hidden, device=device, dtype=dtype) + 0.5
        expected_x, expected_residual = fused_reference(x, residual, weight, 1e-6)
        hotloop.fused_add_rms_norm(x, residual, weight, 1e-6)
        torch.testing.assert_close(residual, expected_residual, **TOLERANCES[dtype])
        # one rounding more: the residual is rounded to dtype before or after the norm
        tol = {k: 2 * v for k, v in TOLERANCES[dtype].items()}
        torch.testing.assert_close(x, expected_x, **tol)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("row_vectors", [384, 512, 1024, 1025, 1280, 1536, 2048, 2049])
@pytest.mark.parametrize("rows", [4, 300])
def test_fused_add_rms_norm_rows_of_many_threads(
    device: str, dtype: torch.dtype, row_vectors: int, rows: int
) -> None:
    # On an H100 aligned rows of up to 512 16-byte vectors take one vector a thread on up to
    # 512 threads, and rows of up to 2048 two on up to 1024 (1025 on 544: threads with two
    # vectors, one, or none); on an H200 16-bit rows of up to 512 one vector on up to 512 too
    # (384, 512), other rows up to four on up to 512. Where those blocks leave an
    # SM one block or less than half its threads and rows queue for them (300 rows: more than
    # one block on every SM), the re-read kernel takes the rows instead (1025-2048 on an H100);
    # 4 rows fit at once and keep the vector kernel. 2049 is past both.
    check_fused_rows(device, dtype, rows, row_vectors)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("row_vectors", [2049, 4096, 8192])
def test_fused_add_rms_norm_wide_rows_in_turn(
    device: str, dtype: torch.dtype, row_vectors: int
) -> None:
    # Aligned rows past the vector kernel are re-read from L2 (2049 and 4096 16-byte vectors on
    # an H100 or an H200) or, where the rows of the blocks in flight would not stay in L2 (8192
    # vectors: 128 KB), staged in shared memory. 400 rows are more than fit on those GPUs at
    # once, so each block takes several rows in turn.
    check_fused_rows(device, dtype, 400, row_vectors)


@requires_compile
def test_fused_add_rms_norm_opcheck_and_compile(device: str) -> None:
    x = torch.randn(4, 33, device=device)
    residual = torch.randn(4, 33, device=device)
    weight = torch.rand(33, device=device)
    opcheck(torch.ops.hotloop.fused_add_rms_norm.default, (x, residual, weight, 1e-5))

    def step(x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        hotloop.fused_add_rms_norm(x, residual, weight, 1e-5)
        return x + 1

    compiled = torch.compile(step, fullgraph=True, dynamic=True)
    x2, residual2 = x.clone(), residual.clone()
    torch.testing.assert_close(compiled(x, residual), step(x2, residual2))
    torch.testing.assert_close(residual, residual2)


@pytest.mark.parametrize(
    ("x", "weight", "message"),
    [
        (torch.randn(3, 8), torch.randn(7), "7"),
        (torch.ones(3, 8, dtype=torch.int64), None, "floating"),
        # (a floating weight of another dtype is computed as torch does: test_mixed_precision)
        (torch.randn(3, 8), torch.ones(8, dtype=torch.int64), "dtype"),
        (torch.randn(3, 8), torch.randn(2, 4), "weight"),
    ],
)
def test_rms_norm_bad_inputs(x: torch.Tensor, weight: torch.Tensor | None, message: str) -> None:
    with pytest.raises((RuntimeError, ValueError), match=message):
        hotloop.rms_norm(x, weight, 1e-6)


def test_rms_norm_bad_backend() -> None:
    with pytest.raises(ValueError, match="backend"):
        hotloop.rms_norm(torch.randn(2, 4), backend="fortran")
    with pytest.raises(ValueError, match="backend"):
        hotloop.RMSNorm(4, backend="fortran")


def test_native_backend_runs_on_every_device(device: str) -> None:
    x = torch.randn(3, 16, device=device)
    torch.testing.assert_close(
        hotloop.rms_norm(x, None, 1e-6, backend="native"), rms_norm_reference(x, None, 1e-6)
    )


def test_cuda_backend_name_is_deprecated() -> None:
    x = torch.randn(3, 16)
    # as before the rename, "cuda" needs a CUDA tensor
    with (
        pytest.warns(DeprecationWarning, match="backend='native'"),
        pytest.raises(ValueError, match="CUDA tensor"),
    ):
        hotloop.rms_norm(x, backend="cuda")


@requires_cuda
@pytest.mark.gpu
def test_cuda_backend_name_runs_the_native_kernels() -> None:
    x = torch.randn(3, 16, device="cuda")
    with pytest.warns(DeprecationWarning, match="backend='native'"):
        out = hotloop.rms_norm(x, None, 1e-6, backend="cuda")
    torch.testing.assert_close(out, hotloop.rms_norm(x, None, 1e-6, backend="native"))


def test_fused_add_rms_norm_bad_inputs() -> None:
    x, residual, weight = torch.randn(4, 8), torch.randn(4, 8), torch.rand(8)
    with pytest.raises(RuntimeError, match="contiguous"):
        hotloop.fused_add_rms_norm(x.t(), residual.t(), torch.rand(4))
    with pytest.raises(RuntimeError, match="shape"):
        hotloop.fused_add_rms_norm(x, torch.randn(4, 9), weight)
    with pytest.raises(RuntimeError, match="8"):
        hotloop.fused_add_rms_norm(x, residual, torch.rand(9))


@requires_cuda
@pytest.mark.gpu
def test_rms_norm_weight_on_another_device() -> None:
    with pytest.raises(RuntimeError, match="cpu"):
        hotloop.rms_norm(torch.randn(2, 8, device="cuda"), torch.rand(8), 1e-6)


def test_empty_input(device: str) -> None:
    x = torch.randn(0, 16, device=device)
    assert hotloop.rms_norm(x, torch.rand(16, device=device), 1e-6).shape == (0, 16)


def test_module_is_a_drop_in_for_torch_rmsnorm(device: str) -> None:
    reference = torch.nn.RMSNorm(24, eps=1e-5, device=device)
    with torch.no_grad():
        reference.weight.uniform_(0.5, 1.5)
    ours = hotloop.RMSNorm(24, eps=1e-5, device=device)
    ours.load_state_dict(reference.state_dict())
    assert list(ours.state_dict()) == list(reference.state_dict())
    x = torch.randn(3, 5, 24, device=device)
    torch.testing.assert_close(ours(x), reference(x))
    converted = hotloop.RMSNorm.from_module(reference)
    assert converted.weight is reference.weight
    torch.testing.assert_close(converted(x), reference(x))


def test_module_is_a_torch_rmsnorm() -> None:
    ours = hotloop.RMSNorm(24, eps=1e-5)
    assert isinstance(ours, torch.nn.RMSNorm)
    reference = torch.nn.RMSNorm(24, eps=1e-5)
    reference.load_state_dict(ours.state_dict())  # and back: the state_dicts are one format
    weightless = hotloop.RMSNorm(24, elementwise_affine=False)
    assert weightless.weight is None
    assert (
        weightless.state_dict().keys()
        == torch.nn.RMSNorm(24, elementwise_affine=False).state_dict().keys()
    )


def test_from_module_without_weight(device: str) -> None:
    reference = torch.nn.RMSNorm(24, eps=1e-5, elementwise_affine=False, device=device)
    converted = hotloop.RMSNorm.from_module(reference)
    assert converted.weight is None
    assert converted.normalized_shape == (24,)
    x = torch.randn(3, 24, device=device)
    torch.testing.assert_close(converted(x), reference(x))


def llama_style_rms_norm(module: str, qualname: str) -> torch.nn.Module:
    """A module with transformers' LlamaRMSNorm's code under the given class name."""

    class LlamaStyle(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(torch.rand(24) + 0.5)
            self.variance_epsilon = 1e-5

        def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
            dtype = hidden_states.dtype
            hidden_states = hidden_states.to(torch.float32)
            variance = hidden_states.pow(2).mean(-1, keepdim=True)
            hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
            return self.weight * hidden_states.to(dtype)

    LlamaStyle.__module__, LlamaStyle.__qualname__ = module, qualname
    return LlamaStyle()


@pytest.mark.parametrize(
    "name", ["llama.modeling_llama.LlamaRMSNorm", "qwen2.modeling_qwen2.Qwen2RMSNorm"]
)
def test_from_module_takes_transformers_rms_norms_by_name(name: str) -> None:
    module, qualname = f"transformers.models.{name}".rsplit(".", 1)
    reference = llama_style_rms_norm(module, qualname)
    converted = hotloop.RMSNorm.from_module(reference)
    assert converted.weight is reference.weight
    assert converted.eps == 1e-5
    x = torch.randn(3, 24)
    torch.testing.assert_close(converted(x), reference(x))


class GemmaRMSNorm(torch.nn.Module):
    """Gemma's form: x_hat * (1 + weight), the weight stored as an offset from one."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(24))
        self.eps = 1e-6

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x_hat = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return x_hat * (1.0 + self.weight)


class OverridingRMSNorm(torch.nn.RMSNorm):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) * 2


@pytest.mark.parametrize(
    ("module", "message"),
    [
        (torch.nn.LayerNorm(24), "cannot convert torch.nn.modules.normalization.LayerNorm: it is"),
        # Gemma's formula outside transformers' classes: its attributes can't tell it apart
        (GemmaRMSNorm(), r"GemmaRMSNorm: it is not known to compute"),
        (llama_style_rms_norm("my_models", "LlamaRMSNorm"), "cannot convert my_models.Llama"),
        (OverridingRMSNorm(24), "OverridingRMSNorm: it is not known to compute"),
    ],
    ids=["LayerNorm", "gemma-style", "lookalike", "overridden-forward"],
)
def test_from_module_refuses_what_is_not_known_to_be_an_rms_norm(
    module: torch.nn.Module, message: str
) -> None:
    with pytest.raises(TypeError, match=message):
        hotloop.RMSNorm.from_module(module)


def test_from_module_takes_its_own_and_torch_subclasses() -> None:
    class Plain(torch.nn.RMSNorm):
        pass

    for module in (hotloop.RMSNorm(24, eps=1e-5), Plain(24, eps=1e-5)):
        converted = hotloop.RMSNorm.from_module(module, backend="native")
        assert converted.weight is module.weight
        assert converted.backend == "native"


def test_module_rejects_multi_dim_shapes() -> None:
    with pytest.raises(ValueError, match="last dimension"):
        hotloop.RMSNorm((4, 8))
    with pytest.raises(ValueError, match="last dimension 8"):
        hotloop.RMSNorm(8)(torch.randn(2, 9))


def test_no_grad_call_matches_and_records_nothing(device: str) -> None:
    """Under no_grad the API function skips the Autograd kernel: same values, no graph."""
    x = torch.randn(4, 64, device=device, requires_grad=True)
    w = torch.randn(64, device=device, requires_grad=True)
    with torch.no_grad():
        y = hotloop.rms_norm(x, w, 1e-6)
    assert y.grad_fn is None
    assert not y.requires_grad
    torch.testing.assert_close(y, rms_norm_reference(x.detach(), w.detach(), 1e-6).float())
    y = hotloop.rms_norm(x, w, 1e-6)  # grad mode: recorded
    assert y.grad_fn is not None


@pytest.mark.parametrize("hidden", [64, 1001])
def test_eager_gradients_equal_the_ops(device: str, hidden: int) -> None:
    """An eager call that needs gradients skips the op's Python Autograd kernel (the API's
    _EagerRmsNorm): it must give what the op through the dispatcher gives, bit for bit,
    and leave what autograd checks in place (an x changed in place before backward)."""
    torch.manual_seed(0)
    x = torch.randn(5, hidden, device=device, requires_grad=True)
    w = torch.randn(hidden, device=device, requires_grad=True)
    g = torch.randn(5, hidden, device=device)
    cases = [(w, (x, w), "torch", 0.0), (None, (x,), "torch", 0.0)]
    cases += [(w, (x, w), "llama", 0.0), (w, (x, w), "gemma", 1.0)]
    for weight, leaves, casting, offset in cases:
        y = hotloop.rms_norm(x, weight, 1e-6, casting=casting, offset=offset)
        mode = hotloop.ops.CASTINGS.index(casting)
        expected_y = torch.ops.hotloop.rms_norm.default(x, weight, 1e-6, mode, offset)
        assert torch.equal(y, expected_y), casting
        got = torch.autograd.grad(y, leaves, g)
        expected = torch.autograd.grad(expected_y, leaves, g)
        for got_t, expected_t in zip(got, expected):
            assert torch.equal(got_t, expected_t), casting
    x_leaf = x.detach().clone().requires_grad_()
    x_in = x_leaf * 1.0
    y = hotloop.rms_norm(x_in, w, 1e-6)
    x_in.mul_(2.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.backward(g)


def test_dispatch_modes_see_the_ops_of_an_eager_call(device: str) -> None:
    """The eager shortcut is for plain calls only: a dispatch mode (FakeTensorMode, a
    tracer, a profiler's) still sees the forward and the backward op."""
    x = torch.randn(4, 256, device=device, requires_grad=True)
    weight = torch.randn(256, device=device, requires_grad=True)
    with OpRecorder() as recorder:
        hotloop.rms_norm(x, weight, 1e-6).sum().backward()
    assert "hotloop.rms_norm.default" in recorder.ops
    assert "hotloop.rms_norm_backward.default" in recorder.ops


@pytest.mark.parametrize(
    "backend",
    ["native", pytest.param("triton", marks=[pytest.mark.gpu, requires_cuda])],
)
def test_float64_gradient_where_it_cancels(device: str, backend: str) -> None:
    """At H = 1, grad_x = g * rstd * eps / (x^2 + eps): a difference of two nearly equal
    terms, so any rounding of rstd or of eps itself shows up magnified (x^2 / eps times).
    float64 must stay within float64's own rounding: the Triton kernels once got eps as a
    float32 (2.5e-9 off at eps = 1e-6, seen on an H100)."""
    if backend == "triton" and device != "cuda":
        pytest.skip("the Triton kernels run on CUDA tensors")
    x = torch.tensor([[0.01], [0.03], [0.1], [1.0], [3.0]], device=device, dtype=torch.float64)
    x.requires_grad_()
    w = torch.ones(1, device=device, dtype=torch.float64, requires_grad=True)
    g = torch.ones_like(x)
    got = torch.autograd.grad(hotloop.rms_norm(x, w, 1e-6, backend=backend), (x, w), g)
    x64, w64 = x.detach().requires_grad_(), w.detach().requires_grad_()
    expected = torch.autograd.grad(rms_norm_reference(x64, w64, 1e-6), (x64, w64), g)
    for got_t, expected_t in zip(got, expected):
        torch.testing.assert_close(got_t, expected_t, rtol=1e-12, atol=1e-12)
