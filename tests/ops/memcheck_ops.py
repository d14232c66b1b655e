"""Runs every CUDA kernel once on awkward shapes, for `compute-sanitizer --tool memcheck`.

Not a pytest module: the sanitizer wraps a whole process, and slows kernels ~100x, so this
keeps to small tensors whose sizes hit each path (tails, unaligned rows, one element,
several blocks per row). Exits non-zero if a result is wrong.
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F

import hotloop


def check(name: str, got: torch.Tensor, expected: torch.Tensor, tol: float) -> bool:
    err = (
        (got.double() - expected.double()).norm() / expected.double().norm().clamp_min(1e-30)
    ).item()
    ok = err < tol
    print(f"{'ok ' if ok else 'BAD'} {name}: relative error {err:.2e}")
    return ok


def e4m3_ulp(q: torch.Tensor) -> torch.Tensor:
    """The spacing of e4m3 values in the binade of each |q|."""
    return torch.exp2(torch.floor(torch.log2(q.abs().clamp(min=2.0**-6))) - 3)


def check_fp8(name: str, got: tuple[torch.Tensor, ...], expected: tuple[torch.Tensor, ...]) -> bool:
    """FP8 outputs (out, scales[, residual]) of the CUDA kernel against the CPU kernel's:
    the same values up to one e4m3 ulp (float32 sums in another order)."""
    out, cpu_out = got[0].cpu().double(), expected[0].double()
    bad = int(((out - cpu_out).abs() > e4m3_ulp(cpu_out)).sum())
    for g, e in zip(got[1:], expected[1:]):
        bad += int(((g.cpu().double() - e.double()).abs() > 2e-6 * e.double().abs()).sum())
    print(f"{'ok ' if bad == 0 else 'BAD'} {name}: {bad} elements off")
    return bad == 0


def check_fp8_ops(x: torch.Tensor, w: torch.Tensor, tag: str) -> bool:
    """The four FP8 ops on x (CUDA), with the CPU kernel as reference."""
    ok = True
    scale = x.float().abs().amax().reshape(1) / 448 + 1e-3
    ub = scale * 100
    for source in (x, x[:, 1:] if x.shape[-1] > 1 else x):  # aligned, then unaligned rows
        wt = w[: source.shape[-1]].contiguous()
        cpu = source.cpu(), wt.cpu()
        where = f"{tag} {'aligned' if source is x else 'unaligned'}"
        ok &= check_fp8(
            f"rms_norm_fp8 {where}",
            (hotloop.rms_norm_fp8(source, wt, scale),),
            (hotloop.rms_norm_fp8(*cpu, scale.cpu()),),
        )
        ok &= check_fp8(
            f"rms_norm_fp8_dynamic {where}",
            hotloop.rms_norm_fp8_dynamic(source, wt, 1e-6, ub),
            hotloop.rms_norm_fp8_dynamic(*cpu, 1e-6, ub.cpu()),
        )
        residual = torch.randn(source.shape, device="cuda", dtype=source.dtype)
        cpu_residual = residual.cpu().clone()  # a copy on every device: both are written
        got = hotloop.fused_add_rms_norm_fp8(source, residual, wt, scale)
        expected = hotloop.fused_add_rms_norm_fp8(*cpu[:1], cpu_residual, cpu[1], scale.cpu())
        ok &= check_fp8(
            f"fused_add_rms_norm_fp8 {where}", (got, residual), (expected, cpu_residual)
        )
        got_pair = hotloop.fused_add_rms_norm_fp8_dynamic(source, residual, wt)
        expected_pair = hotloop.fused_add_rms_norm_fp8_dynamic(cpu[0], cpu_residual, cpu[1])
        ok &= check_fp8(
            f"fused_add_rms_norm_fp8_dynamic {where}",
            (*got_pair, residual),
            (*expected_pair, cpu_residual),
        )
    return ok


def main() -> int:
    ok = True
    fp8 = torch.cuda.get_device_capability() >= hotloop.ops.FP8_MIN_CAPABILITY
    for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 2e-2), (torch.float16, 4e-3)):
        per_vector = 16 // torch.empty((), dtype=dtype).element_size()  # elements a 16-byte vector
        for rows, hidden in (
            (1, 1),
            (3, 7),
            (5, 1000),
            (9, 1001),  # 16-bit rows at every offset from the 16-byte boundary
            (3, 2047),
            (2, 4095),
            (3, 6001),  # 16-bit spans on 384 threads
            (2, 4096),  # the vector backward's one block, two rows in turn
            (3, 4096),
            # The vector backward's persistent grid, some blocks two rows in turn; on an H100
            # several rows a block where they fill their threads' vectors and the block (16-bit
            # 4096: four, float16 2048: eight), rows past the end in the last block (1061).
            (600, 4096),
            (1061, 2048),
            # 16-bit rows of 4096-32768 on an H200 (4096, 8192, 12288, 16384, 32768): one row a
            # block, x read twice from L2.
            (2, 8192),
            (2, 8193),
            (2, 12288),
            # On an H200 the 16-bit backward of these rows with its grad_weight accumulator in
            # shared memory, each block (each cluster of two or four blocks: 32768, 65536)
            # taking four rows or five in turn.
            (1059, 12288),
            (531, 16384),
            (531, 32768),
            (267, 65536),
            (1, 16384),
            (2, 20000),
            (2, 20001),
            (2, 32768),  # float32's backward split over four blocks
            (3, 40000),
            (2, 65536),
        ):
            x = torch.randn(rows, hidden, device="cuda", dtype=dtype, requires_grad=True)
            w = torch.rand(hidden, device="cuda", dtype=dtype, requires_grad=True)
            tag = f"{dtype}-{rows}x{hidden}"
            for backend in ("native", "triton"):
                x.grad = w.grad = None
                y = hotloop.rms_norm(x, w, 1e-6, backend=backend)
                ok &= check(
                    f"rms_norm[{backend}] {tag}",
                    y,
                    F.rms_norm(x.double(), (hidden,), w.double(), 1e-6),
                    tol,
                )
                dy = torch.randn_like(y)
                y.backward(dy)
                x_ref = x.detach().double().requires_grad_()
                w_ref = w.detach().double().requires_grad_()
                F.rms_norm(x_ref, (hidden,), w_ref, 1e-6).backward(dy.double())
                if hidden > 1:  # at H=1, dx is eps-sized: float32 cancellation, not a bug
                    ok &= check(
                        f"rms_norm backward dx[{backend}] {tag}", x.grad, x_ref.grad, 4 * tol
                    )
                ok &= check(f"rms_norm backward dw[{backend}] {tag}", w.grad, w_ref.grad, 4 * tol)
            # The native in-place backward (grad_x over the fresh gradient of y * dy), in
            # Llama's mode, against its out-of-place backward.
            x.grad = w.grad = None
            y = hotloop.rms_norm(
                x, w, 1e-6, backend="native", casting="llama", in_place_backward=True
            )
            (y * dy).sum().backward()
            in_place = x.grad, w.grad
            x.grad = w.grad = None
            hotloop.rms_norm(x, w, 1e-6, backend="native", casting="llama").backward(dy)
            for name, got, expected in zip(("dx", "dw"), in_place, (x.grad, w.grad)):
                ok &= check(f"rms_norm in-place backward {name} {tag}", got, expected, 1e-6)
            xs = x.detach()[:, 1:] if hidden > 1 else x.detach()  # unaligned rows
            ok &= check(
                f"rms_norm unaligned {tag}",
                hotloop.rms_norm(xs, None, 1e-6),
                F.rms_norm(xs.double(), (xs.shape[-1],), None, 1e-6),
                tol,
            )
            a = x.detach().clone()
            residual = torch.randn_like(a)
            summed = a.double() + residual.double()
            hotloop.fused_add_rms_norm(a, residual, w.detach(), 1e-6)
            ok &= check(
                f"fused_add_rms_norm {tag}",
                a,
                F.rms_norm(summed, (hidden,), w.detach().double(), 1e-6),
                2 * tol,
            )
            # Gemma's mode with its offset, against the unfused norm in that mode.
            a = x.detach().clone()
            residual = torch.randn_like(a)
            summed = a + residual
            hotloop.fused_add_rms_norm(a, residual, w.detach(), 1e-6, casting="gemma", offset=1.0)
            ok &= check(
                f"fused_add_rms_norm gemma {tag}",
                a,
                hotloop.rms_norm(summed, w.detach(), 1e-6, casting="gemma", offset=1.0),
                tol,
            )
            b = torch.randn_like(a)
            ok &= check(
                f"muladd {tag}", hotloop.muladd(a, b, 0.5), a.double() * b.double() + 0.5, tol
            )
            if fp8:
                ok &= check_fp8_ops(x.detach(), w.detach(), tag)
        # Rows that queue for the fused op's blocks: the re-read kernel takes 1280 and 1536
        # 16-byte vectors on an H100 (vector blocks of one an SM), the staged kernel 8192
        # (128 KB: too wide to re-read from L2), each block several rows in turn.
        for row_vectors in (1280, 1536, 8192):
            hidden = row_vectors * per_vector
            a = torch.randn(300, hidden, device="cuda", dtype=dtype)
            residual = torch.randn_like(a)
            w = torch.rand(hidden, device="cuda", dtype=dtype)
            summed = a.double() + residual.double()
            hotloop.fused_add_rms_norm(a, residual, w, 1e-6)
            ok &= check(
                f"fused_add_rms_norm {dtype}-300x{hidden}",
                a,
                F.rms_norm(summed, (hidden,), w.double(), 1e-6),
                2 * tol,
            )
        # The FP8 ops' rows re-read from L2: past the vector kernel (2049 16-byte vectors),
        # the fused ops' vector blocks of one an SM (2048), and the unfused ops' rows on two
        # blocks of 768 threads (4096) or one of 1024 (8192), several rows a block in turn.
        if fp8:
            for rows, row_vectors in ((300, 2048), (300, 2049), (300, 4096), (140, 8192)):
                hidden = row_vectors * per_vector
                a = torch.randn(rows, hidden, device="cuda", dtype=dtype)
                w = torch.rand(hidden, device="cuda", dtype=dtype)
                ok &= check_fp8_ops(a, w, f"{dtype}-{rows}x{hidden}")
    if fp8:
        # float64 takes the vector, re-read (aligned rows of 2049 16-byte vectors) and generic
        # kernels only
        for rows, hidden in ((3, 1000), (300, 4098)):
            x64 = torch.randn(rows, hidden, device="cuda", dtype=torch.float64)
            w64 = torch.rand(hidden, device="cuda", dtype=torch.float64)
            ok &= check_fp8_ops(x64, w64, f"f64-{rows}x{hidden}")
    torch.cuda.synchronize()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
