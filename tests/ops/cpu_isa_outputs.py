"""Run every CPU op on fixed inputs and save the outputs: ``python cpu_isa_outputs.py OUT``.

test_cpu_kernels.py runs this once per ``HOTLOOP_CPU_ISA`` (read once per process, hence a
process each) and compares the files bit for bit.
"""

from __future__ import annotations

import sys

import torch

import hotloop

HIDDEN_SIZES = (7, 17, 33, 1041, 4095)
DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def outputs() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    found = {}
    for dtype in DTYPES:
        for hidden in HIDDEN_SIZES:
            x, grad_out, residual = torch.randn(3, 4, hidden + 1, generator=gen).to(dtype)[:, :, 1:]
            x, grad_out, residual = x.contiguous(), grad_out.contiguous(), residual.contiguous()
            weight = torch.rand(hidden, generator=gen).to(dtype) + 0.5
            name = f"{dtype}-{hidden}"
            found[f"rms_norm-{name}"] = hotloop.rms_norm(x, weight, 1e-6)
            grad_x, grad_weight = torch.ops.hotloop.rms_norm_backward.default(
                grad_out, x, weight, 1e-6
            )
            found[f"grad_x-{name}"], found[f"grad_weight-{name}"] = grad_x, grad_weight
            hotloop.fused_add_rms_norm(x, residual, weight, 1e-6)
            found[f"fused_x-{name}"], found[f"fused_residual-{name}"] = x, residual
            found[f"muladd-{name}"] = hotloop.muladd(grad_out, residual, 0.25)
    return found


if __name__ == "__main__":
    torch.save(outputs(), sys.argv[1])
