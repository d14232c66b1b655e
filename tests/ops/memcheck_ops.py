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


def main() -> int:
    ok = True
    for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 2e-2), (torch.float16, 4e-3)):
        for rows, hidden in (
            (1, 1),
            (3, 7),
            (5, 1000),
            (2, 4095),
            (3, 4096),
            (2, 8193),
            (2, 12288),
            (1, 16384),
            (2, 20000),
            (2, 20001),
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
            b = torch.randn_like(a)
            ok &= check(
                f"muladd {tag}", hotloop.muladd(a, b, 0.5), a.double() * b.double() + 0.5, tol
            )
    torch.cuda.synchronize()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
