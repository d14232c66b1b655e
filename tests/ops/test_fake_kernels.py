"""The fake (meta) kernels refuse what the real kernels refuse.

A fake kernel also runs for tensors on the ``meta`` device, and for a call that mixes
``meta`` with a real device (the dispatcher picks the Meta kernel): one that accepted
``rms_norm(cpu_x, meta_weight)`` handed back uninitialised CPU memory. Under torch.compile
and torch.export the fake kernels are all that runs at trace time.
"""

from __future__ import annotations

from typing import Any, Callable

import pytest
import torch
from op_testing import requires_compile

import hotloop

ops = torch.ops.hotloop


def t(*shape: int, device: str = "cpu", dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(shape, device=device, dtype=dtype)


def meta(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return t(*shape, device="meta", dtype=dtype)


# (call, the message the op gives): every case mixes meta with `device` or is all-meta.
def bad_calls(device: str) -> list[Any]:
    def d(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return t(*shape, device=device, dtype=dtype)

    on = f"is on {device}"
    return [
        pytest.param(lambda: hotloop.rms_norm(d(4, 64), meta(64)), on, id="rms_norm-weight-meta"),
        pytest.param(lambda: hotloop.rms_norm(meta(4, 64), d(64)), on, id="rms_norm-x-meta"),
        pytest.param(lambda: hotloop.muladd(d(4), meta(4), 1.0), on, id="muladd-b-meta"),
        pytest.param(lambda: hotloop.muladd(meta(4), d(4), 1.0), on, id="muladd-a-meta"),
        pytest.param(lambda: hotloop.mul(d(4), meta(4)), on, id="mul-b-meta"),
        pytest.param(
            lambda: ops.rms_norm_backward(d(4, 8), d(4, 8), meta(8), 1e-6),
            on,
            id="backward-weight-meta",
        ),
        pytest.param(
            lambda: ops.rms_norm_backward(meta(4, 8), d(4, 8), None, 1e-6),
            on,
            id="backward-grad-meta",
        ),
        pytest.param(
            lambda: hotloop.fused_add_rms_norm(d(4, 8), d(4, 8), meta(8)),
            on,
            id="fused-weight-meta",
        ),
        pytest.param(
            lambda: hotloop.fused_add_rms_norm(d(4, 8), meta(4, 8), d(8)),
            on,
            id="fused-residual-meta",
        ),
        pytest.param(lambda: hotloop.rms_norm_fp8(d(4, 8), d(8), meta(1)), on, id="fp8-scale-meta"),
        pytest.param(lambda: hotloop.rms_norm_fp8(meta(4, 8), meta(8), d(1)), on, id="fp8-x-meta"),
        pytest.param(
            lambda: hotloop.rms_norm_fp8_dynamic(d(4, 8), d(8), 1e-6, meta(1)),
            on,
            id="fp8-dynamic-scale_ub-meta",
        ),
        pytest.param(
            lambda: hotloop.fused_add_rms_norm_fp8(d(4, 8), meta(4, 8), d(8), d(1)),
            on,
            id="fp8-fused-residual-meta",
        ),
        pytest.param(
            lambda: hotloop.fused_add_rms_norm_fp8_dynamic(d(4, 8), d(4, 8), meta(8)),
            on,
            id="fp8-fused-dynamic-weight-meta",
        ),
    ]


# All-meta calls the real kernels refuse for their shapes or dtypes.
META_BAD_CALLS = [
    pytest.param(lambda: hotloop.rms_norm(meta(4, 64), meta(63)), "63", id="rms_norm-weight-len"),
    pytest.param(lambda: hotloop.rms_norm(meta(4, 8), meta(2, 4)), "1-D", id="rms_norm-weight-2d"),
    pytest.param(
        # the op's contract (hotloop.rms_norm casts a weight of another dtype, as torch does)
        lambda: ops.rms_norm(meta(4, 8), meta(8, dtype=torch.float64), 1e-6),
        "same dtype",
        id="rms_norm-weight-dtype",
    ),
    pytest.param(
        lambda: hotloop.rms_norm(meta(4, 8, dtype=torch.int64)), "floating", id="rms_norm-int"
    ),
    pytest.param(lambda: ops.rms_norm(meta(), None, 1e-6), "0-dim", id="rms_norm-0d"),
    pytest.param(
        lambda: ops.rms_norm_backward(meta(4, 9), meta(4, 8), None, 1e-6),
        "grad_out has shape",
        id="backward-grad-shape",
    ),
    pytest.param(
        lambda: ops.rms_norm_backward(meta(4, 8), meta(4, 8), meta(7), 1e-6),
        "7",
        id="backward-weight-len",
    ),
    pytest.param(
        lambda: ops.rms_norm_backward(meta(4, 8, dtype=torch.float16), meta(4, 8), None, 1e-6),
        "same dtype",
        id="backward-grad-dtype",
    ),
    pytest.param(lambda: hotloop.muladd(meta(3, 4), meta(4, 3), 1.0), "shape", id="muladd-shape"),
    pytest.param(
        lambda: hotloop.mul(meta(3), meta(3, dtype=torch.float64)), "same dtype", id="mul-dtype"
    ),
    pytest.param(
        lambda: hotloop.mul(meta(3, dtype=torch.int64), meta(3, dtype=torch.int64)),
        "floating",
        id="mul-int",
    ),
    pytest.param(
        lambda: hotloop.fused_add_rms_norm(meta(4, 8), meta(4, 8), meta(9)),
        "8",
        id="fused-weight-len",
    ),
    pytest.param(
        lambda: hotloop.fused_add_rms_norm(meta(4, 8), meta(4, 9), meta(8)),
        "shape",
        id="fused-residual-shape",
    ),
    pytest.param(
        lambda: hotloop.fused_add_rms_norm(meta(8, 4).t(), meta(4, 8), meta(8)),
        "contiguous",
        id="fused-x-strided",
    ),
    pytest.param(
        lambda: hotloop.rms_norm_fp8(meta(4, 8), meta(7), meta(1)), "7", id="fp8-weight-len"
    ),
    pytest.param(
        lambda: hotloop.rms_norm_fp8(meta(4, 8), meta(8), meta(2)),
        "one element",
        id="fp8-scale-shape",
    ),
    pytest.param(
        lambda: hotloop.rms_norm_fp8(meta(4, 8), meta(8), meta(1, dtype=torch.float16)),
        "float32",
        id="fp8-scale-dtype",
    ),
    pytest.param(
        lambda: hotloop.rms_norm_fp8_dynamic(meta(4, 8, dtype=torch.int32), meta(8)),
        "floating",
        id="fp8-dynamic-int",
    ),
    pytest.param(
        lambda: hotloop.fused_add_rms_norm_fp8(meta(4, 8), meta(4, 9), meta(8), meta(1)),
        "shape",
        id="fp8-fused-residual-shape",
    ),
    pytest.param(
        lambda: hotloop.fused_add_rms_norm_fp8_dynamic(meta(4, 8), meta(8, 4).t(), meta(8)),
        "contiguous",
        id="fp8-fused-dynamic-residual-strided",
    ),
]


def test_meta_mixed_with_a_real_device_raises(device: str) -> None:
    for case in bad_calls(device):
        call, message = case.values
        with pytest.raises(RuntimeError, match=message) as info:
            call()
        assert "meta" in str(info.value), case.id


@pytest.mark.parametrize(("call", "message"), META_BAD_CALLS)
def test_meta_tensors_get_the_real_kernels_checks(call: Callable[[], Any], message: str) -> None:
    with pytest.raises(RuntimeError, match=message):
        call()


def test_fused_add_rms_norm_leaves_real_tensors_alone_with_a_meta_weight() -> None:
    x, residual = t(4, 8), t(4, 8)
    before = x.clone(), residual.clone()
    with pytest.raises(RuntimeError, match="meta"):
        hotloop.fused_add_rms_norm(x, residual, meta(8))
    torch.testing.assert_close((x, residual), before, rtol=0, atol=0)


def test_wrong_weight_length_fails_at_trace_time() -> None:
    """torch.export runs only the fake kernels: the error must come from them."""
    norm = torch.nn.Module()
    norm.weight = torch.nn.Parameter(torch.ones(63))
    norm.forward = lambda x: hotloop.rms_norm(x, norm.weight, 1e-6)
    with pytest.raises(RuntimeError, match="weight has 63 elements but x's last dim is 64"):
        torch.export.export(norm, (t(4, 64),))


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@requires_compile
def test_compile_refuses_a_wrong_weight_while_tracing(dynamic: bool) -> None:
    def f(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return hotloop.rms_norm(x, w, 1e-6) * 2

    compiled = torch.compile(f, fullgraph=True, dynamic=dynamic, backend="eager")
    # TorchRuntimeError: raised by the fake kernel while Dynamo traced, before anything ran
    # (under dynamic shapes the sizes in the message are symbols)
    with pytest.raises(
        torch._dynamo.exc.TorchRuntimeError, match=r"weight has \w+ elements but x's last dim"
    ):
        compiled(t(3, 8), t(7))


@pytest.mark.parametrize(
    ("f", "message"),
    [
        pytest.param(lambda x: hotloop.rms_norm(x), "rms_norm: expected a floating", id="rms_norm"),
        pytest.param(
            lambda x: hotloop.muladd(x, x, 1.0), "muladd: expected a floating", id="muladd"
        ),
    ],
)
@requires_compile
def test_compile_of_an_integer_input_says_what_is_wrong(f: Callable, message: str) -> None:
    x = torch.ones(3, 4, dtype=torch.int64)
    with pytest.raises(RuntimeError, match=message) as info:
        torch.compile(f, fullgraph=True, backend="eager")(x)
    assert "Observed exception" not in str(info.value)
    with pytest.raises(RuntimeError, match="expected a floating"):
        f(x)  # eager: the real kernel's message


def test_rms_norm_keeps_channels_last(device: str) -> None:
    x = t(2, 3, 4, 6, device=device).to(memory_format=torch.channels_last)
    w = torch.rand(6, device=device) + 0.5
    out = hotloop.rms_norm(x, w, 1e-6)
    assert out.is_contiguous(memory_format=torch.channels_last), out.stride()
    torch.testing.assert_close(out, torch.nn.functional.rms_norm(x, (6,), w, 1e-6))


def test_rms_norm_fake_keeps_the_memory_format() -> None:
    x = meta(2, 3, 4, 6).to(memory_format=torch.channels_last)
    assert hotloop.rms_norm(x, meta(6), 1e-6).stride() == x.stride()
    transposed = meta(6, 5).t()
    assert hotloop.rms_norm(transposed, None, 1e-6).stride() == transposed.stride()


@pytest.mark.parametrize(
    "make_x",
    [
        pytest.param(
            lambda d: t(2, 3, 4, 6, device=d).to(memory_format=torch.channels_last),
            id="channels_last",
        ),
        pytest.param(lambda d: t(6, 5, device=d).t(), id="transposed"),
    ],
)
def test_rms_norm_fake_and_real_strides_agree(device: str, make_x: Callable) -> None:
    """torch.compile plans memory from the fake kernel's strides: the real ones must match."""
    x = make_x(device)
    assert (
        hotloop.rms_norm(x, None, 1e-6).stride()
        == hotloop.rms_norm(x.to("meta"), None, 1e-6).stride()
    )
