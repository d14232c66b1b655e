"""Benchmark hotloop's CPU kernels against PyTorch's on this machine's CPU.

RMSNorm (forward, and forward+backward) of hotloop against ``F.rms_norm``, plain PyTorch
(Llama's RMSNorm) and ``torch.compile`` of the plain one, at a few shapes in float32 and
bfloat16; fused_add_rms_norm and muladd against their unfused and compiled forms at the
headline shape. Writes ``<name>.json`` (machine, versions, load, every timing) and
``<name>.md`` (the table, also printed) to ``--out``.

Method:
* Every implementation's result (and gradients, for forward+backward) is checked against a
  float64 reference before it is timed; one that fails is reported and skipped.
* Shared machines are noisy: the implementations of one case are timed in interleaved
  rounds within this process (each round starts with the next implementation), so a burst
  of load hits all of them alike. A sample is one call, or a batch of calls for shapes
  that take microseconds; the figures are the median of all samples with their minimum and
  maximum. The 1-minute load average (``/proc/loadavg``) is recorded with every case.
* torch's intra-op threads (``torch.get_num_threads()``) are used by every implementation.

Usage: python benchmarks/bench_rms_norm_cpu.py [--quick] [--out DIR] [--name NAME]
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import platform
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from bench_rms_norm import (
    EPS,
    TOLERANCE,
    _compile,
    _load_hotloop,
    add_rms_norm,
    eager_muladd,
    f_rms_norm,
    llama_rms_norm,
    rel_err,
)
from result_files import claim

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE / "results"
DEFAULT_NAME = "rms_norm_cpu"
HEADLINE = (8, 512, 4096)
SHAPES = (HEADLINE, (1, 4096), (32, 8192))
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
# The order of the table's columns.
IMPLS = ("hotloop", "torch.compile", "F.rms_norm", "pytorch (Llama)")
# A sample lasts at least this long: calls of a few microseconds are timed in batches.
MIN_SAMPLE_S = 0.02


@dataclass
class Result:
    op: str
    mode: str  # "fwd" or "fwd+bwd"
    impl: str
    shape: list[int]
    dtype: str
    status: str = "ok"  # "ok", "wrong" (failed the reference check), "error"
    ms: float | None = None  # median of the samples, per call
    ms_min: float | None = None
    ms_max: float | None = None
    samples: int | None = None
    calls_per_sample: int | None = None
    max_rel_err: float | None = None
    loadavg: float | None = None  # 1-minute load average when the case started
    note: str = ""


def load_average() -> float | None:
    try:
        return float(Path("/proc/loadavg").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def summarize(per_call_s: Sequence[float]) -> tuple[float, float, float]:
    """(median, min, max) in ms of per-call times in seconds."""
    ms = [t * 1e3 for t in per_call_s]
    return statistics.median(ms), min(ms), max(ms)


def calls_per_sample(seconds_per_call: float) -> int:
    """Calls a sample batches so that it lasts about MIN_SAMPLE_S."""
    return max(1, math.ceil(MIN_SAMPLE_S / max(seconds_per_call, 1e-7)))


def time_interleaved(
    fns: dict[str, Callable[[], Any]], rounds: int, samples_per_round: int
) -> dict[str, tuple[list[float], int]]:
    """Per-call seconds of each fn's samples, and its calls per sample, timed in rounds."""
    batch: dict[str, int] = {}
    for name, fn in fns.items():
        fn()  # warm-up: first-call costs (allocations, compilation) stay out
        start = time.perf_counter()
        fn()
        batch[name] = calls_per_sample(time.perf_counter() - start)
    times: dict[str, list[float]] = {name: [] for name in fns}
    names = list(fns)
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            fn, n = fns[name], batch[name]
            for _ in range(samples_per_round):
                start = time.perf_counter()
                for _ in range(n):
                    fn()
                times[name].append((time.perf_counter() - start) / n)
    return {name: (times[name], batch[name]) for name in names}


class Runner:
    def __init__(self, rounds: int, samples_per_round: int) -> None:
        self.rounds = rounds
        self.samples_per_round = samples_per_round
        self.results: list[Result] = []

    def run_case(
        self,
        op: str,
        mode: str,
        shape: Sequence[int],
        dtype: torch.dtype,
        impls: dict[str, tuple[Callable[[], Any], Callable[[], float]]],
    ) -> None:
        """Check each (fn, check) against the reference, then time the ones that pass."""
        dtype_name = str(dtype).removeprefix("torch.")
        load = load_average()
        timed: dict[str, Callable[[], Any]] = {}
        results: dict[str, Result] = {}
        for name, (fn, check) in impls.items():
            result = Result(op, mode, name, list(shape), dtype_name, loadavg=load)
            results[name] = result
            try:
                err = check()
                result.max_rel_err = err
                if not err <= TOLERANCE[dtype]:  # also catches NaN
                    result.status = "wrong"
                    result.note = (
                        f"max relative error {err:.3g} > {TOLERANCE[dtype]:g} vs float64; not timed"
                    )
                else:
                    timed[name] = fn
            except Exception as err:
                result.status = "error"
                result.note = f"{type(err).__name__}: {str(err).splitlines()[0][:300]}"
                traceback.print_exc(limit=3)
        try:
            measured = time_interleaved(timed, self.rounds, self.samples_per_round)
        except Exception as err:
            traceback.print_exc(limit=3)
            measured = {}
            for name in timed:
                results[name].status = "error"
                results[name].note = f"{type(err).__name__} while timing"
        for name, (per_call, batch) in measured.items():
            r = results[name]
            r.ms, r.ms_min, r.ms_max = summarize(per_call)
            r.samples, r.calls_per_sample = len(per_call), batch
        for r in results.values():
            self.results.append(r)
            self._print(r)

    @staticmethod
    def _print(r: Result) -> None:
        where = f"{r.op:18s} {r.mode:7s} {r.dtype:8s} {tuple(r.shape)!s:16s} {r.impl:16s}"
        if r.status == "ok":
            print(
                f"{where} {r.ms:9.4f} ms ({r.ms_min:.4f}-{r.ms_max:.4f}) load {r.loadavg}",
                flush=True,
            )
        else:
            print(f"{where} {r.status.upper()}: {r.note}", flush=True)


def rms_norm_impls(hotloop: Any) -> dict[str, Callable[..., torch.Tensor]]:
    impls: dict[str, Callable[..., torch.Tensor]] = {}
    if hotloop is not None:
        impls["hotloop"] = hotloop.rms_norm
    impls["torch.compile"] = _compile(llama_rms_norm)
    impls["F.rms_norm"] = f_rms_norm
    impls["pytorch (Llama)"] = llama_rms_norm
    return impls


def bench_rms_norm(
    runner: Runner,
    impls: dict[str, Callable[..., torch.Tensor]],
    shape: tuple[int, ...],
    dtype: torch.dtype,
) -> None:
    H = shape[-1]
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=gen).to(dtype)
    weight = (1.0 + 0.1 * torch.randn(H, generator=gen)).to(dtype)
    dy = torch.randn(shape, generator=gen).to(dtype)

    with torch.no_grad():
        ref_y = f_rms_norm(x.double(), weight.double(), EPS)
    fwd: dict[str, tuple[Callable[[], Any], Callable[[], float]]] = {}
    for name, impl in impls.items():

        def run(impl: Callable[..., torch.Tensor] = impl) -> torch.Tensor:
            with torch.no_grad():
                return impl(x, weight, EPS)

        fwd[name] = (run, lambda run=run: rel_err(run(), ref_y))
    runner.run_case("rms_norm", "fwd", shape, dtype, fwd)

    xg = x.clone().requires_grad_()
    wg = weight.clone().requires_grad_()
    x64 = x.double().requires_grad_()
    w64 = weight.double().requires_grad_()
    y64 = f_rms_norm(x64, w64, EPS)
    ref_dx, ref_dw = torch.autograd.grad(y64, (x64, w64), dy.double())
    ref_y = y64.detach()
    fwd_bwd: dict[str, tuple[Callable[[], Any], Callable[[], float]]] = {}
    for name, impl in impls.items():

        def run_bwd(impl: Callable[..., torch.Tensor] = impl) -> Any:
            y = impl(xg, wg, EPS)
            return (y, *torch.autograd.grad(y, (xg, wg), dy))

        def check(run_bwd: Callable[[], Any] = run_bwd) -> float:
            y, dx, dw = run_bwd()
            return max(rel_err(y.detach(), ref_y), rel_err(dx, ref_dx), rel_err(dw, ref_dw))

        fwd_bwd[name] = (run_bwd, check)
    runner.run_case("rms_norm", "fwd+bwd", shape, dtype, fwd_bwd)


def bench_fused_add_rms_norm(
    runner: Runner, hotloop: Any, shape: tuple[int, ...], dtype: torch.dtype
) -> None:
    H = shape[-1]
    gen = torch.Generator().manual_seed(1)
    x0 = torch.randn(shape, generator=gen).to(dtype)
    r0 = torch.randn(shape, generator=gen).to(dtype)
    weight = (1.0 + 0.1 * torch.randn(H, generator=gen)).to(dtype)
    # The residual rounded to dtype, then normalised (the op's documented order).
    ref_r = (x0.double() + r0.double()).to(dtype).double()
    ref_y = f_rms_norm(ref_r, weight.double(), EPS)
    candidates: dict[str, Callable[..., Any]] = {}
    if hotloop is not None:

        def hotloop_fused(x: torch.Tensor, r: torch.Tensor, w: torch.Tensor, eps: float) -> Any:
            hotloop.fused_add_rms_norm(x, r, w, eps)  # in place: x = normed, r = x + r
            return x, r

        candidates["hotloop"] = hotloop_fused
    candidates["torch.compile"] = _compile(add_rms_norm)
    candidates["pytorch (Llama)"] = add_rms_norm
    cases: dict[str, tuple[Callable[[], Any], Callable[[], float]]] = {}
    for name, impl in candidates.items():
        # The in-place op changes x and r at every call; the values stay finite (x is
        # normalised, r grows by it), which is all timing needs.
        x, r = x0.clone(), r0.clone()

        def run(impl: Callable[..., Any] = impl, x: torch.Tensor = x, r: torch.Tensor = r) -> Any:
            with torch.no_grad():
                return impl(x, r, weight, EPS)

        def check(impl: Callable[..., Any] = impl) -> float:
            with torch.no_grad():
                y, r = impl(x0.clone(), r0.clone(), weight, EPS)
            return max(rel_err(y, ref_y), rel_err(r, ref_r))

        cases[name] = (run, check)
    runner.run_case("fused_add_rms_norm", "fwd", shape, dtype, cases)


def bench_muladd(runner: Runner, hotloop: Any, shape: tuple[int, ...], dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(2)
    a = torch.randn(shape, generator=gen).to(dtype)
    b = torch.randn(shape, generator=gen).to(dtype)
    c = 0.5
    ref = a.double() * b.double() + c
    candidates: dict[str, Callable[..., Any]] = {}
    if hotloop is not None:
        candidates["hotloop"] = hotloop.muladd
    candidates["torch.compile"] = _compile(eager_muladd)
    candidates["pytorch (a*b+c)"] = eager_muladd
    cases: dict[str, tuple[Callable[[], Any], Callable[[], float]]] = {}
    for name, impl in candidates.items():

        def run(impl: Callable[..., Any] = impl) -> Any:
            with torch.no_grad():
                return impl(a, b, c)

        cases[name] = (run, lambda run=run: rel_err(run(), ref))
    runner.run_case("muladd", "fwd", shape, dtype, cases)


def metadata(hotloop: Any, quick: bool) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "device": "cpu",
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "hotloop_cpu_isa_cap": os.environ.get("HOTLOOP_CPU_ISA"),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "quick": quick,
        "eps": EPS,
    }
    if hotloop is not None:
        meta["hotloop"] = getattr(hotloop, "__version__", None)
        build = getattr(hotloop, "BUILD_INFO", None)
        if build:
            meta["hotloop_build"] = dict(build)
    return meta


def cell(r: Result | None) -> str:
    if r is None:
        return "-"
    if r.status != "ok" or r.ms is None:
        return r.status
    return f"{r.ms:.3f} ({r.ms_min:.3f}-{r.ms_max:.3f})"


def results_table(results: Sequence[Result], meta: dict[str, Any]) -> str:
    """Markdown: one row per (op, shape, dtype, mode), the implementations as columns."""
    cases: dict[tuple[str, tuple[int, ...], str, str], dict[str, Result]] = {}
    for r in results:
        cases.setdefault((r.op, tuple(r.shape), r.dtype, r.mode), {})[r.impl] = r
    impls = list(IMPLS) + sorted({r.impl for r in results} - set(IMPLS))
    lines = [
        f"CPU: {meta['cpu']}, {meta['cpu_count']} cores, {meta['torch_threads']} torch threads; "
        f"torch {meta['torch']}; {meta['date']}. ms per call: median (min-max) of "
        "interleaved samples; load = 1-minute load average when the case started.",
        "",
        "| op | shape | dtype | mode | "
        + " | ".join(impls)
        + " | hotloop / torch.compile | load |",
        "| --- | --- | --- | --- | " + " | ".join("---:" for _ in impls) + " | ---: | ---: |",
    ]
    for (op, shape, dtype, mode), by_impl in cases.items():
        mine, compiled = by_impl.get("hotloop"), by_impl.get("torch.compile")
        ratio = (
            f"{mine.ms / compiled.ms:.2f}"
            if mine and compiled and mine.ms is not None and compiled.ms is not None
            else "-"
        )
        load = next((r.loadavg for r in by_impl.values() if r.loadavg is not None), None)
        lines.append(
            f"| {op} | {shape} | {dtype} | {mode} | "
            + " | ".join(cell(by_impl.get(i)) for i in impls)
            + f" | {ratio} | {load if load is not None else '-'} |"
        )
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output folder (%(default)s)")
    p.add_argument("--name", default=DEFAULT_NAME, help="file stem of the outputs (%(default)s)")
    p.add_argument("--quick", action="store_true", help="the headline shape only, fewer rounds")
    p.add_argument("--rounds", type=int, default=7, help="interleaved rounds (%(default)s)")
    p.add_argument(
        "--dtype",
        action="append",
        choices=sorted(DTYPES),
        help="only this dtype (repeatable; default: all)",
    )
    p.add_argument(
        "--rms-norm-only", action="store_true", help="skip fused_add_rms_norm and muladd"
    )
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch.set_num_threads for every implementation (default: torch's choice). "
        "On a loaded machine, 1 keeps the wait for a descheduled thread out of every call",
    )
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    claim(args.out, (f"{args.name}.json", f"{args.name}.md"), "bench_rms_norm_cpu")
    t0 = time.perf_counter()
    # Every shape and dtype is its own compiled graph here (dynamic=False, like a model
    # with a fixed hidden size): allow enough of them.
    for knob in ("cache_size_limit", "recompile_limit", "accumulated_cache_size_limit"):
        if hasattr(torch._dynamo.config, knob):
            setattr(torch._dynamo.config, knob, 256)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    hotloop, note = _load_hotloop()
    if note:
        print(f"note: {note}", file=sys.stderr)
    meta = metadata(hotloop, args.quick)
    meta["tool"] = "bench_rms_norm_cpu"
    meta["loadavg_start"] = Path("/proc/loadavg").read_text().strip()
    print(
        f"{meta['cpu']}, {meta['cpu_count']} cores, {meta['torch_threads']} threads, "
        f"torch {meta['torch']}, load {meta['loadavg_start']}",
        flush=True,
    )
    runner = Runner(rounds=3 if args.quick else args.rounds, samples_per_round=3)
    shapes = (HEADLINE,) if args.quick else SHAPES
    dtypes = [DTYPES[d] for d in (args.dtype or DTYPES)]
    impls = rms_norm_impls(hotloop)
    for dtype in dtypes:
        for shape in shapes:
            bench_rms_norm(runner, impls, shape, dtype)
        if not args.rms_norm_only:
            bench_fused_add_rms_norm(runner, hotloop, HEADLINE, dtype)
            bench_muladd(runner, hotloop, HEADLINE, dtype)
    meta["loadavg_end"] = Path("/proc/loadavg").read_text().strip()
    meta["seconds"] = round(time.perf_counter() - t0, 1)
    table = results_table(runner.results, meta)
    args.out.mkdir(parents=True, exist_ok=True)
    data = {"meta": meta, "results": [asdict(r) for r in runner.results]}
    (args.out / f"{args.name}.json").write_text(json.dumps(data, indent=1) + "\n")
    (args.out / f"{args.name}.md").write_text(table + "\n")
    print("\n" + table)
    print(f"\nwrote {args.out / args.name}.json and .md in {meta['seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
