"""scripts.project: the project table is read and checked in one place, with one error that
names the file, the key and the value, and the docs list exactly the declared keys."""

from __future__ import annotations

from pathlib import Path

import pytest

from scripts import project, typed_toml
from scripts.basics import REPO


def write_table(folder: Path, body: str, with_setup: bool = True) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    if with_setup:
        (folder / "setup.py").write_text("from setuptools import setup\nsetup()\n")
    path = folder / "pyproject.toml"
    path.write_text(f"[tool.torch-wheels]\n{body}")
    return path


MINIMAL = 'distribution = "mypkg"\nimport-name = "mypkg"\n'


def test_hotloop_table_loads_with_its_values() -> None:
    table = project.load_project(REPO)
    assert (table.distribution, table.import_name) == ("hotloop", "hotloop")
    assert table.root == REPO
    assert table.kinds == ("stable", "pinned")
    assert table.audit.build_info == "hotloop/_build_info.py"
    assert table.build_environment("stable", "13.0", "2.11.0", "9.0") == {
        "HOTLOOP_CUDA": "1",
        "HOTLOOP_ABI": "stable",
    }
    assert table.build_environment("pinned", None, "2.9.1", "9.0")["HOTLOOP_CUDA"] == "0"


def test_cuda_switches_are_the_build_env_variables_that_are_exactly_cuda(tmp_path: Path) -> None:
    """What a CPU-only build sets to 0 (the container's --cpu proof, the CPU benchmark)."""
    assert project.load_project(REPO).cuda_switches() == ("HOTLOOP_CUDA",)
    body = (
        MINIMAL
        + 'build-env = { FORCE_CUDA = "{cuda}", CUDA_VERSION = "{cuda_version}", MAX_JOBS = "2" }\n'
    )
    table = project.load_project(write_table(tmp_path / "p", body).parent)
    assert table.cuda_switches() == ("FORCE_CUDA",)


@pytest.mark.parametrize(
    ("name", "use"),
    [
        ("TORCH_CUDA_ARCH_LIST", "set cuda-archs"),
        ("CUDA_HOME", "the row's toolkit"),
        ("CUDACXX", "the row's nvcc"),
        ("CUDAARCHS", "set cuda-archs"),
        ("PATH", "the row's toolkit first"),
        ("CC", "compiler wrappers"),
    ],
)
def test_build_env_refuses_what_the_pipeline_sets(tmp_path: Path, name: str, use: str) -> None:
    path = write_table(tmp_path, MINIMAL + f'build-env = {{ {name} = "x" }}\n')
    with pytest.raises(project.ProjectTableError) as err:
        project.load_project(path)
    assert f"build-env = {{'{name}': 'x'}}: {name} is set by the pipeline" in str(err.value)
    assert use in str(err.value)


def test_top_level_modules_are_import_names(tmp_path: Path) -> None:
    path = write_table(tmp_path, MINIMAL + 'top-level-modules = ["my-ext_cuda"]\n')
    with pytest.raises(project.ProjectTableError, match=r"not Python identifiers: \['my-ext"):
        project.load_project(path)


def test_minimal_table_takes_the_defaults(tmp_path: Path) -> None:
    table = project.load_project(write_table(tmp_path / "p", MINIMAL).parent)
    assert table.python_abi == "abi3"
    assert table.audit.device_code is True
    assert table.build_root == (tmp_path / "p").resolve()


def test_unknown_key_is_refused_with_the_nearest_known_one(tmp_path: Path) -> None:
    path = write_table(tmp_path, MINIMAL + 'build-evn = { FORCE_CUDA = "1" }\n')
    with pytest.raises(project.ProjectTableError) as err:
        project.load_project(path)
    message = str(err.value)
    assert str(path) in message
    assert "build-evn = {'FORCE_CUDA': '1'}" in message
    assert "did you mean build-env?" in message


def test_unknown_audit_key_names_its_table(tmp_path: Path) -> None:
    path = write_table(tmp_path, MINIMAL + "[tool.torch-wheels.audit]\ndevice_code = false\n")
    with pytest.raises(
        project.ProjectTableError,
        match=r"\[tool\.torch-wheels\.audit\]: device_code = False: unknown key",
    ):
        project.load_project(path)


@pytest.mark.parametrize(
    ("line", "words"),
    [
        ("kinds = ['abi4']", "kinds = ['abi4']: expected one or both of"),
        ("python-abi = 'cp312'", "python-abi = 'cp312': expected one of"),
        ("sources = 'csrc'", "sources = 'csrc': expected a list of strings"),
        (
            "build-env = { MAX_JOBS = 4 }",
            "build-env = {'MAX_JOBS': 4}: expected a table of strings",
        ),
        (
            "build-env = { X = '{cuda_home}' }",
            "build-env = {'X': '{cuda_home}'}: unknown placeholder {cuda_home}",
        ),
        ("test-command = ['pytest', '{repo}']", "unknown placeholder {repo}"),
        (
            "cuda-archs = 'sm_90'",
            "cuda-archs = 'sm_90': 'sm_90' is not a TORCH_CUDA_ARCH_LIST entry",
        ),
        ("stable-floor = '2'", "stable-floor = '2': expected a torch minor"),
        ("build-dir = 'python'", "build-dir = 'python': "),
    ],
)
def test_bad_value_names_key_and_value(tmp_path: Path, line: str, words: str) -> None:
    path = write_table(tmp_path, MINIMAL + line + "\n")
    with pytest.raises(project.ProjectTableError) as err:
        project.load_project(path)
    assert words in str(err.value)
    assert str(path) in str(err.value)


def test_missing_required_key(tmp_path: Path) -> None:
    path = write_table(tmp_path, 'distribution = "mypkg"\n')
    with pytest.raises(project.ProjectTableError, match="import-name = None: required, not set"):
        project.load_project(path)


def test_no_table_says_what_to_add(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    with pytest.raises(project.ProjectTableError, match=r"no \[tool.torch-wheels\] table"):
        project.load_project(tmp_path)


def test_table_outside_the_checkout_points_at_it(tmp_path: Path) -> None:
    # A project nobody here may edit: the table lives elsewhere and names the checkout.
    checkout = tmp_path / "upstream"
    (checkout / "pkg").mkdir(parents=True)
    (checkout / "pkg" / "setup.py").write_text("")
    table = tmp_path / "tables" / "pkg.toml"
    table.parent.mkdir()
    table.write_text(
        "[tool.torch-wheels]\n" + MINIMAL + 'checkout = "../upstream"\nbuild-dir = "pkg"\n'
        'test-command = ["pytest", "{project}/test"]\n'
    )
    loaded = project.load_project(table)
    assert loaded.root == checkout.resolve()
    assert loaded.build_root == (checkout / "pkg").resolve()
    assert loaded.test_arguments() == ["pytest", f"{checkout.resolve()}/test"]


def test_every_field_has_a_docstring() -> None:
    for cls in (project.Project, project.AuditSettings):
        declared = {f.name for f in typed_toml.table_fields(cls)}
        assert declared <= set(typed_toml.field_docs(cls)), cls


def test_docs_list_exactly_the_declared_fields() -> None:
    # docs/any-project.md carries the generated table; regenerate it with
    # `python -m scripts.project --fields` when a field changes.
    docs = (REPO / "docs" / "any-project.md").read_text()
    begin, end = "<!-- fields:begin -->\n", "<!-- fields:end -->"
    assert begin in docs
    assert end in docs
    committed = docs.split(begin, 1)[1].split(end, 1)[0]
    assert committed == project.fields_markdown()


def test_docs_explain_every_audit_rule() -> None:
    from scripts import audit

    docs = (REPO / "docs" / "any-project.md").read_text()
    missing = [r.id for r in audit.RULES if f"`{r.id}`" not in docs]
    assert missing == [], f"docs/any-project.md's audit table lacks {missing}"
