"""What ``nox -s bench`` installs before it runs ``benchmarks/bench_rms_norm.py``.

    nox -s bench [-- [--wheel PATH | --torch 2.11] [--wheelhouse DIR] [benchmark options]]

The benchmark measures a built wheel the way a user installs it: that wheel, the torch
it pins (``torch==X.Y.*``, resolved from the index), matplotlib for the plot and
Liger-Kernel to compare with, in a fresh virtualenv. The wheel is ``--wheel PATH``, or
the one ``nox -s wheels`` left in the wheelhouse for a matrix row (``--torch``, default
the newest row). Every other option goes to the benchmark (see benchmarks/README.md).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from scripts import basics, matrix, tools

# Installed next to the wheel: the plot, and the implementation compared against.
TOOLS = tools.group("bench")
BENCHMARK = "benchmarks/bench_rms_norm.py"


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


def plan(argv: Sequence[str]) -> tuple[Path, list[str]]:
    """(wheel to install, arguments for the benchmark) from the session's arguments."""
    # No abbreviations: an option meant for the benchmark must never match one of these.
    parser = argparse.ArgumentParser(prog="nox -s bench --", add_help=False, allow_abbrev=False)
    choice = parser.add_mutually_exclusive_group()
    choice.add_argument("--wheel", type=Path)
    choice.add_argument("--torch")
    parser.add_argument("--wheelhouse", type=Path, default=basics.REPO / "wheelhouse")
    args, rest = parser.parse_known_args(list(argv))
    if args.wheel is not None:
        if not args.wheel.is_file():
            raise SystemExit(f"bench: --wheel {args.wheel}: no such file")
        return args.wheel, rest
    row = matrix.select_rows(matrix.load_rows(), args.torch)[0]
    return wheel_for(args.wheelhouse, row), rest
