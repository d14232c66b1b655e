"""The variant rule (labels, versions, torch pins) from ``src/hotloop/_variant.py``.

That file is the one place for the rule: ``setup.py`` and the import guard use it too. It is
loaded by path so that the pipeline never imports the ``hotloop`` package (which needs torch
and a built extension).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

_PATH = Path(__file__).resolve().parent.parent / "src" / "hotloop" / "_variant.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("hotloop_variant_rule", _PATH)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    # dataclasses look the module up in sys.modules while the class body runs.
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


_rule = _load()

BASE_VERSION: str = _rule.BASE_VERSION
STABLE_ABI_FLOOR: tuple[int, int] = _rule.STABLE_ABI_FLOOR
STABLE: str = _rule.STABLE
PINNED: str = _rule.PINNED
Variant = _rule.Variant
variant_for = _rule.variant_for
parse_label = _rule.parse_label
parse_version = _rule.parse_version
torch_minor = _rule.torch_minor
minor_text = _rule.minor_text
cuda_major = _rule.cuda_major
kind_for = _rule.kind_for

# The variant PyPI serves under the public version (PyPI refuses local labels, and one version
# holds one file per tag): the stable-ABI wheel for CUDA 13, since PyPI's own torch is a CUDA 13
# build from 2.11 on. scripts.pypi_release writes it; the audit accepts that form of it only.
PYPI_VARIANT = Variant(STABLE, "13")


def public_version(version: str) -> str:
    """``0.1.0+stable.cu13`` -> ``0.1.0``: the version without its local label."""
    return version.partition("+")[0]
