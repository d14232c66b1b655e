"""A git checkout for tests of what the pipeline reads from git."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]


def git_checkout_with_a_project(tmp_path: Path) -> Path:
    """A checkout whose one commit (at epoch 1700000000) tracks a project in a subfolder, and
    an untracked folder beside it; the project's folder."""
    subprocess.run([*GIT, "init", "-q", str(tmp_path)], check=True)
    project = tmp_path / "extensions" / "ext"
    project.mkdir(parents=True)
    (project / "setup.py").write_text("# the project\n")
    (tmp_path / ".gitignore").write_text("/unpacked/\n")
    subprocess.run([*GIT, "add", "."], cwd=tmp_path, check=True)
    date = {"GIT_AUTHOR_DATE": "@1700000000 +0000", "GIT_COMMITTER_DATE": "@1700000000 +0000"}
    subprocess.run(
        [*GIT, "commit", "-q", "-m", "monorepo"],
        cwd=tmp_path,
        check=True,
        env={**os.environ, **date},
    )
    (tmp_path / "unpacked").mkdir()
    return project


def commit_all(root: Path, message: str) -> None:
    subprocess.run([*GIT, "add", "."], cwd=root, check=True)
    subprocess.run([*GIT, "commit", "-q", "-m", message], cwd=root, check=True)


def git_checkout_versioned_by_tags(tmp_path: Path) -> Path:
    """A checkout of a project whose version setuptools-scm takes from git: tagged v1.2.3,
    one commit past the tag, and a file changed since (a dirty checkout); its folder."""
    root = tmp_path / "scm"
    subprocess.run([*GIT, "init", "-q", str(root)], check=True)
    (root / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools", "setuptools-scm>=8"]\n'
        'build-backend = "setuptools.build_meta"\n\n'
        '[project]\nname = "scmext"\ndynamic = ["version"]\n\n'
        '[tool.setuptools_scm]\nversion_file = "scmext/_version.py"\n'
    )
    (root / "scmext").mkdir()
    (root / "scmext" / "__init__.py").write_text("")
    (root / ".gitignore").write_text("/scmext/_version.py\n")
    commit_all(root, "first")
    subprocess.run([*GIT, "tag", "v1.2.3"], cwd=root, check=True)
    (root / "setup.py").write_text("from setuptools import setup\nsetup()\n")
    commit_all(root, "past the tag")
    (root / "scmext" / "__init__.py").write_text("# changed\n")
    return root
