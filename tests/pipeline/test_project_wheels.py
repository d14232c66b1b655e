"""Another project's wheels (``nox -s wheels -- --project``): the rows its table serves, its
sources, build environment and requirements, the variant label written into its wheel, and
the arch checks. The whole path runs on the fixture extension in .ci/run."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from scripts import audit, basics, build, matrix, project, project_build, project_wheels, relabel
from scripts.audit import elf
from scripts.basics import REPO
from scripts.build import BuildError
from scripts.interpreters import Interpreter
from scripts.toolchain import Toolchain
from tests.pipeline.git_helpers import (
    GIT,
    git_checkout_versioned_by_tags,
    git_checkout_with_a_project,
)

FIXTURE = REPO / "tests" / "fixtures" / "anyext"
PER_PYTHON = REPO / "tests" / "fixtures" / "anyext-per-python.toml"


@pytest.fixture(scope="module")
def rows() -> list[matrix.Row]:
    return matrix.load_rows()


def row_of(rows: list[matrix.Row], minor: str) -> matrix.Row:
    return matrix.select_rows(rows, minor)[0]


def test_fixture_tables_load() -> None:
    abi3 = project.load_project(FIXTURE)
    assert (abi3.distribution, abi3.python_abi, abi3.kinds) == (
        "anyext",
        "abi3",
        ("stable", "pinned"),
    )
    per_python = project.load_project(PER_PYTHON)
    assert per_python.root == FIXTURE.resolve()
    assert per_python.python_abi == "per-python"


def test_pinned_only_project_pins_every_row(rows) -> None:
    table = project.load_project(PER_PYTHON)
    served = project_wheels.served_rows(table, [row_of(rows, "2.9"), row_of(rows, "2.14")])
    assert [r.variant for r in served] == ["pt29cu128", "pt214cu130"]


def test_stable_only_project_refuses_older_rows(rows, tmp_path) -> None:
    table = project.load_project(FIXTURE)
    stable_only = project.Project(**{**table.__dict__, "kinds": ("stable",)})
    with pytest.raises(SystemExit, match=r"no wheel serves torch 2\.9\.1"):
        project_wheels.served_rows(stable_only, [row_of(rows, "2.9"), row_of(rows, "2.14")])


def test_cpu_rows_are_labelled_cpu(rows) -> None:
    assert project_wheels.cpu_row(row_of(rows, "2.14")).variant == "stable.cpu"
    assert project_wheels.cpu_row(row_of(rows, "2.9")).variant == "pt29cpu"
    assert project_wheels.cpu_row(row_of(rows, "2.9")).requires_torch == "torch==2.9.*"


def test_sources_leave_out_build_output(tmp_path) -> None:
    root = tmp_path / "proj"
    for rel in ("pkg/setup.py", "README.md", "pkg/src/op.cpp", "pkg/build/temp/op.o",
                "pkg/x.egg-info/PKG-INFO", ".git/HEAD", "pkg/mod/_C.abi3.so"):  # fmt: skip
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("x")
    table = tmp_path / "t.toml"
    table.write_text(
        '[tool.torch-wheels]\ndistribution = "pkg"\nimport-name = "pkg"\ncheckout = "proj"\n'
        'build-dir = "pkg"\n'
    )
    loaded = project.load_project(table)
    build_dir = project_build.copy_project(loaded, tmp_path / "copy")
    copied = sorted(
        p.relative_to(tmp_path / "copy").as_posix()
        for p in (tmp_path / "copy").rglob("*")
        if p.is_file()
    )
    assert copied == ["README.md", "pkg/setup.py", "pkg/src/op.cpp"]
    assert build_dir == tmp_path / "copy" / "pkg"


def test_build_requirements_drop_torch() -> None:
    requirements = project_build.build_requirements(project.load_project(FIXTURE))
    assert requirements[0] == "setuptools>=77"
    assert not [r for r in requirements if r.startswith("torch")]
    assert "build" in requirements


def test_build_env_has_the_table_and_sysroot_compilers(rows, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HOTLOOP_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "3.5")  # the caller's: never reaches the build
    tools = Toolchain(None, tmp_path / "sysroot", {"CC": "/usr/bin/gcc", "CXX": "/usr/bin/g++"}, {})
    env = project_build.project_build_env(
        project.load_project(FIXTURE), row_of(rows, "2.9"), "pinned", tools, tmp_path, tmp_path
    )
    assert env["ANYEXT_ABI"] == "pinned"
    assert env["ANYEXT_CUDA"] == "0"
    assert "TORCH_CUDA_ARCH_LIST" not in env
    wrapper = Path(env["CXX"]).read_text()
    assert '\nexec "/usr/bin/g++" ' in wrapper
    assert f'"--sysroot={tmp_path / "sysroot"}"' in wrapper
    assert f'"-L{tmp_path / "sysroot" / "usr/lib/x86_64-linux-gnu"}"' in wrapper
    assert Path(env["CC"]).name == "gcc"


def test_build_env_dates_the_build_by_the_projects_checkout(rows, tmp_path, monkeypatch) -> None:
    """SOURCE_DATE_EPOCH is the last commit to the project's own checkout (here a folder of a
    larger one), not hotloop's: the project's wheel is reproducible whatever hotloop's state."""
    monkeypatch.setenv("HOTLOOP_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)
    checkout = git_checkout_with_a_project(tmp_path / "monorepo")
    table = tmp_path / "t.toml"
    table.write_text(
        '[tool.torch-wheels]\ndistribution = "ext"\nimport-name = "ext"\n'
        f'checkout = "{checkout.relative_to(tmp_path).as_posix()}"\n'
    )
    tools = Toolchain(None, tmp_path / "sysroot", {"CC": "/usr/bin/gcc", "CXX": "/usr/bin/g++"}, {})
    env = project_build.project_build_env(
        project.load_project(table), row_of(rows, "2.14"), "stable", tools, tmp_path, tmp_path
    )
    assert env["SOURCE_DATE_EPOCH"] == "1700000000"


def table_with(tmp_path: Path, body: str) -> project.Project:
    """The fixture's table with ``body`` added (a file beside the fixture checkout)."""
    path = tmp_path / "table.toml"
    path.write_text(
        f'[tool.torch-wheels]\ndistribution = "anyext"\nimport-name = "anyext"\n'
        f'checkout = "{os.path.relpath(FIXTURE, tmp_path)}"\n{body}'
    )
    return project.load_project(path)


@pytest.mark.parametrize(
    ("line", "name", "value"),
    [
        ('build-env = { FORCE_CUDA = "{cuda}" }', "FORCE_CUDA", "1"),
        ('build-env = { CAUSAL_CONV1D_FORCE_BUILD = "TRUE" }', "CAUSAL_CONV1D_FORCE_BUILD", "TRUE"),
        ('build-env = { MAX_JOBS = "1" }', "MAX_JOBS", "1"),
        ('build-env = { NVCC_THREADS = "1" }', "NVCC_THREADS", "1"),
        ('build-env = { NVCC_APPEND_FLAGS = "-lineinfo" }', "NVCC_APPEND_FLAGS", "-lineinfo"),
        ('cuda-archs = "9.0"', "TORCH_CUDA_ARCH_LIST", "9.0"),
    ],
    ids=["force-cuda", "force-build", "max-jobs", "nvcc-threads", "nvcc-flags", "arch-list"],
)
def test_what_readmes_ask_a_builder_to_set_reaches_the_build(
    rows, tmp_path, monkeypatch, line, name, value
) -> None:
    """FORCE_CUDA, a FORCE_BUILD switch against prebuilt downloads, MAX_JOBS, nvcc's own
    flags and the arch list: the table's values win over the pipeline's defaults."""
    monkeypatch.setenv("HOTLOOP_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("MAX_JOBS", "16")
    tools = Toolchain(
        tmp_path / "cuda", tmp_path / "sysroot", {"CC": "/usr/bin/gcc", "CXX": "/usr/bin/g++"}, {}
    )
    table = table_with(tmp_path, line + "\n")
    env = project_build.project_build_env(
        table, row_of(rows, "2.14"), "stable", tools, tmp_path, tmp_path
    )
    assert env[name] == value


def test_a_cuda_build_points_cmake_and_bare_nvcc_at_the_rows_toolkit(
    rows, tmp_path, monkeypatch
) -> None:
    """A CMake build (scikit-build-core) took this builder's /usr/local/bin/nvcc 13.0 for a
    CUDA 12.8 row and linked with the host's g++ (glibc 2.36 symbols, refused at repair):
    CMake reads CUDACXX, CUDAHOSTCXX and CUDAToolkit_ROOT, a setup.py running `nvcc` PATH.
    The caller's own values never reach a build, CPU builds included."""
    monkeypatch.setenv("HOTLOOP_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("CUDACXX", "/usr/local/bin/nvcc")
    monkeypatch.setenv("CUDAToolkit_ROOT", "/usr/local/cuda")
    monkeypatch.setenv("CUDAARCHS", "52")
    compilers = {"CC": "/usr/bin/gcc", "CXX": "/usr/bin/g++"}
    cuda = Toolchain(tmp_path / "cuda", tmp_path / "sysroot", compilers, {})
    env = project_build.project_build_env(
        table_with(tmp_path, ""), row_of(rows, "2.9"), "pinned", cuda, tmp_path, tmp_path
    )
    assert env["CUDACXX"] == str(tmp_path / "cuda" / "bin" / "nvcc")
    assert env["CUDAToolkit_ROOT"] == env["CUDA_HOME"] == str(tmp_path / "cuda")
    assert env["CUDAHOSTCXX"] == env["CXX"]
    assert f'"--sysroot={tmp_path / "sysroot"}"' in Path(env["CUDAHOSTCXX"]).read_text()
    assert env["PATH"].split(os.pathsep)[0] == str(tmp_path / "cuda" / "bin")
    assert env["CUDAARCHS"] == "80-real;86-real;89-real;90"  # the 2.9 row's 8.0;8.6;8.9;9.0+PTX
    cpu = Toolchain(None, tmp_path / "sysroot", compilers, {})
    env = project_build.project_build_env(
        table_with(tmp_path, ""), row_of(rows, "2.9"), "pinned", cpu, tmp_path, tmp_path
    )
    assert not {"CUDACXX", "CUDAToolkit_ROOT", "CUDAHOSTCXX", "CUDA_HOME", "CUDAARCHS"} & set(env)


def test_a_cpu_build_of_a_cmake_project_on_torchs_cuda_build_says_why_it_stops() -> None:
    """pyg-lib's --cpu build (CMake, find_package(Torch)) stopped in torch's CMake config with
    "Your installed Caffe2 version uses CUDA but I cannot find the CUDA libraries": the torch
    on PyPI is a CUDA build, whose config asks for a CUDA toolkit whatever the project builds."""
    log_text = (
        "CMake Error at .../torch/share/cmake/Caffe2/Caffe2Config.cmake:90 (message):\n"
        "  Your installed Caffe2 version uses CUDA but I cannot find the CUDA\n"
        "  libraries.  Please set the proper CUDA prefixes and / or install CUDA.\n"
    )
    said = project_build.cpu_build_failure(log_text)
    assert "find_package(Torch)" in said
    assert "torch's CUDA build" in said
    assert "leave out --cpu" in said
    assert project_build.cpu_build_failure("error: x.cpp\n") == ""


def cuda_12_4_toolkit_without_libraries(root: Path) -> Path:
    """The least of a CUDA 12.4 toolkit that CMake's FindCUDAToolkit accepts: an nvcc that
    tells its release, the runtime's headers and library; no math libraries, like the
    pipeline's own toolkits."""
    for rel in ("include/cuda_runtime.h", "lib64/libcudart.so"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).touch()
    (root / "include/cuda_runtime_api.h").write_text("#define CUDART_VERSION 12040\n")
    nvcc = root / "bin" / "nvcc"
    nvcc.parent.mkdir()
    nvcc.write_text(
        "#!/bin/sh\necho 'nvcc: NVIDIA (R) Cuda compiler driver'\n"
        "echo 'Cuda compilation tools, release 12.4, V12.4.131'\n"
    )
    nvcc.chmod(0o755)
    return root


CMAKE_LINKED_CUDA_LIBRARIES = """\
cmake_minimum_required(VERSION 3.18)
project(probe LANGUAGES NONE)
find_package(CUDAToolkit REQUIRED)
foreach(lib cudart cublas cusparse)
  if(TARGET CUDA::${lib})
    get_target_property(where CUDA::${lib} IMPORTED_LOCATION)
    message(STATUS "CUDA::${lib} at ${where}")
  else()
    message(STATUS "CUDA::${lib} not found")
  endif()
endforeach()
"""


def test_cmake_finds_torchs_cuda_libraries_in_a_cuda_build(rows, tmp_path, monkeypatch) -> None:
    """bitsandbytes' CMake stopped at `Target "bitsandbytes" links to: CUDA::cublas but the
    target was not found`: the pipeline's toolkit has no cuBLAS, and torch's nvidia-* wheels
    ship only run-time names (libcublas.so.12), which CMake and `-lcublas` do not look for.
    A CUDA build links torch's own, whose run-time names torch's installation provides."""
    from cmake import CMAKE_BIN_DIR

    monkeypatch.setenv("HOTLOOP_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("CMAKE_LIBRARY_PATH", str(tmp_path / "elsewhere"))
    site = tmp_path / "site"
    libraries = {"cublas": "libcublas.so.12", "cusparse": "libcusparse.so.12"}
    for component, name in libraries.items():
        (site / "nvidia" / component / "lib").mkdir(parents=True)
        (site / "nvidia" / component / "lib" / name).touch()
    toolkit = cuda_12_4_toolkit_without_libraries(tmp_path / "cuda")
    compilers = {"CC": "/usr/bin/gcc", "CXX": "/usr/bin/g++"}
    cuda = Toolchain(toolkit, tmp_path / "sysroot", compilers, {})
    table = table_with(tmp_path, "")
    env = project_build.project_build_env(
        table, row_of(rows, "2.9"), "pinned", cuda, site, tmp_path / "work"
    )
    probe = tmp_path / "probe"
    probe.mkdir()
    (probe / "CMakeLists.txt").write_text(CMAKE_LINKED_CUDA_LIBRARIES)
    configured = subprocess.run(
        [str(Path(CMAKE_BIN_DIR) / "cmake"), "-S", str(probe), "-B", str(tmp_path / "b")],
        env=env, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    found = dict(
        line.removeprefix("-- CUDA::").split(" at ", 1)
        for line in configured.splitlines()
        if line.startswith("-- CUDA::") and " at " in line
    )
    assert Path(found["cudart"]) == toolkit / "lib64" / "libcudart.so"
    for component, name in libraries.items():
        assert Path(found[component]).resolve() == site / "nvidia" / component / "lib" / name
    # a setup.py's `-lcublas` (gcc's LIBRARY_PATH) finds the same
    assert (Path(env["LIBRARY_PATH"]) / "libcublas.so").resolve().name == "libcublas.so.12"
    assert str(tmp_path / "elsewhere") not in env["CMAKE_LIBRARY_PATH"]
    cpu = Toolchain(None, tmp_path / "sysroot", compilers, {})
    env = project_build.project_build_env(
        table, row_of(rows, "2.9"), "pinned", cpu, site, tmp_path / "work"
    )
    assert not {"CMAKE_LIBRARY_PATH", "LIBRARY_PATH"} & set(env)


def test_a_cmake_target_on_a_cuda_library_torch_does_not_ship_is_named() -> None:
    """CMake's own words for a CUDA library target it did not find ('links to: CUDA::nppc but
    the target was not found') name no cause: the links cover torch's nvidia-* libraries, and
    a library torch does not ship has none."""
    log_text = (
        "CMake Error at CMakeLists.txt:12 (target_link_libraries):\n"
        '  Target "ext" links to:\n\n    CUDA::nppc\n\n  but the target was not found.\n'
        '  Target "ext" links to:\n\n    CUDA::nvjpeg\n\n  but the target was not found.\n'
    )
    said = project_build.missing_cuda_libraries(log_text)
    assert "CUDA::nppc, CUDA::nvjpeg" in said
    assert "torch's nvidia-* wheels" in said
    assert project_build.missing_cuda_libraries("error: x.cu\n") == ""


def test_a_cpu_build_that_compiled_cuda_says_so() -> None:
    """diff-gaussian-rasterization has CUDA sources only: its --cpu build found the builder's
    nvcc and stopped in torch's arch flags with an IndexError."""
    log_text = (
        "W1129 cpp_extension.py:140] No CUDA runtime is found, using CUDA_HOME='/usr/local'\n"
        '  File ".../torch/utils/cpp_extension.py", line 2600, in _get_cuda_arch_flags\n'
        "IndexError: list index out of range\n"
    )
    said = project_build.cpu_build_failure(log_text)
    assert "this CPU build compiled CUDA" in said
    assert "(/usr/local, from the nvcc on PATH)" in said
    assert "leave out --cpu" in said
    # a CPU build that failed otherwise, torch's warning at import notwithstanding
    assert project_build.cpu_build_failure(log_text.split("\n")[0] + "\nerror: x.cpp\n") == ""


def test_build_requires_join_the_build_venv(tmp_path) -> None:
    """What a README asks to pip install before ``pip install --no-build-isolation .``."""
    table = table_with(tmp_path, 'build-requires = ["packaging", "psutil>=5"]\n')
    requirements = project_build.build_requirements(table)
    assert requirements[:3] == ["setuptools>=77", "packaging", "psutil>=5"]


def submodule_checkout(tmp_path: Path, filled: bool) -> project.Project:
    """A checkout with a CUTLASS submodule under csrc/ (empty unless ``filled``) that the
    build reads, and a docs theme submodule, never filled, that it does not."""
    root = tmp_path / "proj"
    (root / "csrc" / "cutlass").mkdir(parents=True)
    (root / "csrc" / "cutlass" / ".git").write_text("gitdir: ../../.git/modules/cutlass\n")
    if filled:
        (root / "csrc" / "cutlass" / "include").mkdir()
        (root / "csrc" / "cutlass" / "include" / "cutlass.h").write_text("//\n")
    (root / "csrc" / "op.cu").write_text("//\n")
    (root / "setup.py").write_text("")
    (root / "docs").mkdir()
    (root / ".gitmodules").write_text(
        '[submodule "csrc/cutlass"]\n\tpath = csrc/cutlass\n\turl = https://github.com/NVIDIA/cutlass\n'
        '[submodule "docs/theme"]\n\tpath = docs/theme\n\turl = https://example.org/theme\n'
    )
    table = tmp_path / "t.toml"
    table.write_text(
        '[tool.torch-wheels]\ndistribution = "pkg"\nimport-name = "pkg"\ncheckout = "proj"\n'
        'sources = ["setup.py", "csrc"]\n'
    )
    return project.load_project(table)


def test_an_empty_submodule_the_build_reads_is_refused_before_building(tmp_path) -> None:
    table = submodule_checkout(tmp_path, filled=False)
    with pytest.raises(BuildError) as err:
        project_build.copy_project(table, tmp_path / "copy")
    message = str(err.value)
    assert "the git submodules csrc/cutlass (.gitmodules) are empty" in message
    assert f"git -C {tmp_path / 'proj'} submodule update --init --recursive" in message
    assert not (tmp_path / "copy").exists()


def test_a_checked_out_submodule_is_copied_and_one_outside_the_sources_is_not_needed(
    tmp_path,
) -> None:
    table = submodule_checkout(tmp_path, filled=True)
    project_build.copy_project(table, tmp_path / "copy")
    assert (tmp_path / "copy" / "csrc" / "cutlass" / "include" / "cutlass.h").is_file()
    assert not (tmp_path / "copy" / "csrc" / "cutlass" / ".git").exists()


def test_archs_a_toolkit_cannot_target() -> None:
    targets = ["compute_75", "compute_80", "compute_90"]
    assert project_build.unsupported_archs("8.0;9.0+PTX", targets) == []
    assert project_build.unsupported_archs("8.0;10.0;12.0+PTX", targets) == ["sm_100", "sm_120"]


def test_own_gencode_failure_is_explained(rows) -> None:
    text = "nvcc fatal   : Unsupported gpu architecture 'compute_100'\n"
    row = row_of(rows, "2.9")
    message = project_build.unsupported_in_log(text, row)
    assert f"nvcc {row.toolkit.nvcc}" in message
    assert "compute_100" in message
    assert "TORCH_CUDA_ARCH_LIST" in message
    assert project_build.unsupported_in_log("error: something else", row) == ""


def test_check_archs_refuses_before_compiling(rows, tmp_path) -> None:
    nvcc = tmp_path / "bin" / "nvcc"
    nvcc.parent.mkdir()
    nvcc.write_text("#!/bin/sh\necho compute_80\necho compute_90\n")
    nvcc.chmod(0o755)
    with pytest.raises(BuildError, match=r"cannot target sm_100 .*cuda-archs"):
        project_build.check_archs(row_of(rows, "2.9"), "9.0;10.0", tmp_path)


def plain_wheel(folder: Path, requires: str = "torch") -> Path:
    info = "mypkg-0.0.1.dist-info"
    path = folder / "mypkg-0.0.1-cp39-abi3-linux_x86_64.whl"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("mypkg/__init__.py", "")
        zf.writestr(
            f"{info}/METADATA",
            f"Metadata-Version: 2.4\nName: mypkg\nVersion: 0.0.1\nRequires-Dist: {requires}\n"
            "Requires-Dist: numpy\n\nlong description\n",
        )
        zf.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nTag: cp39-abi3-linux_x86_64\n")
        zf.writestr(f"{info}/RECORD", "")
    return path


def test_relabel_writes_version_and_torch_pin(tmp_path) -> None:
    labelled = relabel.label_wheel(
        plain_wheel(tmp_path, "torch>=2.6"), "pt29cu128", "torch==2.9.*", tmp_path / "out"
    )
    assert labelled.name == "mypkg-0.0.1+pt29cu128-cp39-abi3-linux_x86_64.whl"
    with zipfile.ZipFile(labelled) as zf:
        names = zf.namelist()
        metadata = zf.read("mypkg-0.0.1+pt29cu128.dist-info/METADATA").decode()
        record = zf.read("mypkg-0.0.1+pt29cu128.dist-info/RECORD").decode()
    assert not [n for n in names if n.startswith("mypkg-0.0.1.dist-info/")]
    assert "Version: 0.0.1+pt29cu128\n" in metadata
    assert "Requires-Dist: torch==2.9.*\n" in metadata
    assert "torch>=2.6" not in metadata
    assert "Requires-Dist: numpy\n" in metadata
    assert metadata.endswith("\nlong description\n")
    assert "mypkg/__init__.py,sha256=" in record


def test_relabel_keeps_a_wheel_with_the_same_label_and_refuses_another(tmp_path) -> None:
    wheel = plain_wheel(tmp_path)
    first = relabel.label_wheel(wheel, "stable.cu13", "torch>=2.10", tmp_path / "a")
    assert relabel.label_wheel(first, "stable.cu13", "torch>=2.10", tmp_path / "b") == first
    with pytest.raises(
        relabel.RelabelError, match=r"'stable\.cu13', but it was built as 'pt29cu128'"
    ):
        relabel.label_wheel(first, "pt29cu128", "torch==2.9.*", tmp_path / "c")


def relabel_refusal(tmp_path: Path, version: str, label: str, requires_torch: str) -> str:
    """Why relabelling a wheel built as ``version`` as ``label`` is refused."""
    wheel = plain_wheel(tmp_path)
    built = wheel.rename(wheel.with_name(f"mypkg-{version}-cp39-abi3-linux_x86_64.whl"))
    with pytest.raises(relabel.RelabelError) as err:
        relabel.label_wheel(built, label, requires_torch, tmp_path / "out")
    return str(err.value)


def test_relabel_says_where_a_projects_own_git_label_is_turned_off(tmp_path) -> None:
    """torchao's setup.py appends `+git<short commit>` unless VERSION_SUFFIX is set: in the
    build's copy, with no repository, that is `+git`; the advice names the table's
    build-env, where such a switch goes."""
    message = relabel_refusal(tmp_path, "0.19.0+git", "pt211cpu", "torch==2.11.*")
    assert "carries the local version label 'git'" in message
    assert "VERSION_SUFFIX" in message
    assert "build-env" in message


def test_relabel_names_versioneers_unknown_version(tmp_path) -> None:
    """versioneer's version where it finds no git (the build's copy has none): not a label of
    the project's own, whose advice (drop it from the version) would not help."""
    message = relabel_refusal(tmp_path, "0+unknown", "pt29cu128", "torch==2.9.*")
    assert "0+unknown is versioneer's version" in message
    assert "Build from the project's sdist unpacked" in message
    assert "drop the project's label" not in message


def test_a_wheel_without_a_version_is_warned_of() -> None:
    warning = relabel.unversioned_warning("pkg-0.0.0-cp312-cp312-linux_x86_64.whl")
    assert warning is not None
    assert "is version 0.0.0, setuptools' default where a project names no version" in warning
    assert relabel.unversioned_warning("pkg-0.0.1-cp312-cp312-linux_x86_64.whl") is None
    assert relabel.unversioned_warning("pkg-0.9.3.dev12-cp312-cp312-linux_x86_64.whl") is None


def test_output_folder_of_someone_else_is_refused(tmp_path) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "notes.txt").write_text("mine")
    with pytest.raises(SystemExit, match="holds files this pipeline did not write"):
        project_wheels.claim_output(theirs)
    ours = project_wheels.claim_output(tmp_path / "ours")
    assert project_wheels.claim_output(ours) == ours


def test_test_command_uses_the_venv_python(tmp_path) -> None:
    table = project.load_project(FIXTURE)
    command = table.test_arguments(str(tmp_path / "bin" / "python"))
    assert command[:3] == [str(tmp_path / "bin" / "python"), "-m", "pytest"]
    assert command[3] == f"{FIXTURE.resolve()}/test/check_anyext.py"
    bare = project.Project(**{**table.__dict__, "test_command": ()})
    assert bare.test_arguments("py") == ["py", "-c", "import anyext"]


@pytest.mark.parametrize("per_python_wheel", [True, False])
def test_auto_builds_per_python_only_when_the_first_wheel_is(
    rows, monkeypatch, tmp_path, per_python_wheel
) -> None:
    # python-abi = auto: one build on the row's build Python; only if that wheel is not abi3
    # (run_cell then names its cell per Python) are the row's other Pythons built, once each.
    table = project.Project(**{**project.load_project(PER_PYTHON).__dict__, "python_abi": "auto"})
    calls = []

    def fake_cell(project_, row, served, interp, test_pythons, out_dir, cpu):
        calls.append(interp.version)
        name = f"{row.variant}-py{interp.version}" if per_python_wheel else row.variant
        return project_wheels.CellReport(name, row.torch, "cpu")

    monkeypatch.setattr(project_wheels, "run_cell", fake_cell)
    monkeypatch.setattr(
        project_wheels,
        "find_interpreters",
        lambda versions: {v: Interpreter(v, tmp_path / f"python{v}", "test") for v in versions},
    )
    row = row_of(rows, "2.14").pinned()
    project_wheels.run_project(table, [row], tmp_path, None, skip_tests=True, cpu=True)
    others = [p for p in row.pythons if p != row.build_python]
    assert calls == [row.build_python, *others] if per_python_wheel else [row.build_python]


def test_stable_wheel_is_built_against_its_oldest_row_even_unselected(
    rows, monkeypatch, tmp_path
) -> None:
    # --torch 2.15 alone: the CUDA 13 stable wheel is still built against torch 2.11.
    built = []

    def fake_cell(project_, row, served, interp, test_pythons, out_dir, cpu):
        built.append((row.torch, [r.torch for r in served]))
        return project_wheels.CellReport(row.variant, row.torch, "cpu")

    monkeypatch.setattr(project_wheels, "run_cell", fake_cell)
    monkeypatch.setattr(
        project_wheels,
        "find_interpreters",
        lambda versions: {v: Interpreter(v, tmp_path / f"python{v}", "test") for v in versions},
    )
    newest = row_of(rows, "2.15")
    table = project.load_project(FIXTURE)
    project_wheels.run_project(table, [newest], tmp_path, ["3.12"], skip_tests=True, cpu=False)
    assert built == [(newest.build_torch, [newest.torch])]
    assert newest.build_torch != newest.torch


def test_a_cell_whose_work_folder_another_run_holds_stops_before_building(
    rows, monkeypatch, tmp_path
) -> None:
    monkeypatch.setenv("HOTLOOP_CACHE_DIR", str(tmp_path / "cache"))
    table = project.load_project(FIXTURE)
    row = project_wheels.cpu_row(row_of(rows, "2.14"))
    interp = Interpreter("3.12", tmp_path / "python3.12", "test")
    held = project_wheels.toolchain.cache_dir() / "projects" / "anyext" / row.variant
    with basics.exclusive_folder(held), pytest.raises(basics.FolderInUse, match=str(held)):
        project_wheels.run_cell(table, row, [row], interp, {}, tmp_path / "out", cpu=True)
    assert not (tmp_path / "out").exists()


def test_a_cell_drops_search_paths_naming_its_own_folders(rows, tmp_path, monkeypatch) -> None:
    """bitsandbytes' wheel was refused for the RUNPATH CMake left naming the pipeline's
    toolkit: between the repair and the audit, a cell drops the entries naming its toolchain's
    folders and its own work folder, and logs them; the wheel then passes."""
    if shutil.which("gcc") is None:
        pytest.skip("gcc not installed")
    monkeypatch.setenv("HOTLOOP_CACHE_DIR", str(tmp_path / "cache"))
    table = table_with(tmp_path, 'kinds = ["pinned"]\npython-abi = "per-python"\n')
    row = project_wheels.cpu_row(row_of(rows, "2.9"))
    interp = Interpreter("3.12", tmp_path / "python3.12", "test")
    workdir = project_wheels.toolchain.cache_dir() / "projects" / "anyext" / f"{row.variant}-py3.12"
    tools = Toolchain(None, tmp_path / "sysroot", {"CC": "gcc", "CXX": "g++"}, {})
    monkeypatch.setattr(project_wheels.toolchain, "assemble", lambda *a, **k: tools)
    (tmp_path / "ops.c").write_text("int answer(void) { return 42; }\n")
    library = tmp_path / "_C.so"
    rpath = f"-Wl,-rpath,{workdir}/venv/lib/python3.12/site-packages/torch/lib"
    subprocess.run(
        ["gcc", "-shared", "-fPIC", rpath, "-o", str(library), str(tmp_path / "ops.c")],
        check=True,
    )

    def fake_build(project_, row_, kind, workdir_, tools_, interp_):
        tag = "cp312-cp312-manylinux_2_28_x86_64"
        info = "anyext-0.1.0.dist-info"
        files = {
            "anyext/__init__.py": b"",
            "anyext/_C.so": library.read_bytes(),
            f"{info}/METADATA": b"Metadata-Version: 2.1\nName: anyext\nVersion: 0.1.0\n",
            f"{info}/WHEEL": f"Wheel-Version: 1.0\nRoot-Is-Purelib: false\nTag: {tag}\n".encode(),
        }
        members = {name: (zipfile.ZipInfo(name), data) for name, data in files.items()}
        (workdir_ / "dist").mkdir(parents=True, exist_ok=True)
        wheel = relabel.write_wheel(
            workdir_ / "dist" / f"anyext-0.1.0-{tag}.whl", members, f"{info}/RECORD"
        )
        return build.BuildResult(wheel, 1.0, workdir_ / "build.log")

    def copied(wheel, out_dir, provided=()):
        out_dir.mkdir(parents=True, exist_ok=True)
        return Path(shutil.copy2(wheel, out_dir / wheel.name)), "auditwheel: (not run here)"

    monkeypatch.setattr(project_wheels, "build_project_wheel", fake_build)
    monkeypatch.setattr(audit.repair, "repair_wheel", copied)
    monkeypatch.setattr(project_wheels, "site_packages", lambda python: tmp_path / "site")
    monkeypatch.setattr(project_wheels, "test_wheel", lambda *a, **k: [])
    said: list[str] = []
    monkeypatch.setattr(project_wheels, "log", said.append)
    (tmp_path / "out").mkdir()
    cell = project_wheels.run_cell(
        table, row, [row], interp, {row.torch: {}}, tmp_path / "out", cpu=True
    )
    assert cell.status == "passed", cell.error
    assert any("dropped anyext/_C.so: RUNPATH" in line and str(workdir) in line for line in said)
    (published,) = (tmp_path / "out").glob("*.whl")
    with zipfile.ZipFile(published) as zf:
        assert elf.read_elf(zf.read("anyext/_C.so")).search_paths == ()


def test_git_in_the_build_sees_no_repository_around_the_copy(rows, tmp_path, monkeypatch) -> None:
    """The private copy of a checkout lives in the cache, by default inside this repository:
    a build that asks git for its version (torchao's `git rev-parse --short HEAD`) got this
    repository's commit, and one that runs `git submodule update` ran it here. git in the
    build now stops at the cell's work folder, as in a copy with no .git."""
    monkeypatch.setenv("HOTLOOP_CACHE_DIR", str(tmp_path / "cache"))
    outer = tmp_path / "outer"
    git_checkout_with_a_project(outer)
    monkeypatch.setenv("GIT_DIR", str(tmp_path / "elsewhere" / ".git"))  # the caller's: dropped
    workdir = outer / "cache" / "cell"
    copy = workdir / "checkout"
    copy.mkdir(parents=True)
    tools = Toolchain(None, tmp_path / "sysroot", {"CC": "/usr/bin/gcc", "CXX": "/usr/bin/g++"}, {})
    env = project_build.project_build_env(
        table_with(tmp_path, ""), row_of(rows, "2.9"), "pinned", tools, tmp_path, workdir
    )
    assert "GIT_DIR" not in env
    toplevel = ["git", "rev-parse", "--show-toplevel"]
    asked = subprocess.run(toplevel, cwd=copy, env=env, capture_output=True, text=True)
    assert asked.returncode != 0, asked.stdout
    assert "not a git repository" in asked.stderr
    # without the ceiling, git finds the repository around the copy
    plain = {k: v for k, v in env.items() if k != "GIT_CEILING_DIRECTORIES"}
    found = subprocess.run(toplevel, cwd=copy, env=plain, capture_output=True, text=True)
    assert found.stdout.strip() == str(outer)


def test_build_temporaries_live_in_the_cells_work_folder(rows, tmp_path, monkeypatch) -> None:
    """nvcc writes its intermediate files (tmpxft_*.ii) to $TMPDIR, /tmp by default: on a
    shared builder, something clearing /tmp under a running build failed three extension-cpp
    rows with 'cannot open source file /tmp/tmpxft_….cpp1.ii'. Each build gets a folder of its
    own in its work folder."""
    seen: dict[str, str] = {}

    def fake_build(py, src, workdir, env, what):
        seen.update(env)
        raise BuildError("stop here")

    monkeypatch.setattr(project_build.build, "create_venv", lambda *a, **k: tmp_path / "py")
    monkeypatch.setattr(project_build.build, "site_packages", lambda py: tmp_path)
    monkeypatch.setattr(project_build.build, "build_in_venv", fake_build)
    monkeypatch.setenv("TMPDIR", "/tmp")
    work = tmp_path / "work"
    (work / "build.log").parent.mkdir(parents=True)
    (work / "build.log").write_text("")
    tools = Toolchain(None, tmp_path / "sysroot", {"CC": "/usr/bin/gcc", "CXX": "/usr/bin/g++"}, {})
    interp = Interpreter("3.12", tmp_path / "python3.12", "test")
    with pytest.raises(BuildError):
        project_build.build_project_wheel(
            project.load_project(FIXTURE), row_of(rows, "2.9"), "pinned", work, tools, interp
        )
    assert seen["TMPDIR"] == str(work / "tmp")
    assert (work / "tmp").is_dir()


def table_for(tmp_path: Path, checkout: Path) -> project.Project:
    table = tmp_path / "t.toml"
    table.write_text(
        '[tool.torch-wheels]\ndistribution = "scmext"\nimport-name = "scmext"\n'
        f'checkout = "{os.path.relpath(checkout, tmp_path)}"\n'
    )
    return project.load_project(table)


@pytest.fixture(scope="module")
def scm_python(tmp_path_factory) -> Path:
    """A build venv's interpreter with setuptools-scm, as a project that asks for it has."""
    where = tmp_path_factory.mktemp("scm-venv")
    return build.create_venv(where / "venv", Path(sys.executable), ["setuptools-scm>=8"])


def test_a_version_from_git_is_the_checkouts_own_not_the_copys_fallback(
    tmp_path, scm_python
) -> None:
    """The build's copy has no .git: there setuptools-scm gives its fallback (torch-harmonics
    built as 0.0.0). The version comes from the checkout, without its local part, and asking
    writes nothing there (not setuptools-scm's version_file)."""
    checkout = git_checkout_versioned_by_tags(tmp_path)
    before = subprocess.run(
        [*GIT, "status", "--porcelain", "--ignored"], cwd=checkout, capture_output=True, text=True
    ).stdout
    assert project_build.version_from_git(table_for(tmp_path, checkout), scm_python) == "1.2.4.dev1"
    after = subprocess.run(
        [*GIT, "status", "--porcelain", "--ignored"], cwd=checkout, capture_output=True, text=True
    ).stdout
    assert after == before
    assert not (checkout / "scmext" / "_version.py").exists()


def test_the_build_is_given_the_checkouts_version(tmp_path, scm_python, monkeypatch) -> None:
    monkeypatch.setenv("HOTLOOP_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("SETUPTOOLS_SCM_PRETEND_VERSION", raising=False)
    table = table_for(tmp_path, git_checkout_versioned_by_tags(tmp_path))
    seen: dict[str, str] = {}

    def build_in_venv(python, src, workdir, env, what):
        seen.update(env)
        raise BuildError("stopped after the environment")

    monkeypatch.setattr(build, "create_venv", lambda *args, **kwargs: scm_python)
    monkeypatch.setattr(build, "site_packages", lambda python: tmp_path / "site")
    monkeypatch.setattr(build, "build_in_venv", build_in_venv)
    tools = Toolchain(None, tmp_path / "sysroot", {"CC": "/usr/bin/gcc", "CXX": "/usr/bin/g++"}, {})
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "build.log").write_text("")
    interp = Interpreter("3.12", Path(sys.executable), "PATH")
    with pytest.raises(BuildError, match="stopped after the environment"):
        project_build.build_project_wheel(
            table, matrix.load_rows()[-1], "stable", tmp_path / "work", tools, interp
        )
    assert seen["SETUPTOOLS_SCM_PRETEND_VERSION"] == "1.2.4.dev1"


def test_a_project_not_versioned_by_git_is_not_asked(tmp_path) -> None:
    checkout = git_checkout_with_a_project(tmp_path / "monorepo")
    table = table_for(tmp_path, checkout)
    assert not project_build.takes_version_from_git(table)
    assert project_build.version_from_git(table, tmp_path / "no-such-python") is None


def test_a_version_from_git_that_cannot_be_asked_is_a_clear_error(tmp_path) -> None:
    """setuptools-scm named only in setup.py's setup_requires, so the build venv lacks it."""
    checkout = git_checkout_versioned_by_tags(tmp_path)
    python = tmp_path / "python"
    python.write_text('#!/bin/sh\necho "$1 $2: No module named setuptools_scm" >&2\nexit 1\n')
    python.chmod(0o755)
    with pytest.raises(BuildError) as err:
        project_build.version_from_git(table_for(tmp_path, checkout), python)
    message = str(err.value)
    assert "the build takes its version from git through setuptools-scm" in message
    assert "(-m setuptools_scm: No module named setuptools_scm)" in message
    assert "add setuptools-scm to the table's build-requires" in message
