"""scripts.matrix.digests: what a wheel is made from."""

from __future__ import annotations

from pathlib import Path

from scripts.matrix import digests


def make_tree(root: Path) -> Path:
    (root / "csrc" / "op").mkdir(parents=True)
    (root / "src" / "hotloop" / "__pycache__").mkdir(parents=True)
    (root / "setup.py").write_text("setup()\n")
    (root / "pyproject.toml").write_text("[project]\n")
    (root / "csrc" / "op" / "op.cu").write_text("kernel\n")
    (root / "src" / "hotloop" / "__init__.py").write_text("x = 1\n")
    (root / "src" / "hotloop" / "_build_info.py").write_text("BUILD_INFO = {}\n")
    (root / "src" / "hotloop" / "_C.abi3.so").write_bytes(b"\x7fELF")
    (root / "src" / "hotloop" / "__pycache__" / "x.pyc").write_bytes(b"pyc")
    (root / "README.md").write_text("readme\n")
    return root


def test_source_digest_covers_only_what_goes_into_the_wheel(tmp_path) -> None:
    tree = make_tree(tmp_path)
    names = [p.relative_to(tree).as_posix() for p in digests.source_paths(tree)]
    assert names == ["csrc/op/op.cu", "pyproject.toml", "setup.py", "src/hotloop/__init__.py"]
    before = digests.source_digest(tree)
    (tree / "src" / "hotloop" / "_build_info.py").write_text("BUILD_INFO = {'x': 2}\n")
    (tree / "src" / "hotloop" / "_C.abi3.so").write_bytes(b"other")
    (tree / "README.md").write_text("changed\n")
    assert digests.source_digest(tree) == before
    (tree / "csrc" / "op" / "op.cu").write_text("kernel 2\n")
    assert digests.source_digest(tree) != before


def test_a_renamed_source_changes_the_digest(tmp_path) -> None:
    tree = make_tree(tmp_path)
    before = digests.source_digest(tree)
    (tree / "csrc" / "op" / "op.cu").rename(tree / "csrc" / "op" / "op2.cu")
    assert digests.source_digest(tree) != before
