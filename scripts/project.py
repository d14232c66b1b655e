"""The project table: what the pipeline needs to know about the package it releases.

The matrix rows (``scripts/matrix/matrix.toml``) are facts about torch, shared by every
project; this table is the project's side. It lives in the project's ``pyproject.toml`` as
``[tool.torch-wheels]``, or in a TOML file of its own (same table) with ``checkout`` pointing
at the project, for a project whose files the maintainer of the release does not control.

Each field below is declared once, with its docstring and rule; ``load_project`` reads and
checks the table in one place, with the loader the build matrix uses too
(:mod:`scripts.typed_toml`): a bad table is one ``ProjectTableError`` naming the file, the
key and the value, and an unknown key gets the nearest known one as a suggestion.
``fields_markdown`` renders the docs' table of fields from the same declarations.

    python -m scripts.project [PATH]          # the loaded table, as JSON
    python -m scripts.project --fields        # the fields' Markdown table (docs/any-project.md)
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import re
import string
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from scripts.basics import REPO
from scripts.matrix.model import optional_arch_list
from scripts.typed_toml import (
    NOT_A_KEY,
    TableError,
    build,
    dashed,
    fail,
    read_document,
    rule,
)
from scripts.typed_toml import (
    fields_markdown as model_fields_markdown,
)

TABLE = "torch-wheels"
KINDS = ("stable", "pinned")
PYTHON_ABIS = ("abi3", "per-python", "auto")
# What a build-env value may name; ``build_environment`` fills them in per wheel.
BUILD_PLACEHOLDERS = ("kind", "cuda", "torch", "cuda_version", "arch_list")
# What a test-command argument may name; the installed-wheel test fills them in.
TEST_PLACEHOLDERS = ("project",)
# Variables the pipeline sets for every build: a table that set them would build with other
# compilers, headers or archs than those the pipeline audits against.
PIPELINE_BUILD_VARIABLES = {
    "CC": "the pipeline's compiler wrappers (sysroot, ccache)",
    "CXX": "the pipeline's compiler wrappers (sysroot, ccache)",
    "PYTORCH_NVCC": "the pipeline's nvcc wrapper",
    "CUDA_HOME": "the row's toolkit",
    "CUDACXX": "the row's nvcc",
    "CUDAHOSTCXX": "the pipeline's compiler wrappers (sysroot, ccache)",
    "CUDAToolkit_ROOT": "the row's toolkit",
    "PATH": "the build venv and the row's toolkit first",
    "CPATH": "torch's CUDA library headers",
    "LIBRARY_PATH": "torch's CUDA libraries, for linking",
    "CMAKE_LIBRARY_PATH": "torch's CUDA libraries, for linking",
    "TORCH_CUDA_ARCH_LIST": "the table's cuda-archs (or the row's list): set cuda-archs",
    "CUDAARCHS": "the table's cuda-archs (or the row's list): set cuda-archs",
    "SOURCE_DATE_EPOCH": "the checkout's last commit time",
    "TMPDIR": "the cell's own work folder",
    "GIT_CEILING_DIRECTORIES": "the cell's own work folder: git in the build finds no repository",
}
_NAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?")
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class ProjectTableError(TableError):
    """A project table that cannot be used: the message names the file, the key and the value."""


def _matches(pattern: re.Pattern[str], expected: str) -> Any:
    def check(value: str) -> str | None:
        return None if pattern.fullmatch(value) else expected

    return check


def _one_of(choices: Sequence[str]) -> Any:
    def check(value: str) -> str | None:
        return None if value in choices else f"expected one of {tuple(choices)}"

    return check


def _kinds(values: tuple[str, ...]) -> str | None:
    return None if values and not set(values) - set(KINDS) else f"expected one or both of {KINDS}"


def _relative(value: str) -> str | None:
    return "expected a relative path" if Path(value).is_absolute() else None


def _placeholders(text: str) -> list[str]:
    return [name for _, name, _, _ in string.Formatter().parse(text) if name is not None]


def _only_placeholders(known: Sequence[str]) -> Any:
    """A rule for strings (or the values of a table, or a list) that may name only ``known``."""

    def check(value: Any) -> str | None:
        texts = value.values() if isinstance(value, Mapping) else value
        for text in [texts] if isinstance(texts, str) else texts:
            for name in _placeholders(text):
                if name not in known:
                    return f"unknown placeholder {{{name}}} (known: {', '.join(known)})"
        return None

    return check


def _build_env(value: Mapping[str, str]) -> str | None:
    """Only the known placeholders, and no variable the pipeline sets for every build."""
    for name in value:
        if name in PIPELINE_BUILD_VARIABLES:
            return f"{name} is set by the pipeline ({PIPELINE_BUILD_VARIABLES[name]})"
    checked: str | None = _only_placeholders(BUILD_PLACEHOLDERS)(value)
    return checked


def _identifiers(values: tuple[str, ...]) -> str | None:
    bad = [v for v in values if not _IDENTIFIER.fullmatch(v)]
    return f"not Python identifiers: {bad}" if bad else None


@dataclass(frozen=True)
class AuditSettings:
    """``[tool.torch-wheels.audit]``: what the audit must find in each wheel."""

    libraries: tuple[str, ...] = ()
    """The libraries that hold the ops, as member paths or globs (``mypkg/_C.*.so``): every
    wheel must hold them, and in a stable wheel each must reach torch through the stable-ABI
    shim. Empty: at least one shared library anywhere in the wheel."""

    build_info: str = ""
    """Member path of a module whose ``BUILD_INFO`` dict records what the wheel was built for
    (version, torch, CUDA, archs); the audit compares it with the row. Empty: none."""

    device_code: bool = True
    """A CUDA-labelled wheel must hold device code (a cubin or PTX in an ELF ``.nv_fatbin``).
    Guards against a setup.py that picks CUDA by ``torch.cuda.is_available()`` and so builds
    CPU-only on a builder without a GPU."""


@dataclass(frozen=True)
class Project:
    """``[tool.torch-wheels]``: one package the pipeline builds, audits, tests and indexes."""

    distribution: str = rule(_matches(_NAME, "not a valid project name"))
    """Distribution name: the wheel file's first part and its METADATA ``Name``."""

    import_name: str = rule(_matches(_IDENTIFIER, "not a Python identifier"))
    """Top-level import package or module (``import NAME``); the wheel holds files only under
    ``NAME/``, its ``.libs`` folder and its ``.dist-info``, or ``NAME.*`` itself (an extension
    built as one module and no package, such as ``rotary_emb``)."""

    checkout: str = rule(_relative, ".")
    """The project's checkout, relative to the file holding the table: set it in a table kept
    outside the project (the project's own ``pyproject.toml`` leaves it at ``.``)."""

    build_dir: str = rule(_relative, ".")
    """Folder of the checkout holding ``setup.py`` or ``pyproject.toml``."""

    sources: tuple[str, ...] = ()
    """Files and folders of the checkout that the build reads (copied to a private folder
    before every build; build output and ``.git`` left out). Empty: the whole checkout."""

    build_env: Mapping[str, str] = rule(_build_env, default_factory=dict)
    """Environment variables the build needs, e.g. ``{ FORCE_CUDA = "{cuda}" }``. Values may
    name ``{kind}`` (stable/pinned), ``{cuda}`` (``1`` for a CUDA build, ``0`` for a CPU one),
    ``{torch}``, ``{cuda_version}`` and ``{arch_list}``. Set here what a setup.py needs to build
    CUDA without a GPU (``FORCE_CUDA``), to build rather than download a prebuilt wheel
    (``MYPKG_FORCE_BUILD = "TRUE"``), and its other switches (``MAX_JOBS``, ``NVCC_THREADS``
    and ``NVCC_APPEND_FLAGS`` replace the pipeline's). The variables the pipeline sets for
    every build (``CC``, ``CXX``, ``CUDA_HOME``, ``CUDACXX``, ``CPATH``, ``PATH``,
    ``TORCH_CUDA_ARCH_LIST``: use ``cuda-archs``, and the others of
    ``PIPELINE_BUILD_VARIABLES``) are refused."""

    build_requires: tuple[str, ...] = ()
    """More requirements of the build venv, next to the row's torch and the build folder's
    ``[build-system] requires``: what the project's README asks to ``pip install`` before
    ``pip install --no-build-isolation .`` (a setup.py that imports ``packaging``, say). Every
    build runs without isolation, in that venv."""

    kinds: tuple[str, ...] = rule(_kinds, KINDS)
    """Wheel kinds the project ships: ``stable`` (one wheel per CUDA major on the LibTorch
    stable ABI, for every torch from ``stable-floor`` on) and/or ``pinned`` (one wheel per
    torch minor and CUDA version)."""

    python_abi: str = rule(_one_of(PYTHON_ABIS), "abi3")
    """``abi3``: one ``cp39-abi3`` wheel serves every Python (limited API); ``per-python``: one
    ``cpXY-cpXY`` wheel per Python of the row (pybind11 and other full-API modules);
    ``auto``: build on the row's build Python, and per Python only if that wheel is not
    abi3 (for a setup.py that decides by itself, per torch)."""

    stable_floor: str = rule(
        _matches(re.compile(r"[0-9]+\.[0-9]+"), "expected a torch minor (2.10)"), "2.10"
    )
    """The oldest torch minor a stable wheel loads into (its ``TORCH_TARGET_VERSION``)."""

    cuda_archs: str = rule(optional_arch_list, "")
    """GPU architectures in torch's syntax (``8.0;9.0+PTX``), set as ``TORCH_CUDA_ARCH_LIST``.
    Empty: the matrix row's list."""

    test_command: tuple[str, ...] = rule(_only_placeholders(TEST_PLACEHOLDERS), ())
    """The command that tests an installed wheel, run in a fresh venv from an empty folder
    (so the checkout is not imported); ``{project}`` is the checkout. Empty: import only."""

    test_extras: tuple[str, ...] = ()
    """Extras of the wheel installed for the test (``test`` installs ``NAME[test]``)."""

    test_requires: tuple[str, ...] = ()
    """More requirements installed next to the wheel for the test (``pytest``, ``numpy``)."""

    test_env: Mapping[str, str] = field(default_factory=dict)
    """Environment variables the test command needs."""

    top_level_modules: tuple[str, ...] = rule(_identifiers, ())
    """Top-level modules the wheel installs besides ``import-name``, as their import names: a
    compiled extension that a setup.py names outside its package (``causal_conv1d_cuda``,
    ``flash_attn_2_cuda``). The wheel may hold ``NAME.*`` files and a ``NAME/`` folder for
    each."""

    audit: AuditSettings = field(default_factory=AuditSettings)
    """The ``[tool.torch-wheels.audit]`` table."""

    table_file: Path = field(default=Path("pyproject.toml"), compare=False, metadata=NOT_A_KEY)
    """Not a key: the file the table was read from."""

    @property
    def root(self) -> Path:
        """The checkout."""
        return (self.table_file.parent / self.checkout).resolve()

    @property
    def build_root(self) -> Path:
        """The folder the build runs in."""
        return self.root / self.build_dir

    def output_dir(self, what: str) -> Path:
        """Where this repository's commands write ``what`` (``wheelhouse``, ``index``,
        ``matrix``) for this project by default: ``build/projects/<distribution>/<what>``."""
        return REPO / "build" / "projects" / self.distribution / what

    def build_environment(
        self, kind: str, cuda_version: str | None, torch: str, arch_list: str
    ) -> dict[str, str]:
        """``build-env`` filled in for one wheel (``cuda_version`` None: a CPU build)."""
        values = {
            "kind": kind,
            "cuda": "1" if cuda_version else "0",
            "torch": torch,
            "cuda_version": cuda_version or "",
            "arch_list": self.cuda_archs or arch_list,
        }
        return {name: value.format(**values) for name, value in self.build_env.items()}

    def cuda_switches(self) -> tuple[str, ...]:
        """The ``build-env`` variables that are exactly ``{cuda}``: the build's own switch
        between a CUDA (``1``) and a CPU-only (``0``) build."""
        return tuple(name for name, value in self.build_env.items() if value == "{cuda}")

    def test_arguments(self, python: str = "python", root: str | None = None) -> list[str]:
        """``test-command`` (default: import the package) with ``python`` for the word
        ``python`` (the test venv's interpreter) and ``{project}`` as ``root`` (default: the
        checkout)."""
        args = self.test_command or ("python", "-c", f"import {self.import_name}")
        where = str(self.root) if root is None else root
        return [python if arg == "python" else arg.format(project=where) for arg in args]


def fields_markdown() -> str:
    """The Markdown table of every key, its default and its docstring (docs/any-project.md)."""
    return model_fields_markdown(((Project, ""), (AuditSettings, "audit.")), dashed)


# -------------------------------------------------------------------------- loading


def _check_build_dir(project: Project) -> None:
    """The rule no single value expresses: the build folder holds a build."""
    if (
        not (project.build_root / "setup.py").is_file()
        and not (project.build_root / "pyproject.toml").is_file()
    ):
        raise fail(
            f"[tool.{TABLE}]",
            "build-dir",
            project.build_dir,
            f"{project.build_root} has neither setup.py nor pyproject.toml",
        )


def table_file_for(path: Path) -> Path:
    """The file holding the table: ``PATH/pyproject.toml`` for a checkout, else ``PATH``."""
    return path / "pyproject.toml" if path.is_dir() else path


def load_project(path: Path = REPO) -> Project:
    """The validated table of the checkout or table file at ``path``."""
    table_file = table_file_for(path).resolve()
    document = read_document(table_file, "the project table", ProjectTableError)
    table = document.get("tool", {}).get(TABLE)
    if table is None:
        raise ProjectTableError(
            f"{table_file}: no [tool.{TABLE}] table; add one (docs/any-project.md lists its "
            "keys) or point --project at a table file"
        )
    try:
        project: Project = build(Project, table, f"[tool.{TABLE}]", dashed)
        project = dataclasses.replace(project, table_file=table_file)
        _check_build_dir(project)
    except TableError as exc:
        raise ProjectTableError(f"{table_file}: {exc}") from None
    return project


def other_project(path: Path, own_way: str) -> Project:
    """The table at ``path`` for a ``--project`` command; ProjectTableError when it is bad, or
    when it is this repository's own project, whose way is ``own_way``."""
    table = load_project(path)
    if table.root == REPO:
        raise ProjectTableError(f"{path} is this repository's own project: {own_way}")
    return table


@functools.cache
def own_project() -> Project:
    """This repository's own table: what the pipeline releases by default."""
    return load_project(REPO)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.project", description=__doc__)
    parser.add_argument("path", nargs="?", type=Path, default=REPO, help="checkout or table file")
    parser.add_argument("--fields", action="store_true", help="print the fields' Markdown table")
    args = parser.parse_args(argv)
    if args.fields:
        sys.stdout.write(fields_markdown())
        return 0
    try:
        project = load_project(args.path)
    except ProjectTableError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps({**asdict(project), "table_file": str(project.table_file)}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
