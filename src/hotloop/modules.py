"""``hotloop.RMSNorm``: a drop-in for ``torch.nn.RMSNorm`` and Llama-style RMSNorm layers."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from hotloop.ops import rms_norm


class RMSNorm(nn.Module):
    """RMSNorm over the last dimension, with the parameters and state_dict of ``nn.RMSNorm``.

    ``from_module`` converts an existing ``nn.RMSNorm`` or a Hugging Face
    ``LlamaRMSNorm`` (weight plus ``variance_epsilon``) and keeps its weight.
    """

    def __init__(
        self,
        normalized_shape: int | tuple[int, ...] | list[int] | torch.Size,
        eps: float | None = None,
        elementwise_affine: bool = True,
        device: torch.device | None = None,
        dtype: torch.dtype | None = None,
        backend: str | None = None,
    ) -> None:
        super().__init__()
        shape = (
            (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
        )
        if len(shape) != 1:
            raise ValueError(
                f"hotloop.RMSNorm normalises over the last dimension only: normalized_shape must "
                f"have one element, got {shape}"
            )
        self.normalized_shape = shape
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        self.backend = backend
        if elementwise_affine:
            self.weight = nn.Parameter(torch.ones(shape, device=device, dtype=dtype))
        else:
            self.register_parameter("weight", None)

    @classmethod
    def from_module(cls, module: nn.Module, backend: str | None = None) -> RMSNorm:
        """A hotloop.RMSNorm with the weight and eps of ``module`` (shared, not copied)."""
        weight = getattr(module, "weight", None)
        eps = getattr(module, "eps", getattr(module, "variance_epsilon", None))
        shape = getattr(module, "normalized_shape", None) or tuple(weight.shape)
        new = cls(shape, eps=eps, elementwise_affine=False, backend=backend)
        if weight is not None:
            new.elementwise_affine = True
            new.weight = weight
        return new

    def forward(self, x: Tensor) -> Tensor:
        if x.shape[-1:] != self.normalized_shape:
            raise ValueError(
                f"hotloop.RMSNorm: expected input with last dimension {self.normalized_shape[0]}, "
                f"got shape {tuple(x.shape)}"
            )
        weight = self.weight
        if weight is not None and weight.dtype != x.dtype:
            weight = weight.to(x.dtype)
        return rms_norm(x, weight, self.eps, backend=self.backend)

    def extra_repr(self) -> str:
        return (
            f"{self.normalized_shape}, eps={self.eps}, "
            f"elementwise_affine={self.elementwise_affine}, backend={self.backend}"
        )
