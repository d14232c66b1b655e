"""Export a Llama-style block that uses hotloop's ops and compile it with AOTInductor.

    python examples/aoti/export_block.py --device cpu --out build/aoti

writes, in OUT:

* ``block.pt2``: the AOTInductor package (``torch._inductor.aoti_compile_and_package``);
* ``inputs.pt``: the inputs to run it on, ``torch.save([x])``, on the CPU;
* ``expected.pt``: eager PyTorch's outputs for them, ``torch.save([y])``, on the CPU.

``hotloop_aoti_run`` (this folder's C++ runner) reads all three without Python. The batch and
token dimensions are exported as dynamic, and the saved inputs have a different shape from
the example the block was traced with, so the run also checks that the package is not
specialised to one shape.

On a GPU (``--device cuda``) the block's first norm uses hotloop's Triton RMSNorm, whose
kernels AOTInductor compiles into the package; every other hotloop op is a C++/CUDA kernel
that the package calls through the dispatcher, which is why the runner loads hotloop's library.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

import hotloop

HIDDEN = 64
INTERMEDIATE = 128
EPS = 1e-5
# (batch, tokens): the example the block is traced with, and the inputs that are saved.
TRACE_SHAPE = (2, 8)
RUN_SHAPE = (3, 5)


class LlamaStyleBlock(nn.Module):
    """A decoder layer in the shape of Llama's (a linear map stands in for attention), then
    the model's final norm: every hotloop op in the order an inference engine calls them."""

    def __init__(self, hidden: int, intermediate: int, first_norm_backend: str | None) -> None:
        super().__init__()
        self.attn_norm = hotloop.RMSNorm(hidden, eps=EPS, backend=first_norm_backend)
        self.attn = nn.Linear(hidden, hidden, bias=False)
        self.mlp_norm = hotloop.RMSNorm(hidden, eps=EPS)
        self.gate_up = nn.Linear(hidden, 2 * intermediate, bias=False)
        self.down = nn.Linear(intermediate, hidden, bias=False)
        self.final_norm = hotloop.RMSNorm(hidden, eps=EPS)

    def forward(self, x: Tensor) -> Tensor:
        # fused_add_rms_norm works in place, on a copy so the caller's x stays as it was.
        residual = x.clone()
        h = self.attn(self.attn_norm(x))
        # residual += h, then h = mlp_norm(residual): one pass over memory.
        hotloop.fused_add_rms_norm(h, residual, self.mlp_norm.weight, EPS)
        gate, up = self.gate_up(h).chunk(2, dim=-1)
        # SwiGLU's product, silu(gate) * up, as muladd with c = 0.
        h = self.down(hotloop.muladd(F.silu(gate), up, 0.0))
        return self.final_norm(residual + h)


def make_block(device: str) -> LlamaStyleBlock:
    """The block with seeded random weights (norm weights too, so that they matter)."""
    torch.manual_seed(0)
    block = LlamaStyleBlock(HIDDEN, INTERMEDIATE, "triton" if device == "cuda" else None)
    with torch.no_grad():
        for norm in (block.attn_norm, block.mlp_norm, block.final_norm):
            norm.weight.uniform_(0.5, 1.5)
    return block.to(device).eval()


def export_block(device: str, out: Path) -> None:
    block = make_block(device)
    example = torch.randn(*TRACE_SHAPE, HIDDEN, device=device)
    dims = {0: torch.export.Dim("batch", min=1, max=64), 1: torch.export.Dim("tokens", min=1)}
    out.mkdir(parents=True, exist_ok=True)
    with torch.no_grad():
        started = time.perf_counter()
        program = torch.export.export(block, (example,), dynamic_shapes=(dims,))
        exported = time.perf_counter()
        package = torch._inductor.aoti_compile_and_package(
            program, package_path=str(out / "block.pt2")
        )
        compiled = time.perf_counter()
        x = torch.randn(*RUN_SHAPE, HIDDEN, device=device)
        expected = block(x)
    torch.save([x.cpu()], out / "inputs.pt")
    torch.save([expected.cpu()], out / "expected.pt")
    print(
        f"{package}: torch.export {exported - started:.1f} s, "
        f"AOTInductor {compiled - exported:.1f} s (torch {torch.__version__}, {device})"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--out", type=Path, default=Path("build/aoti"))
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error(f"--device cuda: torch {torch.__version__} sees no CUDA device here")
    export_block(args.device, args.out)


if __name__ == "__main__":
    main()
