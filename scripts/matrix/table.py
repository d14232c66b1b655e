"""The build matrix: typed access to ``matrix.toml`` beside this file.

Imported as ``scripts.matrix`` (the package re-exports it). ``python -m scripts.matrix table``
prints the selected rows; ``--github-json`` prints the ``strategy.matrix`` object GitHub
Actions consumes (``{"include": [...]}``, one entry per wheel).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from scripts import variant as variant_rule
from scripts.matrix.model import (
    MatrixTableError,
    RowSpec,
    ToolkitSpec,
    load_matrix,
    release,
    row_error,
)
from scripts.toolchain import DebPin, Toolkit

MATRIX_FILE = Path(__file__).with_name("matrix.toml")
PACKAGE_VERSION = variant_rule.BASE_VERSION


# The repair step's torch-abi-audit (the stable wheels' check) runs on Python >= 3.11.
STABLE_BUILD_MIN_PYTHON = (3, 11)


@dataclass(frozen=True)
class Row:
    """One row of the build matrix: a torch release, and the wheel that serves it.

    Rows from the stable-ABI floor on share one wheel per CUDA major, compiled against the
    oldest such row (``build_torch``); older rows each get their own pinned wheel.
    """

    torch: str
    cuda: str
    pythons: tuple[str, ...]
    arch_list: str
    toolkit: Toolkit
    build_torch: str
    # "pinned" forces an ATen build where the table says stable (to compare the two);
    # None follows the variant rule.
    abi: str | None = None

    def pinned(self) -> Row:
        """This row as a pinned build against its own torch (``nox -s wheels -- --pinned``)."""
        return replace(self, build_torch=self.torch, abi=variant_rule.PINNED)

    @property
    def torch_minor(self) -> str:
        """``"2.11"`` for torch ``2.11.0``."""
        major, minor = self.torch.split(".")[:2]
        return f"{major}.{minor}"

    @property
    def kind(self) -> str:
        """``"stable"`` or ``"pinned"``: which kind of wheel serves this torch."""
        return self.abi or variant_rule.kind_for(self.torch)

    @property
    def build_python(self) -> str:
        """The Python every build of this row's wheel runs on (``nox -s wheels``, cibuildwheel,
        ``nox -s reproducible``): the row's lowest that can audit the wheel. The wheel is
        cp39-abi3 whichever Python builds it, but not byte for byte: the limited-API module
        object takes its initial reference count from the building Python's headers
        (immortal from 3.12 on)."""
        return self.audit_pythons(self.pythons, self.kind)[0]

    @staticmethod
    def audit_pythons(pythons: Sequence[str], kind: str) -> tuple[str, ...]:
        """The Pythons that can build and audit a wheel of ``kind`` (the loader checks that a
        build row lists one)."""
        if kind == variant_rule.STABLE:
            return tuple(p for p in pythons if release(p) >= STABLE_BUILD_MIN_PYTHON)
        return tuple(pythons)

    @property
    def is_build(self) -> bool:
        """Whether this row's torch is the one its wheel is compiled against."""
        return self.build_torch == self.torch

    @property
    def variant(self) -> str:
        """Local version label of the wheel serving this row: ``stable.cu13``, ``pt29cu128``."""
        label: str = self._variant.label
        return label

    @property
    def _variant(self) -> Any:
        return variant_rule.variant_for(self.torch, self.cuda, self.kind)

    @property
    def version(self) -> str:
        """Full wheel version, e.g. ``0.1.0+stable.cu13``."""
        return f"{PACKAGE_VERSION}+{self.variant}"

    @property
    def requires_torch(self) -> str:
        """The Requires-Dist the wheel must carry: ``torch>=2.10`` or ``torch==2.9.*``."""
        requires: str = self._variant.requires_torch
        return requires

    @property
    def archs(self) -> list[str]:
        """Compiled targets as ``_build_info`` lists them: ``sm_80``, ..., ``compute_120``."""
        return archs_from_list(self.arch_list)

    def as_github(self, served: Sequence[Row] = ()) -> dict[str, Any]:
        return {
            "torch": self.torch,
            "kind": self.kind,
            "serves": " ".join(r.torch for r in served) or self.torch,
            "torch-minor": self.torch_minor,
            "cuda": self.cuda,
            "variant": self.variant,
            "pythons": " ".join(self.pythons),
            "min-python": self.pythons[0],
            "arch-list": self.arch_list,
        }


def variant_wheels(folder: Path, variant: str, distribution: str | None = None) -> list[Path]:
    """The wheels of ``distribution`` (default: this repository's project) of one variant
    (local version label) in ``folder``, by name."""
    if distribution is None:
        # Imported here: the project table's module imports this package.
        from scripts.project import own_project

        distribution = own_project().distribution
    return sorted(folder.glob(f"{distribution}-*+{variant}-*.whl"))


def variant_label(torch_version: str, cuda: str | None) -> str:
    """The label of the wheel serving that torch: ``stable.cu13``, ``pt29cu128``, ``pt28cpu``."""
    label: str = variant_rule.variant_for(torch_version, cuda).label
    return label


def archs_from_list(arch_list: str) -> list[str]:
    """Translate ``TORCH_CUDA_ARCH_LIST`` syntax into the targets nvcc gets.

    ``"8.0;9.0+PTX"`` -> ``["sm_80", "sm_90", "compute_90"]`` (PTX is ``compute_XX``).
    """
    targets: list[str] = []
    for entry in arch_list.replace(" ", ";").split(";"):
        if not entry:
            continue
        ptx = entry.endswith("+PTX")
        number = entry.removesuffix("+PTX").replace(".", "")
        targets.append(f"sm_{number}")
        if ptx:
            targets.append(f"compute_{number}")
    return targets


def cmake_cuda_architectures(arch_list: str) -> str:
    """The same targets in CMake's ``CUDA_ARCHITECTURES`` syntax (what ``CUDAARCHS`` sets).

    ``"8.0;9.0+PTX"`` -> ``"80-real;90"`` (``90``: the cubin and the PTX).
    """
    targets = archs_from_list(arch_list)
    return ";".join(
        number if f"compute_{number}" in targets else f"{number}-real"
        for kind, number in (t.split("_", 1) for t in targets)
        if kind == "sm"
    )


def toolkit_of(cuda: str, spec: ToolkitSpec) -> Toolkit:
    """The toolkit a ``[toolkits."X.Y"]`` table describes."""
    debian = spec.debian
    return Toolkit(
        nvcc=spec.nvcc or cuda,
        packages=spec.packages,
        debs=tuple(DebPin(p.name, p.version, p.sha256) for p in debian.packages) if debian else (),
        suite=debian.suite if debian else "",
        components=debian.components if debian else (),
        arch_list=spec.arch_list or None,
    )


def _row_problem(
    number: int,
    raw: RowSpec,
    earlier: dict[str, tuple[int, RowSpec]],
    builder: RowSpec,
    toolkits: Mapping[str, ToolkitSpec],
) -> MatrixTableError | None:
    """What is wrong with row ``number`` next to the rows before it (older torch first)."""
    label = variant_label(raw.torch, raw.cuda)
    if raw.torch in earlier:
        first, other = earlier[raw.torch]
        return row_error(
            number,
            raw,
            "torch",
            f"already row {first} (CUDA {other.cuda}). A row is the wheel PyPI serves for "
            f"`pip install torch=={raw.torch}`, built for one CUDA, and its cells install exactly "
            "that; PyTorch's other builds of a release (download.pytorch.org/whl/cu128 and the "
            "like) need no row of their own: the stable wheel of their CUDA major serves them "
            "from 2.10 on. Keep one row per torch release",
        )
    if builder.cuda not in toolkits:
        return row_error(
            number,
            raw,
            "cuda",
            f"the {label} wheel serving it is built with CUDA {builder.cuda} (torch "
            f'{builder.torch}), and there is no [toolkits."{builder.cuda}"]',
        )
    if builder is raw and not Row.audit_pythons(raw.pythons, variant_rule.kind_for(raw.torch)):
        return row_error(
            number,
            raw,
            "pythons",
            f"this row builds the {label} wheel, whose audit (torch-abi-audit) runs on Python "
            f">= {'.'.join(map(str, STABLE_BUILD_MIN_PYTHON))}: list one",
        )
    return None


def load_rows(path: Path = MATRIX_FILE) -> list[Row]:
    """All rows, oldest torch first. A bad table is one :class:`MatrixTableError` naming the
    file, the row, the key and the value: :func:`load_matrix` checks each value, and this the
    rows next to each other (one per torch release, a toolkit for each wheel)."""
    spec = load_matrix(path)
    numbered = sorted(enumerate(spec.row, 1), key=lambda item: release(item[1].torch))
    # A variant's wheel is compiled against the oldest torch it serves.
    build_row: dict[str, RowSpec] = {}
    earlier: dict[str, tuple[int, RowSpec]] = {}
    rows = []
    for number, raw in numbered:
        builder = build_row.setdefault(variant_label(raw.torch, raw.cuda), raw)
        problem = _row_problem(number, raw, earlier, builder, spec.toolkits)
        if problem:
            raise MatrixTableError(f"{path}: {problem}")
        earlier[raw.torch] = (number, raw)
        toolkit = spec.toolkits[builder.cuda]
        rows.append(
            Row(
                torch=raw.torch,
                cuda=raw.cuda,
                pythons=raw.pythons,
                arch_list=builder.arch_list or toolkit.arch_list or spec.arch_list,
                toolkit=toolkit_of(builder.cuda, toolkit),
                build_torch=builder.torch,
            )
        )
    return rows


def build_row_of(row: Row, rows: Sequence[Row]) -> Row:
    """The row whose torch ``row``'s wheel is compiled against."""
    return next(r for r in rows if r.torch == row.build_torch)


def build_rows(rows: Sequence[Row], all_rows: Sequence[Row] | None = None) -> list[Row]:
    """One row per wheel to build for ``rows`` (their build rows, each once, in order)."""
    every = rows if all_rows is None else all_rows
    builds: list[Row] = []
    for row in rows:
        builder = build_row_of(row, every)
        if builder not in builds:
            builds.append(builder)
    return builds


def select_rows(
    rows: Sequence[Row], torch: Sequence[str] | str | None = None, all_rows: bool = False
) -> list[Row]:
    """``--all`` -> every row; ``--torch 2.11`` (or ``2.11.0``) -> that row; default -> newest."""
    if all_rows:
        return list(rows)
    if not torch:
        return [rows[-1]]
    wanted = [torch] if isinstance(torch, str) else list(torch)
    chosen: list[Row] = []
    for want in wanted:
        match = [r for r in rows if want in (r.torch, r.torch_minor)]
        if not match:
            known = ", ".join(r.torch for r in rows)
            raise SystemExit(f"no build-matrix row for torch {want!r} (rows: {known})")
        chosen.extend(m for m in match if m not in chosen)
    return chosen


def github_matrix(rows: Sequence[Row], all_rows: Sequence[Row] | None = None) -> dict[str, Any]:
    """One entry per wheel to build for ``rows``, naming the torch releases it serves."""
    every = rows if all_rows is None else all_rows
    return {
        "include": [
            builder.as_github([r for r in rows if r.build_torch == builder.torch])
            for builder in build_rows(rows, every)
        ]
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.matrix table", description=__doc__)
    parser.add_argument("--torch", action="append", help="torch version or minor (repeatable)")
    parser.add_argument("--all", action="store_true", help="every row (default: newest)")
    parser.add_argument("--github-json", action="store_true", help="GitHub Actions matrix JSON")
    args = parser.parse_args(argv)
    rows = load_rows()
    # The GitHub matrix is every row unless a selection was asked for.
    selected = select_rows(
        rows, args.torch, all_rows=args.all or (args.github_json and not args.torch)
    )
    if args.github_json:
        print(json.dumps(github_matrix(selected, rows), separators=(",", ":")))
        return 0
    for row in selected:
        built = "built against" if row.is_build else "served by the wheel built against"
        print(
            f"{row.variant:12} torch {row.torch:7} CUDA {row.cuda:5} Python "
            f"{' '.join(row.pythons):25} {built} torch {row.build_torch}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
