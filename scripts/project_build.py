"""Build another project's wheel for a matrix row, as its project table describes it.

The project's files are never changed: its build folder is copied to a private one first
(a build writes ``build/`` and ``*.egg-info`` next to setup.py). The build runs without
isolation in a fresh venv holding the row's torch and the project's other build
requirements, with the environment its table asks for (``build-env``) and the pipeline's
toolchain: the row's CUDA toolkit (unless a CPU build), ccache, and compilers that target
the glibc 2.31 sysroot whether or not the project's setup.py knows of one.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from scripts import basics, build, toolchain, tools
from scripts.basics import tomllib
from scripts.build import BuildError, BuildResult
from scripts.interpreters import Interpreter
from scripts.matrix import Row, archs_from_list, cmake_cuda_architectures
from scripts.project import Project
from scripts.toolchain import Toolchain
from scripts.toolchain.sysroot import host_tuned_flags_left_out, sysroot_compilers

log = basics.logger("build")

# Never a source: what builds, venvs and version control leave in a checkout.
_SKIPPED_DIRS = frozenset({".git", "build", "dist", "__pycache__", ".nox", ".tox", ".venv"})
_SKIPPED_SUFFIXES = (".so", ".o", ".pyc")
_UNSUPPORTED_ARCH = re.compile(r"Unsupported gpu architecture '([a-z_0-9]+)'")
_SUBMODULE_PATH = re.compile(r"^\s*path\s*=\s*(.+?)\s*$", re.MULTILINE)
_SCM_REQUIREMENT = re.compile(r"(setuptools[-_]scm|hatch[-_]vcs)\b", re.IGNORECASE)
# torch's cpp_extension, on finding nvcc but no GPU; and what compiling CUDA then leaves in a log.
_CUDA_HOME_FOUND = re.compile(r"No CUDA runtime is found, using CUDA_HOME='([^']*)'")
_CUDA_COMPILE_SIGNS = ("_get_cuda_arch_flags", "unix_cuda_flags", "/bin/nvcc")


def skipped(rel: Path) -> bool:
    """Whether ``rel`` (relative to the checkout) is build output or tool state."""
    return rel.suffix in _SKIPPED_SUFFIXES or any(
        part in _SKIPPED_DIRS or part.endswith(".egg-info") for part in rel.parts
    )


def empty_submodules(project: Project) -> list[str]:
    """The git submodules (``.gitmodules``) among the build's ``sources`` that the checkout
    has not filled in: a clone without ``--recursive`` leaves each an empty folder."""
    gitmodules = project.root / ".gitmodules"
    if not gitmodules.is_file():
        return []
    sources = [s.strip("/") for s in project.sources if s not in (".", "./")]
    empty = []
    for path in _SUBMODULE_PATH.findall(gitmodules.read_text()):
        read = not sources or any(
            path == s or path.startswith(f"{s}/") or s.startswith(f"{path}/") for s in sources
        )
        folder = project.root / path
        filled = folder.is_dir() and any(p.name != ".git" for p in folder.iterdir())
        if read and not filled:
            empty.append(path)
    return empty


def project_files(project: Project) -> list[Path]:
    """The files the build reads: ``sources`` (default: the whole checkout: a setup.py may
    read files above its folder, extension-cpp's its README), outputs left out, sorted.
    BuildError when a submodule they include is not checked out."""
    root = project.root
    missing = empty_submodules(project)
    if missing:
        raise BuildError(
            f"{root}: the git submodules {', '.join(missing)} (.gitmodules) are empty, and the "
            f"build reads them; run `git -C {root} submodule update --init --recursive` first"
        )
    found: list[Path] = []
    for item in project.sources or (".",):
        path = root / item
        if path.is_file():
            found.append(path)
        elif path.is_dir():
            found += [
                p for p in path.rglob("*") if p.is_file() and not skipped(p.relative_to(root))
            ]
        else:
            raise BuildError(
                f"{project.table_file}: sources names {item!r}, which {root} does not have"
            )
    return sorted(set(found))


def copy_project(project: Project, dest: Path) -> Path:
    """A private copy of the project's sources at ``dest`` (replaced if there); returns the
    copy's build folder."""
    files = project_files(project)
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    for path in files:
        target = dest / path.relative_to(project.root)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)
    return dest / project.build_dir


def takes_version_from_git(project: Project) -> bool:
    """Whether the build asks setuptools-scm (or hatch-vcs, built on it) for its version: a
    ``[tool.setuptools_scm]`` table or either in ``[build-system] requires``, or setup.py's
    ``use_scm_version``."""
    pyproject = project.build_root / "pyproject.toml"
    if pyproject.is_file():
        data = tomllib.loads(pyproject.read_text())
        requires = data.get("build-system", {}).get("requires", [])
        if "setuptools_scm" in data.get("tool", {}) or any(
            _SCM_REQUIREMENT.match(r.strip()) for r in requires
        ):
            return True
    setup_py = project.build_root / "setup.py"
    return setup_py.is_file() and "use_scm_version" in setup_py.read_text()


def version_from_git(project: Project, python: Path) -> str | None:
    """The version setuptools-scm gives the project's own checkout (``python -m
    setuptools_scm`` there, with the build venv's ``python``: it prints, it writes no file),
    less its local part; None where the build does not take its version from git, or no
    checkout tracks the project.

    The build runs on a copy without ``.git``, where setuptools-scm finds no tag and
    falls back (torch-harmonics: ``0.0.0`` instead of ``0.9.3.dev12``); the build is given
    this version instead. The local part (``+g9e9fa53.d20261129``) gives way to the
    variant's label; the report names the commit and whether the checkout was dirty."""
    if not takes_version_from_git(project) or not build.tracked_by_git(project.root):
        return None
    found = subprocess.run(
        [str(python), "-m", "setuptools_scm"],
        cwd=project.build_root,
        capture_output=True,
        text=True,
        env=build.clean_environment(),
    )
    printed = found.stdout.split()
    if found.returncode != 0 or len(printed) != 1:
        said = (found.stderr.strip().splitlines() or found.stdout.strip().splitlines() or [""])[-1]
        raise BuildError(
            f"{project.build_root}: the build takes its version from git through "
            "setuptools-scm, and the build's copy has no .git, so the version is asked of the "
            f"checkout first; `python -m setuptools_scm` there failed ({said or 'no output'}): "
            "add setuptools-scm to the table's build-requires, or set "
            "SETUPTOOLS_SCM_PRETEND_VERSION in its build-env"
        )
    return printed[0].partition("+")[0]


def build_requirements(project: Project) -> list[str]:
    """The project's ``[build-system] requires`` less torch (the row's is installed), its
    table's ``build-requires``, and what the pipeline builds with."""
    pyproject = project.build_root / "pyproject.toml"
    declared: list[str] = []
    if pyproject.is_file():
        declared = tomllib.loads(pyproject.read_text()).get("build-system", {}).get("requires", [])
    own = [r for r in declared if not re.match(r"torch\b(?![-_.\w])", r.strip())]
    return [*own, *project.build_requires, *tools.BUILD, "build"]


def toolkit_targets(cuda_home: Path) -> list[str]:
    """The ``compute_XX`` targets this nvcc can compile for (``nvcc --list-gpu-arch``)."""
    out = subprocess.run(
        [str(cuda_home / "bin" / "nvcc"), "--list-gpu-arch"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return sorted(set(re.findall(r"compute_[0-9]+[af]?", out)))


def unsupported_archs(arch_list: str, targets: Sequence[str]) -> list[str]:
    """The archs of ``arch_list`` (torch's syntax) that none of ``targets`` compiles."""
    numbers = {t.split("_", 1)[1] for t in targets}
    wanted = [a for a in archs_from_list(arch_list) if a.startswith("sm_")]
    return [a for a in wanted if a.split("_", 1)[1] not in numbers]


def check_archs(row: Row, arch_list: str, cuda_home: Path) -> None:
    """Refuse, before compiling, archs the row's toolkit cannot target."""
    targets = toolkit_targets(cuda_home)
    bad = unsupported_archs(arch_list, targets)
    if bad:
        raise BuildError(
            f"torch {row.torch}'s wheels are compiled by nvcc {row.toolkit.nvcc}, which cannot "
            f"target {', '.join(bad)} (asked for by {arch_list!r}; it targets "
            f"{', '.join(targets)}): drop them from the project table's cuda-archs, or leave "
            "cuda-archs empty for the row's list"
        )


def unsupported_in_log(log_text: str, row: Row) -> str:
    """A sentence for a build that failed on an arch its own ``-gencode`` list asked for."""
    found = sorted(set(_UNSUPPORTED_ARCH.findall(log_text)))
    if not found:
        return ""
    return (
        f"\nnvcc {row.toolkit.nvcc} (the toolkit of torch {row.torch}'s row) cannot target "
        f"{', '.join(found)}, which the project's own -gencode flags ask for: make its build "
        "take TORCH_CUDA_ARCH_LIST (set from cuda-archs or the row), or leave such archs out "
        "for this CUDA"
    )


# CMake's words for a target that links an imported target it did not find.
_MISSING_CUDA_TARGET = re.compile(r"links to:\s+(CUDA::\w+)\s+but the target was not found")


def missing_cuda_libraries(log_text: str) -> str:
    """A sentence for a CUDA build that stopped at CMake's ``CUDA::X`` targets it did not
    find, or "": the pipeline's toolkit holds the compiler, the runtime and CCCL, and builds
    link torch's own CUDA libraries (its nvidia-* wheels); a library torch does not ship has
    neither."""
    missing = sorted(set(_MISSING_CUDA_TARGET.findall(log_text)))
    if not missing:
        return ""
    return (
        f"\nCMake found no {', '.join(missing)}: builds here link the CUDA libraries that torch's "
        "nvidia-* wheels hold (cuBLAS, cuSPARSE, cuFFT, cuRAND, cuSOLVER, NVRTC, ...), and the "
        "row's toolkit holds the compiler and the runtime alone; a library torch does not ship "
        "is not available to the build"
    )


# torch's CMake config (Caffe2Config.cmake) when the torch it describes is a CUDA build and no
# CUDA toolkit is found: what find_package(Torch) says in a CPU build against PyPI's torch.
_TORCH_CMAKE_WANTS_CUDA = "Your installed Caffe2 version uses CUDA but I cannot find the CUDA"


def cpu_build_failure(log_text: str) -> str:
    """A sentence for a CPU build that failed for want of CUDA, or "".

    - The project compiled CUDA with a toolkit torch's cpp_extension found by itself (the
      builder's nvcc on PATH), whatever its switch says (diff-gaussian-rasterization: an
      IndexError in torch's arch flags, with no GPU and no arch list to build for).
    - A CMake project's find_package(Torch) found torch's CUDA build, the one on PyPI, whose
      CMake config asks for a CUDA toolkit whatever the project builds (pyg-lib).
    """
    found = _CUDA_HOME_FOUND.search(log_text)
    if found and any(sign in log_text for sign in _CUDA_COMPILE_SIGNS):
        return (
            "\nthis CPU build compiled CUDA: torch's cpp_extension found the builder's own "
            f"toolkit ({found.group(1)}, from the nvcc on PATH) and the project builds its CUDA "
            "sources whatever its switch says. It has no CPU build here: leave out --cpu, or "
            "make it build CPU-only under a switch that the table's build-env sets to {cuda}"
        )
    if _TORCH_CMAKE_WANTS_CUDA in log_text:
        return (
            "\nthe project's find_package(Torch) found torch's CUDA build (the torch on PyPI), "
            "whose CMake config asks for a CUDA toolkit even when the project builds for the CPU "
            "alone, and a CPU build has none: build the CUDA rows (leave out --cpu)"
        )
    return ""


def project_build_env(
    project: Project, row: Row, kind: str, tools_: Toolchain, torch_site: Path, workdir: Path
) -> dict[str, str]:
    """The caller's environment, less what would point the build elsewhere, plus the
    toolchain's compilers (wrapped to target the sysroot) and the table's ``build-env``.
    A CUDA build's links to torch's CUDA libraries go in ``workdir``."""
    env = build.clean_environment()
    with_cuda = tools_.cuda_home is not None
    arch_list = project.cuda_archs or row.arch_list
    compilers = dict(tools_.compilers)
    compilers.update(sysroot_compilers(tools_.sysroot, compilers))
    env.update(
        {
            "MAX_JOBS": os.environ.get("MAX_JOBS", str(os.cpu_count() or 2)),
            "NVCC_THREADS": os.environ.get("NVCC_THREADS", "2"),
            "SOURCE_DATE_EPOCH": build.source_date_epoch(project.root),
            "TORCH_NO_COMPILER_WRAPPER": "1",
            "UV_PYTHON_DOWNLOADS": "never",
            # The copy has no .git: git in the build (a version from `git rev-parse HEAD`, a
            # `git submodule update`) finds no repository, rather than this one.
            **build.no_repository_around(workdir),
            **compilers,
            **tools_.ccache_env,
        }
    )
    if with_cuda:
        assert tools_.cuda_home is not None
        # torch's cpp_extension finds the toolkit by CUDA_HOME; CMake's CUDA language by
        # CUDACXX and CUDAToolkit_ROOT, and links with CUDAHOSTCXX, or else with the first nvcc
        # on PATH (this builder's /usr/local/bin/nvcc 13.0 for a CUDA 12.8 row) and the host's
        # own g++ (glibc 2.36 symbols). A setup.py that runs `nvcc` finds the row's first too.
        nvcc_bin = tools_.cuda_home / "bin"
        env.update(
            {
                "CUDA_HOME": str(tools_.cuda_home),
                "CUDAToolkit_ROOT": str(tools_.cuda_home),
                "CUDACXX": str(nvcc_bin / "nvcc"),
                "CUDAHOSTCXX": compilers["CXX"],
                "PATH": os.pathsep.join([str(nvcc_bin), env.get("PATH", "")]),
            }
        )
        env["TORCH_CUDA_ARCH_LIST"] = arch_list
        # CMake's own spelling of it, for targets that name no CUDA_ARCHITECTURES (else nvcc's
        # default arch alone, sm_52 for CUDA 12).
        env["CUDAARCHS"] = cmake_cuda_architectures(arch_list)
        includes = [str(p) for p in toolchain.torch_cuda_include_dirs(torch_site)]
        if includes:
            env["CPATH"] = os.pathsep.join(includes)
        # CMake's CUDA::cublas and a setup.py's -lcublas link torch's own cuBLAS (and the
        # rest of its nvidia-* libraries), as its headers are those on CPATH.
        links = workdir / "cuda-libraries"
        toolchain.torch_cuda_library_links(torch_site, tools_.cuda_home, links)
        env["CMAKE_LIBRARY_PATH"] = env["LIBRARY_PATH"] = str(links)
    env.update(
        project.build_environment(kind, row.cuda if with_cuda else None, row.torch, arch_list)
    )
    return env


def build_project_wheel(
    project: Project,
    row: Row,
    kind: str,
    workdir: Path,
    tools_: Toolchain,
    interp: Interpreter,
    extra_env: Mapping[str, str] | None = None,
) -> BuildResult:
    """Build the project's wheel for ``row`` on ``interp`` into ``workdir/dist``."""
    start = time.monotonic()
    what = f"{project.distribution} {row.variant} (Python {interp.version})"
    workdir.mkdir(parents=True, exist_ok=True)
    if tools_.cuda_home is not None:
        check_archs(row, project.cuda_archs or row.arch_list, tools_.cuda_home)
    log(f"{what}: build venv on Python {interp.version} ({interp.path})")
    py = build.create_venv(
        workdir / "venv", interp.path, [f"torch=={row.torch}", *build_requirements(project)]
    )
    src = copy_project(project, workdir / "checkout")
    env = project_build_env(project, row, kind, tools_, build.site_packages(py), workdir)
    if "SETUPTOOLS_SCM_PRETEND_VERSION" not in env:
        version = version_from_git(project, py)
        if version:
            log(f"{what}: version {version}, from git in its checkout (setuptools-scm)")
            env["SETUPTOOLS_SCM_PRETEND_VERSION"] = version
    env.update(extra_env or {})
    # nvcc's intermediates (tmpxft_*) go to $TMPDIR: a folder of this build's own, which
    # nothing else on a shared builder clears while it runs, and which the next build replaces.
    tmp = workdir / "tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    env["TMPDIR"] = str(tmp)
    try:
        wheel, log_path = build.build_in_venv(py, src, workdir, env, what=what)
    except BuildError as exc:
        log_text = (workdir / "build.log").read_text()
        found = (
            unsupported_in_log(log_text, row) + missing_cuda_libraries(log_text)
            if tools_.cuda_home
            else cpu_build_failure(log_text)
        )
        raise BuildError(str(exc) + found) from None
    left_out = host_tuned_flags_left_out(log_path.read_text())
    if left_out:
        log(
            f"{what}: its compiles asked for {', '.join(left_out)}, which would build for this "
            f"machine's CPU alone; left out, so the wheel runs on any x86-64 CPU ({log_path})"
        )
    return BuildResult(
        wheel, time.monotonic() - start, log_path, build.compile_times(src / "build")
    )
