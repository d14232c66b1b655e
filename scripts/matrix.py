"""The build matrix: typed access to ``scripts/matrix.toml``.

``python -m scripts.matrix`` prints the selected rows; ``--github-json`` prints the
``strategy.matrix`` object GitHub Actions consumes (``{"include": [...]}``).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - nox may run on 3.9/3.10, where tomli is installed
    import tomli as tomllib

MATRIX_FILE = Path(__file__).with_name("matrix.toml")
PACKAGE_VERSION = "0.1.0"


@dataclass(frozen=True)
class Row:
    """One cell of the build matrix: a torch release and everything derived from it."""

    torch: str
    cuda: str
    pythons: tuple[str, ...]
    arch_list: str
    toolkit: tuple[str, ...]

    @property
    def torch_minor(self) -> str:
        """``"2.11"`` for torch ``2.11.0``."""
        major, minor = self.torch.split(".")[:2]
        return f"{major}.{minor}"

    @property
    def variant(self) -> str:
        """Local version label, e.g. ``pt211cu130``."""
        return variant_label(self.torch, self.cuda)

    @property
    def version(self) -> str:
        """Full wheel version, e.g. ``0.1.0+pt211cu130``."""
        return f"{PACKAGE_VERSION}+{self.variant}"

    @property
    def requires_torch(self) -> str:
        """The Requires-Dist pin the wheel must carry, e.g. ``torch==2.11.*``."""
        return f"torch=={self.torch_minor}.*"

    @property
    def archs(self) -> list[str]:
        """Compiled targets as ``_build_info`` lists them: ``sm_80``, ..., ``compute_120``."""
        return archs_from_list(self.arch_list)

    def as_github(self) -> dict[str, Any]:
        return {
            "torch": self.torch,
            "torch-minor": self.torch_minor,
            "cuda": self.cuda,
            "variant": self.variant,
            "pythons": " ".join(self.pythons),
            "min-python": self.pythons[0],
            "arch-list": self.arch_list,
        }


def variant_wheels(folder: Path, variant: str) -> list[Path]:
    """The hotloop wheels of one variant (local version label) in ``folder``, by name."""
    return sorted(folder.glob(f"hotloop-*+{variant}-*.whl"))


def variant_label(torch_version: str, cuda: str | None) -> str:
    """``pt<major><minor>cu<cuda without dot>``, or ``pt<major><minor>cpu``."""
    major, minor = torch_version.split("+")[0].split(".")[:2]
    suffix = "cpu" if cuda is None else "cu" + cuda.replace(".", "")
    return f"pt{major}{minor}{suffix}"


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


def load_rows(path: Path = MATRIX_FILE) -> list[Row]:
    """All rows, oldest torch first."""
    data = tomllib.loads(path.read_text())
    toolkits = data["toolkits"]
    rows = []
    for raw in data["row"]:
        cuda = raw["cuda"]
        if cuda not in toolkits:
            raise ValueError(
                f'{path}: torch {raw["torch"]} needs CUDA {cuda}, no [toolkits."{cuda}"]'
            )
        rows.append(
            Row(
                torch=raw["torch"],
                cuda=cuda,
                pythons=tuple(raw["pythons"]),
                arch_list=raw.get("arch_list", data["arch_list"]),
                toolkit=tuple(toolkits[cuda]["packages"]),
            )
        )
    return sorted(rows, key=lambda r: tuple(int(p) for p in r.torch.split(".")))


def select_rows(
    rows: Sequence[Row], torch: Sequence[str] | str | None = None, all_rows: bool = False
) -> list[Row]:
    """``--all`` -> every row; ``--torch 2.11`` (or ``2.11.0``) -> that row; default -> newest."""
    if all_rows:
        return list(rows)
    if not torch:
        return [rows[-1]]
    wanted = [torch] if isinstance(torch, str) else list(torch)
    chosen = []
    for want in wanted:
        match = [r for r in rows if want in (r.torch, r.torch_minor)]
        if not match:
            known = ", ".join(r.torch for r in rows)
            raise SystemExit(f"no build-matrix row for torch {want!r} (rows: {known})")
        chosen.extend(m for m in match if m not in chosen)
    return chosen


def github_matrix(rows: Sequence[Row]) -> dict[str, Any]:
    return {"include": [row.as_github() for row in rows]}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.matrix", description=__doc__)
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
        print(json.dumps(github_matrix(selected), separators=(",", ":")))
        return 0
    for row in selected:
        print(
            f"{row.variant:12} torch {row.torch:7} CUDA {row.cuda:5} Python {' '.join(row.pythons)}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
