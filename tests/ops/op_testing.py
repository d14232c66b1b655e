"""Helpers shared by the op tests (a module of its own: conftest.py is not importable by name)."""

from __future__ import annotations

import importlib.util
import inspect
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
import torch._dynamo
from torch.utils._python_dispatch import TorchDispatchMode

requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, requires_cuda])]


# torch.compile where this torch supports it on this Python. torch 2.9 refuses Python 3.14
# ("torch.compile is not supported on Python 3.14+"), and opcheck's aot_dispatch tests, which
# trace through the same machinery, fail there importing torch's own quantization code. The
# wheel is still tested there: every eager test, and opcheck's other tests.
def compile_supported() -> bool:
    return bool(torch._dynamo.is_dynamo_supported())


def requires_compile_marker() -> pytest.MarkDecorator:
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    return pytest.mark.skipif(
        not compile_supported(),
        reason=f"torch {torch.__version__} does not support torch.compile on Python {python} "
        "(torch._dynamo.is_dynamo_supported() is False)",
    )


requires_compile = requires_compile_marker()


def opcheck_utils() -> tuple[str, ...]:
    """torch.library.opcheck's default tests, less the aot_dispatch ones where torch.compile
    cannot run (see :func:`compile_supported`)."""
    default: Sequence[str] = (
        inspect.signature(torch.library.opcheck).parameters["test_utils"].default
    )
    if compile_supported():
        return tuple(default)
    return tuple(u for u in default if not u.startswith("test_aot_dispatch"))


def opcheck(op: Any, args: tuple[Any, ...], kwargs: dict[str, Any] | None = None) -> dict[str, str]:
    """torch.library.opcheck with every default test this torch can run on this Python."""
    return torch.library.opcheck(op, args, kwargs, test_utils=opcheck_utils())


# Every tolerance of the op tests, in one table.
# assert_close against a float64 reference, per dtype of the op's output.
TOLERANCES = {
    torch.float16: {"atol": 2e-3, "rtol": 2e-3},
    torch.bfloat16: {"atol": 2e-2, "rtol": 2e-2},
    torch.float32: {"atol": 1e-5, "rtol": 1e-5},
    torch.float64: {"atol": 1e-10, "rtol": 1e-10},
}
# Largest error against a float64 reference, relative to the reference's largest value (or to
# 1 where that is smaller: gradients that cancel to ~0, as for H = 1, keep the absolute error
# of the float32 arithmetic): one rounding of the output dtype, with margin.
RELATIVE_TOLERANCES = {
    torch.float16: 2e-3,
    torch.bfloat16: 1.6e-2,
    torch.float32: 2e-5,
    torch.float64: 1e-10,
}


def assert_norm_grads_close(
    got: tuple[torch.Tensor, torch.Tensor],
    expected: tuple[torch.Tensor, torch.Tensor],
    dtype: torch.dtype,
) -> None:
    """(grad_x, grad_weight) of a norm against another computation's, in x's dtype: a few
    roundings of it for grad_x; grad_weight sums a product over every row, so its error
    grows with their count and is measured against its largest element."""
    tol = TOLERANCES[dtype]
    grad_x, grad_w = got
    ref_x, ref_w = expected
    torch.testing.assert_close(grad_x, ref_x.to(dtype), atol=8 * tol["atol"], rtol=4 * tol["rtol"])
    scale = ref_w.abs().max().item()
    torch.testing.assert_close(
        grad_w, ref_w.to(grad_w.dtype), atol=4 * tol["rtol"] * scale, rtol=4 * tol["rtol"]
    )


# check_compiled_autograd(call, device): call(x, w) -> y, eager; torch.compile of its backward
# (compiled autograd, which training frameworks turn on) must trace it and give the eager
# backward's gradients. Source rather than a function: the Triton interpreter's checks run it
# in a Python that imports torch and hotloop only (defined here from the same source).
COMPILED_AUTOGRAD_CHECK = """
def check_compiled_autograd(call, device):
    from torch._dynamo import compiled_autograd
    from torch._dynamo.utils import counters

    x = torch.randn(8, 256, device=device, requires_grad=True)
    w = (torch.rand(256, device=device) + 0.5).requires_grad_()

    def loss():
        y = call(x, w)
        return (y * y).sum()

    expected = torch.autograd.grad(loss(), (x, w))
    compiled_autograd.reset()  # a graph cached by an earlier check would not be captured
    captures = counters["compiled_autograd"]["captures"]
    out = loss()
    with compiled_autograd._enable(torch.compile(backend="aot_eager")):
        out.backward()
    assert counters["compiled_autograd"]["captures"] == captures + 1, "Dynamo traced nothing"
    torch.testing.assert_close(x.grad, expected[0])
    torch.testing.assert_close(w.grad, expected[1])
"""


_compiled_autograd_namespace: dict[str, Any] = {"torch": torch}
exec(COMPILED_AUTOGRAD_CHECK, _compiled_autograd_namespace)
check_compiled_autograd: Callable[[Callable[..., torch.Tensor], str], None] = (
    _compiled_autograd_namespace["check_compiled_autograd"]
)


# Gradients of a bfloat16 block (norm + matmul) compiled by inductor against eager: the weight
# gradient sums over every row, so its rounding grows with them.
BLOCK_GRAD_TOLERANCE = {"atol": 5e-2, "rtol": 2e-2}
# bfloat16 end to end through a model (the Llama drop-in): a few bf16 ulps over the layers.
MODEL_TOLERANCE = {"atol": 5e-2, "rtol": 5e-2}


def rms_norm_samples(
    device: str, dtype: torch.dtype, hidden_sizes: list[int], requires_grad: bool = False
) -> list[tuple[torch.Tensor, torch.Tensor | None, float]]:
    """(x, weight, eps) for the RMSNorm ops: five rows of each hidden size with a weight,
    then the shapes and layouts every backend must take."""

    def make(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device=device, dtype=torch.float64).to(dtype)

    samples = [(make(5, h), make(h) * 0.5 + 1, 1e-6) for h in hidden_sizes]
    samples += [
        (make(2, 3, 5, 40), make(40), 1e-5),  # several leading dims
        (make(300, 24), make(24), 1e-6),  # many short rows, several to a block or program
        (make(10), None, 1e-6),  # one dimension, no weight
        (make(4, 9000), None, 1e-6),  # wide rows without weight
        (make(40, 6).t(), make(40), 1e-3),  # non-contiguous rows (a transpose)
        (make(4, 96)[:, ::2], None, 1e-6),  # strided last dim
        (make(6, 100)[1:5, :33], make(33), 1e-6),  # a row stride other than H
    ]
    # marked last, so that views stay leaves autograd fills .grad of
    return [
        (x.requires_grad_(requires_grad), w if w is None else w.requires_grad_(requires_grad), e)
        for x, w, e in samples
    ]


# The models' RMSNorm formulas, written out as transformers writes them (models/llama and
# models/gemma, modeling_*.py): the references of the casting modes where transformers
# is not installed. Where it is, the tests also run its own classes.
def llama_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' LlamaRMSNorm.forward (Mistral's and Qwen2's are the same)."""
    input_dtype = x.dtype
    hidden_states = x.to(torch.float32)
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    hidden_states = hidden_states * torch.rsqrt(variance + eps)
    return weight * hidden_states.to(input_dtype)


def gemma_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' GemmaRMSNorm.forward: (1 + weight), everything in float32."""
    output = x.float()
    output = output * torch.rsqrt(output.pow(2).mean(-1, keepdim=True) + eps)
    output = output * (1.0 + weight.float())
    return output.type_as(x)


def exact_square_sums(
    rows: int, hidden: int, dtype: torch.dtype, device: str, seed: int
) -> torch.Tensor:
    """Values k / 8, |k| <= 16: every sum of their squares is exact in float32, so any
    order of summation gives the same rstd, and kernels and references must then round
    the rest alike, bit for bit."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    k = torch.randint(-16, 17, (rows, hidden), generator=gen)
    return (k.to(torch.float32) / 8).to(device=device, dtype=dtype)


class OpRecorder(TorchDispatchMode):
    """A dispatch mode that records the name of every op it sees (``self.ops``): the eager
    shortcuts past the dispatcher must still show hotloop's ops to such modes."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def load_benchmark(name: str) -> Any:
    """benchmarks/<name>.py as a module, for the tests of a benchmark's logic (the folder is
    not a package: its scripts run from there)."""
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    # Run as scripts, they import their neighbours (result_files); a dataclass looks its
    # module up while the module loads.
    sys.path.insert(0, str(BENCHMARKS))
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[name]
        sys.path.remove(str(BENCHMARKS))
    return module
