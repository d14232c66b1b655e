"""hotloop's rms_norm at one width, for Nsight Compute: a few warm-up calls, then one call
between cudaProfilerStart and cudaProfilerStop, so that ``ncu --profile-from-start off``
profiles that call's kernels and nothing else (the warm-up's one-time work, a Triton compile
or the caching allocator's first allocations, stays out of the report).

    ncu --profile-from-start off --clock-control none --set full \\
        python benchmarks/profile_rows.py --hidden 2047 [--mode fwd+bwd] [--casting llama]

``device_run.sh ncu`` runs it so, one width a process. The shape is the benchmark's sweep
shape for the width (``bench_rms_norm.sweep_shape``: about the headline's 8 x 4096 x 4096
elements), so the kernels are the ones the benchmark times at that width.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence

import torch
from bench_rms_norm import DTYPES, EPS, HEADLINE, sweep_shape

import hotloop

WARMUP_CALLS = 3


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--hidden", type=int, required=True, help="the row's width H")
    p.add_argument("--mode", choices=("fwd", "fwd+bwd"), default="fwd")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16")
    p.add_argument("--casting", choices=hotloop.ops.CASTINGS, default="torch")
    p.add_argument("--backend", choices=hotloop.ops.BACKENDS, default="native")
    p.add_argument(
        "--rows", type=int, default=None, help="rows instead of the sweep shape's (a short run)"
    )
    p.add_argument(
        "--device",
        choices=("cuda", "cpu"),
        default="cuda",
        help="cpu only for a smoke run of this script, which then profiles nothing",
    )
    args = p.parse_args(argv)
    for name in ("hidden", "rows"):
        value = getattr(args, name)
        if value is not None and value < 1:
            p.error(f"--{name} {value}: expected 1 or more")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    profiled = args.device == "cuda"
    if profiled and not torch.cuda.is_available():
        print(
            "profile_rows: no CUDA device (torch.cuda.is_available() is False); this script "
            "profiles hotloop's kernels on a GPU under ncu",
            file=sys.stderr,
        )
        return 2
    shape = (
        sweep_shape(args.hidden, math.prod(HEADLINE))
        if args.rows is None
        else (args.rows, args.hidden)
    )
    dtype = DTYPES[args.dtype]
    device = torch.device(args.device)
    x = torch.randn(shape, device=device, dtype=dtype, requires_grad=args.mode == "fwd+bwd")
    weight = torch.randn(args.hidden, device=device, dtype=dtype, requires_grad=x.requires_grad)
    grad = torch.randn(shape, device=device, dtype=dtype)

    def call() -> None:
        y = hotloop.rms_norm(x, weight, EPS, backend=args.backend, casting=args.casting)
        if args.mode == "fwd+bwd":
            torch.autograd.grad(y, (x, weight), grad)

    for _ in range(WARMUP_CALLS):
        call()
    print(
        f"profile_rows: rms_norm {args.mode} {tuple(shape)} {args.dtype}, casting "
        f"{args.casting}, backend {args.backend} on {device}: the profiled call",
        flush=True,
    )
    if not profiled:
        call()
        return 0
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    call()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
