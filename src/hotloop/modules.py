"""``hotloop.RMSNorm``: a drop-in for ``torch.nn.RMSNorm`` and Llama-style RMSNorm layers."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from hotloop._casting import CASTINGS, casting_index
from hotloop.ops import _DEPRECATED_BACKENDS, BACKENDS, rms_norm


def _transformers_classes(*classes: tuple[str, str]) -> frozenset[str]:
    return frozenset(
        f"transformers.models.{package}.modeling_{package}.{name}" for package, name in classes
    )


# transformers' RMSNorm classes read in its source (modeling_<model>.py), by the casting mode
# that gives their bits. Llama's and its copies have a 1-D ``weight`` and a
# ``variance_epsilon``; their forward normalises x in float32 over the last dim, rounds it
# to x's dtype, then multiplies by the weight: the "llama" casting.
TRANSFORMERS_RMS_NORMS = _transformers_classes(
    ("llama", "LlamaRMSNorm"),
    ("mistral", "MistralRMSNorm"),
    ("mixtral", "MixtralRMSNorm"),
    ("qwen2", "Qwen2RMSNorm"),
    ("qwen2_moe", "Qwen2MoeRMSNorm"),
    ("qwen3", "Qwen3RMSNorm"),
    ("qwen3_moe", "Qwen3MoeRMSNorm"),
    ("phi3", "Phi3RMSNorm"),
)
# Gemma's have a 1-D ``weight`` stored as w in (1 + w) and an ``eps``; their forward computes
# x_hat * (1 + weight.float()) in float32 and rounds once: the "gemma" casting, offset 1.
TRANSFORMERS_GEMMA_RMS_NORMS = _transformers_classes(
    ("gemma", "GemmaRMSNorm"),
    ("gemma2", "Gemma2RMSNorm"),
    ("gemma3", "Gemma3RMSNorm"),
)
GEMMA_OFFSET = 1.0


def _class_names(names: frozenset[str]) -> str:
    return ", ".join(sorted(n.rsplit(".", 1)[1] for n in names))


def _not_convertible(name: str) -> str:
    return (
        f"hotloop.RMSNorm.from_module: cannot convert {name}: it is not known to compute "
        "x / rms(x) * weight over the last dimension in one of hotloop's casting modes. "
        "from_module takes torch.nn.RMSNorm, hotloop.RMSNorm and transformers' "
        f"{_class_names(TRANSFORMERS_RMS_NORMS)} (casting='llama') and "
        f"{_class_names(TRANSFORMERS_GEMMA_RMS_NORMS)} (casting='gemma', offset=1.0). For "
        "another module that computes exactly one of those formulas, build "
        "hotloop.RMSNorm(hidden_size, eps=..., casting=...) and assign its weight"
    )


class RMSNorm(nn.RMSNorm):
    """``torch.nn.RMSNorm`` over the last dimension, computed by hotloop's kernels.

    A subclass: parameters, state_dict, ``reset_parameters`` and ``isinstance`` checks are
    torch's. ``backend``, ``casting``, ``offset`` and ``in_place_backward`` are
    :func:`hotloop.rms_norm`'s, and so is what torch.compile and torch.export see of it: the
    mode's arithmetic and hotloop's op by default (:func:`hotloop.set_compile_arithmetic`).
    ``from_module`` converts an existing ``nn.RMSNorm`` or a Hugging Face ``LlamaRMSNorm``
    or ``GemmaRMSNorm`` (and the other classes of ``TRANSFORMERS_RMS_NORMS`` and
    ``TRANSFORMERS_GEMMA_RMS_NORMS``), keeps its weight and picks the casting mode that
    reproduces its bits.
    """

    def __init__(
        self,
        normalized_shape: int | tuple[int, ...] | list[int] | torch.Size,
        eps: float | None = None,
        elementwise_affine: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        backend: str | None = None,
        *,
        casting: str = "torch",
        offset: float = 0.0,
        in_place_backward: bool = False,
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
        casting_index("hotloop.RMSNorm", casting, offset)  # now, rather than at the first call
        super().__init__(shape[0], eps, elementwise_affine, device=device, dtype=dtype)
        self.backend = backend
        self.casting = casting
        self.offset = offset
        self.in_place_backward = in_place_backward

    @classmethod
    def from_module(
        cls, module: nn.Module, backend: str | None = None, in_place_backward: bool = False
    ) -> RMSNorm:
        """A hotloop.RMSNorm with the weight and eps of ``module`` (shared, not copied), in
        the casting mode that gives ``module``'s bits.

        ``module`` must be known to compute ``x / rms(x) * weight`` over the last dim in one
        of the modes: ``torch.nn.RMSNorm`` (or a subclass that keeps its ``forward``) in
        "torch", a hotloop.RMSNorm in its own, the transformers classes in
        ``TRANSFORMERS_RMS_NORMS`` (Llama's and its copies) in "llama", those in
        ``TRANSFORMERS_GEMMA_RMS_NORMS`` in "gemma" with offset 1. Anything else is refused,
        naming its class: a LayerNorm subtracts the mean and adds a bias, and a module's
        attributes cannot tell what it computes.
        """
        kind = type(module)
        name = f"{kind.__module__}.{kind.__qualname__}"
        weight: nn.Parameter | None
        eps: float | None
        offset = 0.0
        # (getattr: nn.Module types unknown attributes as Tensor | Module)
        if isinstance(module, nn.RMSNorm) and kind.forward in (nn.RMSNorm.forward, RMSNorm.forward):
            shape = tuple(module.normalized_shape)
            weight, eps = module.weight, module.eps
            casting = getattr(module, "casting", "torch")
            offset = getattr(module, "offset", 0.0)
        elif name in TRANSFORMERS_RMS_NORMS:
            weight, eps = getattr(module, "weight"), getattr(module, "variance_epsilon")  # noqa: B009
            shape, casting = tuple(weight.shape), "llama"
        elif name in TRANSFORMERS_GEMMA_RMS_NORMS:
            weight, eps = getattr(module, "weight"), getattr(module, "eps")  # noqa: B009
            shape, casting, offset = tuple(weight.shape), "gemma", GEMMA_OFFSET
        else:
            raise TypeError(_not_convertible(name))
        new = cls(
            shape,
            eps=eps,
            elementwise_affine=False,
            backend=backend,
            casting=casting,
            offset=offset,
            in_place_backward=in_place_backward,
        )
        if weight is not None:
            new.elementwise_affine = True
            new.weight = weight
        return new

    @classmethod
    def replace_in(
        cls,
        model: nn.Module,
        type_name: str,
        backend: str | None = None,
        in_place_backward: bool = False,
    ) -> int:
        """Replaces, in place, every submodule of ``model`` whose class is named
        ``type_name`` (e.g. ``"LlamaRMSNorm"``) by ``from_module`` of it; returns how many.
        Matching the name rather than the class keeps transformers an optional import."""
        replaced = 0
        for parent in list(model.modules()):
            for name, child in list(parent.named_children()):
                if type(child).__name__ == type_name:
                    new = cls.from_module(child, backend, in_place_backward)
                    setattr(parent, name, new)
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
        return rms_norm(
            x,
            self.weight,
            self.eps,
            self.backend,
            casting=self.casting,
            offset=self.offset,
            in_place_backward=self.in_place_backward,
        )

    def extra_repr(self) -> str:
        mode = f", casting={self.casting!r}" if self.casting != CASTINGS[0] else ""
        mode += f", offset={self.offset}" if self.offset != 0.0 else ""
        return f"{super().extra_repr()}, backend={self.backend}{mode}"
