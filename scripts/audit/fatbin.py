"""Which GPU targets an ELF's ``.nv_fatbin`` section holds: the archs actually compiled.

nvcc embeds device code in a fat binary: a container header (magic ``0xBA55ED50``, version,
header size, payload size), then one entry per target, each with a header giving its kind
(1: PTX, 2: a cubin), its size and its architecture (``80`` for sm_80). The layout is
NVIDIA's, undocumented but stable across CUDA 11-13 (the same fields cuobjdump lists);
reading it here needs no CUDA toolkit on the auditing machine.
"""

from __future__ import annotations

import struct

SECTION = ".nv_fatbin"
MAGIC = 0xBA55ED50
_CONTAINER = struct.Struct("<IHHQ")  # magic, version, header size, payload size
_ENTRY = struct.Struct("<HHIQ")  # kind, version, header size, payload size
_ARCH_OFFSET = 28
# The entry's flags: arch-specific (sm_90a, from TORCH_CUDA_ARCH_LIST's 9.0a) and
# family-specific (sm_100f) targets carry the same arch number as sm_90 / sm_100 and differ
# only here (read from nvcc 13.0's output for each -gencode).
_FLAGS_OFFSET = 40
_FLAG_ARCH_SPECIFIC = 0x100000
_FLAG_FAMILY_SPECIFIC = 0x200000
KIND_PTX = 1
KIND_CUBIN = 2


def _suffix(flags: int) -> str:
    if flags & _FLAG_ARCH_SPECIFIC:
        return "a"
    if flags & _FLAG_FAMILY_SPECIFIC:
        return "f"
    return ""


class FatbinError(ValueError):
    """A ``.nv_fatbin`` section whose headers do not add up."""


def device_targets(section: bytes) -> tuple[str, ...]:
    """``("compute_90", "sm_80", "sm_90a", ...)``: every target in the section's containers,
    sorted."""
    targets: set[str] = set()
    offset = 0
    while offset + _CONTAINER.size <= len(section):
        magic, _version, header_size, size = _CONTAINER.unpack_from(section, offset)
        if magic != MAGIC:
            offset += 8  # containers are 8-byte aligned; padding lies between them
            continue
        entry = offset + header_size
        end = entry + size
        if end > len(section):
            raise FatbinError(f"container at {offset} claims {size} bytes past the section's end")
        while entry + _ARCH_OFFSET + 4 <= end:
            kind, _, entry_header, payload = _ENTRY.unpack_from(section, entry)
            if entry_header == 0:
                raise FatbinError(f"entry at {entry} has a zero-sized header")
            (arch,) = struct.unpack_from("<I", section, entry + _ARCH_OFFSET)
            flags = 0
            if entry_header >= _FLAGS_OFFSET + 8 and entry + _FLAGS_OFFSET + 8 <= end:
                (flags,) = struct.unpack_from("<Q", section, entry + _FLAGS_OFFSET)
            if kind == KIND_CUBIN:
                targets.add(f"sm_{arch}{_suffix(flags)}")
            elif kind == KIND_PTX:
                targets.add(f"compute_{arch}{_suffix(flags)}")
            entry += entry_header + payload
        offset = end + (-end % 8)
    return tuple(sorted(targets))
