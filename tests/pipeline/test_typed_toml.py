"""scripts.typed_toml: the one loader of the pipeline's TOML tables (the build matrix and the
project table), with one error form naming where, the key and the value."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import pytest

from scripts import project, typed_toml
from scripts.matrix import model


def _positive(value: str) -> str | None:
    return None if value.isdigit() and int(value) > 0 else "expected a positive number"


@dataclass(frozen=True)
class Inner:
    """A sub-table."""

    flag: bool = False
    """A switch."""


@dataclass(frozen=True)
class Item:
    """An array of tables, told apart by their name."""

    LABEL: ClassVar[str] = "name"

    name: str
    """Its name."""

    count: str = typed_toml.rule(_positive, "1")
    """How many."""


@dataclass(frozen=True)
class Outer:
    """The whole table."""

    build_env: Mapping[str, str] = field(default_factory=dict)
    """Variables."""

    item: tuple[Item, ...] = ()
    """Items."""

    inner: Inner = field(default_factory=Inner)
    """A sub-table."""

    origin: str = field(default="", metadata=typed_toml.NOT_A_KEY)
    """Not a key."""


def test_dashed_keys_sub_tables_and_arrays_load() -> None:
    table = {"build-env": {"A": "1"}, "item": [{"name": "x", "count": "2"}], "inner": {}}
    loaded = typed_toml.build(Outer, table, "[tool.x]", typed_toml.dashed)
    assert loaded == Outer(build_env={"A": "1"}, item=(Item("x", "2"),), inner=Inner())


@pytest.mark.parametrize(
    ("table", "words"),
    [
        (
            {"build_env": {}},
            "[tool.x]: build_env = {}: unknown key (known: build-env, item, inner)",
        ),
        ({"origin": "here"}, "[tool.x]: origin = 'here': unknown key"),
        ({"inner": {"flag": "yes"}}, "[tool.x.inner]: flag = 'yes': expected true or false"),
        ({"inner": {"flags": True}}, "[tool.x.inner]: flags = True: unknown key"),
        (
            {"item": [{"name": "a", "count": "0"}]},
            "[tool.x] item 1 (name a): count = '0': expected",
        ),
        ({"item": [{"count": "3"}]}, "[tool.x] item 1: name = None: required, not set"),
        ({"build-env": {"A": 1}}, "[tool.x]: build-env = {'A': 1}: expected a table of strings"),
        ({"item": "x"}, "[tool.x]: item = 'x': expected an array of tables ([[item]])"),
    ],
)
def test_one_error_names_the_table_the_key_and_the_value(table: dict, words: str) -> None:
    with pytest.raises(typed_toml.TableError) as err:
        typed_toml.build(Outer, table, "[tool.x]", typed_toml.dashed)
    assert str(err.value).startswith(words), str(err.value)


def test_both_tables_fail_the_same_way(tmp_path: Path) -> None:
    """The matrix and the project table share the loader: same error class, same form."""
    matrix_file = tmp_path / "matrix.toml"
    matrix_file.write_text('arch_list = "sm_90"\n')
    with pytest.raises(typed_toml.TableError) as matrix_err:
        model.load_matrix(matrix_file)
    (tmp_path / "setup.py").write_text("")
    table_file = tmp_path / "pyproject.toml"
    table_file.write_text(
        '[tool.torch-wheels]\ndistribution = "p"\nimport-name = "p"\ncuda-archs = "sm_90"\n'
    )
    with pytest.raises(typed_toml.TableError) as project_err:
        project.load_project(table_file)
    assert isinstance(matrix_err.value, model.MatrixTableError)
    assert isinstance(project_err.value, project.ProjectTableError)
    why = "'sm_90' is not a TORCH_CUDA_ARCH_LIST entry"
    assert str(matrix_err.value).startswith(f"{matrix_file}: top level: arch_list = 'sm_90': {why}")
    assert str(project_err.value).startswith(
        f"{table_file}: [tool.torch-wheels]: cuda-archs = 'sm_90': {why}"
    )


def test_unreadable_and_invalid_files_name_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[x\n")
    with pytest.raises(model.MatrixTableError, match=f"{bad}: not valid TOML"):
        typed_toml.read_document(bad, "the build matrix", model.MatrixTableError)
    with pytest.raises(project.ProjectTableError, match="cannot read the project table"):
        typed_toml.read_document(
            tmp_path / "none.toml", "the project table", project.ProjectTableError
        )


def test_fields_markdown_lists_keys_defaults_and_docs() -> None:
    text = typed_toml.fields_markdown([(Outer, ""), (Inner, "inner.")], typed_toml.dashed)
    assert "| `build-env` | `{}` | Variables. |" in text
    assert "| `inner` | (table below) | A sub-table. |" in text
    assert "| `inner.flag` | `false` | A switch. |" in text
    assert "origin" not in text
