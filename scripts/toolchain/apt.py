"""Packages from Debian's archive, never installed: the mirror this machine's apt already uses,
a private apt state, ``apt-get download`` and ``dpkg-deb -x``.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from scripts import basics

log = basics.logger("toolchain")


@dataclass(frozen=True)
class AptSource:
    uri: str
    suites: tuple[str, ...]
    components: tuple[str, ...]
    signed_by: str | None


def parse_deb822(text: str) -> list[AptSource]:
    sources = []
    for stanza in re.split(r"\n\s*\n", text):
        fields: dict[str, str] = {}
        for line in stanza.splitlines():
            if line.startswith("#") or ":" not in line or line[:1].isspace():
                continue
            name, value = line.split(":", 1)
            fields[name.strip().lower()] = value.strip()
        if "deb" not in fields.get("types", "").split() or "uris" not in fields:
            continue
        if fields.get("enabled", "yes").lower() == "no":
            continue
        for uri in fields["uris"].split():
            sources.append(
                AptSource(
                    uri.rstrip("/"),
                    tuple(fields.get("suites", "").split()),
                    tuple(fields.get("components", "main").split()),
                    fields.get("signed-by"),
                )
            )
    return sources


def parse_one_line(text: str) -> list[AptSource]:
    sources = []
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line.startswith("deb "):
            continue
        options = None
        rest = line[4:].strip()
        if rest.startswith("["):
            options, rest = rest[1:].split("]", 1)
        parts = rest.split()
        if len(parts) < 2:
            continue
        signed = None
        if options:
            for opt in options.split():
                if opt.startswith("signed-by="):
                    signed = opt.split("=", 1)[1]
        sources.append(
            AptSource(parts[0].rstrip("/"), (parts[1],), tuple(parts[2:]) or ("main",), signed)
        )
    return sources


def system_apt_sources(etc: Path = Path("/etc/apt")) -> list[AptSource]:
    sources: list[AptSource] = []
    if (etc / "sources.list").is_file():
        sources += parse_one_line((etc / "sources.list").read_text())
    for f in (
        sorted((etc / "sources.list.d").glob("*.list")) if (etc / "sources.list.d").is_dir() else []
    ):
        sources += parse_one_line(f.read_text())
    for f in (
        sorted((etc / "sources.list.d").glob("*.sources"))
        if (etc / "sources.list.d").is_dir()
        else []
    ):
        sources += parse_deb822(f.read_text())
    return sources


def debian_mirror(sources: Sequence[AptSource]) -> AptSource:
    """The main Debian archive among the configured sources (not -security, not -updates)."""
    for src in sources:
        if any(re.fullmatch(r"[a-z]+", s) for s in src.suites) and "security" not in src.uri:
            return src
    raise RuntimeError(
        "no Debian archive found in /etc/apt (sources.list or sources.list.d/*.sources); "
        "the sysroot (bullseye's libc6) and the CUDA 12 toolkit (Debian's nvidia-cuda-*) are "
        "fetched from it"
    )


def debian_sources_line(
    mirror: AptSource, suite: str, components: Sequence[str] = ("main",)
) -> str:
    """A one-line ``deb`` source for ``suite`` on the host's mirror, with its keyring."""
    signed = f"[signed-by={mirror.signed_by}] " if mirror.signed_by else ""
    return f"deb {signed}{mirror.uri} {suite} {' '.join(components)}\n"


def apt_download(
    packages: Sequence[str],
    suite: str,
    workdir: Path,
    mirror: AptSource | None = None,
    components: Sequence[str] = ("main",),
) -> list[Path]:
    """``apt-get download`` ``packages`` of ``suite`` into ``workdir/debs``, private apt state.

    Nothing is installed and the host's apt state is untouched: lists, cache and status live
    under ``workdir/apt``.
    """
    mirror = mirror or debian_mirror(system_apt_sources())
    state = workdir / "apt"
    lists = state / "lists"
    cache = state / "cache"
    (lists / "partial").mkdir(parents=True, exist_ok=True)
    (cache / "archives" / "partial").mkdir(parents=True, exist_ok=True)
    sources = state / "sources.list"
    sources.write_text(debian_sources_line(mirror, suite, components))
    opts = [
        f"-o=Dir::Etc::sourcelist={sources}",
        "-o=Dir::Etc::sourceparts=-",
        f"-o=Dir::State::Lists={lists}",
        f"-o=Dir::Cache={cache}",
        f"-o=Dir::State::status={state / 'status'}",
        "-o=APT::Get::List-Cleanup=0",
        "-o=Debug::NoLocking=1",
    ]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        # root downloads into our own cache dir, which apt's _apt sandbox user cannot write
        opts.append("-o=APT::Sandbox::User=root")
    (state / "status").touch()
    basics.run(["apt-get", *opts, "update"], stdout=subprocess.DEVNULL, log=log)
    debs = workdir / "debs"
    debs.mkdir(exist_ok=True)
    for old in debs.glob("*.deb"):
        old.unlink()
    basics.run(
        ["apt-get", *opts, "download", *packages], cwd=debs, stdout=subprocess.DEVNULL, log=log
    )
    found = sorted(debs.glob("*.deb"))
    if len(found) != len(packages):
        raise RuntimeError(f"apt-get download {packages} gave {[f.name for f in found]}")
    return found


def extract_deb(deb: Path, dest: Path) -> None:
    basics.run(["dpkg-deb", "-x", deb, dest], log=log)


def relativize_symlinks(root: Path) -> int:
    """Point absolute symlinks inside ``root`` at their target inside ``root``, relatively."""
    fixed = 0
    for link in root.rglob("*"):
        if not link.is_symlink():
            continue
        target = os.readlink(link)
        if not target.startswith("/"):
            continue
        inside = root / target.lstrip("/")
        link.unlink()
        link.symlink_to(os.path.relpath(inside, link.parent))
        fixed += 1
    return fixed
