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
