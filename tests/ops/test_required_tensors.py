"""None for a required tensor argument: an error that names the op and the argument.

The dispatcher hands None for a ``Tensor`` (not ``Tensor?``) argument to the kernels as an
undefined tensor; without a check its first use fails inside torch ("tensor does not have a
device ... aoti_torch_get_device_type") or in Python ("'NoneType' object has no attribute").
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from op_testing import requires_compile

import hotloop
from hotloop.ops import api

# op: (the arguments of a valid call, the names of its required tensor arguments by position)
ARGUMENTS: dict[str, tuple[Callable[[str], tuple[Any, ...]], tuple[str | None, ...]]] = {
    "muladd": (lambda d: (_t(d, 4, 8), _t(d, 4, 8), 1.0), ("a", "b", None)),
    "mul": (lambda d: (_t(d, 4, 8), _t(d, 4, 8)), ("a", "b")),
    "rms_norm": (lambda d: (_t(d, 4, 8), _t(d, 8), 1e-6), ("x", None, None)),
    "rms_norm_backward": (
        lambda d: (_t(d, 4, 8), _t(d, 4, 8), _t(d, 8), 1e-6),
        ("grad_out", "x", None, None),
    ),
    "fused_add_rms_norm": (
        lambda d: (_t(d, 4, 8), _t(d, 4, 8), _t(d, 8), 1e-6),
        ("x", "residual", "weight", None),
    ),
    "rms_norm_fp8": (
        lambda d: (_t(d, 4, 8), _t(d, 8), _t(d, 1), 1e-6),
        ("x", "weight", "scale", None),
    ),
    "rms_norm_fp8_dynamic": (
        lambda d: (_t(d, 4, 8), _t(d, 8), 1e-6, None),
        ("x", "weight", None, None),
    ),
    "fused_add_rms_norm_fp8": (
        lambda d: (_t(d, 4, 8), _t(d, 4, 8), _t(d, 8), _t(d, 1), 1e-6),
        ("x", "residual", "weight", "scale", None),
    ),
    "fused_add_rms_norm_fp8_dynamic": (
        lambda d: (_t(d, 4, 8), _t(d, 4, 8), _t(d, 8), 1e-6, None),
        ("x", "residual", "weight", None, None),
    ),
}


def _t(device: str, *shape: int) -> torch.Tensor:
    return torch.rand(*shape, device=device) + 0.5


def cases() -> Iterator[tuple[str, int, str]]:
    for op, (_, names) in ARGUMENTS.items():
        for position, name in enumerate(names):
            if name is not None:
                yield op, position, name


CASES = list(cases())
IDS = [f"{op}-{name}" for op, _, name in CASES]
MODES = {
    "grad": contextlib.nullcontext,
    "no_grad": torch.no_grad,
    "inference_mode": torch.inference_mode,
}


def call_with_none(device: str, op: str, position: int) -> tuple[Any, ...]:
    args = list(ARGUMENTS[op][0](device))
    args[position] = None
    return tuple(args)


def message(op: str, name: str) -> str:
    return f"{op}: expected a tensor for {name} but got None"


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize(("op", "position", "name"), CASES, ids=IDS)
def test_none_for_a_required_tensor_names_op_and_argument(
    device: str, op: str, position: int, name: str, mode: str
) -> None:
    args = call_with_none(device, op, position)
    calls = [getattr(torch.ops.hotloop, op).default]
    if hasattr(hotloop, op):
        calls.append(getattr(hotloop, op))
    for call in calls:
        with MODES[mode](), pytest.raises(RuntimeError, match=message(op, name)):
            call(*args)


@pytest.mark.parametrize(("op", "position", "name"), CASES, ids=IDS)
@requires_compile
def test_none_for_a_required_tensor_under_compile(
    device: str, op: str, position: int, name: str
) -> None:
    args = call_with_none(device, op, position)
    compiled = torch.compile(
        getattr(torch.ops.hotloop, op).default, backend="eager", fullgraph=True
    )
    with pytest.raises(Exception, match=message(op, name)):
        compiled(*args)


@pytest.mark.skipif(api.triton_rms_norm is None, reason="Triton is not importable")
def test_none_for_the_triton_ops_required_tensors() -> None:
    x = torch.rand(4, 8)
    with pytest.raises(RuntimeError, match=message("rms_norm", "x")):
        hotloop.rms_norm(None, None, 1e-6, backend="triton")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"rms_norm\(backend='triton'\): expected a tensor for x"):
        torch.ops.hotloop.rms_norm_triton(None, None, 1e-6)
    with pytest.raises(
        ValueError, match=r"rms_norm_backward\(backend='triton'\): expected a tensor for grad_out"
    ):
        torch.ops.hotloop.rms_norm_triton_backward(None, x, None, 1e-6)
