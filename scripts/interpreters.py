"""Find CPython interpreters for fresh venvs without relying on pyenv's shims.

Order per version: an exact ``pythonX.Y`` on PATH that really is X.Y (shims that refuse are
skipped), then ``$(pyenv root)/versions/X.Y.*/bin/pythonX.Y`` (newest patch release), then
``uv python find`` (managed or system interpreters; uv never downloads here because
``UV_PYTHON_DOWNLOADS=never``).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Interpreter:
    version: str  # "3.12"
    path: Path
    source: str  # "PATH", "pyenv", "uv"


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


def find_interpreters(versions: Iterable[str]) -> dict[str, Interpreter | None]:
    root = pyenv_root()
    return {v: find_interpreter(v, root) for v in versions}


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


if __name__ == "__main__":
    for ver, found in find_interpreters(["3.9", "3.10", "3.11", "3.12", "3.13"]).items():
        print(f"{ver}: {found.path} ({found.source})" if found else f"{ver}: not found")
