"""Find CPython interpreters for fresh venvs without relying on pyenv's shims, and say where
each comes from: the host, or a container root.

Order per version on the host: an exact ``pythonX.Y`` on PATH that really is X.Y (shims that
refuse are skipped), then ``$(pyenv root)/versions/X.Y.*/bin/pythonX.Y`` (newest patch
release), then ``uv python find`` (managed or system interpreters; uv never downloads here
because ``UV_PYTHON_DOWNLOADS=never``). With ``container=True``, a version the host lacks comes
from the Debian root of :mod:`scripts.interpreter_root` (3.14 and 3.15: their Debian builds
need a newer glibc than the host's), made on first use.

    python -m scripts.interpreters [--no-container]    where each Python comes from
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

HOST = "host"
CONTAINER = "container"
KNOWN_PYTHONS = ("3.9", "3.10", "3.11", "3.12", "3.13", "3.14", "3.15")


@dataclass(frozen=True)
class Interpreter:
    version: str  # "3.12"
    path: Path  # for a container interpreter: its path inside the root
    source: str  # "PATH", "pyenv", "uv" (the host), or CONTAINER
    detail: str = ""  # a container interpreter's root, in words ("Debian sid root")
    root: Path | None = None  # the root filesystem a container interpreter runs in

    @property
    def origin(self) -> str:
        """Where it comes from: ``host (pyenv)``, ``container (Debian sid root)``."""
        if self.root is not None:
            return f"{CONTAINER} ({self.detail})"
        return f"{HOST} ({self.source})"


def pyenv_root() -> Path | None:
    """``$PYENV_ROOT``, else ``pyenv root``, else ``~/.pyenv`` if it exists."""
    env = os.environ.get("PYENV_ROOT")
    if env and Path(env).is_dir():
        return Path(env)
    exe = shutil.which("pyenv")
    if exe:
        try:
            out = subprocess.run(
                [exe, "root"], capture_output=True, text=True, timeout=20, check=True
            )
            root = Path(out.stdout.strip())
            if root.is_dir():
                return root
        except (OSError, subprocess.SubprocessError):
            pass
    home = Path.home() / ".pyenv"
    return home if home.is_dir() else None


def _patch_key(name: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", name))


def pyenv_candidates(version: str, root: Path | None) -> list[Path]:
    """Executables ``versions/<version>.*/bin/python<version>``, newest patch release first."""
    if root is None:
        return []
    dirs = [
        d
        for d in (root / "versions").glob(f"{version}.*")
        if re.fullmatch(re.escape(version) + r"\.\d+", d.name)
    ]
    dirs.sort(key=lambda d: _patch_key(d.name), reverse=True)
    return [
        d / "bin" / f"python{version}" for d in dirs if (d / "bin" / f"python{version}").is_file()
    ]


def interpreter_version(path: Path | str) -> str | None:
    """``"3.12"`` if ``path`` runs; ``None`` for a refusing shim or a broken binary."""
    try:
        out = subprocess.run(
            [str(path), "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def is_virtualenv_python(path: Path | str) -> bool:
    """A venv's ``bin/python``: fresh venvs should start from the base interpreter instead."""
    return (Path(path).parent.parent / "pyvenv.cfg").is_file()


def _from_path(version: str) -> Path | None:
    exe = shutil.which(f"python{version}")
    if (
        exe
        and "/shims/" not in exe
        and not is_virtualenv_python(exe)
        and interpreter_version(exe) == version
    ):
        return Path(exe)
    return None


def _from_uv(version: str) -> Path | None:
    uv = shutil.which("uv")
    if not uv:
        return None
    env = {**os.environ, "UV_PYTHON_DOWNLOADS": "never"}
    try:
        out = subprocess.run(
            [uv, "python", "find", "--no-project", version],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    path = out.stdout.strip()
    if (
        out.returncode == 0
        and path
        and "/shims/" not in path
        and interpreter_version(path) == version
    ):
        return Path(path)
    return None


def find_interpreter(version: str, root: Path | None = None) -> Interpreter | None:
    path = _from_path(version)
    if path:
        return Interpreter(version, path, "PATH")
    for candidate in pyenv_candidates(version, root if root is not None else pyenv_root()):
        if interpreter_version(candidate) == version:
            return Interpreter(version, candidate, "pyenv")
    path = _from_uv(version)
    if path:
        return Interpreter(version, path, "uv")
    return None


def find_interpreters(
    versions: Iterable[str], container: bool = False
) -> dict[str, Interpreter | None]:
    """Each version's interpreter (None: not found); see :func:`find_with_reasons`."""
    return find_with_reasons(versions, container)[0]


def find_with_reasons(
    versions: Iterable[str], container: bool = False
) -> tuple[dict[str, Interpreter | None], dict[str, str]]:
    """Each version's interpreter: the host's, else (``container``) the Debian root's; and
    for each one not found, why."""
    root = pyenv_root()
    found = {v: find_interpreter(v, root) for v in versions}
    missing = [v for v, i in found.items() if i is None]
    reasons = {v: f"no Python {v} on this machine" for v in missing}
    if container and missing:
        from scripts import interpreter_root  # makes a root: only when asked for

        extra, why = interpreter_root.root_interpreters(missing)
        found.update(extra)
        for v in missing:
            if v in extra:
                del reasons[v]
            elif v in interpreter_root.PYTHONS and why:
                reasons[v] += f", and none from the Debian root: {why}"
    return found, reasons


def pyenv_bin_dirs(versions: Sequence[str]) -> list[str]:
    """``bin`` folders of the pyenv installs of ``versions`` (for nox's lookup of ``pythonX.Y``)."""
    root = pyenv_root()
    return [str(c.parent) for v in versions for c in pyenv_candidates(v, root)[:1]]


def put_on_path(versions: Sequence[str]) -> None:
    """Prepend pyenv's ``bin`` folders so ``python3.X`` finds real interpreters, not shims."""
    dirs = [
        d for d in pyenv_bin_dirs(versions) if d not in os.environ.get("PATH", "").split(os.pathsep)
    ]
    if dirs:
        os.environ["PATH"] = os.pathsep.join([*dirs, os.environ.get("PATH", "")])
    os.environ.setdefault("UV_PYTHON_DOWNLOADS", "never")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.interpreters", description=__doc__)
    parser.add_argument("--no-container", action="store_true", help="the host's interpreters only")
    args = parser.parse_args(argv)
    found, reasons = find_with_reasons(KNOWN_PYTHONS, container=not args.no_container)
    for version, interp in found.items():
        if interp is None:
            print(f"{version}: not found ({reasons[version]})")
        elif interp.root is not None:
            print(f"{version}: {interp.path} in {interp.root}, {interp.origin}")
        else:
            print(f"{version}: {interp.path}, {interp.origin}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
