"""Where the host's time goes in a decode-sized eager call (issue 17, target 3).

At a few rows a call's time is the host's: Python, the dispatcher, autograd, allocation and
the launch. This script times an eager loop of each call below and records, with
torch.profiler, what one call did on the host: the operators it dispatched and the CUDA
runtime calls it made (how many a call, and their time). The calls, from the floor up:

* ``aten.mul``: one kernel through the dispatcher, the least any operator costs here;
* ``torch.ops.hotloop.muladd``: hotloop's simplest operator (one allocation, one launch);
* ``torch.ops.hotloop.rms_norm``: the operator alone;
* ``hotloop.rms_norm``: the Python API users call;
* ``F.rms_norm``: torch's own;
* on CUDA, ``hotloop.rms_norm(backend="triton")``: the Triton kernels' eager path.

Each forward runs under ``inference_mode`` and under ``no_grad``. Then a forward+backward
(``y.backward(g)`` with x and the weight requiring gradients) of ``F.rms_norm``, of
``hotloop.rms_norm`` and, on CUDA, of its Triton backend and of torch's own fused kernels
(``aten._fused_rms_norm`` and its backward, what ``F.rms_norm`` runs there) behind a Python
``autograd.Function``: the least a forward+backward costs whose autograd is defined in
Python, as the stable ABI leaves hotloop's. And the backward operators alone under
``inference_mode``: hotloop's and torch's. Writes ``host_overhead.json`` and
``host_overhead.md`` to ``--out``; compare figures within one run only (host timings move by
several microseconds between runs on the same machine).

Usage: python benchmarks/host_overhead.py --out DIR [--device cuda|cpu]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

import hotloop

sys.path.insert(0, str(Path(__file__).resolve().parent))

from result_files import claim, driver_version, triton_version

SHAPES = ((1, 4096), (8, 4096), (32, 8192))
DTYPE = torch.bfloat16
EPS = 1e-6
# Profiled calls a row: at most this, and no more than the timed rounds' --calls.
PROFILED_CALLS = 200


# The Triton backend's rows (CUDA only): issue 29's bound for its eager forward is 2x F.rms_norm.
TRITON = 'hotloop.rms_norm(backend="triton")'


def calls(device: str, shape: tuple[int, int]) -> dict[str, Callable[[], Any]]:
    gen = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(shape, device=device, dtype=DTYPE, generator=gen)
    w = torch.randn(shape[-1], device=device, dtype=DTYPE, generator=gen)
    forwards = {
        "aten.mul": lambda: torch.ops.aten.mul.Tensor(x, w),
        "torch.ops.hotloop.muladd": lambda: torch.ops.hotloop.muladd.default(x, x, 2.0),
        "torch.ops.hotloop.rms_norm": lambda: torch.ops.hotloop.rms_norm.default(x, w, EPS),
        "hotloop.rms_norm": lambda: hotloop.rms_norm(x, w, EPS),
        "F.rms_norm": lambda: F.rms_norm(x, (shape[-1],), w, EPS),
    }
    if device == "cuda":  # the Triton kernels need CUDA tensors
        forwards[TRITON] = lambda: hotloop.rms_norm(x, w, EPS, backend="triton")
    return forwards


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def per_call_us(fn: Callable[[], Any], device: str, n: int = 2000, rounds: int = 7) -> list[float]:
    """Per-call time of `n` back-to-back calls, synchronised at the end of each round."""
    for _ in range(50):
        fn()
    times = []
    for _ in range(rounds):
        synchronize(device)
        start = time.perf_counter()
        for _ in range(n):
            fn()
        synchronize(device)
        times.append((time.perf_counter() - start) / n * 1e6)
    return times


def host_events(fn: Callable[[], Any], device: str, n: int) -> list[dict[str, Any]]:
    """What one call did on the host: every profiler event key with its count and self time
    per call (operators, and with CUDA the runtime API calls CUPTI saw)."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    for _ in range(20):
        fn()
    synchronize(device)
    with profile(activities=activities) as prof:
        for _ in range(n):
            fn()
        synchronize(device)
    events = []
    for e in prof.key_averages():
        if e.key.startswith(("cudaDeviceSynchronize", "ProfilerStep")) or e.count < n:
            continue
        events.append(
            {
                "name": e.key,
                "per_call": e.count / n,
                "self_us": e.self_cpu_time_total / e.count,
                "total_us": e.cpu_time_total / e.count,
            }
        )
    return sorted(events, key=lambda e: -e["total_us"] * e["per_call"])


class TorchKernelsFunction(torch.autograd.Function):
    """torch's fused CUDA kernels behind a Python autograd.Function, as hotloop's are."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        y, rstd = torch.ops.aten._fused_rms_norm.default(x, [x.shape[-1]], w, EPS)
        ctx.save_for_backward(x, w, rstd)
        return y

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x, w, rstd = ctx.saved_tensors
        grad_x, grad_w = torch.ops.aten._fused_rms_norm_backward.default(
            grad, x, [x.shape[-1]], rstd, w, [True, True]
        )
        return grad_x, grad_w


def training_calls(device: str, shape: tuple[int, int]) -> dict[str, Callable[[], Any]]:
    """Forward+backward steps, gradients accumulating into x.grad and w.grad as in training."""
    gen = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(shape, device=device, dtype=DTYPE, generator=gen).requires_grad_()
    w = torch.randn(shape[-1], device=device, dtype=DTYPE, generator=gen).requires_grad_()
    g = torch.randn(shape, device=device, dtype=DTYPE, generator=gen)
    steps = {
        "F.rms_norm": lambda: F.rms_norm(x, (shape[-1],), w, EPS).backward(g),
        "hotloop.rms_norm": lambda: hotloop.rms_norm(x, w, EPS).backward(g),
    }
    if device == "cuda":  # aten._fused_rms_norm_backward has no CPU kernel
        steps["autograd.Function over torch's kernels"] = lambda: TorchKernelsFunction.apply(
            x, w
        ).backward(g)
        steps[TRITON] = lambda: hotloop.rms_norm(x, w, EPS, backend="triton").backward(g)
    return steps


def backward_op_calls(device: str, shape: tuple[int, int]) -> dict[str, Callable[[], Any]]:
    gen = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(shape, device=device, dtype=DTYPE, generator=gen)
    w = torch.randn(shape[-1], device=device, dtype=DTYPE, generator=gen)
    g = torch.randn(shape, device=device, dtype=DTYPE, generator=gen)
    ops = {
        "torch.ops.hotloop.rms_norm_backward": lambda: torch.ops.hotloop.rms_norm_backward.default(
            g, x, w, EPS
        )
    }
    if device == "cuda":
        rstd = torch.ops.aten._fused_rms_norm.default(x, [shape[-1]], w, EPS)[1]
        ops["aten._fused_rms_norm_backward"] = lambda: (
            torch.ops.aten._fused_rms_norm_backward.default(
                g, x, [shape[-1]], rstd, w, [True, True]
            )
        )
    return ops


# Each forward runs under both: inference_mode keeps the dispatcher out of Autograd kernels.
GRAD_MODES = {"inference_mode": torch.inference_mode, "no_grad": torch.no_grad}
TRAINING = "forward+backward"


def timed_row(
    fn: Callable[[], Any], device: str, n_calls: int, shape: tuple[int, int], name: str, mode: str
) -> dict[str, Any]:
    times = per_call_us(fn, device, n_calls)
    row = {
        "shape": list(shape),
        "call": name,
        "mode": mode,
        "us_median": statistics.median(times),
        "us_min": min(times),
        "us_max": max(times),
        "events": host_events(fn, device, min(n_calls, PROFILED_CALLS)),
    }
    print(f"{shape} {name:40} {mode:16} {row['us_median']:7.2f} µs", flush=True)
    return row


def measure(device: str, n_calls: int) -> list[dict[str, Any]]:
    rows = []
    for shape in SHAPES:
        for name, fn in calls(device, shape).items():
            for mode, grad_mode in GRAD_MODES.items():
                with grad_mode():
                    rows.append(timed_row(fn, device, n_calls, shape, name, mode))
        for name, fn in training_calls(device, shape).items():
            rows.append(timed_row(fn, device, n_calls, shape, name, TRAINING))
        with torch.inference_mode():
            for name, fn in backward_op_calls(device, shape).items():
                rows.append(timed_row(fn, device, n_calls, shape, name, "inference_mode"))
    return rows


def markdown(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    lines = [
        f"# Host time of decode-sized calls, bf16 ({meta['device_name']}, driver "
        f"{meta['driver']}, torch {meta['torch']}, CUDA {meta['cuda']}, Triton {meta['triton']})",
        "",
        "| shape | call | mode | µs/call (min-max) | host events a call (self µs) |",
        "| --- | --- | --- | ---: | --- |",
    ]
    for r in rows:
        events = "; ".join(
            f"{e['name']} x{e['per_call']:g} ({e['self_us']:.1f})" for e in r["events"][:10]
        )
        lines.append(
            f"| {tuple(r['shape'])} | {r['call']} | {r['mode']} | {r['us_median']:.2f} "
            f"({r['us_min']:.2f}-{r['us_max']:.2f}) | {events} |"
        )
    return "\n".join(lines) + "\n"


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="output folder")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument(
        "--calls", type=positive_int, default=2000, help="calls per timed round (%(default)s)"
    )
    args = parser.parse_args(argv)
    claim(args.out, ("host_overhead.json", "host_overhead.md"), "host_overhead")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("no CUDA device: pass --device cpu")
    meta = {
        "device_name": torch.cuda.get_device_name()
        if args.device == "cuda"
        else platform.processor() or platform.machine(),
        "driver": driver_version() if args.device == "cuda" else None,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "triton": triton_version(),
        "hotloop": hotloop.__version__,
        "python": platform.python_version(),
        "tool": "host_overhead",
    }
    rows = measure(args.device, args.calls)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "host_overhead.json").write_text(
        json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n"
    )
    (args.out / "host_overhead.md").write_text(markdown(rows, meta))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
