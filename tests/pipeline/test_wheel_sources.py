"""scripts.wheel_sources: the one list of what a wheel is built from, and its two readers."""

from __future__ import annotations

from pathlib import Path

from scripts import build, wheel_sources
from scripts.basics import REPO, tomllib
from scripts.matrix import digests


def make_tree(root: Path) -> Path:
    for rel, text in {
        "setup.py": "setup()\n",
        "pyproject.toml": "[project]\n",
        "README.md": "# r\n",
        "LICENSE": "MIT\n",
        "csrc/op/op_cuda.cu": "kernel\n",
        "csrc/op/build/temp.o": "object\n",
        "src/hotloop/__init__.py": "x = 1\n",
        "src/hotloop/sub/__init__.py": "",
        "src/hotloop/_build_info.py": "BUILD_INFO = {}\n",
        "src/hotloop/_C.abi3.so": "elf\n",
        "src/hotloop/__pycache__/x.cpython-312.pyc": "pyc\n",
        "src/hotloop.egg-info/PKG-INFO": "stale\n",
        "tests/ops/test_op.py": "test\n",
    }.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def relative(paths: list[Path], root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in paths)


def test_the_build_copies_what_the_reuse_digest_covers_plus_the_metadata(
    tmp_path, monkeypatch
) -> None:
    # The build and the matrix's reuse check must agree on what a wheel is made from:
    # a file the build reads but the digest misses would let a stale wheel be reused.
    tree = make_tree(tmp_path / "repo")
    monkeypatch.setattr(build, "REPO", tree)
    dest = tmp_path / "copy"
    build.copy_sources(dest)
    copied = relative([p for p in dest.rglob("*") if p.is_file()], dest)
    digested = relative(digests.source_paths(tree), tree)
    assert digested == [
        "csrc/op/op_cuda.cu",
        "pyproject.toml",
        "setup.py",
        "src/hotloop/__init__.py",
        "src/hotloop/sub/__init__.py",
    ]
    assert sorted(set(copied) - set(wheel_sources.METADATA)) == digested
    assert sorted(set(copied) & set(wheel_sources.METADATA)) == ["LICENSE", "README.md"]


def test_every_package_setuptools_finds_is_code() -> None:
    # pyproject.toml's packages.find folders and the package folders under them must lie
    # inside wheel_sources.code_items(), or a packaged module would not count as the wheel's code.
    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    code = [REPO / item for item in wheel_sources.code_items()]
    for where in setuptools["packages"]["find"]["where"]:
        for init in (REPO / where).rglob("__init__.py"):
            if "__pycache__" in init.parts or any(p.endswith(".egg-info") for p in init.parts):
                continue
            assert any(init.is_relative_to(c) for c in code), init.relative_to(REPO)
