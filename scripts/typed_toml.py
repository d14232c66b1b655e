"""TOML tables read into typed models: one loader for every table the pipeline reads.

A table is a frozen dataclass: each key a field with a docstring (the string after it), a
type, and optionally a rule (:func:`rule`) for what the type cannot say. :func:`build`
turns the parsed TOML into the model and refuses the first bad value with one
:class:`TableError` naming the table, the key and the value (an unknown key gets the
nearest known one as a suggestion); :func:`read_document` reads the file, and the caller
prefixes the file's name. ``matrix.toml`` (:mod:`scripts.matrix.model`) and the project
table (:mod:`scripts.project`) are its two models; :func:`fields_markdown` renders a model's
keys for the docs from the same declarations.

Standard library only: the GitHub workflow reads the build matrix with a bare Python.
"""

from __future__ import annotations

import ast
import difflib
import inspect
import json
import types
from collections.abc import Callable, Iterable, Mapping
from dataclasses import MISSING, Field, field, fields, is_dataclass
from pathlib import Path
from typing import Any, Union, get_args, get_origin, get_type_hints

from scripts.basics import tomllib

# ``X | None`` is types.UnionType from Python 3.10 on; nox may run on 3.9.
_UNIONS = (Union, getattr(types, "UnionType", Union))

TOP = "top level"

Check = Callable[[Any], "str | None"]  # a value's problem in words, or None


class TableError(ValueError):
    """A table that cannot be used: the message names where, the key and the value."""


def rule(check: Check, default: Any = MISSING, *, default_factory: Any = MISSING) -> Any:
    """A field whose values must also pass ``check`` (beyond the field's type)."""
    return field(default=default, default_factory=default_factory, metadata={"check": check})


# The metadata of a field that no table sets (where the table was read from).
NOT_A_KEY = {"key": False}


def same_name(name: str) -> str:
    """Keys spelled as the fields are (``arch_list``): ``matrix.toml``'s style."""
    return name


def dashed(name: str) -> str:
    """Keys spelled with dashes (``build-env`` for ``build_env``): ``pyproject.toml``'s style."""
    return name.replace("_", "-")


def table_fields(cls: type) -> tuple[Field[Any], ...]:
    """The fields of ``cls`` that are keys of its table."""
    return tuple(f for f in fields(cls) if f.metadata.get("key", True))


def required(f: Field[Any]) -> bool:
    return f.default is MISSING and f.default_factory is MISSING


def describe(where: str, key: str, value: Any, why: str) -> str:
    """The one error's words: ``where: key = value: why``."""
    return f"{where}: {key} = {value!r}: {why}"


def fail(where: str, key: str, value: Any, why: str) -> TableError:
    """The one error (see :func:`describe`)."""
    return TableError(describe(where, key, value, why))


def sub_table(where: str, key: str) -> str:
    """The TOML header of table ``key`` inside the table at ``where``."""
    return f"[{key}]" if where == TOP else f"{where[:-1]}.{key}]"


def _dataclass_of(hint: Any) -> type | None:
    """The dataclass in ``hint`` (``X`` or ``X | None``), if there is one."""
    optional = get_origin(hint) in _UNIONS
    for candidate in get_args(hint) if optional else (hint,):
        if isinstance(candidate, type) and is_dataclass(candidate):
            return candidate
    return None


def _convert(where: str, key: str, value: Any, hint: Any, keys: Callable[[str], str]) -> Any:
    """``value`` as the field's type ``hint``, or the one error naming what is wrong."""
    origin = get_origin(hint)
    table = _dataclass_of(hint)
    if table is not None:  # a sub-table: [toolkits."12.8".debian], [tool.torch-wheels.audit]
        return build(table, value, sub_table(where, key), keys)
    if hint is str:
        if not isinstance(value, str):
            raise fail(where, key, value, "expected a string")
        return value
    if hint is bool:
        if not isinstance(value, bool):
            raise fail(where, key, value, "expected true or false")
        return value
    if origin is tuple:
        item = get_args(hint)[0]
        if is_dataclass(item):  # [[row]], or an array of inline tables
            if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
                raise fail(where, key, value, f"expected an array of tables ([[{key}]])")
            assert isinstance(item, type)
            name = f"[[{key}]]" if where == TOP else f"{where} {key}"
            return tuple(build(item, v, f"{name} {i}", keys) for i, v in enumerate(value, 1))
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise fail(where, key, value, "expected a list of strings")
        return tuple(value)
    if origin is Mapping:
        item = get_args(hint)[1]
        if item is str:  # build-env = { NAME = "value" }
            if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
                raise fail(where, key, value, 'expected a table of strings ({ NAME = "value" })')
            return dict(value)
        # [toolkits."13.0"]: tables by name
        if not isinstance(value, dict) or not all(isinstance(v, dict) for v in value.values()):
            raise fail(where, key, value, f'expected tables ([{key}."NAME"])')
        return {
            name: build(item, v, sub_table(where, f'{key}."{name}"'), keys)
            for name, v in value.items()
        }
    raise AssertionError(f"no conversion for {hint}")  # a field type this loader lacks


def build(cls: type, table: Any, where: str, keys: Callable[[str], str] = same_name) -> Any:
    """An instance of ``cls`` from the TOML ``table`` at ``where``: unknown keys refused with
    the nearest known one, each value converted to its field's type and checked.

    ``keys`` spells a field's key (:func:`same_name`, :func:`dashed`). A model whose tables
    are best told apart by one of their values (a ``[[row]]`` by its torch) names that key in
    a ``LABEL`` class attribute.
    """
    if not isinstance(table, dict):
        raise fail(where, "", table, "expected a table")
    label = getattr(cls, "LABEL", None)
    if label and isinstance(table.get(label), str):
        where = f"{where} ({label} {table[label]})"
    hints = get_type_hints(cls)
    known = {keys(f.name): f for f in table_fields(cls)}
    for key, value in table.items():
        if key not in known:
            near = difflib.get_close_matches(key, known, n=1)
            hint = f"; did you mean {near[0]}?" if near else ""
            raise fail(where, key, value, f"unknown key (known: {', '.join(known)}){hint}")
    values: dict[str, Any] = {}
    for key, f in known.items():
        if key not in table:
            if required(f):
                raise fail(where, key, None, "required, not set")
            continue
        values[f.name] = _convert(where, key, table[key], hints[f.name], keys)
        check = f.metadata.get("check")
        problem = check(values[f.name]) if check else None
        if problem:
            raise fail(where, key, table[key], problem)
    return cls(**values)


def read_document(path: Path, what: str, error: type[TableError]) -> dict[str, Any]:
    """The parsed TOML file ``path``; ``what`` names it in the ``error`` ("the build matrix")."""
    try:
        document: dict[str, Any] = tomllib.loads(path.read_text())
    except OSError as exc:
        raise error(f"{path}: cannot read {what}: {exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise error(f"{path}: not valid TOML: {exc}") from exc
    return document


# -------------------------------------------------------------------------- field docs


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


def _default_text(f: Field[Any]) -> str:
    if required(f):
        return "required"
    value = f.default_factory() if f.default_factory is not MISSING else f.default
    if is_dataclass(value):
        return "(table below)"
    if isinstance(value, tuple):
        value = list(value)
    if isinstance(value, Mapping):
        value = dict(value)
    return "`" + json.dumps(value) + "`"


def fields_markdown(
    models: Iterable[tuple[type, str]], keys: Callable[[str], str] = same_name
) -> str:
    """The Markdown table of every key of ``models`` (``(cls, key prefix)`` pairs), its
    default and its docstring."""
    lines = ["| key | default | meaning |", "| --- | --- | --- |"]
    for cls, prefix in models:
        docs = field_docs(cls)
        for f in table_fields(cls):
            lines.append(f"| `{prefix}{keys(f.name)}` | {_default_text(f)} | {docs[f.name]} |")
    return "\n".join(lines) + "\n"
