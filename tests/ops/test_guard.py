"""The import-time guard and `python -m hotloop`, against the installed build info."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import hotloop
from hotloop import _guard, _variant
from hotloop.__main__ import kernel_for_capability

RELEASED = ["pt28cu128", "pt29cu128", "stable.cu12", "stable.cu13"]
STABLE = {
    "version": "0.1.0+stable.cu13",
    "variant": "stable.cu13",
    "abi": "stable",
    "requires_torch": "torch>=2.10",
    "torch_version": "2.11.0+cu130",
    "torch_minor": "2.11",
    "cuda_version": "13.0",
    "released_variants": RELEASED,
}
PINNED = {
    **STABLE,
    "version": "0.1.0+pt29cu128",
    "variant": "pt29cu128",
    "abi": "pinned",
    "requires_torch": "torch==2.9.*",
    "torch_version": "2.9.1+cu128",
    "torch_minor": "2.9",
    "cuda_version": "12.8",
}


@pytest.mark.parametrize(
    ("build", "torch_version", "torch_cuda", "torch_hip", "expected"),
    [
        (STABLE, "2.11.0+cu130", "13.0", None, None),
        (STABLE, "2.15.0", "13.2", None, None),  # newer than the build: the point of it
        (STABLE, "2.10.0+cu130", "13.0", None, None),
        (STABLE, "2.9.1", "13.0", None, "exists from torch 2.10 on"),
        (STABLE, "2.11.0+cpu", None, None, "a CPU-only build"),
        (STABLE, "2.11.0+rocm7.0", None, "7.0", "ROCm 7.0"),
        (STABLE, "2.10.0", "12.8", None, "CUDA major versions differ"),
        (PINNED, "2.9.1", "12.8", None, None),
        (PINNED, "2.9.0+cu126", "12.6", None, None),
        (PINNED, "2.10.0", "12.8", None, "changes between minor versions"),
        (PINNED, "2.9.1+cu130", "13.0", None, "CUDA major versions differ"),
    ],
)
def test_find_mismatch(build, torch_version, torch_cuda, torch_hip, expected) -> None:
    mismatch = _guard.find_mismatch(build, torch_version, torch_cuda, torch_hip)
    if expected is None:
        assert mismatch is None
    else:
        assert expected in mismatch
        assert torch_version in mismatch
        assert build["version"] in mismatch


def test_a_cpu_build_loads_into_a_cuda_torch() -> None:
    cpu_build = {**STABLE, "version": "0.1.0+stable.cpu", "variant": "stable.cpu"}
    cpu_build["cuda_version"] = None
    assert _guard.find_mismatch(cpu_build, "2.14.1", "13.0") is None


@pytest.mark.parametrize(
    ("torch_version", "torch_cuda", "wheel", "page"),
    [
        ("2.9.1", "12.8", "0.1.0+pt29cu128", "cu12"),
        ("2.10.0", "12.8", "0.1.0+stable.cu12", "cu12"),
        ("2.15.0", "13.2", "0.1.0+stable.cu13", "cu13"),
        ("2.11.0+cu128", "12.8", "0.1.0+stable.cu12", "cu12"),  # a CUDA 12 build of torch 2.11
    ],
)
def test_install_hint_names_a_released_wheel_and_keeps_torch(
    torch_version: str, torch_cuda: str, wheel: str, page: str
) -> None:
    hint = _guard.install_hint(STABLE, torch_version, torch_cuda)
    assert f'"hotloop=={wheel}"' in hint
    # The release without torch's local label: pip keeps an installed 2.11.0+cu128 for it.
    assert f'"torch=={torch_version.split("+")[0]}"' in hint
    assert f"/{page}/simple/" in hint


@pytest.mark.parametrize(
    ("torch_version", "torch_cuda", "torch_hip", "says"),
    [
        ("2.13.0+cpu", None, None, "no released hotloop wheel fits torch 2.13.0+cpu"),
        ("2.11.0+cu118", "11.8", None, "no released hotloop wheel fits"),  # no CUDA 11 wheels
        ("2.7.1", "12.6", None, "no released hotloop wheel fits"),
        ("2.11.0+rocm7.0", None, "7.0", "hotloop has no ROCm wheels"),
    ],
)
def test_install_hint_never_names_a_wheel_that_is_not_built(
    torch_version: str, torch_cuda: str | None, torch_hip: str | None, says: str
) -> None:
    hint = _guard.install_hint(STABLE, torch_version, torch_cuda, torch_hip)
    assert says in hint
    assert "hotloop==" not in hint
    assert 'pip install "torch>=2.10"' in hint


@pytest.mark.parametrize("torch_version", ["", "v", "2", "2.x.0", "2!2.10.0", "latest"])
def test_a_torch_version_the_guard_cannot_read_is_its_import_error(torch_version: str) -> None:
    """Never a ValueError at import: the guard says what it found and what it expected."""
    mismatch = _guard.find_mismatch(STABLE, torch_version, "13.0")
    assert mismatch is not None
    assert f"torch {torch_version!r}" in mismatch
    assert "expected a release such as 2.11.0 or 2.11.0+cu130" in mismatch
    hint = _guard.install_hint(STABLE, torch_version, "13.0")
    assert "hotloop==" not in hint
    assert 'pip install "torch>=2.10"' in hint


@pytest.mark.parametrize(
    ("torch_version", "minor"),
    [("v2.10.0", (2, 10)), ("2.11.0a0+git1234", (2, 11)), ("2.12.0.dev20260101+cu130", (2, 12)),
     (" 2.10.0 ", (2, 10)), ("0!2.15.0.post1", (2, 15)), ("2.10rc1", (2, 10))],
)  # fmt: skip
def test_torch_versions_are_read_by_pep_440s_rules(torch_version: str, minor) -> None:
    assert _variant.torch_minor(torch_version) == minor
    assert _guard.find_mismatch(STABLE, torch_version, "13.0") is None


def test_the_import_of_an_unreadable_torch_version_is_the_guards_import_error() -> None:
    result = run_with_torch_version("2!2.10.0", torch.version.cuda)
    assert result.returncode != 0
    assert "ImportError: " in result.stderr
    assert "ValueError" not in result.stderr
    assert "torch '2!2.10.0'" in result.stderr


def test_the_source_build_advice_replaces_the_installed_wheel_and_keeps_torch() -> None:
    """No sdist is published, and `--no-binary hotloop` does nothing next to an installed
    wheel: the advice builds the source tree against the torch that is there."""
    hint = _guard.install_hint(STABLE, "2.7.1", "12.6")
    assert "--no-binary" not in hint
    assert _guard.SOURCE_BUILD in hint
    for flag in ("--no-build-isolation", "--no-deps", "--force-reinstall"):
        assert flag in _guard.SOURCE_BUILD
    assert "CUDA_HOME" in hint


@pytest.mark.parametrize(
    ("build", "index"),
    [
        (STABLE, " --index-url <hotloop index>/cu13/simple/"),
        (PINNED, " --index-url <hotloop index>/cu12/simple/"),
        ({**STABLE, "version": "0.1.0"}, ""),  # PyPI's copy: PyPI serves it
    ],
)
def test_the_reinstall_advice_keeps_torch_and_names_where_the_wheel_is(build, index) -> None:
    command = _guard.reinstall_command(build)
    assert command == (
        f'pip install --force-reinstall --no-deps "hotloop=={build["version"]}"{index}'
    )


def test_a_development_build_says_it_knows_no_released_wheels() -> None:
    hint = _guard.install_hint({**STABLE, "released_variants": []}, "2.9.1", "12.8")
    assert "development build" in hint
    assert "hotloop==" not in hint


def run_python(code: str) -> subprocess.CompletedProcess:
    """``python -c CODE`` in a fresh interpreter, its output captured."""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)


def run_with_torch_version(
    version: str, cuda: str | None, *args: str
) -> subprocess.CompletedProcess:
    """`python ARGS` in a fresh interpreter whose torch claims another version."""
    code = (
        "import runpy, sys, torch\n"
        f"torch.__version__ = {version!r}\n"
        f"torch.version.cuda = {cuda!r}\n"
        f"sys.argv = {['-m', *args]!r}\n"
        "sys.orig_argv = [sys.executable, *sys.argv]\n"
        "runpy.run_module(sys.argv[1], run_name='__main__', alter_sys=True)\n"
        if args
        else f"import torch\ntorch.__version__ = {version!r}\ntorch.version.cuda = {cuda!r}\n"
        "import hotloop\n"
    )
    return run_python(code)


def unserved_torch_version(build_info: dict, torch_cuda: str | None) -> str:
    """A torch release the build refuses although its CUDA matches: one below the
    stable-ABI floor for a stable build, another minor for a pinned one (the pt29 wheel
    serves 2.9.1)."""
    variant = _guard.built_variant(build_info)
    return next(v for v in ("2.9.1", "2.8.0") if not variant.serves(v, torch_cuda))


@pytest.mark.parametrize(
    ("build", "torch_cuda", "expected"),
    [
        (STABLE, "13.0", "2.9.1"),
        (PINNED, "12.8", "2.8.0"),
        ({**PINNED, "version": "0.1.0+pt28cu128", "variant": "pt28cu128"}, "12.8", "2.9.1"),
    ],
)
def test_unserved_torch_version_is_one_the_build_refuses(build, torch_cuda, expected) -> None:
    version = unserved_torch_version(build, torch_cuda)
    assert version == expected
    assert _guard.find_mismatch(build, version, torch_cuda) is not None


def test_import_into_a_torch_the_wheel_does_not_serve_raises_import_error() -> None:
    version = unserved_torch_version(hotloop.BUILD_INFO, torch.version.cuda)
    result = run_with_torch_version(version, torch.version.cuda)
    assert result.returncode != 0
    assert "ImportError" in result.stderr
    assert version in result.stderr
    assert hotloop.BUILD_INFO["version"] in result.stderr
    assert "pip install" in result.stderr
    assert "undefined symbol" not in result.stderr


def test_doctor_reports_a_torch_the_wheel_does_not_serve_instead_of_crashing() -> None:
    version = unserved_torch_version(hotloop.BUILD_INFO, torch.version.cuda)
    result = run_with_torch_version(version, torch.version.cuda, "hotloop")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    assert hotloop.BUILD_INFO["version"] in result.stdout
    assert "the ops can't load into this torch" in result.stdout
    assert "verdict      BROKEN" in result.stdout


def test_a_free_threaded_python_is_told_to_use_the_regular_build() -> None:
    """An abi3 wheel has no free-threaded build (3.14t imports no ``.abi3.so``): where one
    got installed anyway (``--target``, a copied site-packages), the import must say so, not
    that the wheel is damaged."""
    code = (
        "import sysconfig, torch\n"
        "real = sysconfig.get_config_var\n"
        "sysconfig.get_config_var = lambda n: 1 if n == 'Py_GIL_DISABLED' else real(n)\n"
        "import hotloop\n"
    )
    result = run_python(code)
    assert result.returncode != 0
    python = f"python{sys.version_info.major}.{sys.version_info.minor}"
    assert "ImportError" in result.stderr
    assert "free-threaded" in result.stderr
    assert f"{python}, not {python}t" in result.stderr
    assert hotloop.BUILD_INFO["version"] in result.stderr
    assert "failed to load" not in result.stderr


@pytest.mark.skipif(hotloop.BUILD_INFO["cuda_version"] is None, reason="a CPU build loads anywhere")
def test_cuda_build_with_cpu_torch_raises_import_error() -> None:
    result = run_with_torch_version(torch.__version__.split("+")[0] + "+cpu", None)
    assert "CPU-only" in result.stderr


@pytest.mark.parametrize(
    ("capability", "expected"),
    [
        ((8, 0), "sm_80"),
        ((8, 6), "sm_86"),
        ((8, 7), "sm_86"),  # Orin: runs the sm_86 cubin
        ((9, 0), "sm_90"),
        ((12, 1), "sm_120"),
        ((13, 0), "compute_120"),  # a future GPU: PTX only
        ((7, 5), None),
    ],
)
def test_kernel_for_capability(capability: tuple[int, int], expected: str | None) -> None:
    archs = ["sm_80", "sm_86", "sm_89", "sm_90", "sm_100", "sm_120", "compute_120"]
    assert kernel_for_capability(archs, capability) == expected


@pytest.mark.parametrize(
    ("archs", "capability", "expected"),
    [
        (["sm_80", "sm_90", "sm_90a"], (9, 0), "sm_90a"),  # Hopper: the wgmma kernels
        (["sm_80", "sm_90a"], (8, 6), "sm_80"),
        (["sm_90a", "compute_90a"], (10, 0), None),  # arch-specific: 9.0 only, PTX too
        (["sm_90a", "compute_90"], (10, 0), "compute_90"),
        (["sm_100a"], (10, 3), None),
        (["sm_100f"], (10, 3), "sm_100f"),  # family-specific: 10.x from 10.0 on
        (["compute_100f"], (10, 3), "compute_100f"),
        (["compute_100f"], (12, 0), None),
        (["sm_100a", "compute_100a"], (10, 0), "sm_100a"),
    ],
)
def test_kernel_for_capability_with_arch_specific_targets(
    archs: list[str], capability: tuple[int, int], expected: str | None
) -> None:
    assert kernel_for_capability(archs, capability) == expected


def test_python_m_hotloop_shows_arch_specific_targets() -> None:
    code = (
        "import runpy, sys, hotloop\n"
        "hotloop.BUILD_INFO['archs'] = ['sm_80', 'sm_90', 'sm_90a', 'sm_100f', 'compute_100f']\n"
        "sys.argv = ['-m', 'hotloop']\n"
        "runpy.run_module('hotloop', run_name='__main__', alter_sys=True)\n"
    )
    result = run_python(code)
    assert "Traceback" not in result.stderr, result.stderr
    assert (
        "archs        sm_80, sm_90, sm_90a (arch-specific: compute capability 9.0 only), "
        "sm_100f (family-specific: compute capability 10.0 to 10.x), compute_100f"
    ) in result.stdout


@pytest.mark.parametrize(
    ("commit", "shown"),
    [("a" * 40, "a" * 12), ("b" * 40 + "-dirty", "b" * 12 + "-dirty"), ("unknown", "unknown")],
)
def test_python_m_hotloop_shows_a_dirty_build_as_dirty(commit: str, shown: str) -> None:
    # A wheel built from an edited checkout must not read as a build of the clean commit.
    code = (
        "import runpy, sys, hotloop\n"
        f"hotloop.BUILD_INFO['git_commit'] = {commit!r}\n"
        "sys.argv = ['-m', 'hotloop']\n"
        "runpy.run_module('hotloop', run_name='__main__', alter_sys=True)\n"
    )
    result = run_python(code)
    assert "Traceback" not in result.stderr, result.stderr
    assert f"commit       {shown}, built " in result.stdout


def test_python_m_hotloop_reports_ok() -> None:
    result = subprocess.run([sys.executable, "-m", "hotloop"], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert hotloop.BUILD_INFO["version"] in result.stdout
    assert "kind " in result.stdout
    assert "verdict      OK" in result.stdout


def test_library_path_loads_with_torch_ops_load_library() -> None:
    path = hotloop.library_path()
    assert path.is_file()
    code = (
        "import torch\n"
        f"torch.ops.load_library({str(path)!r})\n"
        "x = torch.randn(3, 8)\n"
        "torch.testing.assert_close(torch.ops.hotloop.rms_norm(x, None, 1e-6),\n"
        "                           torch.nn.functional.rms_norm(x, (8,), eps=1e-6))\n"
    )
    result = run_python(code)
    assert result.returncode == 0, result.stderr
