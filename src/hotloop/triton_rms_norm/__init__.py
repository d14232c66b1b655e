"""RMSNorm in Triton, registered as custom ops that torch.compile traces into.

Two ops, both made with ``torch.library.triton_op`` so that torch.compile sees the
Triton kernels themselves (``wrap_triton``) instead of an opaque call:

* ``hotloop::rms_norm_triton(Tensor x, Tensor? weight, float eps, int casting=0,
  float offset=0.) -> Tensor``
* ``hotloop::rms_norm_triton_backward(Tensor grad_out, Tensor x, Tensor? weight,
  float eps, int casting=0, float offset=0.) -> (Tensor grad_x, Tensor grad_weight)``;
  ``grad_weight`` is an empty ``(0,)`` tensor when ``weight`` is None, as for the C++
  ``hotloop::rms_norm_backward``.

Semantics are those of the C++ ops: with casting 0, those of
``torch.nn.functional.rms_norm(x, (x.size(-1),), weight, eps)``: the mean of squares, the
normalisation and the multiplication by the weight happen in float32 (float64 for float64
inputs) and the result is rounded once. Casting 1 (transformers' LlamaRMSNorm) rounds the
normalised value to the dtype before the weight, 2 (GemmaRMSNorm) multiplies by
``offset + weight`` (hotloop._casting). The backward recomputes ``rstd`` from ``x``.

The weight gradient is reduced without a second pass over ``x``: the backward runs a
fixed number of persistent programs (a few per SM), which stride over the row tiles, and
each accumulates its share of ``sum_rows(grad_out * x_hat)`` in float32 registers while it
computes ``grad_x``. The ``[num_programs, H]`` partials are summed afterwards (the
scheme of Liger-Kernel and Unsloth). A row is held in registers as one power-of-two
block, or, where that would be mostly padding, as half of it plus a small tail block
(8193 as 8192 + 16). Rows wider than one program holds (``MAX_FUSED_BLOCK``) take a
looped path (forward: two passes over each row, the second from L2; backward: a per-row
statistics kernel, then a column-blocked kernel that writes ``grad_x`` and the dw
partials, which reads x and dy twice).

Inputs must be CUDA tensors, except under ``TRITON_INTERPRET=1`` (Triton's
interpreter, which reads the variable when ``kernels`` is imported), where CPU tensors
run through the interpreter so that the kernels can be tested on a machine without a GPU.

This package imports on a machine without a GPU; kernels compile at their first call.

Modules, one job each: ``kernels`` (the Triton kernels), ``launch_config`` (the tuned
launch settings as data, and the rules for shapes the tuning did not cover), ``launch``
(host code that picks the settings and launches the kernels) and ``op`` (the custom ops,
their fake kernels, and the Python API; importing it registers the ops; hotloop.ops.autograd
registers their autograd).
"""

from hotloop.triton_rms_norm.kernels import interpreting
from hotloop.triton_rms_norm.launch import backward_rows, forward_rows
from hotloop.triton_rms_norm.launch_config import (
    MAX_FUSED_BLOCK,
    BwdConfig,
    FwdConfig,
    bwd_config,
    fused,
    fwd_config,
    row_alignment,
    row_blocks,
)
from hotloop.triton_rms_norm.op import rms_norm, rms_norm_backward

__all__ = [
    "MAX_FUSED_BLOCK",
    "BwdConfig",
    "FwdConfig",
    "backward_rows",
    "bwd_config",
    "forward_rows",
    "fused",
    "fwd_config",
    "interpreting",
    "rms_norm",
    "rms_norm_backward",
    "row_alignment",
    "row_blocks",
]
