"""Real ``.deb`` files for the tests of what the pipeline unpacks from Debian's archive."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest


def build_deb(out_dir: Path, name: str, version: str, files: dict[str, str | Path]) -> Path:
    """A ``.deb`` named ``name`` with ``files`` (path -> text, or a Path for a symlink)."""
    if shutil.which("dpkg-deb") is None:
        pytest.skip("dpkg-deb not installed")
    tree = out_dir / f"{name}-tree"
    (tree / "DEBIAN").mkdir(parents=True)
    (tree / "DEBIAN" / "control").write_text(
        f"Package: {name}\nVersion: {version}\nArchitecture: amd64\n"
        "Maintainer: test <t@example.invalid>\nDescription: test\n"
    )
    for rel, content in files.items():
        path = tree / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, Path):
            path.symlink_to(content)
        else:
            path.write_text(content)
            if "/bin/" in rel:
                path.chmod(0o755)
    deb = out_dir / f"{name}_{version}_amd64.deb"
    subprocess.run(
        ["dpkg-deb", "--root-owner-group", "-Zgzip", "--build", tree, deb],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    shutil.rmtree(tree)
    return deb
