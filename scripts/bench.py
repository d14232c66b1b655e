"""What ``nox -s bench`` installs before it runs a benchmark.

    nox -s bench [-- [--wheel PATH | --torch 2.11] [--wheelhouse DIR] [benchmark options]]
    nox -s bench -- --device cpu [--torch 2.11] [benchmark options]

On a GPU (the default) the benchmark measures a built wheel the way a user installs it:
that wheel, the torch it pins (``torch==X.Y.*``, resolved from the index), matplotlib for
the plot and Liger-Kernel to compare with, in a fresh virtualenv. The wheel is ``--wheel
PATH``, or the one ``nox -s wheels`` left in the wheelhouse for a matrix row (``--torch``,
default the newest row), and ``benchmarks/bench_rms_norm.py`` runs.

``--device cpu`` measures the CPU kernels of the source tree instead: the session installs
the row's torch and builds the package for the CPU (its table's CUDA switch at 0), as a user without
a GPU would, then runs ``benchmarks/bench_rms_norm_cpu.py``. Every other option goes to
the benchmark (see benchmarks/README.md).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from scripts import basics, matrix, tools
from scripts.project import own_project

# Installed next to the wheel: the plot, and the implementation compared against.
TOOLS = tools.group("bench")
BENCHMARK = "benchmarks/bench_rms_norm.py"
CPU_BENCHMARK = "benchmarks/bench_rms_norm_cpu.py"
DEVICES = ("cuda", "cpu")


def cpu_build_env() -> dict[str, str]:
    """How the CPU mode builds the source tree: the CPU kernels only, both cores."""
    return {**{name: "0" for name in own_project().cuda_switches()}, "MAX_JOBS": "2"}


@dataclass(frozen=True)
class Plan:
    """What the session installs and runs."""

    benchmark: str
    args: list[str]
    # The wheel to install (GPU), or None: build the source tree for the CPU against `torch`.
    wheel: Path | None = None
    torch: str | None = None


def wheel_for(wheelhouse: Path, row: matrix.Row) -> Path:
    """The row's wheel in the wheelhouse; a message that says how to build it if absent."""
    found = matrix.variant_wheels(wheelhouse, row.variant)
    if len(found) != 1:
        what = "no wheel" if not found else f"{len(found)} wheels"
        raise SystemExit(
            f"bench: {what} for {row.variant} (torch {row.torch}) in {wheelhouse}/; build it "
            f"with `nox -s wheels -- --torch {row.torch_minor}`, or pass --wheel PATH"
        )
    return found[0]


def plan(argv: Sequence[str]) -> Plan:
    """What to install and which benchmark to run with which arguments, from the session's."""
    # No abbreviations: an option meant for the benchmark must never match one of these.
    parser = argparse.ArgumentParser(prog="nox -s bench --", add_help=False, allow_abbrev=False)
    parser.add_argument("--device", choices=DEVICES, default="cuda")
    choice = parser.add_mutually_exclusive_group()
    choice.add_argument("--wheel", type=Path)
    choice.add_argument("--torch")
    parser.add_argument("--wheelhouse", type=Path, default=basics.REPO / "wheelhouse")
    args, rest = parser.parse_known_args(list(argv))
    if args.device == "cpu":
        if args.wheel is not None:
            raise SystemExit(
                "bench: --device cpu builds the source tree for the CPU; --wheel is for the "
                "GPU benchmark (drop one of them)"
            )
        row = matrix.select_rows(matrix.load_rows(), args.torch)[0]
        return Plan(CPU_BENCHMARK, rest, torch=f"torch=={row.torch}")
    if args.wheel is not None:
        if not args.wheel.is_file():
            raise SystemExit(f"bench: --wheel {args.wheel}: no such file")
        return Plan(BENCHMARK, rest, wheel=args.wheel)
    row = matrix.select_rows(matrix.load_rows(), args.torch)[0]
    return Plan(BENCHMARK, rest, wheel=wheel_for(args.wheelhouse, row))
