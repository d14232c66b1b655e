"""Autograd and ADInplaceOrView kernels of the ops without a backward (most write in place)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from hotloop.ops.api import (
    _bump_versions_in_place,
    _dual_arguments,
    _forward_ad_active,
    _refuse_none,
)
from hotloop.ops.autograd import _LIB

# fused_add_rms_norm writes x and residual. torch's in-place ops (add_, copy_) get two
# things from their generated autograd code that an op defined in C++ without an autograd
# kernel lacks, so it gets them here, with torch's behaviour and messages:
# - Autograd: the check_inplace errors (a leaf that requires grad); and since the op has
#   no backward, an error whenever autograd would have to record it, rather than outputs
#   that silently carry no gradient;
# - ADInplaceOrView: the version-counter bump, which makes backward refuse tensors that
#   were saved and then overwritten ("modified by an inplace operation"), and the refusal
#   of inference tensors outside inference mode (this key still runs for them there).
#   torch.library.custom_op registers the same kernel for its mutable ops.
# Under torch.inference_mode() neither key is dispatched to, as for torch's ops.


def _refuse_dual(op: str, names: tuple[str, ...], args: tuple[Any, ...]) -> None:
    """An op without derivatives must not drop a forward-mode tangent silently."""
    if not _forward_ad_active():
        return
    dual = _dual_arguments(names, args)
    if dual:
        raise RuntimeError(
            f"{op}: {' and '.join(dual)} carries a forward-mode AD tangent (torch.func.jvp, "
            "jacfwd, hessian or torch.autograd.forward_ad), but the op is an inference op "
            "without derivatives; pass plain tensors (forward_ad.unpack_dual(t).primal), or "
            "for differentiable code use hotloop.rms_norm"
        )


def _fused_add_rms_norm_inplace_or_view(
    keyset: torch._C.DispatchKeySet,
    x: Tensor,
    residual: Tensor,
    weight: Tensor,
    eps: float,
    casting: int = 0,
    offset: float = 0.0,
) -> None:
    _bump_versions_in_place("fused_add_rms_norm", ("x", x), ("residual", residual))
    with torch._C._AutoDispatchBelowADInplaceOrView():
        torch.ops.hotloop.fused_add_rms_norm.default.redispatch(
            keyset & torch._C._after_ADInplaceOrView_keyset,
            x,
            residual,
            weight,
            eps,
            casting,
            offset,
        )


def _fused_add_rms_norm_autograd(
    keyset: torch._C.DispatchKeySet,
    x: Tensor,
    residual: Tensor,
    weight: Tensor,
    eps: float,
    casting: int = 0,
    offset: float = 0.0,
) -> None:
    _refuse_none("fused_add_rms_norm", ("x", x), ("residual", residual), ("weight", weight))
    _refuse_dual("fused_add_rms_norm", ("x", "residual", "weight"), (x, residual, weight))
    if torch.is_grad_enabled():
        for name, t in (("x", x), ("residual", residual)):
            if t.requires_grad and t.is_leaf:
                raise RuntimeError(
                    f"fused_add_rms_norm: {name}: a leaf Variable that requires grad is being "
                    "used in an in-place operation."
                )
        needing_grad = [
            n for n, t in (("x", x), ("residual", residual), ("weight", weight)) if t.requires_grad
        ]
        if needing_grad:
            raise RuntimeError(
                f"fused_add_rms_norm: {' and '.join(needing_grad)} requires grad, but the op is "
                "an inference op without a backward. Call it under torch.no_grad() or "
                "torch.inference_mode(), or for training write residual.add_(x) and "
                "x.copy_(hotloop.rms_norm(residual, weight, eps)), which autograd differentiates"
            )
    # The ADInplaceOrView step runs from here rather than as a second dispatch through
    # Python: each Python kernel adds about 25 us to a call (no_grad, CPU, torch 2.11).
    _fused_add_rms_norm_inplace_or_view(keyset, x, residual, weight, eps, casting, offset)


_LIB.impl("fused_add_rms_norm", _fused_add_rms_norm_autograd, "Autograd", with_keyset=True)
_LIB.impl(
    "fused_add_rms_norm",
    _fused_add_rms_norm_inplace_or_view,
    "ADInplaceOrView",
    with_keyset=True,
)


# ------------------------------------------------------------------------ inference ops
# The FP8 ops have no backward (a float8 output has no gradient worth the name): their
# Autograd kernels refuse inputs that require grad, with a message saying so, instead of
# outputs that silently carry no gradient. The fused ones write residual in place and get
# fused_add_rms_norm's bookkeeping for it (leaf check, version bump, inference tensors).


def _register_inference_op(name: str, arg_names: tuple[str, ...], written: str | None) -> None:
    op = getattr(torch.ops.hotloop, name).default

    def inplace_or_view(keyset: torch._C.DispatchKeySet, *args: Any) -> Any:
        assert written is not None  # registered below only for the ops that write
        target = args[arg_names.index(written)]
        _refuse_none(name, (written, target))
        if not torch.is_inference_mode_enabled() and target.is_inference():
            raise RuntimeError(
                f"{name}: Inplace update to inference tensor outside InferenceMode is not "
                "allowed. You can make a clone to get a normal tensor before doing inplace "
                "update. See https://github.com/pytorch/rfcs/pull/17 for more details."
            )
        torch.autograd.graph.increment_version(target)
        with torch._C._AutoDispatchBelowADInplaceOrView():
            return op.redispatch(keyset & torch._C._after_ADInplaceOrView_keyset, *args)

    def autograd(keyset: torch._C.DispatchKeySet, *args: Any) -> Any:
        _refuse_dual(name, arg_names, args)
        if torch.is_grad_enabled():
            tensors = [(n, t) for n, t in zip(arg_names, args) if isinstance(t, Tensor)]
            for arg_name, t in tensors:
                if arg_name == written and t.requires_grad and t.is_leaf:
                    raise RuntimeError(
                        f"{name}: {arg_name}: a leaf Variable that requires grad is being "
                        "used in an in-place operation."
                    )
            needing_grad = [n for n, t in tensors if t.requires_grad]
            if needing_grad:
                raise RuntimeError(
                    f"{name}: {' and '.join(needing_grad)} requires grad, but the op is an "
                    "inference op without a backward (its output is float8). Call it under "
                    "torch.no_grad() or torch.inference_mode()"
                )
        if written is not None:
            return inplace_or_view(keyset, *args)
        with torch._C._AutoDispatchBelowAutograd():
            return op.redispatch(keyset & torch._C._after_autograd_keyset, *args)

    _LIB.impl(name, autograd, "Autograd", with_keyset=True)
    if written is not None:
        _LIB.impl(name, inplace_or_view, "ADInplaceOrView", with_keyset=True)


_CASTING_ARGS = ("casting", "offset")
_register_inference_op("rms_norm_fp8", ("x", "weight", "scale", "eps", *_CASTING_ARGS), None)
_register_inference_op(
    "rms_norm_fp8_dynamic", ("x", "weight", "eps", "scale_ub", *_CASTING_ARGS), None
)
_register_inference_op(
    "fused_add_rms_norm_fp8",
    ("x", "residual", "weight", "scale", "eps", *_CASTING_ARGS),
    "residual",
)
_register_inference_op(
    "fused_add_rms_norm_fp8_dynamic",
    ("x", "residual", "weight", "eps", "scale_ub", *_CASTING_ARGS),
    "residual",
)
