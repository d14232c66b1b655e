"""The project table: what the pipeline needs to know about the package it releases.

The matrix rows (``scripts/matrix/matrix.toml``) are facts about torch, shared by every
project; this table is the project's side. It lives in the project's ``pyproject.toml`` as
``[tool.torch-wheels]``, or in a TOML file of its own (same table) with ``checkout`` pointing
at the project, for a project whose files the maintainer of the release does not control.

Each field below is declared once, with its docstring; ``load_project`` reads and checks the
table in one place (a bad table is one ``ProjectTableError`` naming the file, the key and the
value; an unknown key gets the nearest known one as a suggestion), and ``fields_markdown``
renders the docs' table of fields from the same declarations.

    python -m scripts.project [PATH]          # the loaded table, as JSON
    python -m scripts.project --fields        # the fields' Markdown table (docs/any-project.md)
"""

from __future__ import annotations

import argparse
import ast
import difflib
import functools
import inspect
import json
import re
import string
import sys
from collections.abc import Mapping, Sequence
from dataclasses import MISSING, Field, asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, get_origin, get_type_hints

from scripts.basics import REPO, tomllib

TABLE = "torch-wheels"
KINDS = ("stable", "pinned")
PYTHON_ABIS = ("abi3", "per-python", "auto")
# What a build-env value may name; ``build_environment`` fills them in per wheel.
BUILD_PLACEHOLDERS = ("kind", "cuda", "torch", "cuda_version", "arch_list")
# What a test-command argument may name; the installed-wheel test fills them in.
TEST_PLACEHOLDERS = ("project",)
_NAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?")
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class ProjectTableError(ValueError):
    """A project table that cannot be used: the message names the file, the key and the value."""


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

    distribution: str
    """Distribution name: the wheel file's first part and its METADATA ``Name``."""

    import_name: str
    """Top-level import package (``import NAME``); the wheel holds files only under it, its
    ``.libs`` folder and its ``.dist-info``."""

    checkout: str = "."
    """The project's checkout, relative to the file holding the table: set it in a table kept
    outside the project (the project's own ``pyproject.toml`` leaves it at ``.``)."""

    build_dir: str = "."
    """Folder of the checkout holding ``setup.py`` or ``pyproject.toml``."""

    sources: tuple[str, ...] = ()
    """Files and folders of the checkout that the build reads (copied to a private folder
    before every build; build output and ``.git`` left out). Empty: the whole checkout."""

    build_env: Mapping[str, str] = field(default_factory=dict)
    """Environment variables the build needs, e.g. ``{ FORCE_CUDA = "{cuda}" }``. Values may
    name ``{kind}`` (stable/pinned), ``{cuda}`` (``1`` for a CUDA build, ``0`` for a CPU one),
    ``{torch}``, ``{cuda_version}`` and ``{arch_list}``. Set here what a setup.py needs to build
    CUDA without a GPU and to build rather than download a prebuilt wheel."""

    kinds: tuple[str, ...] = KINDS
    """Wheel kinds the project ships: ``stable`` (one wheel per CUDA major on the LibTorch
    stable ABI, for every torch from ``stable-floor`` on) and/or ``pinned`` (one wheel per
    torch minor and CUDA version)."""

    python_abi: str = "abi3"
    """``abi3``: one ``cp39-abi3`` wheel serves every Python (limited API); ``per-python``: one
    ``cpXY-cpXY`` wheel per Python of the row (pybind11 and other full-API modules);
    ``auto``: build on the row's build Python, and per Python only if that wheel is not
    abi3 (for a setup.py that decides by itself, per torch)."""

    stable_floor: str = "2.10"
    """The oldest torch minor a stable wheel loads into (its ``TORCH_TARGET_VERSION``)."""

    cuda_archs: str = ""
    """GPU architectures in torch's syntax (``8.0;9.0+PTX``), set as ``TORCH_CUDA_ARCH_LIST``.
    Empty: the matrix row's list."""

    test_command: tuple[str, ...] = ()
    """The command that tests an installed wheel, run in a fresh venv from an empty folder
    (so the checkout is not imported); ``{project}`` is the checkout. Empty: import only."""

    test_extras: tuple[str, ...] = ()
    """Extras of the wheel installed for the test (``test`` installs ``NAME[test]``)."""

    test_requires: tuple[str, ...] = ()
    """More requirements installed next to the wheel for the test (``pytest``, ``numpy``)."""

    test_env: Mapping[str, str] = field(default_factory=dict)
    """Environment variables the test command needs."""

    audit: AuditSettings = field(default_factory=AuditSettings)
    """The ``[tool.torch-wheels.audit]`` table."""

    table_file: Path = field(default=Path("pyproject.toml"), compare=False)
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

    def test_arguments(self, python: str = "python", root: str | None = None) -> list[str]:
        """``test-command`` (default: import the package) with ``python`` for the word
        ``python`` (the test venv's interpreter) and ``{project}`` as ``root`` (default: the
        checkout)."""
        args = self.test_command or ("python", "-c", f"import {self.import_name}")
        where = str(self.root) if root is None else root
        return [python if arg == "python" else arg.format(project=where) for arg in args]


# -------------------------------------------------------------------------- field docs


def key_of(name: str) -> str:
    """The TOML key of a field: ``build_env`` -> ``build-env``."""
    return name.replace("_", "-")


def field_docs(cls: type) -> dict[str, str]:
    """Each field's docstring (the string literal after its declaration), by field name."""
    body = ast.parse(inspect.getsource(cls)).body[0]
    assert isinstance(body, ast.ClassDef)
    docs = {}
    for node, after in zip(body.body, body.body[1:]):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            docs[node.target.id] = " ".join(inspect.cleandoc(after.value.value).split())
    return docs


def _table_fields(cls: type) -> list[Field[Any]]:
    return [f for f in fields(cls) if f.name != "table_file"]


def _required(f: Field[Any]) -> bool:
    return f.default is MISSING and f.default_factory is MISSING


def _default_text(f: Field[Any]) -> str:
    if _required(f):
        return "required"
    value = f.default_factory() if f.default_factory is not MISSING else f.default
    if isinstance(value, AuditSettings):
        return "(table below)"
    if isinstance(value, tuple):
        value = list(value)
    if isinstance(value, Mapping):
        value = dict(value)
    return "`" + json.dumps(value) + "`"


def fields_markdown() -> str:
    """The Markdown table of every key, its default and its docstring."""
    lines = ["| key | default | meaning |", "| --- | --- | --- |"]
    for cls, prefix in ((Project, ""), (AuditSettings, "audit.")):
        docs = field_docs(cls)
        for f in _table_fields(cls):
            lines.append(f"| `{prefix}{key_of(f.name)}` | {_default_text(f)} | {docs[f.name]} |")
    return "\n".join(lines) + "\n"


# -------------------------------------------------------------------------- loading


def _fail(where: str, key: str, value: Any, why: str) -> ProjectTableError:
    return ProjectTableError(f"{where}: {key} = {value!r}: {why}")


def _convert(where: str, key: str, value: Any, hint: Any) -> Any:
    """``value`` as the field's type ``hint``, or the one error naming what is wrong."""
    origin = get_origin(hint)
    if hint is str:
        if not isinstance(value, str):
            raise _fail(where, key, value, "expected a string")
        return value
    if hint is bool:
        if not isinstance(value, bool):
            raise _fail(where, key, value, "expected true or false")
        return value
    if origin is tuple:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise _fail(where, key, value, "expected a list of strings")
        return tuple(value)
    if origin is Mapping:
        if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
            raise _fail(where, key, value, 'expected a table of strings ({ NAME = "value" })')
        return dict(value)
    raise AssertionError(f"no conversion for {hint}")  # a field type this loader lacks


def _build(cls: type, table: Any, where: str, prefix: str) -> dict[str, Any]:
    """The constructor arguments of ``cls`` from ``table``; unknown keys refused with the
    nearest known one."""
    if not isinstance(table, dict):
        raise _fail(where, prefix.rstrip(".") or TABLE, table, "expected a table")
    hints = get_type_hints(cls)
    known = {key_of(f.name): f for f in _table_fields(cls)}
    values: dict[str, Any] = {}
    for key, value in table.items():
        if key not in known:
            near = difflib.get_close_matches(key, known, n=1)
            hint = f"; did you mean {prefix}{near[0]}?" if near else ""
            raise _fail(
                where, prefix + key, value, f"unknown key (known: {', '.join(known)}){hint}"
            )
        f = known[key]
        if hints[f.name] is AuditSettings:
            values[f.name] = AuditSettings(**_build(AuditSettings, value, where, f"{key}."))
        else:
            values[f.name] = _convert(where, prefix + key, value, hints[f.name])
    for key, f in known.items():
        if _required(f) and f.name not in values:
            raise _fail(where, prefix + key, None, "required, not set")
    return values


def _placeholders(text: str) -> list[str]:
    return [name for _, name, _, _ in string.Formatter().parse(text) if name is not None]


def _check_placeholders(
    where: str, key: str, value: Any, texts: Sequence[str], known: Sequence[str]
) -> None:
    for text in texts:
        for name in _placeholders(text):
            if name not in known:
                raise _fail(
                    where, key, value, f"unknown placeholder {{{name}}} (known: {', '.join(known)})"
                )


def _check(project: Project, where: str) -> None:
    """The rules no type expresses; each failure names the key and the value."""
    if not _NAME.fullmatch(project.distribution):
        raise _fail(where, "distribution", project.distribution, "not a valid project name")
    if not _IDENTIFIER.fullmatch(project.import_name):
        raise _fail(where, "import-name", project.import_name, "not a Python identifier")
    if not project.kinds or set(project.kinds) - set(KINDS):
        raise _fail(where, "kinds", list(project.kinds), f"expected one or both of {KINDS}")
    if project.python_abi not in PYTHON_ABIS:
        raise _fail(where, "python-abi", project.python_abi, f"expected one of {PYTHON_ABIS}")
    if not re.fullmatch(r"[0-9]+\.[0-9]+", project.stable_floor):
        raise _fail(where, "stable-floor", project.stable_floor, "expected a torch minor (2.10)")
    if project.cuda_archs and not re.fullmatch(
        r"[0-9]+\.[0-9]+[af]?(\+PTX)?(;[0-9]+\.[0-9]+[af]?(\+PTX)?)*", project.cuda_archs
    ):
        raise _fail(
            where, "cuda-archs", project.cuda_archs, 'expected torch\'s syntax, "8.0;9.0+PTX"'
        )
    for rel, key in ((project.checkout, "checkout"), (project.build_dir, "build-dir")):
        if Path(rel).is_absolute():
            raise _fail(where, key, rel, "expected a relative path")
    for name, value in project.build_env.items():
        _check_placeholders(where, f"build-env.{name}", value, [value], BUILD_PLACEHOLDERS)
    _check_placeholders(
        where, "test-command", list(project.test_command), project.test_command, TEST_PLACEHOLDERS
    )
    if (
        not (project.build_root / "setup.py").is_file()
        and not (project.build_root / "pyproject.toml").is_file()
    ):
        raise _fail(
            where,
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
    try:
        document = tomllib.loads(table_file.read_text())
    except OSError as exc:
        raise ProjectTableError(f"{table_file}: cannot read the project table: {exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ProjectTableError(f"{table_file}: not valid TOML: {exc}") from exc
    table = document.get("tool", {}).get(TABLE)
    if table is None:
        raise ProjectTableError(
            f"{table_file}: no [tool.{TABLE}] table; add one (docs/any-project.md lists its "
            "keys) or point --project at a table file"
        )
    where = f"{table_file} [tool.{TABLE}]"
    project = Project(**_build(Project, table, where, ""), table_file=table_file)
    _check(project, where)
    return project


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
