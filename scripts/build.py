"""Build one CUDA abi3 wheel for a matrix row, in a fresh venv with exactly the row's torch.

The sources are copied to a private folder first: setup.py writes ``_build_info.py`` and
``build/`` next to itself, and other builds (and people) use the repository at the same time.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from scripts import basics, diskspace, matrix, names, toolchain, tools, wheel_sources
from scripts.basics import REPO
from scripts.interpreters import Interpreter, find_interpreters
from scripts.matrix import Row
from scripts.project import own_project
from scripts.toolchain import Toolchain

BUILD_REQUIREMENTS = (*tools.BUILD, "build")


@dataclass
class BuildResult:
    wheel: Path
    seconds: float
    log: Path
    compile_seconds: dict[str, float] = field(default_factory=dict)


def compile_times(build_dir: Path) -> dict[str, float]:
    """Seconds per object file from ninja's ``.ninja_log`` (``start end mtime output hash``).

    Only the last entry per output counts (ninja appends); a ccache hit shows as a short time.
    """
    times: dict[str, float] = {}
    for log_file in build_dir.rglob(".ninja_log"):
        for line in log_file.read_text().splitlines():
            fields = line.split("\t")
            if line.startswith("#") or len(fields) < 4:
                continue
            output = fields[3]
            if "/csrc/" in output:
                output = "csrc/" + output.split("/csrc/", 1)[1]
            times[output] = (int(fields[1]) - int(fields[0])) / 1000
    return times


log = basics.logger("build")


def uv_exe() -> str:
    exe = shutil.which("uv")
    if not exe:
        raise SystemExit("uv not found on PATH (python3 -m pip install -r requirements-nox.txt)")
    return exe


def uv_cache_dir() -> Path:
    """The folder uv downloads and unpacks wheels into (``$UV_CACHE_DIR``, else uv's own)."""
    out = subprocess.run([uv_exe(), "cache", "dir"], capture_output=True, text=True, check=True)
    return Path(out.stdout.strip())


def uv_env() -> dict[str, str]:
    env = dict(os.environ)
    env["UV_PYTHON_DOWNLOADS"] = "never"
    return env


def create_venv(path: Path, python: Path, packages: Sequence[str], seed: bool = False) -> Path:
    """Fresh uv venv at ``path`` with ``packages``; returns its interpreter.

    ``seed``: also what ``python -m venv`` puts there (pip, and setuptools below Python 3.12),
    for venvs that stand for a user's.
    """
    if path.exists():
        shutil.rmtree(path)
    uv = uv_exe()
    uv_cache = uv_cache_dir()
    # uv hardlinks from its cache into a venv on the same filesystem and copies across two
    diskspace.require_free_space([uv_cache, path.parent], diskspace.torch_install(uv_cache))
    seeding = ["--seed"] if seed else []
    subprocess.run(
        [uv, "venv", "--quiet", *seeding, "--python", str(python), str(path)],
        check=True,
        env=uv_env(),
    )
    py = path / "bin" / "python"
    subprocess.run(
        [uv, "pip", "install", "--quiet", "--python", str(py), *packages], check=True, env=uv_env()
    )
    return py


def site_packages(python: Path) -> Path:
    out = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    )
    return Path(out.stdout.strip())


def git_output(*args: str, cwd: Path | None = None) -> str:
    """What ``git ARGS`` prints in ``cwd`` (default: the repository; raises when git can't
    tell)."""
    return subprocess.run(
        ["git", *args], cwd=cwd or REPO, capture_output=True, text=True, check=True
    ).stdout.strip()


def tracked_by_git(root: Path) -> bool:
    """Whether ``root`` is a folder of its checkout's HEAD. git looks upwards: a folder it
    does not track (an unpacked sdist, an ignored copy) inside somebody else's checkout would
    otherwise take that checkout's HEAD and history for its own. (One lookup, where listing
    the folder's files would print a monorepo's.)"""
    try:
        git_output("rev-parse", "--verify", "--quiet", "HEAD:./", cwd=root)
    except (OSError, subprocess.CalledProcessError):
        return False
    return True


def checkout_commit(root: Path, paths: Sequence[str] = (".",)) -> str:
    """HEAD of the checkout that tracks ``root``, "-dirty" where ``paths`` (relative to
    ``root``) differ from it, or "unknown" where no checkout tracks it."""
    if not tracked_by_git(root):
        return "unknown"
    try:
        head = git_output("rev-parse", "HEAD", cwd=root)
        dirty = git_output("status", "--porcelain", "--", *paths, cwd=root)
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("-dirty" if dirty else "")


def git_commit() -> str:
    """The commit of the repository's own wheel sources (its HEAD, "-dirty" where they
    differ from it)."""
    return checkout_commit(REPO, wheel_sources.sources())


def source_date_epoch(root: Path | None = None) -> str:
    """``$SOURCE_DATE_EPOCH``, or the time of the last commit to ``root`` (default: the
    repository), or now where no checkout tracks it: reproducible build_time."""
    if os.environ.get("SOURCE_DATE_EPOCH"):
        return os.environ["SOURCE_DATE_EPOCH"]
    where = root or REPO
    if not tracked_by_git(where):
        return str(int(time.time()))
    return git_output("log", "-1", "--format=%ct", "--", ".", cwd=where)


def copy_sources(dest: Path) -> None:
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    for path in wheel_sources.build_inputs(REPO):
        target = dest / path.relative_to(REPO)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)
    if not (dest / "README.md").exists() and (dest / "pyproject.toml").exists():
        # pyproject names README.md as the long description; until it exists, don't fail on it.
        log("README.md missing in the repository: using a one-line placeholder for the build")
        (dest / "README.md").write_text(f"# {own_project().distribution}\n")


# The commit a build records in the wheel, handed to setup.py (git is not in the sources' copy).
GIT_COMMIT_VARIABLE = names.env_var("GIT_COMMIT")


def wheel_content_env() -> dict[str, str]:
    """The settings whose values setup.py writes into the wheel (``_build_info``, zip times).

    Every build of a release wheel, ``nox -s wheels``'s and cibuildwheel's, hands these over.
    """
    return {
        "SOURCE_DATE_EPOCH": source_date_epoch(),
        GIT_COMMIT_VARIABLE: git_commit(),
        # The guard suggests only wheels the release builds.
        names.env_var("RELEASED_VARIANTS"): ",".join(
            r.variant for r in matrix.build_rows(matrix.load_rows())
        ),
    }


# Variables of the caller's shell that would point a build at other headers, libraries, a
# system CUDA or other archs than the build is given.
FOREIGN_BUILD_VARIABLES = (
    "CPATH",
    "CPLUS_INCLUDE_PATH",
    "C_INCLUDE_PATH",
    "LIBRARY_PATH",
    "CMAKE_LIBRARY_PATH",
    "CUDA_HOME",
    "CUDA_PATH",
    "CUDAARCHS",
    "CUDACXX",
    "CUDAHOSTCXX",
    "CUDAToolkit_ROOT",
    "TORCH_CUDA_ARCH_LIST",
    # a repository of the caller's, which git in the build would read (and write) instead
    "GIT_DIR",
    "GIT_WORK_TREE",
    "GIT_INDEX_FILE",
)


def no_repository_around(folder: Path) -> dict[str, str]:
    """What git run in ``folder`` or below needs to find no repository around it, as in a
    fresh folder: the cache, where another project's build and tests run, lies by default
    inside this repository."""
    return {"GIT_CEILING_DIRECTORIES": str(folder)}


def clean_environment() -> dict[str, str]:
    """The caller's environment less ``FOREIGN_BUILD_VARIABLES``."""
    return {k: v for k, v in os.environ.items() if k not in FOREIGN_BUILD_VARIABLES}


def build_env(row: Row, tools: Toolchain, torch_site: Path) -> dict[str, str]:
    """The environment setup.py's build contract reads (see setup.py's docstring): the
    caller's, less what would point the build elsewhere, plus the row's settings, what the
    toolchain decides and the table's ``build-env``. A toolchain without CUDA makes a
    CPU-only build."""
    env = clean_environment()
    with_cuda = tools.cuda_home is not None
    cuda = row.cuda if with_cuda else None
    env.update(
        {
            **own_project().build_environment(row.kind, cuda, row.torch, row.arch_list),
            "MAX_JOBS": os.environ.get("MAX_JOBS", str(os.cpu_count() or 2)),
            "NVCC_THREADS": os.environ.get("NVCC_THREADS", "2"),
            **wheel_content_env(),
            # We wrap compilers in ccache ourselves (torch >= 2.14 would too, older ones don't).
            "TORCH_NO_COMPILER_WRAPPER": "1",
            "UV_PYTHON_DOWNLOADS": "never",
        }
    )
    if with_cuda:
        env["TORCH_CUDA_ARCH_LIST"] = row.arch_list
        # torch's headers include cublas_v2.h, cusparse.h, ...: they ship in torch's nvidia deps.
        includes = [str(p) for p in toolchain.torch_cuda_include_dirs(torch_site)]
        if includes:
            env["CPATH"] = os.pathsep.join(includes)
    env.update(tools.environment())
    return env


def pick_build_python(
    row: Row, found: Mapping[str, Interpreter | None] | None = None
) -> Interpreter:
    """The row's ``build_python``, the one cibuildwheel builds on too."""
    version = row.build_python
    found = found if found is not None else find_interpreters([version])
    interp = found.get(version)
    if interp is None:
        raise SystemExit(
            f"torch {row.torch}'s wheel is built on Python {version} (every build of a row uses "
            f"the same Python, so that their wheels are byte-identical), which was not found; "
            f"install it (pyenv install {version}) or put a python{version} on PATH"
        )
    return interp


def run_build(
    py: Path, src: Path, dist: Path, env: Mapping[str, str], log_path: Path, what: str
) -> None:
    """``python -m build --wheel --no-isolation`` of ``src`` into ``dist``, logged to
    ``log_path``; BuildError with the log's last lines when it fails."""
    with log_path.open("w") as fh:
        proc = subprocess.run(
            [str(py), "-m", "build", "--wheel", "--no-isolation", "--outdir", str(dist), str(src)],
            env=dict(env),
            stdout=fh,
            stderr=subprocess.STDOUT,
        )
    if proc.returncode != 0:
        tail = "".join(log_path.read_text().splitlines(keepends=True)[-40:])
        raise BuildError(
            f"{what}: build failed (exit {proc.returncode}); last lines of {log_path}:\n{tail}"
        )


def build_wheel(
    row: Row, workdir: Path, tools: Toolchain, build_python: Interpreter | None = None
) -> BuildResult:
    """Build ``row``'s wheel with ``tools`` into ``workdir/dist``; BuildError on failure."""
    start = time.monotonic()
    workdir.mkdir(parents=True, exist_ok=True)
    interp = build_python or pick_build_python(row)
    log(f"{row.variant}: build venv on Python {interp.version} ({interp.path})")
    py = create_venv(workdir / "venv", interp.path, [f"torch=={row.torch}", *BUILD_REQUIREMENTS])
    src = workdir / "src"
    copy_sources(src)
    env = build_env(row, tools, site_packages(py))
    wheel, log_path = build_in_venv(py, src, workdir, env, what=row.variant)
    return BuildResult(wheel, time.monotonic() - start, log_path, compile_times(src / "build"))


def build_in_venv(
    py: Path, src: Path, workdir: Path, env: Mapping[str, str], what: str
) -> tuple[Path, Path]:
    """``python -m build --wheel --no-isolation`` of ``src`` with the build venv's ``py`` (first
    on ``PATH``, and ``VIRTUAL_ENV``) into ``workdir/dist``, emptied first, logged to
    ``workdir/build.log``; the one wheel and the log. BuildError when it fails."""
    env = {
        **env,
        "PATH": os.pathsep.join([str(py.parent), env.get("PATH", "")]),
        "VIRTUAL_ENV": str(py.parent.parent),
    }
    dist = workdir / "dist"
    shutil.rmtree(dist, ignore_errors=True)
    log_path = workdir / "build.log"
    log(f"{what}: python -m build --wheel --no-isolation (log: {log_path})")
    run_build(py, src, dist, env, log_path, what=what)
    return single_wheel(dist, what), log_path


def single_wheel(dist: Path, what: str) -> Path:
    """The one wheel a build wrote into ``dist``; BuildError naming what is there otherwise."""
    wheels = sorted(dist.glob("*.whl"))
    if len(wheels) != 1:
        raise BuildError(f"{what}: expected one wheel in {dist}, found {[w.name for w in wheels]}")
    return wheels[0]


class BuildError(RuntimeError):
    pass
