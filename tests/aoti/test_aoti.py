"""hotloop's ops in an AOTInductor package, run by a C++ program without Python (examples/aoti).

The module builds examples/aoti's runner with build.sh and exports the example block with
export_block.py once per device, as the README's commands do, then runs the package from C++
and compares with the eager outputs the Python side wrote. On the CPU the module takes about
90 s of CPU time (a g++ build of the runner, AOTInductor compiles of the block and of a small
model that updates its inputs), most of it in g++.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import NamedTuple

import pytest
import torch

import hotloop

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "aoti"
LOADER = Path(__file__).with_name("load_package.py")
# Both the runner's comparison and this module's: float32 through a few matmuls, where
# AOTInductor's fused kernels may round differently from eager's.
RTOL, ATOL = 1e-4, 1e-5
# The hotloop ops the block calls through the dispatcher (AOTInductor's extern calls).
EXTERN_OPS = {"hotloop::rms_norm", "hotloop::fused_add_rms_norm", "hotloop::muladd"}
TIMEOUT_S = 900

requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
requires_fp8_gpu = pytest.mark.skipif(
    not torch.cuda.is_available()
    or torch.cuda.get_device_capability() < hotloop.ops.FP8_MIN_CAPABILITY,
    reason="needs a CUDA GPU of compute capability 8.9 or newer",
)


def ops_library_path() -> str:
    """hotloop's compiled ops: ``hotloop.library_path()`` where this build has it, else the
    Python extension that holds them in builds that don't."""
    library_path = getattr(hotloop, "library_path", None)
    return str(library_path()) if library_path is not None else hotloop._C.__file__


def run(args: list[str | Path], **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in args], capture_output=True, text=True, timeout=TIMEOUT_S, **kwargs
    )


def check(result: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert result.returncode == 0, (
        f"{result.args} exited with {result.returncode}\n"
        f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    )
    return result


@pytest.fixture(scope="module")
def runner(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("runner")
    env = {**os.environ, "PYTHON": sys.executable}
    check(run(["bash", EXAMPLE / "build.sh", out], env=env))
    return out / "hotloop_aoti_run"


class Exported(NamedTuple):
    device: str
    folder: Path  # block.pt2, inputs.pt, expected.pt


@pytest.fixture(
    scope="module", params=["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, requires_cuda])]
)
def exported(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Exported:
    out = tmp_path_factory.mktemp(f"block-{request.param}")
    # A cache of its own: the package must not depend on what an earlier run left behind.
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(out / "inductor-cache")}
    check(
        run(
            [sys.executable, EXAMPLE / "export_block.py", "--device", request.param, "--out", out],
            env=env,
        )
    )
    return Exported(request.param, out)


def run_block(
    runner: Path, folder: Path, *extra: str | Path, **kwargs: object
) -> subprocess.CompletedProcess[str]:
    return run(
        [
            runner,
            "--ops",
            ops_library_path(),
            "--package",
            folder / "block.pt2",
            "--inputs",
            folder / "inputs.pt",
            *extra,
        ],
        **kwargs,
    )


def load_in_python(
    package: str, inputs: list[torch.Tensor], tmp_path: Path
) -> tuple[object, list[torch.Tensor]]:
    """Python's loader (aoti_load_package) on the package, called on inputs, in a process of its
    own (load_package.py): the outputs, and the inputs as the call left them.

    On the GPU host (torch 2.11.0+cu130, Python 3.12) aoti_load_package segfaults on every
    package, CPU or CUDA, hotloop's or not, in std::regex inside the package's
    parse_device_str; the C++ runner loads the same packages there without fault. A crash is
    therefore checked against a package of x * 2 + 1 loaded in a process that never imports
    hotloop: if that crashes too the test skips, saying so; if it does not, hotloop's package
    is at fault and the test fails."""
    inputs_path, out = tmp_path / "loader-inputs.pt", tmp_path / "loader-out.pt"
    torch.save(inputs, inputs_path)
    result = run([sys.executable, LOADER, "run", package, inputs_path, out])
    if result.returncode < 0:
        control = run([sys.executable, LOADER, "control", tmp_path])
        if control.returncode < 0:
            pytest.skip(
                f"aoti_load_package crashes in this torch ({torch.__version__}) on this host "
                f"even for x * 2 + 1 in a process without hotloop (signal {-control.returncode}); "
                "the C++ runner's tests load hotloop's packages here"
            )
    check(result)
    outputs, after = torch.load(out)
    return outputs, after


def package_files(package: Path) -> dict[str, bytes]:
    """The package's files by name (without the archive's top folder)."""
    with zipfile.ZipFile(package) as archive:
        return {name.split("/", 1)[1]: archive.read(name) for name in archive.namelist()}


def extern_ops(files: dict[str, bytes]) -> set[str]:
    """The ops the package calls through the dispatcher (its ``*.wrapper.json``)."""
    (wrapper_json,) = [name for name in files if name.endswith(".wrapper.json")]
    return {node["node"]["target"] for node in json.loads(files[wrapper_json])["nodes"]}


def test_runner_matches_eager(runner: Path, exported: Exported) -> None:
    folder = exported.folder
    outputs = folder / "outputs.pt"
    result = check(
        run_block(
            runner,
            folder,
            "--expected",
            folder / "expected.pt",
            "--outputs",
            outputs,
            "--rtol",
            str(RTOL),
            "--atol",
            str(ATOL),
        )
    )
    assert "MISMATCH" not in result.stdout
    assert f"on {exported.device}:" in result.stdout
    (expected,) = torch.load(folder / "expected.pt")
    (got,) = torch.load(outputs)
    (x,) = torch.load(folder / "inputs.pt")
    assert got.shape == x.shape
    torch.testing.assert_close(got, expected, rtol=RTOL, atol=ATOL)


def test_package_calls_hotloop_ops(exported: Exported) -> None:
    files = package_files(exported.folder / "block.pt2")
    assert extern_ops(files) == EXTERN_OPS, sorted(files)
    if exported.device == "cuda":
        # The Triton RMSNorm is compiled into the package, not called through the dispatcher.
        kernels = [name for name in files if name.endswith((".cubin", ".fatbin"))]
        assert kernels, f"no compiled GPU kernels in the package: {sorted(files)}"
        (wrapper,) = [name for name in files if name.endswith(".wrapper.cpp")]
        assert b"rms_norm_fwd_kernel" in files[wrapper], "the Triton RMSNorm is not launched"


def test_runner_needs_no_libpython(runner: Path, exported: Exported, tmp_path: Path) -> None:
    files = package_files(exported.folder / "block.pt2")
    (model,) = [name for name in files if name.endswith(".wrapper.so")]
    model_so = tmp_path / "model.so"
    model_so.write_bytes(files[model])
    for binary in (runner, model_so):
        linked = check(run(["ldd", binary])).stdout
        assert "libpython" not in linked, f"{binary} links libpython:\n{linked}"


def test_ops_library_binds_without_python(runner: Path, exported: Exported) -> None:
    if not hasattr(hotloop, "library_path"):
        pytest.skip(
            "this hotloop build keeps its ops in the Python extension, whose module init "
            "needs libpython's symbols: no Python-free library to bind"
        )
    # Every symbol of every library resolved at load time, as dlopen(RTLD_NOW) does: fails
    # with "undefined symbol: Py..." if the library still needs the interpreter.
    check(run_block(runner, exported.folder, env={**os.environ, "LD_BIND_NOW": "1"}))


def test_runner_reports_a_mismatch(runner: Path, exported: Exported, tmp_path: Path) -> None:
    (expected,) = torch.load(exported.folder / "expected.pt")
    wrong = tmp_path / "wrong.pt"
    torch.save([expected + 1e-2], wrong)
    result = run_block(runner, exported.folder, "--expected", wrong)
    assert result.returncode == 1
    assert "MISMATCH" in result.stdout
    assert f"outputs differ from {wrong}" in result.stderr


def test_runner_reports_a_missing_library(runner: Path, tmp_path: Path) -> None:
    missing = tmp_path / "libmissing.so"
    result = run([runner, "--ops", missing, "--package", "block.pt2", "--inputs", "inputs.pt"])
    assert result.returncode == 1
    assert f"could not load hotloop's op library {missing}" in result.stderr


def test_runner_rejects_a_library_without_hotloop_ops(runner: Path) -> None:
    other = Path(torch.__file__).parent / "lib" / "libc10.so"
    result = run([runner, "--ops", other, "--package", "block.pt2", "--inputs", "inputs.pt"])
    assert result.returncode == 1
    assert f"{other} loaded but registered no hotloop ops" in result.stderr


def test_torch_ops_load_library() -> None:
    """The library loads with torch.ops.load_library in a Python that never imports hotloop."""
    code = """
import sys
import torch
import torch.nn.functional as F

torch.ops.load_library(sys.argv[1])
assert "hotloop" not in sys.modules
x, w = torch.randn(4, 32), torch.rand(32) + 0.5
torch.testing.assert_close(torch.ops.hotloop.rms_norm(x, w, 1e-6), F.rms_norm(x, (32,), w, 1e-6))
torch.testing.assert_close(torch.ops.hotloop.muladd(x, x, 2.0), x * x + 2.0)
"""
    check(run([sys.executable, "-c", code, ops_library_path()]))


class ResidualUpdate(torch.nn.Module):
    """fused_add_rms_norm on the caller's tensors, as an inference engine's layer does."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.rand(64) + 0.5)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        hotloop.fused_add_rms_norm(x, residual, self.weight, 1e-5)
        return x * 2


def test_package_updates_its_inputs_in_place_like_eager(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor-cache"))
    model = ResidualUpdate()
    x, residual = torch.randn(4, 64), torch.randn(4, 64)
    with torch.no_grad():
        program = torch.export.export(model, (x.clone(), residual.clone()))
        # Functionalised, the op becomes a pure call whose results are written back to the
        # inputs: the exported signature records both mutations.
        mutated = program.run_decompositions().graph_signature.user_inputs_to_mutate
        assert set(mutated.values()) == {"x", "residual"}
        package = torch._inductor.aoti_compile_and_package(
            program, package_path=str(tmp_path / "residual.pt2")
        )
        eager_x, eager_residual = x.clone(), residual.clone()
        eager_out = model(eager_x, eager_residual)
    aoti_out, (aoti_x, aoti_residual) = load_in_python(package, [x, residual], tmp_path)
    assert not torch.equal(aoti_x, x), "the package left x as it was"
    torch.testing.assert_close(aoti_x, eager_x)
    torch.testing.assert_close(aoti_residual, eager_residual)
    torch.testing.assert_close(aoti_out, eager_out)


class Fp8Producer(torch.nn.Module):
    """The FP8 norms as an FP8 GEMM's producer: static and dynamic scale, alone and fused
    (each fused op adds x to the caller's residual in place). The float8 outputs are returned
    as their bytes (a free view) for the C++ runner: C++'s unpickler cannot read float8
    tensors saved by torch.save, nor Python read those saved from C++. The last output is
    the residual after both fused ops have updated it."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.rand(64) + 0.5)
        self.register_buffer("scale", torch.full((1,), 0.01))

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, ...]:
        static = hotloop.rms_norm_fp8(x, self.weight, self.scale, 1e-5)
        dynamic, scales = hotloop.rms_norm_fp8_dynamic(x, self.weight, 1e-5)
        fused_static = hotloop.fused_add_rms_norm_fp8(x, residual, self.weight, self.scale, 1e-5)
        fused_dynamic, fused_scales = hotloop.fused_add_rms_norm_fp8_dynamic(
            x, residual, self.weight, 1e-5
        )
        as_bytes = [q.view(torch.uint8) for q in (static, dynamic, fused_static, fused_dynamic)]
        # The residual as the fused ops left it, for a runner that sees only outputs.
        return (*as_bytes, scales, fused_scales, residual.clone())


@pytest.mark.parametrize(
    "device", ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, requires_fp8_gpu])]
)
def test_fp8_ops_in_a_package_match_eager(
    device: str, runner: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor-cache"))
    model = Fp8Producer().to(device)
    x, residual = torch.randn(4, 64, device=device), torch.randn(4, 64, device=device)
    with torch.no_grad():
        program = torch.export.export(model, (x.clone(), residual.clone()))
        package = torch._inductor.aoti_compile_and_package(
            program, package_path=str(tmp_path / "block.pt2")
        )
        eager_residual = residual.clone()
        eager = model(x, eager_residual)
    assert extern_ops(package_files(Path(package))) == {
        f"hotloop::{op}" for op in hotloop.ops.FP8_OPS
    }
    # From C++ without Python, exactly (the last output is the updated residual).
    torch.save([x.cpu(), residual.cpu()], tmp_path / "inputs.pt")
    torch.save([e.cpu() for e in eager], tmp_path / "expected.pt")
    expected = ["--expected", tmp_path / "expected.pt", "--rtol", "0", "--atol", "0"]
    result = check(run_block(runner, tmp_path, *expected))
    assert "MISMATCH" not in result.stdout
    assert f"on {device}" in result.stdout
    # And from Python (last: it skips where the loader itself crashes).
    got, (_, aoti_residual) = load_in_python(package, [x, residual], tmp_path)
    torch.testing.assert_close(aoti_residual, eager_residual)
    assert len(got) == len(eager)
    for index, (g, e) in enumerate(zip(got, eager)):
        # The same kernel on the same inputs: the same bits.
        assert (g.dtype, g.shape) == (e.dtype, e.shape), index
        assert torch.equal(g, e), index
