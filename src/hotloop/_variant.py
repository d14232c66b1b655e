"""What a hotloop wheel is called and which torch it loads into: the one place for that rule.

Standard library only, and importable without importing ``hotloop`` (which loads torch and
the extension): ``setup.py``, the import guard and the pipeline in ``scripts/`` all load
this file (``scripts/variant.py`` and ``setup.py`` by path).

Two kinds of wheel:

* **stable**: the ops on the LibTorch stable ABI, compiled with ``TORCH_TARGET_VERSION`` =
  ``STABLE_ABI_FLOOR``. One wheel per CUDA major loads into every torch from the floor on:
  label ``stable.cu13``, ``Requires-Dist: torch>=2.10``.
* **pinned**: the ops on torch's C++ API (ATen), for torch older than the floor. One wheel
  per torch minor and CUDA version: label ``pt29cu128``, ``Requires-Dist: torch==2.9.*``.

Why ``stable.`` and not ``cu130``: pip and uv try the highest version first, and PEP 440
compares local labels segment by segment, letters lexicographically. ``cu130`` would sort
below ``pt29cu128``, so a torch 2.15 user would be offered the torch-2.9 wheel first and pip
would downgrade their torch to satisfy its pin. ``stable`` sorts above every ``pt…`` label.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

BASE_VERSION = "0.1.0"
# The oldest torch the stable-ABI wheel loads into (its TORCH_TARGET_VERSION).
STABLE_ABI_FLOOR: tuple[int, int] = (2, 10)

STABLE = "stable"
PINNED = "pinned"

_PINNED_LABEL = re.compile(r"pt(?P<major>[1-9])(?P<minor>[0-9]{1,2})(?P<device>cpu|cu[0-9]{3})")
_STABLE_LABEL = re.compile(r"stable\.(?P<device>cpu|cu[1-9][0-9])")


# PEP 440's version syntax (packaging's VERSION_PATTERN; hotloop cannot require packaging,
# which torch does not install): what pip accepts as a version, torch's nightlies included.
_PEP_440 = re.compile(
    r"""
    v?
    (?:(?P<epoch>[0-9]+)!)?
    (?P<release>[0-9]+(?:\.[0-9]+)*)
    (?:[-_.]?(?:alpha|a|beta|b|preview|pre|c|rc)[-_.]?[0-9]*)?
    (?:-[0-9]+|[-_.]?(?:post|rev|r)[-_.]?[0-9]*)?
    (?:[-_.]?dev[-_.]?[0-9]*)?
    (?:\+[a-z0-9]+(?:[-_.][a-z0-9]+)*)?
    """,
    re.VERBOSE | re.IGNORECASE,
)


def torch_minor(version: str) -> tuple[int, int]:
    """``"2.11.0+cu130"`` -> ``(2, 11)``, by PEP 440's rules (``v2.11.0``, ``2.12.0.dev2026``
    too); ValueError naming the version for anything that is no torch release."""
    match = _PEP_440.fullmatch(version.strip())
    release = match["release"].split(".") if match else []
    if not match or len(release) < 2 or int(match["epoch"] or 0) != 0:
        raise ValueError(
            f"torch {version!r} is not a version hotloop can read (PEP 440, MAJOR.MINOR at least, "
            "no epoch): expected a release such as 2.11.0 or 2.11.0+cu130"
        )
    return int(release[0]), int(release[1])


def minor_text(minor: tuple[int, int]) -> str:
    """``(2, 11)`` -> ``"2.11"``."""
    return f"{minor[0]}.{minor[1]}"


def cuda_major(cuda: str | None) -> str | None:
    """``"13.0"`` -> ``"13"``; None (a CPU build) stays None."""
    return cuda.split(".")[0] if cuda else None


def kind_for(torch_version: str) -> str:
    """The kind of wheel that serves a torch release: stable from the floor on, else pinned."""
    return STABLE if torch_minor(torch_version) >= STABLE_ABI_FLOOR else PINNED


@dataclass(frozen=True)
class Variant:
    """One build variant: the local version label and what it says about the wheel."""

    kind: str
    cuda: str | None  # "13" for stable (a CUDA major), "12.8" for pinned; None: CPU
    torch: tuple[int, int] | None = None  # the pinned minor; None for stable

    @property
    def label(self) -> str:
        device = "cpu" if self.cuda is None else "cu" + self.cuda.replace(".", "")
        if self.kind == STABLE:
            return f"{STABLE}.{device}"
        assert self.torch is not None
        return f"pt{self.torch[0]}{self.torch[1]}{device}"

    @property
    def version(self) -> str:
        """``0.1.0+stable.cu13``."""
        return f"{BASE_VERSION}+{self.label}"

    @property
    def requires_torch(self) -> str:
        """The wheel's Requires-Dist on torch."""
        if self.kind == STABLE:
            return f"torch>={minor_text(STABLE_ABI_FLOOR)}"
        assert self.torch is not None
        return f"torch=={minor_text(self.torch)}.*"

    @property
    def cuda_major(self) -> str | None:
        return cuda_major(self.cuda)

    def serves(self, torch_version: str, torch_cuda: str | None) -> bool:
        """Whether this variant's wheel loads into that torch (version and CUDA)."""
        if self.kind == STABLE:
            if torch_minor(torch_version) < STABLE_ABI_FLOOR:
                return False
        elif torch_minor(torch_version) != self.torch:
            return False
        if self.cuda is None:
            return True  # the CPU kernels run under any build of torch
        return torch_cuda is not None and cuda_major(torch_cuda) == self.cuda_major


def variant_for(torch_version: str, cuda: str | None, kind: str | None = None) -> Variant:
    """The variant built for (and serving) a torch release with that CUDA (None or "": CPU).

    ``kind`` forces a pinned build where a stable one would serve (to compare the two);
    a stable build below the floor is refused.
    """
    kind = kind or kind_for(torch_version)
    cuda = cuda or None  # "" as well as None: a CPU build
    if kind == STABLE:
        if kind_for(torch_version) != STABLE:
            raise ValueError(
                f"torch {torch_version} is older than the stable-ABI floor "
                f"{minor_text(STABLE_ABI_FLOOR)}: only a pinned build serves it"
            )
        return Variant(STABLE, cuda_major(cuda))
    if kind != PINNED:
        raise ValueError(f"kind must be {STABLE!r} or {PINNED!r}, got {kind!r}")
    return Variant(PINNED, cuda, torch_minor(torch_version))


def parse_label(label: str) -> Variant:
    """The variant a local version label names; ValueError for anything else.

    Labels become file and folder names in the index: only these two shapes are accepted.
    """
    match = _STABLE_LABEL.fullmatch(label)
    if match:
        device = match["device"]
        return Variant(STABLE, None if device == "cpu" else device[2:])
    match = _PINNED_LABEL.fullmatch(label)
    if match:
        device = match["device"]
        cuda = None if device == "cpu" else f"{device[2:-1]}.{device[-1]}"
        return Variant(PINNED, cuda, (int(match["major"]), int(match["minor"])))
    raise ValueError(
        f"{label!r} is not a hotloop variant label: expected 'stable.cu<CUDA major>' "
        "(e.g. stable.cu13), 'stable.cpu', 'pt<torch major><minor>cu<CUDA>' (e.g. pt29cu128) "
        "or 'pt<torch major><minor>cpu'"
    )


def parse_version(version: str) -> Variant:
    """The variant of a full hotloop version (``0.1.0+stable.cu13``); ValueError otherwise."""
    base, sep, label = version.partition("+")
    if not sep or not base:
        raise ValueError(f"{version!r} has no local version label (expected {BASE_VERSION}+...)")
    return parse_label(label)
