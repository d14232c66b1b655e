"""``hotloop.RMSNorm``: a drop-in for ``torch.nn.RMSNorm`` and Llama-style RMSNorm layers."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from hotloop.ops import _DEPRECATED_BACKENDS, BACKENDS, rms_norm

# transformers' RMSNorm classes read in its source (modeling_<model>.py): each has a 1-D
# ``weight`` and a ``variance_epsilon``, and its forward is Llama's, x in float32 normalised
# over the last dim, cast back to x's dtype, times the weight. (They multiply in the
# promoted dtype after that cast; hotloop.RMSNorm rounds once, as torch.nn.RMSNorm does.)
TRANSFORMERS_RMS_NORMS = frozenset(
    f"transformers.models.{package}.modeling_{package}.{name}"
    for package, name in [
        ("llama", "LlamaRMSNorm"),
        ("mistral", "MistralRMSNorm"),
        ("mixtral", "MixtralRMSNorm"),
        ("qwen2", "Qwen2RMSNorm"),
        ("qwen2_moe", "Qwen2MoeRMSNorm"),
        ("qwen3", "Qwen3RMSNorm"),
        ("qwen3_moe", "Qwen3MoeRMSNorm"),
        ("phi3", "Phi3RMSNorm"),
    ]
)


def _not_convertible(name: str) -> str:
    prefix = f"hotloop.RMSNorm.from_module: cannot convert {name}"
    if "gemma" in name.lower():
        return (
            f"{prefix}: Gemma's RMSNorm scales by (1 + weight), not by weight, and "
            "hotloop.RMSNorm has no such offset; converting it would change the results. Keep "
            "the module as it is"
        )
    return (
        f"{prefix}: it is not known to compute x / rms(x) * weight over the last dimension. "
        "from_module takes torch.nn.RMSNorm, hotloop.RMSNorm and transformers' "
        f"{', '.join(sorted(n.rsplit('.', 1)[1] for n in TRANSFORMERS_RMS_NORMS))}. For "
        "another module that computes exactly that, build hotloop.RMSNorm(hidden_size, "
        "eps=...) and assign its weight"
    )


class RMSNorm(nn.RMSNorm):
    """``torch.nn.RMSNorm`` over the last dimension, computed by hotloop's kernels.

    A subclass: parameters, state_dict, ``reset_parameters`` and ``isinstance`` checks are
    torch's. ``backend`` picks the kernels as in :func:`hotloop.rms_norm`. ``from_module``
    converts an existing ``nn.RMSNorm`` or a Hugging Face ``LlamaRMSNorm`` (and the other
    classes of ``TRANSFORMERS_RMS_NORMS``) and keeps its weight.
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

        ``module`` must be known to compute ``x / rms(x) * weight`` over the last dim:
        ``torch.nn.RMSNorm`` (or a subclass that keeps its ``forward``), a hotloop.RMSNorm,
        or one of the transformers classes in ``TRANSFORMERS_RMS_NORMS``. Anything else is
        refused, naming its class: a LayerNorm subtracts the mean and adds a bias, Gemma's
        norms scale by ``1 + weight``, and a module's attributes cannot tell what it computes.
        """
        kind = type(module)
        name = f"{kind.__module__}.{kind.__qualname__}"
        weight: nn.Parameter | None
        eps: float | None
        if isinstance(module, nn.RMSNorm) and kind.forward in (nn.RMSNorm.forward, RMSNorm.forward):
            shape = tuple(module.normalized_shape)
            weight, eps = module.weight, module.eps
        elif name in TRANSFORMERS_RMS_NORMS:
            # (getattr: nn.Module types unknown attributes as Tensor | Module)
            weight, eps = getattr(module, "weight"), getattr(module, "variance_epsilon")  # noqa: B009
            shape = tuple(weight.shape)
        else:
            raise TypeError(_not_convertible(name))
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
        # A weight of another dtype (float32 master weights, bfloat16 x) goes in as it is:
        # rms_norm computes what torch.nn.RMSNorm does with it, in the weight's precision.
        return rms_norm(x, self.weight, self.eps, backend=self.backend)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, backend={self.backend}"
