"""What the audit reads from ELF files: the symbol versions they need and their library
search paths (pyelftools)."""

from __future__ import annotations

import io
import re
from collections.abc import Iterable
from dataclasses import dataclass

from scripts.audit import fatbin

# torch's own libraries need no newer glibc/libstdc++ than these: an extension library that
# needs newer ones would not load where torch does.
MAX_SYMBOL_VERSIONS = {"GLIBC": (2, 28), "GLIBCXX": (3, 4, 22)}
ELF_MAGIC = b"\x7fELF"


class ElfReadError(ValueError):
    """An ELF file pyelftools cannot parse."""


def is_elf(data: bytes) -> bool:
    return data[:4] == ELF_MAGIC


@dataclass(frozen=True)
class ElfFacts:
    """What the rules judge in one ELF: symbol versions it needs, library search paths."""

    version_needs: frozenset[str]
    # ("RPATH" | "RUNPATH", one entry), in the order the dynamic section lists them.
    search_paths: tuple[tuple[str, str], ...]
    # GPU targets compiled into its .nv_fatbin (``sm_80``, ``compute_90``); empty: no device code.
    device_code: tuple[str, ...] = ()


def read_elf(data: bytes) -> ElfFacts:
    """The version names an ELF needs (``GLIBC_2.14``, ``GLIBCXX_3.4.21``, ...), its
    RPATH/RUNPATH entries and the GPU targets of its fat binary, via pyelftools.

    ElfReadError for a file pyelftools cannot parse (truncated, corrupt headers).
    """
    from elftools.elf.dynamic import DynamicSection
    from elftools.elf.elffile import ELFFile
    from elftools.elf.gnuversions import GNUVerNeedSection

    needs: set[str] = set()
    paths: list[tuple[str, str]] = []
    targets: tuple[str, ...] = ()
    try:
        elf = ELFFile(io.BytesIO(data))
        for section in elf.iter_sections():
            if isinstance(section, GNUVerNeedSection):
                for _verneed, auxiliaries in section.iter_versions():
                    needs.update(aux.name for aux in auxiliaries)
            elif isinstance(section, DynamicSection):
                for tag in section.iter_tags():
                    if tag.entry.d_tag in ("DT_RPATH", "DT_RUNPATH"):
                        kind = tag.entry.d_tag[3:]
                        text = tag.rpath if kind == "RPATH" else tag.runpath
                        paths.extend((kind, entry) for entry in text.split(":") if entry)
            elif section.name == fatbin.SECTION:
                targets = fatbin.device_targets(section.data())
    # A hostile or truncated file can make the parser fail in many ways (ELFError, struct
    # and construct errors, IndexError on bad offsets): each means "not a readable ELF".
    except Exception as exc:
        raise ElfReadError(f"{type(exc).__name__}: {exc}") from None
    return ElfFacts(frozenset(needs), tuple(paths), targets)


def elf_version_needs(data: bytes) -> set[str]:
    """The version names an ELF needs (:func:`read_elf`)."""
    return set(read_elf(data).version_needs)


def outside_the_wheel(search_path: str) -> bool:
    """Whether a library search path names a folder other than one relative to the library.

    An absolute entry names the build machine (pyenv's interpreters put their own lib folder
    there) and makes the loader look in that folder on every user's machine; a relative one
    is relative to the process's working directory.
    """
    return not (search_path == "$ORIGIN" or search_path.startswith(("$ORIGIN/", "${ORIGIN}")))


def parse_version(name: str) -> tuple[str, tuple[int, ...]] | None:
    """``"GLIBC_2.14"`` -> ``("GLIBC", (2, 14))``; ``None`` for names like ``GLIBC_PRIVATE``."""
    match = re.fullmatch(r"([A-Z]+)_(\d+(?:\.\d+)*)", name)
    if not match:
        return None
    return match.group(1), tuple(int(p) for p in match.group(2).split("."))


def max_versions(needs: Iterable[str]) -> dict[str, tuple[int, ...]]:
    """The newest version needed per family: ``{"GLIBC": (2, 14), "GLIBCXX": (3, 4, 21)}``."""
    best: dict[str, tuple[int, ...]] = {}
    for name in needs:
        parsed = parse_version(name)
        if parsed and parsed[1] > best.get(parsed[0], ()):
            best[parsed[0]] = parsed[1]
    return best


def newer_than(needs: Iterable[str], family: str, limit: tuple[int, ...]) -> list[str]:
    """The versions of ``family`` in ``needs`` above ``limit``, oldest first."""
    found = [
        (parsed[1], name)
        for name in needs
        if (parsed := parse_version(name)) and parsed[0] == family and parsed[1] > limit
    ]
    return [name for _, name in sorted(found)]


def version_text(family: str, version: tuple[int, ...]) -> str:
    """``("GLIBC", (2, 28))`` -> ``"GLIBC_2.28"``."""
    return f"{family}_{'.'.join(map(str, version))}"
