"""Which shared libraries an extension's wheel must not bundle: torch's and CUDA's.

They come from the user's torch at run time. A second copy inside the wheel is loaded
next to torch's, and two CUDA runtimes or two libc10 in one process break in ways
that are hard to trace. The set is derived, not listed by hand:

* from a torch installation, when the audit has one (``--torch-site``, and always in
  ``repair_and_audit``): every shared library that torch's wheel installs, and that the
  distributions it requires install, transitively (the ``nvidia-*`` CUDA wheels, triton,
  ``cuda-toolkit``'s components), read from their RECORD files; plus every ``nvidia-*``
  distribution installed there;
* from names, always, so a wheel audited without a torch site is still caught: torch's
  own libraries are ``libtorch*``, ``libc10*``, ``libshm*``, ``libcaffe2*`` and the OpenMP
  runtime its wheel ships (``libgomp*``); NVIDIA names every library of the CUDA toolkit
  and of its ``nvidia-*`` wheels ``libcu<component>`` (cudart, cublas, cufft, curand,
  cusolver, cusparse, cudnn, cupti, cufile), ``libnv<component>`` (nvrtc, nvJitLink,
  nvToolsExt, nvshmem, nvjpeg), ``libnccl*`` or ``libnpp*``. The ``libcu`` prefix also
  matches a few system libraries (libcurl, libcups); an extension links none of
  them, and auditwheel only bundles what the extension links.

auditwheel renames what it bundles (``libcufft.so.12`` -> ``libcufft-1a2b3c4d.so.12``);
names are compared with that hash removed.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Iterable
from email.parser import Parser
from pathlib import Path, PurePosixPath

TORCH_LIBRARY = re.compile(r"lib(?:torch|c10|shm|caffe2|gomp)[^/]*")
DRIVER_LIBRARY = re.compile(r"lib(?:cuda|nvidia-[a-z-]+)\.so(?:\.[0-9.]+)?")
CUDA_LIBRARY = re.compile(r"lib(?:cu|nv|nccl|npp)[^/]*")
SHARED_LIBRARY = re.compile(r".+\.so(?:\.[0-9][0-9.]*)?")
# Python extension modules in torch's requirements (numpy's, cuda-bindings') are modules of
# their packages, not libraries a wheel could bundle: their names say nothing about an extension's.
PYTHON_EXTENSION = re.compile(r".+\.(?:cpython-[^.]+|abi3|pypy[^.]*)\.so")
# auditwheel's rename of a bundled library: <stem>-<8 hex digits><.so...>
_AUDITWHEEL_HASH = re.compile(r"(?P<stem>.+)-[0-9a-f]{8}(?P<suffix>\.so(?:\..*)?)")
# Where torch and its CUDA wheels keep libraries, for installations without a RECORD.
_LIBRARY_GLOBS = (
    "torch/lib/*.so*",
    "nvidia/**/lib/*.so*",
    "cusparselt/lib/*.so*",
    "triton/_C/*.so*",
)


def unhashed(name: str) -> str:
    """``libcufft-1a2b3c4d.so.12`` -> ``libcufft.so.12``; other names unchanged."""
    match = _AUDITWHEEL_HASH.fullmatch(name)
    return match["stem"] + match["suffix"] if match else name


def forbidden_reason(member: str, provided_by_torch: Iterable[str]) -> str | None:
    """Why ``member`` must not be in the wheel, or None if it may be."""
    base = PurePosixPath(member).name
    if not SHARED_LIBRARY.fullmatch(base):
        return None
    names = {base, unhashed(base)}
    provided = names & set(provided_by_torch)
    from_torch = "; it must come from torch at run time"
    if provided:
        return f"torch's installation provides {sorted(provided)[0]}{from_torch}"
    plain = unhashed(base)
    if DRIVER_LIBRARY.fullmatch(plain):
        return (
            "the NVIDIA driver's library: a copy is the builder's driver, which the machine's "
            "own must replace at run time"
        )
    if TORCH_LIBRARY.match(plain):
        return f"a torch library (libtorch*, libc10*, libshm*, libcaffe2*, libgomp*){from_torch}"
    if CUDA_LIBRARY.match(plain):
        return f"a CUDA library (NVIDIA's libcu*, libnv*, libnccl*, libnpp*){from_torch}"
    return None


def _normalize(name: str) -> str:
    """PEP 503 name normalization: ``Nvidia_CUBLAS`` -> ``nvidia-cublas``."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _installed_distributions(site: Path) -> dict[str, Path]:
    """Normalized distribution name -> its ``.dist-info`` folder in ``site``."""
    found: dict[str, Path] = {}
    for dist_info in site.glob("*.dist-info"):
        found[_normalize(dist_info.name.split("-")[0])] = dist_info
    return found


def _required_names(dist_info: Path) -> list[str]:
    """Names in ``Requires-Dist`` (markers and extras ignored: only installed ones matter)."""
    try:
        text = (dist_info / "METADATA").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    names = []
    for requirement in Parser().parsestr(text, headersonly=True).get_all("Requires-Dist") or []:
        match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", str(requirement))
        if match:
            names.append(_normalize(match.group(1)))
    return names


def _recorded_libraries(dist_info: Path) -> set[str]:
    """File names of the shared libraries a distribution's RECORD lists."""
    try:
        text = (dist_info / "RECORD").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return set()
    names = set()
    for fields in csv.reader(io.StringIO(text)):
        if fields:
            base = PurePosixPath(fields[0]).name
            if SHARED_LIBRARY.fullmatch(base):
                names.add(base)
    return names


def torch_provided_libs(site_packages: Path) -> list[str]:
    """Shared-library file names that torch, its requirements and nvidia-* install there.

    Python extension modules (``_C.cpython-312-x86_64-linux-gnu.so``) are left out.
    """
    names: set[str] = set()
    for pattern in _LIBRARY_GLOBS:
        names.update(p.name for p in site_packages.glob(pattern))
    installed = _installed_distributions(site_packages)
    pending = ["torch", *(n for n in installed if n.startswith("nvidia-"))]
    seen: set[str] = set()
    while pending:
        name = pending.pop()
        if name in seen or name not in installed:
            continue
        seen.add(name)
        names |= _recorded_libraries(installed[name])
        pending.extend(_required_names(installed[name]))
    return sorted(n for n in names if not PYTHON_EXTENSION.fullmatch(n))
