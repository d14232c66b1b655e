"""``hotloop.RMSNorm``: a drop-in for ``torch.nn.RMSNorm`` and Llama-style RMSNorm layers."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from hotloop.ops import _DEPRECATED_BACKENDS, BACKENDS, rms_norm


class RMSNorm(nn.RMSNorm):
    """``torch.nn.RMSNorm`` over the last dimension, computed by hotloop's kernels.

    A subclass: parameters, state_dict, ``reset_parameters`` and ``isinstance`` checks are
    torch's. ``backend`` picks the kernels as in :func:`hotloop.rms_norm`. ``from_module``
    converts an existing ``nn.RMSNorm`` or a Hugging Face ``LlamaRMSNorm`` (weight plus
    ``variance_epsilon``) and keeps its weight.
    """

    def __init__(
        self,
        normalized_shape: int | tuple[int, ...] | list[int] | torch.Size,
        eps: float | None = None,
        elementwise_affine: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        backend: str | None = None,
    ) -> None:
        shape = (
            (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
        )
        if len(shape) != 1:
            raise ValueError(
                f"hotloop.RMSNorm normalises over the last dimension only: normalized_shape must "
                f"have one element, got {shape}"
            )
        if backend is not None and backend not in BACKENDS and backend not in _DEPRECATED_BACKENDS:
            raise ValueError(
                f"hotloop.RMSNorm: backend must be one of {BACKENDS} or None, got {backend!r}"
            )
        super().__init__(shape[0], eps, elementwise_affine, device=device, dtype=dtype)
        self.backend = backend

    @classmethod
    def from_module(cls, module: nn.Module, backend: str | None = None) -> RMSNorm:
        """A hotloop.RMSNorm with the weight and eps of ``module`` (shared, not copied).

        ``module`` has a 1-D ``weight`` (or none, with ``normalized_shape`` saying the size)
        and an ``eps`` or ``variance_epsilon``.
        """
        weight = getattr(module, "weight", None)
        eps = getattr(module, "eps", getattr(module, "variance_epsilon", None))
        shape = getattr(module, "normalized_shape", None)
        if shape is None:
            if weight is None:
                raise ValueError(
                    f"hotloop.RMSNorm.from_module: {type(module).__name__} has neither a weight "
                    "nor a normalized_shape, so the normalised size is unknown; construct "
                    "hotloop.RMSNorm(hidden_size, eps=..., elementwise_affine=False) instead"
                )
            shape = tuple(weight.shape)
        new = cls(shape, eps=eps, elementwise_affine=False, backend=backend)
        if weight is not None:
            new.elementwise_affine = True
            new.weight = weight
        return new

    @classmethod
    def replace_in(cls, model: nn.Module, type_name: str, backend: str | None = None) -> int:
        """Replaces, in place, every submodule of ``model`` whose class is named
        ``type_name`` (e.g. ``"LlamaRMSNorm"``) by ``from_module`` of it; returns how many.
        Matching the name rather than the class keeps transformers an optional import."""
        replaced = 0
        for parent in list(model.modules()):
            for name, child in list(parent.named_children()):
                if type(child).__name__ == type_name:
                    setattr(parent, name, cls.from_module(child, backend=backend))
                    replaced += 1
        return replaced

    def forward(self, x: Tensor) -> Tensor:
        if x.shape[-1:] != self.normalized_shape:
            raise ValueError(
                f"hotloop.RMSNorm: expected input with last dimension {self.normalized_shape[0]}, "
                f"got shape {tuple(x.shape)}"
            )
        weight: Tensor | None = self.weight
        if weight is not None and weight.dtype != x.dtype:
            weight = weight.to(x.dtype)
        return rms_norm(x, weight, self.eps, backend=self.backend)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, backend={self.backend}"
