"""``python -m scripts.toolchain [--torch X.Y | --all]``: fetch the toolkits, sysroot and ccache
the selected rows' builds need, ahead of the builds."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from scripts import matrix
from scripts.toolchain import ensure_ccache, ensure_cuda_toolkit, ensure_sysroot


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.toolchain", description=__doc__)
    parser.add_argument("--torch", action="append")
    parser.add_argument("--all", action="store_true")
    args = parser.parse_args(argv)
    rows = matrix.select_rows(matrix.load_rows(), args.torch, args.all)
    builders: dict[str, matrix.Row] = {}
    for builder in matrix.build_rows(rows, matrix.load_rows()):
        builders.setdefault(builder.cuda, builder)
    for cuda, row in sorted(builders.items()):
        home = ensure_cuda_toolkit(cuda, row.toolkit)
        print(f"CUDA {cuda} (nvcc {row.toolkit.nvcc}): {home}")
    print(f"sysroot: {ensure_sysroot()}")
    print(f"ccache: {ensure_ccache()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
