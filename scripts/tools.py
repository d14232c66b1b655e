"""The tools the pipeline installs, read from ``[dependency-groups]`` in pyproject.toml.

pyproject.toml is the one place for these pins: noxfile.py reads the same groups with
``nox.project.dependency_groups``; this module serves ``scripts/`` and cibuildwheel's hooks,
which run where nox is not installed (standard library, plus tomli before Python 3.11).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from scripts.basics import tomllib

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


def normalize(name: str) -> str:
    """PEP 503 normalization, which PEP 735 applies to group names."""
    return re.sub(r"[-_.]+", "-", name).lower()


def resolve(groups: Mapping[str, Sequence[str | Mapping[str, str]]], name: str) -> tuple[str, ...]:
    """The requirements of one group, ``{include-group = ...}`` entries expanded (PEP 735)."""
    table = {normalize(key): value for key, value in groups.items()}

    def expand(group: str, seen: tuple[str, ...]) -> list[str]:
        key = normalize(group)
        if key in seen:
            cycle = " -> ".join((*seen, key))
            raise ValueError(f"[dependency-groups] include a group in a cycle: {cycle}")
        if key not in table:
            known = ", ".join(sorted(table))
            raise LookupError(f"no dependency group {group!r} in pyproject.toml (groups: {known})")
        out: list[str] = []
        for item in table[key]:
            if isinstance(item, str):
                out.append(item)
            elif set(item) == {"include-group"}:
                out.extend(expand(item["include-group"], (*seen, key)))
            else:
                raise ValueError(
                    f"dependency group {group!r}: {dict(item)!r} is neither a requirement "
                    "string nor {include-group = NAME}"
                )
        return out

    return tuple(expand(name, ()))


def dependency_groups(pyproject: Path = PYPROJECT) -> dict[str, Sequence[str | Mapping[str, str]]]:
    groups: dict[str, Sequence[str | Mapping[str, str]]]
    groups = tomllib.loads(pyproject.read_text())["dependency-groups"]
    return groups


def group(name: str, pyproject: Path = PYPROJECT) -> tuple[str, ...]:
    """``group("pipeline")`` -> ``("uv==0.13.9", ...)``, as ``pip install --group`` reads it."""
    return resolve(dependency_groups(pyproject), name)


# Build the extension (setup.py, without build isolation, against the row's torch).
BUILD = group("build")
# Drive, repair and audit release builds: `nox -s wheels`, `nox -s matrix`, cibuildwheel's repair.
PIPELINE = group("pipeline")
# Run the op and pipeline tests from a source checkout.
TEST = group("test")
# Checks that a stable-ABI wheel's libraries use no libtorch symbol outside the stable ABI
# (scripts/audit). It needs Python >= 3.11: its marker keeps the pinned-wheel builds on
# older Pythons installable, and the audit fails a stable wheel where the tool is missing.
TORCH_ABI_AUDIT = next(r for r in PIPELINE if r.startswith("torch-abi-audit"))
# CycloneDX SBOMs for the release wheels (scripts/sbom.py).
SBOM = group("sbom")
