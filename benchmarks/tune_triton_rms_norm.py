"""Sweep the launch settings of hotloop's Triton RMSNorm kernels on the current GPU.

For each hidden size (bf16 tensors of about the headline's 268 MB), every forward setting
(rows a program, warps) and every backward setting (rows a tile, warps, programs an SM,
prefetching the next tile, Triton's loop pipeliner) is checked against a float64
reference, then timed the way benchmarks/bench_rms_norm.py times (CUDA events, median,
inputs rotated past L2). Writes ``tune_triton_rms_norm.json`` (every setting's time) and
``tune_triton_rms_norm.md`` (the best per hidden size next to the default the module
picks today). The winners go into ``FWD_CONFIG`` / ``BWD_CONFIG`` of
src/hotloop/triton_rms_norm/launch_config.py by hand, with the run that chose them.

Usage: python benchmarks/tune_triton_rms_norm.py [--hidden 4096,8193] [--out DIR]
       [--deadline SECONDS]
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
TOOL = "tune_triton_rms_norm"
sys.path.insert(0, str(HERE))

from bench_rms_norm import (  # noqa: E402 (the benchmark's timing, shared)
    HEADLINE,
    TOLERANCE,
    copy_bandwidth,
    metadata,
    n_buffers,
    rel_err,
    sweep_shape,
    time_cuda,
)
from result_files import claim  # noqa: E402

# In order of importance: the headline, the odd sizes, the rest.
DEFAULT_HIDDEN = (4096, 4095, 8193, 1000, 16384, 8192, 2048, 1024)
EPS = 1e-6
DTYPE = torch.bfloat16
# Elements of a tile (rows a program x register blocks) tried for each hidden size, and
# the warps tried for each tile (forward: 2 to 64 elements a thread; backward, which
# holds more of them at once: 4 to 32).
FWD_TILES = (1024, 2048, 4096, 8192, 16384)
BWD_TILES = (1024, 2048, 4096, 8192, 16384)
WARPS = (4, 8, 16)
PROGRAMS_PER_SM = (1, 2, 4, 8)
MAX_WARPS_PER_SM = 64
# (prefetch, loop_stages): plain loop, prefetch the next tile, Triton's pipeliner.
BWD_LOOP_VARIANTS = ((False, 1), (True, 1), (False, 2), (False, 3))
TIMING = {"warmup_ms": 5.0, "rep_ms": 25.0, "min_reps": 10}


def _rows_per_tile(width: int, tiles: Sequence[int]) -> list[int]:
    return sorted({max(1, t // width) for t in tiles})


def fwd_candidates(trn: Any, hidden: int) -> Iterator[Any]:
    width = sum(trn.row_blocks(hidden))
    for block_m in _rows_per_tile(width, FWD_TILES):
        for warps in WARPS:
            per_thread = block_m * width // (32 * warps)
            if 2 <= per_thread <= 64:
                yield trn.FwdConfig(block_m, warps)


def bwd_candidates(trn: Any, hidden: int) -> Iterator[Any]:
    width = sum(trn.row_blocks(hidden))
    for block_m, warps, (prefetch, stages) in itertools.product(
        _rows_per_tile(width, BWD_TILES), WARPS, BWD_LOOP_VARIANTS
    ):
        if not 4 <= block_m * width // (32 * warps) <= 32:
            continue
        for per_sm in PROGRAMS_PER_SM:
            if warps * per_sm <= MAX_WARPS_PER_SM:
                yield trn.BwdConfig(block_m, warps, per_sm, prefetch, stages)


def reference(x: torch.Tensor, w: torch.Tensor, dy: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """(y, dx, dw) in float64."""
    x64, w64, dy64 = x.double(), w.double(), dy.double()
    rstd = torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + EPS)
    x_hat = x64 * rstd
    g = dy64 * w64
    dx = rstd * (g - x_hat * (g * x_hat).mean(-1, keepdim=True))
    return x_hat * w64, dx, (dy64 * x_hat).sum(0)


class Sweep:
    def __init__(self, trn: Any, copy_gbps: float, l2_bytes: int, deadline: float) -> None:
        self.trn = trn
        self.copy_gbps = copy_gbps
        self.l2_bytes = l2_bytes
        self.deadline = deadline
        self.results: list[dict[str, Any]] = []

    def out_of_time(self) -> bool:
        return time.monotonic() > self.deadline

    def record(
        self, hidden: int, kind: str, config: Any, nbytes: int, run: Any, inputs: Any, err: float
    ) -> None:
        entry: dict[str, Any] = {
            "hidden": hidden,
            "kind": kind,
            "config": dataclasses.asdict(config) if config is not None else "default",
            "max_rel_err": err,
        }
        if not err <= TOLERANCE[DTYPE]:
            entry["status"] = "wrong"
        else:
            t = time_cuda(run, inputs, **TIMING)
            entry.update(
                status="ok",
                ms=t.ms,
                gbps=nbytes / (t.ms * 1e-3) / 1e9,
                pct_copy=100.0 * nbytes / (t.ms * 1e-3) / 1e9 / self.copy_gbps,
            )
        self.results.append(entry)
        shown = f"{entry['pct_copy']:5.1f}% {entry['ms']:.4f} ms" if "ms" in entry else "WRONG"
        print(f"{hidden:6d} {kind} {shown} {entry['config']}", flush=True)

    def hidden_size(self, hidden: int) -> None:
        trn = self.trn
        rows, _ = sweep_shape(hidden, HEADLINE[0] * HEADLINE[1] * HEADLINE[2])
        gen = torch.Generator(device="cuda").manual_seed(0)
        esize = torch.empty((), dtype=DTYPE).element_size()
        tensor_bytes = rows * hidden * esize
        k = n_buffers(2 * tensor_bytes, self.l2_bytes)
        xs = [
            torch.randn(rows, hidden, device="cuda", dtype=DTYPE, generator=gen) for _ in range(k)
        ]
        dys = [torch.randn_like(x) for x in xs]
        w = (1.0 + 0.1 * torch.randn(hidden, device="cuda", generator=gen)).to(DTYPE)
        y_ref, dx_ref, dw_ref = reference(xs[0], w, dys[0])
        y = torch.empty_like(xs[0])
        dx = torch.empty_like(xs[0])

        def fwd_runner(config: Any) -> Any:
            return lambda x: trn.forward_rows(x, w, y, EPS, config)

        def bwd_runner(config: Any) -> Any:
            return lambda dy, x: trn.backward_rows(dy, x, w, dx, EPS, config)[0].sum(0)

        for config in [None, *fwd_candidates(trn, hidden)]:
            if self.out_of_time():
                return
            try:
                fwd_runner(config)(xs[0])
                err = rel_err(y, y_ref)
                self.record(
                    hidden,
                    "fwd",
                    config,
                    2 * tensor_bytes,
                    fwd_runner(config),
                    [(x,) for x in xs],
                    err,
                )
            except Exception as exc:  # a setting that doesn't compile or launch: note it
                self.results.append(_failed(hidden, "fwd", config, exc))
        for config in [None, *bwd_candidates(trn, hidden)]:
            if self.out_of_time():
                return
            try:
                dw = bwd_runner(config)(dys[0], xs[0])
                err = max(rel_err(dx, dx_ref), rel_err(dw, dw_ref))
                inputs = list(zip(dys, xs))
                self.record(
                    hidden, "bwd", config, 3 * tensor_bytes, bwd_runner(config), inputs, err
                )
            except Exception as exc:
                self.results.append(_failed(hidden, "bwd", config, exc))


def _failed(hidden: int, kind: str, config: Any, exc: Exception) -> dict[str, Any]:
    print(f"{hidden:6d} {kind} ERROR {config}: {exc!r}"[:300], flush=True)
    return {
        "hidden": hidden,
        "kind": kind,
        "config": dataclasses.asdict(config) if config is not None else "default",
        "status": "error",
        "note": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}",
    }


def summary(results: list[dict[str, Any]]) -> str:
    """Markdown: per hidden size and kernel, the default setting's and the best one's %."""
    lines = [
        "| H | kernel | default % copy | best % copy | best ms | best setting |",
        "| ---: | --- | ---: | ---: | ---: | --- |",
    ]
    keys = sorted({(r["hidden"], r["kind"]) for r in results})
    for hidden, kind in keys:
        ok = [r for r in results if (r["hidden"], r["kind"]) == (hidden, kind) and "ms" in r]
        if not ok:
            continue
        default = next((r for r in ok if r["config"] == "default"), None)
        best = min(ok, key=lambda r: r["ms"])
        shown_default = f"{default['pct_copy']:.1f}" if default else "-"
        lines.append(
            f"| {hidden} | {kind} | {shown_default} | {best['pct_copy']:.1f} | "
            f"{best['ms']:.4f} | {best['config']} |"
        )
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--hidden",
        type=lambda s: [int(v) for v in s.split(",")],
        default=list(DEFAULT_HIDDEN),
        help="comma-separated hidden sizes",
    )
    p.add_argument("--out", type=Path, default=HERE / "results")
    p.add_argument(
        "--deadline", type=float, default=480.0, help="seconds; then write what was measured"
    )
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    claim(args.out, ("tune_triton_rms_norm.json", "tune_triton_rms_norm.md"), TOOL)
    if not torch.cuda.is_available():
        print("tune_triton_rms_norm: needs a CUDA GPU", file=sys.stderr)
        return 2
    start = time.monotonic()
    from hotloop import triton_rms_norm as trn

    props = torch.cuda.get_device_properties(0)
    l2_bytes = int(getattr(props, "L2_cache_size", 50 << 20) or (50 << 20))
    copy_gbps, _ = copy_bandwidth()
    print(f"{torch.cuda.get_device_name(0)}: copy {copy_gbps:.0f} GB/s", flush=True)
    sweep = Sweep(trn, copy_gbps, l2_bytes, start + args.deadline)
    for hidden in args.hidden:
        sweep.hidden_size(hidden)
        torch.cuda.empty_cache()
    import hotloop

    doc = {
        "meta": {
            **metadata(hotloop, liger_note="not part of the sweep", quick=False),
            "tool": TOOL,
        },
        "copy_gbps": copy_gbps,
        "dtype": str(DTYPE).removeprefix("torch."),
        "bytes": {"fwd": "read x, write y", "bwd": "read x, dy; write dx"},
        "complete": not sweep.out_of_time(),
        "elapsed_s": round(time.monotonic() - start, 1),
        "results": sweep.results,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "tune_triton_rms_norm.json").write_text(json.dumps(doc, indent=1) + "\n")
    table = summary(sweep.results)
    (args.out / "tune_triton_rms_norm.md").write_text(table + "\n")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
