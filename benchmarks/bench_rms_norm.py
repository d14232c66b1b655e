"""Benchmark hotloop's RMSNorm, fused add + RMSNorm and muladd against PyTorch and Liger.

Runs on the current CUDA GPU and writes ``rms_norm.json`` (device, versions, and for every
implementation and shape: ms, GB/s, % of the measured copy bandwidth) and, where
matplotlib is importable, ``rms_norm.png`` (else run ``benchmarks/plot.py`` on the JSON
wherever matplotlib is). A markdown table of the headline shape goes to stdout and to
``rms_norm.md``.

Method:
* The roofline is a device-to-device copy of a large buffer (bytes read + written / time).
* Every implementation's result (and gradients, for forward+backward) is checked against a
  float64 reference before it is timed; one that fails is reported and skipped.
* Timing: CUDA events around each call, median of many calls after a warm-up. Inputs
  rotate through enough buffers that the working set exceeds the L2 cache several times,
  and a GPU-side sleep ahead of each batch keeps the CPU's launch cost out of the
  numbers (the GPU never waits for the next launch).
* Bytes moved, as in issue 6: forward reads x and w and writes y; forward+backward also
  reads x, w and dy and writes dx and dw (5 tensors of x's size at the headline shape:
  537 MB forward, 1.34 GB forward+backward for (8, 4096, 4096) bfloat16).

Usage: python benchmarks/bench_rms_norm.py [--quick] [--out DIR]
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import platform
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from result_files import claim, driver_version

HERE = Path(__file__).resolve().parent
TOOL = "bench_rms_norm"
DEFAULT_OUT = HERE / "results"
EPS = 1e-6
# Where the tensors live; only a smoke test of this script on a CPU machine changes it.
DEVICE = "cuda"

HEADLINE = (8, 4096, 4096)
SWEEP_HIDDEN = (512, 1000, 1024, 2047, 2048, 4095, 4096, 8192, 8193, 12288, 16384, 32768, 65536)
HEADLINE_DTYPES = ("bfloat16", "float16", "float32")
QUICK_SWEEP_HIDDEN = (1024, 4096, 8193)
# fused_add_rms_norm beyond the headline: the widths its vector kernel doesn't take
# (unaligned rows), wide rows, and 12288, where its vector kernel holds one block an SM
# (benchmarks/NOTES.md, runs O28-O29).
FUSED_ADD_SWEEP_HIDDEN = (1000, 4095, 8193, 12288, 16384, 32768, 65536)
# Decode-sized calls, where the host's cost per call (Python, dispatcher, autograd, launch)
# rather than memory decides the time.
SMALL_BATCH_SHAPES = ((1, 4096), (8, 4096), (32, 8192))
SMALL_BATCH_OP = "rms_norm (small batch)"
SMALL_BATCH_MODES = (
    "call fwd",
    "call fwd inference_mode",
    "call fwd+bwd",
    "kernel fwd",
    "graph fwd",
)
# The FP8 norms beyond the headline: unaligned rows (the scalar kernels) and the widest
# vector rows.
FP8_SWEEP_HIDDEN = (4095, 8193, 16384)
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
# Error allowed against the float64 reference, relative to the reference's largest value.
TOLERANCE = {torch.bfloat16: 2e-2, torch.float16: 4e-3, torch.float32: 1e-4}
# The FP8 ops' dequantised output: half an e4m3 ulp at the largest value is 2^-4 of it.
FP8_TOLERANCE = 0.07


# ------------------------------------------------------------------------------ timing


@dataclass
class Timing:
    ms: float  # median
    ms_min: float
    ms_max: float
    reps: int


def _gpu_sleep(seconds: float) -> None:
    # torch.cuda._sleep spins for a number of GPU clock cycles; ~2 GHz on H100/H200.
    cycles = int(min(seconds, 0.5) * 2.0e9)
    if cycles > 0:
        torch.cuda._sleep(cycles)


def time_cuda(
    fn: Callable[..., Any],
    inputs: Sequence[tuple[Any, ...]],
    *,
    warmup_ms: float = 30.0,
    rep_ms: float = 150.0,
    min_reps: int = 10,
    max_reps: int = 500,
) -> Timing:
    """Median GPU time of fn(*inputs[i % len(inputs)]) over many calls."""
    n_inputs = len(inputs)
    fn(*inputs[0])
    torch.cuda.synchronize()
    # Estimate the GPU time and the CPU launch time of one call.
    probe = max(3, n_inputs)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    cpu_start = time.perf_counter()
    start.record()
    for i in range(probe):
        fn(*inputs[i % n_inputs])
    end.record()
    cpu_per_call = (time.perf_counter() - cpu_start) / probe
    torch.cuda.synchronize()
    gpu_per_call_ms = max(start.elapsed_time(end) / probe, 1e-3)

    for i in range(max(1, int(warmup_ms / gpu_per_call_ms))):
        fn(*inputs[i % n_inputs])
    reps = max(min_reps, min(max_reps, int(rep_ms / gpu_per_call_ms)))
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    times: list[float] = []
    batch = 50
    for b0 in range(0, reps, batch):
        b1 = min(reps, b0 + batch)
        torch.cuda.synchronize()
        _gpu_sleep(1.5 * cpu_per_call * (b1 - b0) + 1e-4)
        for i in range(b0, b1):
            starts[i].record()
            fn(*inputs[i % n_inputs])
            ends[i].record()
    torch.cuda.synchronize()
    times = [s.elapsed_time(e) for s, e in zip(starts, ends)]
    return Timing(statistics.median(times), min(times), max(times), reps)


def time_host_calls(
    fn: Callable[..., Any], inputs: Sequence[tuple[Any, ...]], *, calls: int = 400, rounds: int = 7
) -> Timing:
    """Per-call time of back-to-back calls, synchronised only at the end of a round: what an
    eager loop of small calls costs, the host's work (Python, dispatcher, autograd, launch)
    included. Median over rounds."""
    n_inputs = len(inputs)
    for i in range(max(20, n_inputs)):
        fn(*inputs[i % n_inputs])
    times: list[float] = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for i in range(calls):
            fn(*inputs[i % n_inputs])
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e3 / calls)
    return Timing(statistics.median(times), min(times), max(times), rounds * calls)


def time_graph_replay(
    fn: Callable[..., Any], inputs: Sequence[tuple[Any, ...]], *, calls: int = 50, rounds: int = 20
) -> Timing:
    """Per-call GPU time of `calls` calls captured in one CUDA graph and replayed: the host's
    cost is gone, launches are back to back."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for i in range(3):
            fn(*inputs[i % len(inputs)])
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            fn(*inputs[i % len(inputs)])
    graph.replay()
    times: list[float] = []
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / calls)
    return Timing(statistics.median(times), min(times), max(times), rounds * calls)


def copy_bandwidth(nbytes: int = 2 << 30) -> tuple[float, Timing]:
    """GB/s of a device-to-device copy (bytes read + written), the roofline."""
    n = nbytes // 4
    srcs = [torch.empty(n, dtype=torch.float32, device=DEVICE).fill_(1.0) for _ in range(2)]
    dst = torch.empty(n, dtype=torch.float32, device=DEVICE)
    t = time_cuda(lambda s: dst.copy_(s), [(s,) for s in srcs], rep_ms=300.0, min_reps=20)
    gbps = 2 * n * 4 / (t.ms * 1e-3) / 1e9
    return gbps, t


def n_buffers(bytes_per_call: int, l2_bytes: int) -> int:
    """Input sets to rotate through so that their total is >= 4x the L2 cache."""
    return max(2, min(32, math.ceil(4 * l2_bytes / max(bytes_per_call, 1))))


# ---------------------------------------------------------------------- implementations


def llama_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' LlamaRMSNorm.forward, as plain PyTorch ops."""
    input_dtype = x.dtype
    hidden = x.to(torch.float32)
    variance = hidden.pow(2).mean(-1, keepdim=True)
    hidden = hidden * torch.rsqrt(variance + eps)
    return weight * hidden.to(input_dtype)


def f_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Unfused residual add + Llama RMSNorm: returns (normed, new residual)."""
    hidden = x + residual
    return llama_rms_norm(hidden, weight, eps), hidden


def quantize_fp8(y: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """y / scale saturated to float8_e4m3fn's range, as the FP8 ops define it."""
    return (y.float() * (1.0 / scale)).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)


def rms_norm_fp8_unfused(
    x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, eps: float
) -> torch.Tensor:
    """F.rms_norm then the quantisation, as plain PyTorch ops."""
    return quantize_fp8(F.rms_norm(x, (x.shape[-1],), weight, eps), scale)


def rms_norm_fp8_dynamic_unfused(
    x: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    y = F.rms_norm(x, (x.shape[-1],), weight, eps).float()
    scales = (y.abs().amax(-1, keepdim=True) / 448.0).clamp(min=1.0 / (448.0 * 512.0))
    return quantize_fp8(y, scales), scales


def eager_muladd(a: torch.Tensor, b: torch.Tensor, c: float) -> torch.Tensor:
    return a * b + c


def _load_hotloop() -> tuple[Any, str | None]:
    try:
        import hotloop
    except Exception as err:  # any import failure: report it, benchmark the rest
        return None, f"import hotloop failed: {err!r}"
    return hotloop, None


def _load_liger() -> tuple[Any, Any, str | None]:
    try:
        from liger_kernel.transformers.rms_norm import LigerRMSNorm
    except Exception as err:
        return None, None, f"liger_kernel not importable: {err!r}"
    try:
        from liger_kernel.transformers import LigerFusedAddRMSNorm
    except Exception:
        LigerFusedAddRMSNorm = None
    return LigerRMSNorm, LigerFusedAddRMSNorm, None


def liger_rms_norm_fn(LigerRMSNorm: Any) -> Callable[..., torch.Tensor]:
    modules: dict[tuple[int, torch.dtype], Any] = {}

    def run(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        key = (x.shape[-1], x.dtype)
        if key not in modules:
            try:  # in_place=False: don't overwrite dy with dx (the buffers are reused)
                mod = LigerRMSNorm(x.shape[-1], eps=eps, in_place=False)
            except TypeError:
                mod = LigerRMSNorm(x.shape[-1], eps=eps)
            modules[key] = mod.to(device=x.device, dtype=x.dtype)
        # The caller's weight in place of the module's (same values for every
        # implementation, and autograd reaches it).
        return torch.func.functional_call(modules[key], {"weight": weight}, (x,))

    return run


def _compile(fn: Callable[..., Any]) -> Callable[..., Any]:
    return torch.compile(fn, dynamic=False)


def rms_norm_impls(hotloop: Any, LigerRMSNorm: Any) -> dict[str, Callable[..., torch.Tensor]]:
    impls: dict[str, Callable[..., torch.Tensor]] = {
        "pytorch (Llama)": llama_rms_norm,
        "F.rms_norm": f_rms_norm,
        "torch.compile": _compile(llama_rms_norm),
    }
    if LigerRMSNorm is not None:
        impls["Liger-Kernel"] = liger_rms_norm_fn(LigerRMSNorm)
    if hotloop is not None:
        impls["hotloop CUDA"] = lambda x, w, eps: hotloop.rms_norm(x, w, eps, backend="native")
        impls["hotloop Triton"] = lambda x, w, eps: hotloop.rms_norm(x, w, eps, backend="triton")
    return impls


def casting_impls(hotloop: Any) -> dict[str, Callable[..., torch.Tensor]]:
    """hotloop's kernels in the "llama" and "gemma" casting modes (issue 31), timed beside
    the default's rows of the same run. Gemma's offset is 0 here: the kernels add it all the
    same (its cost), and the float64 reference stays F.rms_norm's."""
    impls: dict[str, Callable[..., torch.Tensor]] = {}
    for backend, label in (("native", "CUDA"), ("triton", "Triton")):
        for casting in ("llama", "gemma"):
            impls[f"hotloop {label} {casting}"] = (
                lambda x, w, eps, backend=backend, casting=casting: hotloop.rms_norm(
                    x, w, eps, backend=backend, casting=casting
                )
            )
    return impls


# ------------------------------------------------------------------------- results


@dataclass
class Result:
    op: str
    mode: str  # "fwd" or "fwd+bwd"
    impl: str
    shape: list[int]
    hidden: int
    dtype: str
    bytes: int
    status: str = "ok"  # "ok", "wrong" (failed the reference check), "error"
    ms: float | None = None
    ms_min: float | None = None
    ms_max: float | None = None
    reps: int | None = None
    gbps: float | None = None
    pct_copy: float | None = None
    max_rel_err: float | None = None
    note: str = ""
    tags: list[str] = field(default_factory=list)


def rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    """max |got - ref| / max |ref| (the reference in float64)."""
    scale = ref.abs().max().item() or 1.0
    return (got.double() - ref).abs().max().item() / scale


class Runner:
    def __init__(self, copy_gbps: float, l2_bytes: int, quick: bool) -> None:
        self.copy_gbps = copy_gbps
        self.l2_bytes = l2_bytes
        self.quick = quick
        self.results: list[Result] = []

    def measure(
        self,
        result: Result,
        fn: Callable[..., Any],
        inputs: Sequence[tuple[Any, ...]],
        check: Callable[[], float],
        tol: float,
        timer: Callable[..., Timing] | None = None,
    ) -> Result:
        """Check fn against the reference (check() returns the relative error), then time
        it with `timer` (default: time_cuda, the GPU time per call)."""
        try:
            err = check()
            result.max_rel_err = err
            if not err <= tol:  # also catches NaN
                result.status = "wrong"
                result.note = f"max relative error {err:.3g} > {tol:g} vs float64; not timed"
            else:
                if timer is not None:
                    t = timer(fn, inputs)
                else:
                    kw = {"rep_ms": 60.0, "warmup_ms": 15.0} if self.quick else {}
                    t = time_cuda(fn, inputs, **kw)
                result.ms, result.ms_min, result.ms_max, result.reps = (
                    t.ms,
                    t.ms_min,
                    t.ms_max,
                    t.reps,
                )
                result.gbps = result.bytes / (t.ms * 1e-3) / 1e9
                result.pct_copy = 100.0 * result.gbps / self.copy_gbps
        except Exception as err:
            result.status = "error"
            result.note = f"{type(err).__name__}: {str(err).splitlines()[0][:300]}"
            traceback.print_exc(limit=3)
        self.results.append(result)
        self._print(result)
        return result

    @staticmethod
    def _print(r: Result) -> None:
        where = f"{r.op:18s} {r.mode:7s} {r.dtype:8s} {tuple(r.shape)!s:20s} {r.impl:16s}"
        if r.status == "ok":
            print(
                f"{where} {r.ms:8.3f} ms {r.gbps:7.0f} GB/s {r.pct_copy:5.1f}% of copy",
                flush=True,
            )
        else:
            print(f"{where} {r.status.upper()}: {r.note}", flush=True)


# ----------------------------------------------------------------------------- cases


def bench_rms_norm_case(
    runner: Runner,
    impls: dict[str, Callable[..., torch.Tensor]],
    shape: tuple[int, ...],
    dtype: torch.dtype,
    tags: list[str],
) -> None:
    H = shape[-1]
    n = math.prod(shape)
    esize = torch.empty((), dtype=dtype).element_size()
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    weight = (1.0 + 0.1 * torch.randn(H, device=DEVICE, generator=gen)).to(dtype)
    tol = TOLERANCE[dtype]
    dtype_name = str(dtype).removeprefix("torch.")

    # ---- forward
    fwd_bytes = 2 * n * esize + H * esize
    k = n_buffers(fwd_bytes, runner.l2_bytes)
    xs = [torch.randn(shape, device=DEVICE, dtype=dtype, generator=gen) for _ in range(k)]
    with torch.no_grad():
        ref_y = F.rms_norm(xs[0].double(), (H,), weight.double(), EPS)
    for name, impl in impls.items():

        def check(impl: Callable[..., torch.Tensor] = impl) -> float:
            with torch.no_grad():
                return rel_err(impl(xs[0], weight, EPS), ref_y)

        def fwd(x: torch.Tensor, impl: Callable[..., torch.Tensor] = impl) -> torch.Tensor:
            with torch.no_grad():
                return impl(x, weight, EPS)

        runner.measure(
            Result("rms_norm", "fwd", name, list(shape), H, dtype_name, fwd_bytes, tags=tags),
            fwd,
            [(x,) for x in xs],
            check,
            tol,
        )

    # ---- forward + backward
    bwd_bytes = fwd_bytes + 3 * n * esize + 2 * H * esize  # + read x, dy; write dx; w, dw
    k = n_buffers(bwd_bytes - fwd_bytes, runner.l2_bytes)
    xs = [x.requires_grad_() for x in xs[:k]]
    while len(xs) < k:
        xs.append(torch.randn(shape, device=DEVICE, dtype=dtype, generator=gen).requires_grad_())
    dys = [torch.randn(shape, device=DEVICE, dtype=dtype, generator=gen) for _ in range(k)]
    w = weight.clone().requires_grad_()
    x64 = xs[0].detach().double().requires_grad_()
    w64 = w.detach().double().requires_grad_()
    y64 = F.rms_norm(x64, (H,), w64, EPS)
    ref_dx, ref_dw = torch.autograd.grad(y64, (x64, w64), dys[0].double())
    ref_y = y64.detach()
    for name, impl in impls.items():

        def check(impl: Callable[..., torch.Tensor] = impl) -> float:
            y = impl(xs[0], w, EPS)
            dx, dw = torch.autograd.grad(y, (xs[0], w), dys[0])
            return max(rel_err(y.detach(), ref_y), rel_err(dx, ref_dx), rel_err(dw, ref_dw))

        def fwd_bwd(
            x: torch.Tensor, dy: torch.Tensor, impl: Callable[..., torch.Tensor] = impl
        ) -> Any:
            y = impl(x, w, EPS)
            return torch.autograd.grad(y, (x, w), dy)

        runner.measure(
            Result("rms_norm", "fwd+bwd", name, list(shape), H, dtype_name, bwd_bytes, tags=tags),
            fwd_bwd,
            list(zip(xs, dys)),
            check,
            tol,
        )


def bench_small_batch(
    runner: Runner,
    impls: dict[str, Callable[..., torch.Tensor]],
    hotloop: Any,
    shape: tuple[int, ...],
    dtype: torch.dtype,
) -> None:
    """Decode-sized calls: per-call time of an eager loop (host included) forward under
    no_grad and under inference_mode, forward+backward, the GPU time of the forward alone,
    and the per-call time of the forward replayed from a CUDA graph. The gap between
    `hotloop CUDA` and `hotloop (torch.ops)` is the Python wrapper's; between no_grad and
    inference_mode, the autograd kernel's."""
    H = shape[-1]
    n = math.prod(shape)
    esize = torch.empty((), dtype=dtype).element_size()
    gen = torch.Generator(device=DEVICE).manual_seed(3)
    weight = (1.0 + 0.1 * torch.randn(H, device=DEVICE, generator=gen)).to(dtype)
    w_grad = weight.clone().requires_grad_()
    xs = [torch.randn(shape, device=DEVICE, dtype=dtype, generator=gen) for _ in range(4)]
    xs_grad = [x.clone().requires_grad_() for x in xs]
    dys = [torch.randn(shape, device=DEVICE, dtype=dtype, generator=gen) for _ in range(4)]
    ref_y = F.rms_norm(xs[0].double(), (H,), weight.double(), EPS)
    dtype_name = str(dtype).removeprefix("torch.")
    fwd_bytes = 2 * n * esize + H * esize
    bwd_bytes = fwd_bytes + 3 * n * esize + 2 * H * esize
    impls = dict(impls)
    impls.pop("pytorch (Llama)", None)  # many small kernels: not a contender at this size
    if hotloop is not None:
        impls["hotloop (torch.ops)"] = torch.ops.hotloop.rms_norm.default

    def result(mode: str, name: str, nbytes: int) -> Result:
        return Result(
            SMALL_BATCH_OP, mode, name, list(shape), H, dtype_name, nbytes,
            tags=["small_batch"],
        )  # fmt: skip

    for name, impl in impls.items():

        def check(impl: Callable[..., torch.Tensor] = impl) -> float:
            with torch.no_grad():
                return rel_err(impl(xs[0], weight, EPS), ref_y)

        def fwd_no_grad(x: torch.Tensor, impl: Callable[..., torch.Tensor] = impl) -> Any:
            with torch.no_grad():
                return impl(x, weight, EPS)

        def fwd_inference(x: torch.Tensor, impl: Callable[..., torch.Tensor] = impl) -> Any:
            with torch.inference_mode():
                return impl(x, weight, EPS)

        def fwd_bwd(
            x: torch.Tensor, dy: torch.Tensor, impl: Callable[..., torch.Tensor] = impl
        ) -> Any:
            return torch.autograd.grad(impl(x, w_grad, EPS), (x, w_grad), dy)

        inputs = [(x,) for x in xs]
        tol = TOLERANCE[dtype]
        runner.measure(
            result("call fwd", name, fwd_bytes), fwd_no_grad, inputs, check, tol, time_host_calls
        )
        runner.measure(
            result("call fwd inference_mode", name, fwd_bytes),
            fwd_inference,
            inputs,
            check,
            tol,
            time_host_calls,
        )
        if name != "hotloop (torch.ops)":
            runner.measure(
                result("call fwd+bwd", name, bwd_bytes),
                fwd_bwd,
                list(zip(xs_grad, dys)),
                check,
                tol,
                time_host_calls,
            )
        runner.measure(result("kernel fwd", name, fwd_bytes), fwd_no_grad, inputs, check, tol)
        if name != "torch.compile":  # a compiled function replays through its own graphs
            runner.measure(
                result("graph fwd", name, fwd_bytes),
                fwd_no_grad,
                inputs,
                check,
                tol,
                time_graph_replay,
            )


def bench_fused_add_rms_norm(
    runner: Runner, hotloop: Any, LigerFusedAdd: Any, shape: tuple[int, ...], dtype: torch.dtype
) -> None:
    H = shape[-1]
    n = math.prod(shape)
    esize = torch.empty((), dtype=dtype).element_size()
    nbytes = 4 * n * esize + H * esize  # read x, residual, w; write residual, y
    gen = torch.Generator(device=DEVICE).manual_seed(1)
    weight = (1.0 + 0.1 * torch.randn(H, device=DEVICE, generator=gen)).to(dtype)
    k = n_buffers(nbytes, runner.l2_bytes)
    xs = [torch.randn(shape, device=DEVICE, dtype=dtype, generator=gen) for _ in range(k)]
    rs = [torch.randn(shape, device=DEVICE, dtype=dtype, generator=gen) for _ in range(k)]
    # Reference: the residual rounded to dtype, then normalised (the op's documented order).
    ref_r = (xs[0].double() + rs[0].double()).to(dtype).double()
    ref_y = F.rms_norm(ref_r, (H,), weight.double(), EPS)
    dtype_name = str(dtype).removeprefix("torch.")

    impls: dict[str, Callable[..., Any]] = {
        "pytorch (Llama)": add_rms_norm,
        "torch.compile": _compile(add_rms_norm),
    }
    if LigerFusedAdd is not None:
        liger_mod = LigerFusedAdd(H, eps=EPS).to(device=DEVICE, dtype=dtype)

        def liger(x: torch.Tensor, r: torch.Tensor, w: torch.Tensor, eps: float) -> Any:
            return torch.func.functional_call(liger_mod, {"weight": w}, (x, r))  # (y, x + r)

        impls["Liger-Kernel"] = liger
    if hotloop is not None:

        def hotloop_fused(x: torch.Tensor, r: torch.Tensor, w: torch.Tensor, eps: float) -> Any:
            hotloop.fused_add_rms_norm(x, r, w, eps)  # in place: x = normed, r = x + r
            return x, r

        impls["hotloop CUDA"] = hotloop_fused

    for name, impl in impls.items():

        def check(impl: Callable[..., Any] = impl) -> float:
            with torch.no_grad():
                y, r = impl(xs[0].clone(), rs[0].clone(), weight, EPS)
            return max(rel_err(y, ref_y), rel_err(r, ref_r))

        def run(x: torch.Tensor, r: torch.Tensor, impl: Callable[..., Any] = impl) -> Any:
            # The in-place ops change x and r at every call; the values stay finite
            # (x is normalised, r grows by it), which is all timing needs.
            with torch.no_grad():
                return impl(x, r, weight, EPS)

        runner.measure(
            Result("fused_add_rms_norm", "fwd", name, list(shape), H, dtype_name, nbytes),
            run,
            list(zip(xs, rs)),
            check,
            TOLERANCE[dtype],
        )


def bench_rms_norm_fp8(
    runner: Runner, hotloop: Any, shape: tuple[int, ...], dtype: torch.dtype
) -> None:
    """The FP8 norms (static and dynamic scale, and the fused add) against their unfused
    PyTorch forms; each result is dequantised and checked against the float64 norm."""
    H = shape[-1]
    n = math.prod(shape)
    rows = n // H
    esize = torch.empty((), dtype=dtype).element_size()
    gen = torch.Generator(device=DEVICE).manual_seed(3)
    weight = (1.0 + 0.1 * torch.randn(H, device=DEVICE, generator=gen)).to(dtype)
    dtype_name = str(dtype).removeprefix("torch.")
    # read x and w, write out at one byte per element (+ a float32 scale per row)
    static_bytes = n * esize + n + H * esize
    k = n_buffers(static_bytes, runner.l2_bytes)
    xs = [torch.randn(shape, device=DEVICE, dtype=dtype, generator=gen) for _ in range(k)]
    rs = [torch.randn(shape, device=DEVICE, dtype=dtype, generator=gen) for _ in range(k)]
    y64 = F.rms_norm(xs[0].double(), (H,), weight.double(), EPS)
    scale = (y64.abs().max() / 448.0).float().reshape(1)
    ref_static = y64.clamp(-448.0 * scale.item(), 448.0 * scale.item())

    def fp8_err(out: torch.Tensor, scales: torch.Tensor, ref: torch.Tensor) -> float:
        return rel_err(out.double() * scales.double(), ref)

    static_impls: dict[str, Callable[..., Any]] = {
        "pytorch (F.rms_norm + cast)": rms_norm_fp8_unfused,
        "torch.compile": _compile(rms_norm_fp8_unfused),
    }
    dynamic_impls: dict[str, Callable[..., Any]] = {
        "pytorch (F.rms_norm + cast)": rms_norm_fp8_dynamic_unfused,
        "torch.compile": _compile(rms_norm_fp8_dynamic_unfused),
    }
    if hotloop is not None:
        static_impls["hotloop CUDA"] = hotloop.rms_norm_fp8
        dynamic_impls["hotloop CUDA"] = hotloop.rms_norm_fp8_dynamic
    for name, impl in static_impls.items():

        def check(impl: Callable[..., Any] = impl) -> float:
            with torch.no_grad():
                return fp8_err(impl(xs[0], weight, scale, EPS), scale, ref_static)

        def run(x: torch.Tensor, impl: Callable[..., Any] = impl) -> Any:
            with torch.no_grad():
                return impl(x, weight, scale, EPS)

        runner.measure(
            Result("rms_norm_fp8", "fwd", name, list(shape), H, dtype_name, static_bytes),
            run,
            [(x,) for x in xs],
            check,
            FP8_TOLERANCE,
        )
    for name, impl in dynamic_impls.items():

        def check(impl: Callable[..., Any] = impl) -> float:
            with torch.no_grad():
                return fp8_err(*impl(xs[0], weight, EPS), y64)

        def run(x: torch.Tensor, impl: Callable[..., Any] = impl) -> Any:
            with torch.no_grad():
                return impl(x, weight, EPS)

        runner.measure(
            Result(
                "rms_norm_fp8_dynamic",
                "fwd",
                name,
                list(shape),
                H,
                dtype_name,
                static_bytes + 4 * rows,
            ),
            run,
            [(x,) for x in xs],
            check,
            FP8_TOLERANCE,
        )
    if hotloop is None:
        return
    # read x, residual, w; write residual, out at one byte per element
    fused_bytes = 3 * n * esize + n + H * esize
    new_residual = (xs[0].double() + rs[0].double()).to(dtype).double()
    fused_y64 = F.rms_norm(new_residual, (H,), weight.double(), EPS)
    fused_scale = (fused_y64.abs().max() / 448.0).float().reshape(1)
    fused_ref = fused_y64.clamp(-448.0 * fused_scale.item(), 448.0 * fused_scale.item())

    def fused_check() -> float:
        with torch.no_grad():
            out = hotloop.fused_add_rms_norm_fp8(xs[0], rs[0].clone(), weight, fused_scale, EPS)
        return fp8_err(out, fused_scale, fused_ref)

    def fused_run(x: torch.Tensor, r: torch.Tensor) -> Any:
        # residual grows by the normalised x at every call: finite, which is all timing needs
        with torch.no_grad():
            return hotloop.fused_add_rms_norm_fp8(x, r, weight, fused_scale, EPS)

    runner.measure(
        Result(
            "fused_add_rms_norm_fp8", "fwd", "hotloop CUDA", list(shape), H, dtype_name, fused_bytes
        ),
        fused_run,
        list(zip(xs, rs)),
        fused_check,
        FP8_TOLERANCE,
    )


def bench_muladd(runner: Runner, hotloop: Any, shape: tuple[int, ...], dtype: torch.dtype) -> None:
    n = math.prod(shape)
    esize = torch.empty((), dtype=dtype).element_size()
    nbytes = 3 * n * esize  # read a, b; write out
    c = 0.5
    gen = torch.Generator(device=DEVICE).manual_seed(2)
    k = n_buffers(nbytes, runner.l2_bytes)
    abs_ = [
        (
            torch.randn(shape, device=DEVICE, dtype=dtype, generator=gen),
            torch.randn(shape, device=DEVICE, dtype=dtype, generator=gen),
        )
        for _ in range(k)
    ]
    ref = abs_[0][0].double() * abs_[0][1].double() + c
    dtype_name = str(dtype).removeprefix("torch.")
    impls: dict[str, Callable[..., Any]] = {
        "pytorch (a*b+c)": eager_muladd,
        "torch.compile": _compile(eager_muladd),
    }
    if hotloop is not None:
        impls["hotloop CUDA"] = lambda a, b, c: hotloop.muladd(a, b, c)
    for name, impl in impls.items():

        def check(impl: Callable[..., Any] = impl) -> float:
            with torch.no_grad():
                return rel_err(impl(abs_[0][0], abs_[0][1], c), ref)

        def run(a: torch.Tensor, b: torch.Tensor, impl: Callable[..., Any] = impl) -> Any:
            with torch.no_grad():
                return impl(a, b, c)

        runner.measure(
            Result("muladd", "fwd", name, list(shape), shape[-1], dtype_name, nbytes),
            run,
            abs_,
            check,
            TOLERANCE[dtype],
        )


# ------------------------------------------------------------------------------ main


def in_place_backward_memory(
    hotloop: Any, shape: tuple[int, ...], dtype: torch.dtype
) -> dict[str, Any]:
    """Peak GPU memory of a training step through the norm, with and without
    in_place_backward (issue 31), on each backend, each peak above what was allocated before
    the step. The in-place backward writes grad_x over the gradient the next op's backward
    made: the norm's backward holds one x-sized tensor less. Two steps: "vector", x -> rms_norm
    -> @ v (H,) -> sum, where the norm's backward is the step's peak; "linear", x -> rms_norm
    -> @ proj (H, H) -> sum, where the linear layer's backward (its gradient materialised, its
    input saved) is. Keys: "<backend>_<step>_..."; a backend that refuses the option (a build
    from before the native kernels took it) gets "<backend>_refused" with the message."""
    H = shape[-1]
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    x = torch.randn(shape, device=DEVICE, dtype=dtype, generator=gen, requires_grad=True)
    w = (1.0 + 0.1 * torch.randn(H, device=DEVICE, generator=gen)).to(dtype).requires_grad_()
    heads = {
        "vector": torch.randn(H, device=DEVICE, generator=gen).to(dtype),
        "linear": (torch.randn(H, H, device=DEVICE, generator=gen) / H**0.5).to(dtype),
    }
    memory: dict[str, Any] = {
        "x_bytes": x.numel() * x.element_size(),
        "shape": list(shape),
        "dtype": str(dtype).removeprefix("torch."),
        "how": "torch.cuda.max_memory_allocated over the forward and over the backward of a "
        "step (x -> rms_norm(backend=...) -> @ head -> sum), above what was allocated "
        "before it",
    }
    for backend in ("native", "triton"):
        try:
            _in_place_steps(hotloop, backend, x, w, heads, memory)
        except ValueError as err:
            memory[f"{backend}_refused"] = str(err)
            print(f"in_place_backward, {backend}: refused: {err}", flush=True)
    return memory


def _in_place_steps(
    hotloop: Any,
    backend: str,
    x: torch.Tensor,
    w: torch.Tensor,
    heads: dict[str, torch.Tensor],
    memory: dict[str, Any],
) -> None:
    for step, head in heads.items():
        grads = {}
        for in_place in (False, True):
            x.grad = w.grad = None
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            y = hotloop.rms_norm(x, w, EPS, backend=backend, in_place_backward=in_place)
            loss = (y @ head).sum()
            del y  # held by the graph only, as in a model
            forward_peak = torch.cuda.max_memory_allocated() - base
            torch.cuda.reset_peak_memory_stats()
            loss.backward()
            torch.cuda.synchronize()
            key = f"{backend}_{step}_{'in_place' if in_place else 'default'}"
            memory[f"{key}_step_peak_bytes"] = max(
                forward_peak, torch.cuda.max_memory_allocated() - base
            )
            grads[in_place] = (x.grad.clone(), w.grad.clone())
            del loss
        name = f"{backend}_{step}"
        memory[f"{name}_saved_bytes"] = (
            memory[f"{name}_default_step_peak_bytes"] - memory[f"{name}_in_place_step_peak_bytes"]
        )
        memory[f"{name}_same_grads"] = all(
            torch.equal(a, b) for a, b in zip(grads[False], grads[True])
        )
        print(
            f"in_place_backward, {backend}, {step} step: peak "
            f"{memory[f'{name}_default_step_peak_bytes'] / 2**20:.0f} -> "
            f"{memory[f'{name}_in_place_step_peak_bytes'] / 2**20:.0f} MiB (x is "
            f"{memory['x_bytes'] / 2**20:.0f} MiB), same grads: {memory[f'{name}_same_grads']}",
            flush=True,
        )


def sweep_shape(hidden: int, total: int) -> tuple[int, int]:
    """(rows, hidden) with rows * hidden about `total` elements."""
    return (max(1, round(total / hidden)), hidden)


def metadata(hotloop: Any, liger_note: str | None, quick: bool) -> dict[str, Any]:
    props = torch.cuda.get_device_properties(0)
    meta: dict[str, Any] = {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name(0),
        # Which GPU of a pool: two H100s of one pool read a point apart (NOTES.md, run 104).
        "device_uuid": str(getattr(props, "uuid", "")) or None,
        "sm_count": props.multi_processor_count,
        "memory_gib": round(props.total_memory / 2**30, 1),
        "l2_cache_mb": round(getattr(props, "L2_cache_size", 0) / 1e6, 1),
        "compute_capability": f"{props.major}.{props.minor}",
        "driver": driver_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "quick": quick,
        "eps": EPS,
    }
    try:
        import triton

        meta["triton"] = triton.__version__
    except ImportError:
        meta["triton"] = None
    if hotloop is not None:
        meta["hotloop"] = getattr(hotloop, "__version__", None)
        build = getattr(hotloop, "BUILD_INFO", None)
        if build:
            meta["hotloop_build"] = dict(build)
    try:
        from importlib.metadata import version

        meta["liger_kernel"] = version("liger-kernel") if liger_note is None else None
    except Exception:
        meta["liger_kernel"] = None
    return meta


def headline_table(results: list[Result], shape: Sequence[int], copy_gbps: float) -> str:
    """Markdown table of the headline shape, bfloat16: fwd and fwd+bwd per implementation."""
    rows = [r for r in results if r.op == "rms_norm" and list(r.shape) == list(shape)]
    rows = [r for r in rows if r.dtype == "bfloat16"]
    by_impl: dict[str, dict[str, Result]] = {}
    for r in rows:
        by_impl.setdefault(r.impl, {})[r.mode] = r
    plain = by_impl.get("pytorch (Llama)", {})
    lines = [
        f"RMSNorm, (B, S, H) = {tuple(shape)}, bfloat16; copy bandwidth {copy_gbps:.0f} GB/s",
        "",
        "| implementation | fwd ms | fwd GB/s | fwd % copy | fwd+bwd ms | fwd+bwd GB/s "
        "| fwd+bwd % copy | fwd+bwd speed-up vs plain |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]

    def cells(r: Result | None) -> list[str]:
        if r is None:
            return ["-", "-", "-"]
        if r.status != "ok":
            return [r.status, "", ""]
        return [f"{r.ms:.3f}", f"{r.gbps:.0f}", f"{r.pct_copy:.1f}"]

    for impl, modes in by_impl.items():
        fb = modes.get("fwd+bwd")
        base = plain.get("fwd+bwd")
        speedup = (
            f"{base.ms / fb.ms:.1f}x"
            if fb and base and fb.status == "ok" and base.status == "ok"
            else "-"
        )
        lines.append(
            f"| {impl} | " + " | ".join(cells(modes.get("fwd")) + cells(fb)) + f" | {speedup} |"
        )
    others = [r for r in results if r.op not in ("rms_norm", SMALL_BATCH_OP)]
    if others:
        lines += [
            "",
            "| op | implementation | shape | dtype | ms | GB/s | % copy |",
            "| --- | --- | --- | --- | ---: | ---: | ---: |",
        ]
        for r in others:
            c = cells(r)
            lines.append(f"| {r.op} | {r.impl} | {tuple(r.shape)} | {r.dtype} | " + " | ".join(c))
            lines[-1] += " |"
    return "\n".join(lines)


def small_batch_table(results: list[Result]) -> str:
    """Markdown table of the decode-sized calls: microseconds per call, one row per
    (shape, implementation), one column per mode."""
    rows = [r for r in results if r.op == SMALL_BATCH_OP]
    if not rows:
        return ""
    cells: dict[tuple[tuple[int, ...], str], dict[str, str]] = {}
    for r in rows:
        text = f"{r.ms * 1e3:.1f}" if r.status == "ok" and r.ms is not None else r.status
        cells.setdefault((tuple(r.shape), r.impl), {})[r.mode] = text
    lines = [
        "Decode-sized calls, bfloat16, microseconds per call (call: an eager loop, host "
        "included; kernel: GPU time; graph: replayed from a CUDA graph)",
        "",
        "| shape | implementation | " + " | ".join(SMALL_BATCH_MODES) + " |",
        "| --- | --- |" + " ---: |" * len(SMALL_BATCH_MODES),
    ]
    for (shape, impl), modes in cells.items():
        values = " | ".join(modes.get(m, "-") for m in SMALL_BATCH_MODES)
        lines.append(f"| {shape} | {impl} | {values} |")
    return "\n".join(lines)


def hidden_sizes(text: str) -> frozenset[int]:
    """--hidden's value: positive integers, comma-separated."""
    try:
        sizes = frozenset(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        sizes = frozenset()
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(
            f"expected positive hidden sizes separated by commas (e.g. 4096,12288), got {text!r}"
        )
    return sizes


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output folder (%(default)s)")
    p.add_argument(
        "--quick",
        action="store_true",
        help="short run: headline shape in bfloat16, 3 sweep sizes, fewer repetitions",
    )
    p.add_argument(
        "--scale",
        type=float,
        default=1.0,
        help="multiply the headline's row count (B*S) by this, e.g. 0.25 on a small GPU",
    )
    p.add_argument(
        "--only",
        default=None,
        help="comma-separated substrings: only the RMSNorm implementations whose name "
        "matches (e.g. 'triton,compile')",
    )
    p.add_argument(
        "--rms-norm-only",
        action="store_true",
        help="skip fused_add_rms_norm, muladd and the FP8 norms",
    )
    p.add_argument(
        "--hidden",
        type=hidden_sizes,
        default=None,
        help="comma-separated hidden sizes: only these widths of the sweeps, and the headline "
        "shape only where its H is one of them (a short before/after run; see compare_runs.py)",
    )
    p.add_argument(
        "--sweep-hidden",
        type=hidden_sizes,
        default=None,
        help="comma-separated hidden sizes: RMSNorm's sweep at these widths instead of its own "
        "(widths it does not hold, such as 3001,6001, for a kernel change that reaches them)",
    )
    p.add_argument(
        "--castings",
        action="store_true",
        help="time hotloop's Llama and Gemma casting modes at every width of the sweep too, "
        "not only at the headline shape",
    )
    p.add_argument("--no-plot", action="store_true", help="write the JSON only")
    p.add_argument(
        "--no-small-batch", action="store_true", help="skip the decode-sized per-call timings"
    )
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    outputs = ["rms_norm.json", "rms_norm.md"] + ([] if args.no_plot else ["rms_norm.png"])
    claim(args.out, outputs, TOOL)
    if not torch.cuda.is_available():
        print(
            "bench_rms_norm: no CUDA device (torch.cuda.is_available() is False); this "
            "benchmark needs a GPU. benchmarks/plot.py makes the plot from an existing JSON.",
            file=sys.stderr,
        )
        return 2
    t0 = time.perf_counter()
    # Every shape and dtype is its own compiled graph here (dynamic=False, like a model
    # with a fixed hidden size): allow enough of them.
    for knob in ("cache_size_limit", "recompile_limit", "accumulated_cache_size_limit"):
        if hasattr(torch._dynamo.config, knob):
            setattr(torch._dynamo.config, knob, 256)

    hotloop, hotloop_note = _load_hotloop()
    LigerRMSNorm, LigerFusedAdd, liger_note = _load_liger()
    for note in (hotloop_note, liger_note):
        if note:
            print(f"note: {note}", file=sys.stderr)

    props = torch.cuda.get_device_properties(0)
    l2_bytes = int(getattr(props, "L2_cache_size", 50 << 20) or (50 << 20))
    copy_gbps, copy_t = copy_bandwidth()
    print(
        f"{torch.cuda.get_device_name(0)}: device-to-device copy {copy_gbps:.0f} GB/s "
        f"({copy_t.ms:.3f} ms for 2 GiB read + 2 GiB written)",
        flush=True,
    )
    runner = Runner(copy_gbps, l2_bytes, args.quick)

    impls = rms_norm_impls(hotloop, LigerRMSNorm)
    if args.only:
        keys = [s.strip().lower() for s in args.only.split(",") if s.strip()]
        impls = {k: v for k, v in impls.items() if any(s in k.lower() for s in keys)}
    B, S, H = HEADLINE
    headline = HEADLINE if args.scale == 1.0 else (1, max(1, round(B * S * args.scale)), H)
    total = math.prod(headline)

    def widths(sizes: Sequence[int]) -> list[int]:
        return [h for h in sizes if args.hidden is None or h in args.hidden]

    run_headline = args.hidden is None or H in args.hidden
    headline_dtypes = ("bfloat16",) if args.quick else HEADLINE_DTYPES
    # 1. The headline shape in every dtype.
    for dname in headline_dtypes if run_headline else ():
        bench_rms_norm_case(runner, impls, headline, DTYPES[dname], ["headline"])
        torch.cuda.empty_cache()
    # 1b. The casting modes at the headline shape, bfloat16, beside the default's rows.
    modes = casting_impls(hotloop) if hotloop is not None else {}
    if args.only:
        modes = {k: v for k, v in modes.items() if any(s in k.lower() for s in keys)}
    if modes and run_headline:
        bench_rms_norm_case(runner, modes, headline, torch.bfloat16, ["headline", "casting"])
        torch.cuda.empty_cache()
    # 2. The hidden-size sweep in bfloat16, tensors of about the headline's size (with
    # --castings, the casting modes' rows beside each width's).
    sweep = QUICK_SWEEP_HIDDEN if args.quick else SWEEP_HIDDEN
    for hidden in widths(sorted(args.sweep_hidden) if args.sweep_hidden else sweep):
        if hidden == H:
            continue  # the headline shape is this point of the sweep
        shape = sweep_shape(hidden, total)
        bench_rms_norm_case(runner, impls, shape, torch.bfloat16, ["sweep"])
        if args.castings and modes:
            bench_rms_norm_case(runner, modes, shape, torch.bfloat16, ["sweep", "casting"])
        torch.cuda.empty_cache()
    # 3. Decode-sized calls.
    if not args.no_small_batch:
        for shape in SMALL_BATCH_SHAPES:
            bench_small_batch(runner, impls, hotloop, shape, torch.bfloat16)
    # 4. fused_add_rms_norm, muladd and (on GPUs that have FP8) the FP8 norms at the
    # headline shape.
    if not args.rms_norm_only:
        if run_headline:
            bench_fused_add_rms_norm(runner, hotloop, LigerFusedAdd, headline, torch.bfloat16)
            bench_muladd(runner, hotloop, headline, torch.bfloat16)
        if torch.cuda.get_device_capability() >= (8, 9):
            if run_headline:
                bench_rms_norm_fp8(runner, hotloop, headline, torch.bfloat16)
            for hidden in () if args.quick else widths(FP8_SWEEP_HIDDEN):
                bench_rms_norm_fp8(runner, hotloop, sweep_shape(hidden, total), torch.bfloat16)
                torch.cuda.empty_cache()
        else:
            print("note: no FP8 benchmark: this GPU's compute capability is below 8.9")
        for hidden in () if args.quick else widths(FUSED_ADD_SWEEP_HIDDEN):
            shape = sweep_shape(hidden, total)
            bench_fused_add_rms_norm(runner, hotloop, LigerFusedAdd, shape, torch.bfloat16)
            torch.cuda.empty_cache()
    # 5. The in-place backward's peak memory of a training step at the headline shape.
    memory = (
        in_place_backward_memory(hotloop, headline, torch.bfloat16)
        if hotloop and run_headline
        else None
    )

    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    doc = {
        "meta": {
            **metadata(hotloop, liger_note, args.quick),
            "hidden": sorted(args.hidden) if args.hidden else None,
            "sweep_hidden": sorted(args.sweep_hidden) if args.sweep_hidden else None,
            "castings_at_every_width": args.castings,
            "tool": TOOL,
        },
        "notes": [n for n in (hotloop_note, liger_note) if n],
        "copy_bandwidth": {
            "gbps": copy_gbps,
            "ms": copy_t.ms,
            "bytes": 2 * (2 << 30),
            "how": "torch copy_ of a 2 GiB float32 buffer; bytes read + written",
        },
        "headline_shape": list(headline),
        "bytes_accounting": {
            "fwd": "read x, w; write y",
            "fwd+bwd": "fwd + read x, w, dy; write dx, dw",
            "fused_add_rms_norm": "read x, residual, w; write residual, y",
            "muladd": "read a, b; write out",
            "rms_norm_fp8": "read x, w; write out (1 byte per element)",
            "rms_norm_fp8_dynamic": "read x, w; write out (1 byte per element), scales",
            "fused_add_rms_norm_fp8": "read x, residual, w; write residual, out (1 byte)",
        },
        "timing": "median of CUDA-event times per call after warm-up; inputs rotated through "
        ">= 4x L2 of buffers; a GPU sleep ahead of each batch hides CPU launch time",
        "results": [asdict(r) for r in runner.results],
        "in_place_backward_memory": memory,
        "elapsed_s": round(time.perf_counter() - t0, 1),
    }
    json_path = out / "rms_norm.json"
    json_path.write_text(json.dumps(doc, indent=1) + "\n")
    table = headline_table(runner.results, headline, copy_gbps)
    if small := small_batch_table(runner.results):
        table += "\n\n" + small
    (out / "rms_norm.md").write_text(table + "\n")
    print()
    print(table)
    print(f"\nwrote {json_path} and {out / 'rms_norm.md'} in {doc['elapsed_s']} s")

    if not args.no_plot:
        sys.path.insert(0, str(HERE))
        try:
            import plot
        except ImportError as err:  # plot.py imports matplotlib
            print(f"no plot ({err}); run: python benchmarks/plot.py {json_path}")
        else:
            png = plot.plot(json_path, out / "rms_norm.png")
            print(f"wrote {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
