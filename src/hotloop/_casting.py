"""The casting modes of the RMSNorm ops and the dtypes they take, shared by the native ops' and
the Triton ops' Python code (which cannot import each other: hotloop.ops imports the Triton
package).

A mode says where rms_norm rounds to x's dtype, named by the model whose formula it
reproduces bit for bit; the ops take the mode's index (csrc/common/norm_casting.h):
- "torch": torch.nn.RMSNorm, x * rstd * weight in float32, rounded once;
- "llama": transformers' LlamaRMSNorm (Mistral's, Mixtral's, Qwen2's, Qwen3's, Phi-3's compute
  the same): x * rstd rounded to the dtype, then times the weight and rounded again;
- "gemma": transformers' GemmaRMSNorm (Gemma 2's and 3's too): x * rstd * (offset + weight),
  all in float32, with offset + weight formed in float32. Gemma's offset is 1.
"""

from __future__ import annotations

import torch

# The dtypes every op takes for x (and the norms for their weight).
FLOATING_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)

CASTINGS = ("torch", "llama", "gemma")
TORCH, LLAMA, GEMMA = range(len(CASTINGS))


def casting_index(op: str, casting: str, offset: float) -> int:
    """The ops' index of a casting mode named in the Python API, checked with its offset."""
    if casting == "torch":  # first: the common call pays for one comparison
        index = TORCH
    elif casting in CASTINGS:
        index = CASTINGS.index(casting)
    else:
        raise ValueError(
            f"{op}: casting must be one of {CASTINGS} but got {casting!r}: 'torch' rounds as "
            "torch.nn.RMSNorm does, 'llama' as transformers' LlamaRMSNorm, 'gemma' as its "
            "GemmaRMSNorm"
        )
    if offset != 0.0 and index != GEMMA:
        raise ValueError(
            f"{op}: offset={offset} is Gemma's (x_hat * (offset + weight)), which only "
            f"casting='gemma' computes, but casting is {casting!r}; pass casting='gemma' "
            "(Gemma's offset is 1.0), or leave offset at 0.0"
        )
    return index


def casting_takes(casting: int, offset: float) -> bool:
    """Whether the ops take this mode index with this offset (check_casting says why not)."""
    return casting in (TORCH, LLAMA, GEMMA) and (offset == 0.0 or casting == GEMMA)


def check_casting(op: str, casting: int, offset: float) -> None:
    """The ops' own check of their ``casting`` and ``offset`` arguments, for the Python
    kernels (fake, batching rules, Triton): csrc/common/norm_casting.h's checked_casting,
    with its words."""
    if casting_takes(casting, offset):
        return
    if casting not in (TORCH, LLAMA, GEMMA):
        raise RuntimeError(
            f"{op}: casting must be 0 (torch), 1 (llama) or 2 (gemma) but got {casting}"
        )
    raise RuntimeError(
        f"{op}: offset {offset:g} is Gemma's (offset + weight) and needs casting 2 (gemma), "
        f"but casting is {casting}"
    )
