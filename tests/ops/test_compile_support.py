"""Where torch.compile cannot run (torch 2.9 on Python 3.14), its tests skip and opcheck
drops its aot_dispatch tests only; everywhere else the suite runs all of them."""

from __future__ import annotations

import inspect

import op_testing
import pytest
import torch

import hotloop  # noqa: F401  (registers torch.ops.hotloop)

AOT_DISPATCH = ("test_aot_dispatch_dynamic",)
OTHERS = ("test_schema", "test_autograd_registration", "test_faketensor")


def torchs_default_utils() -> tuple[str, ...]:
    return tuple(inspect.signature(torch.library.opcheck).parameters["test_utils"].default)


def dynamo_supported(monkeypatch: pytest.MonkeyPatch, supported: bool) -> None:
    monkeypatch.setattr(torch._dynamo, "is_dynamo_supported", lambda: supported)


def test_without_dynamo_compile_tests_skip_and_say_why(monkeypatch: pytest.MonkeyPatch) -> None:
    dynamo_supported(monkeypatch, False)
    mark = op_testing.requires_compile_marker().mark
    assert mark.name == "skipif"
    assert mark.args == (True,)
    assert f"torch {torch.__version__} does not support torch.compile" in mark.kwargs["reason"]
    assert "is_dynamo_supported() is False" in mark.kwargs["reason"]


def test_with_dynamo_compile_tests_run(monkeypatch: pytest.MonkeyPatch) -> None:
    dynamo_supported(monkeypatch, True)
    assert op_testing.requires_compile_marker().mark.args == (False,)


def test_without_dynamo_opcheck_drops_aot_dispatch_only(monkeypatch: pytest.MonkeyPatch) -> None:
    dynamo_supported(monkeypatch, False)
    utils = op_testing.opcheck_utils()
    assert set(OTHERS) <= set(utils)
    assert not [u for u in utils if u.startswith("test_aot_dispatch")]
    assert utils == tuple(u for u in torchs_default_utils() if u not in AOT_DISPATCH)


def test_with_dynamo_opcheck_runs_torchs_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    dynamo_supported(monkeypatch, True)
    assert op_testing.opcheck_utils() == torchs_default_utils()
    assert set(AOT_DISPATCH + OTHERS) <= set(op_testing.opcheck_utils())


# With dynamo, opcheck runs aot_dispatch: only where this torch can (the marker under test).
@pytest.mark.parametrize(
    "supported",
    [
        pytest.param(False, id="without-dynamo"),
        pytest.param(True, id="with-dynamo", marks=op_testing.requires_compile),
    ],
)
def test_opcheck_runs_the_utils_it_chose(monkeypatch: pytest.MonkeyPatch, supported: bool) -> None:
    dynamo_supported(monkeypatch, supported)
    a, b = torch.randn(3, requires_grad=True), torch.randn(3)
    ran = op_testing.opcheck(torch.ops.hotloop.mul.default, (a, b))
    assert tuple(ran) == op_testing.opcheck_utils()
    assert set(ran.values()) == {"SUCCESS"}
