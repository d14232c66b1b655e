"""scripts/index.py: the static PEP 503 tree, then pip and uv against it over HTTP on loopback."""

from __future__ import annotations

import hashlib
import shutil
import sys
import zipfile
from collections.abc import Callable
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urldefrag

import pytest
from index_helpers import (
    REPO,
    TORCH_VARIANT,
    find_uv,
    installed_hotloop,
    make_tiny_wheel,
    make_tool_venv,
    make_torch_venv,
    make_variant_wheels,
    pip_install,
    run,
    static_server,
    uv_pip_install,
)

from scripts import index

VARIANTS = ("pt211cu130", "pt214cu130")


class Anchors(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.anchors: list[dict[str, str | None]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self.anchors.append(dict(attrs))


def anchors(page: Path) -> list[dict[str, str | None]]:
    parser = Anchors()
    parser.feed(page.read_text())
    return parser.anchors


def tree_bytes(root: Path) -> dict[str, bytes]:
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def wheel_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return Path(make_variant_wheels(tmp_path_factory.mktemp("wheels") / "wheelhouse")[0].parent)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory, wheel_dir: Path) -> Path:
    out = tmp_path_factory.mktemp("site") / "site"
    index.build_index([wheel_dir], out)
    return out


# --------------------------------------------------------------------------- the tree


def test_tree_layout(site: Path) -> None:
    files = set(tree_bytes(site))
    wheels = sorted(p.name for p in (site / "files").glob("*.whl"))
    assert len(wheels) == 2
    expected = {
        ".nojekyll",
        "index.html",
        "simple/index.html",
        "simple/hotloop/index.html",
        *(f"files/{w}" for w in wheels),
        *(f"files/{w}.metadata" for w in wheels),
        *(f"{v}/index.html" for v in VARIANTS),
        *(f"{v}/simple/index.html" for v in VARIANTS),
        *(f"{v}/simple/hotloop/index.html" for v in VARIANTS),
    }
    assert files == expected
    assert [a["href"] for a in anchors(site / "simple" / "index.html")] == ["hotloop/"]
    assert (
        'name="pypi:repository-version" content="1.0"' in (site / "simple/index.html").read_text()
    )


def test_links_carry_file_hash_requires_python_and_metadata(site: Path, wheel_dir: Path) -> None:
    page = site / "simple" / "hotloop" / "index.html"
    assert page.read_text().count('data-requires-python="&gt;=3.9"') == 2
    links = anchors(page)
    assert len(links) == 2
    for link in links:
        url, fragment = urldefrag(link["href"] or "")
        assert "%2Bpt2" in url
        target = (page.parent / unquote(url)).resolve()
        data = target.read_bytes()
        assert data == (wheel_dir / target.name).read_bytes()
        assert fragment == "sha256=" + hashlib.sha256(data).hexdigest()
        assert link["data-requires-python"] == ">=3.9"
        # PEP 658: <file>.metadata beside the file, equal to the wheel's METADATA.
        metadata = Path(str(target) + ".metadata").read_bytes()
        with zipfile.ZipFile(target) as zf:
            version = target.name.split("-")[1]
            assert metadata == zf.read(f"hotloop-{version}.dist-info/METADATA")
        digest = "sha256=" + hashlib.sha256(metadata).hexdigest()
        assert link["data-core-metadata"] == digest  # PEP 714
        assert link["data-dist-info-metadata"] == digest  # PEP 658, for pip < 23.1


def test_variant_trees_hold_only_their_variant(site: Path) -> None:
    for variant in VARIANTS:
        for page in (
            site / variant / "simple" / "hotloop" / "index.html",
            site / variant / "index.html",
        ):
            hrefs = [unquote(urldefrag(a["href"] or "")[0]) for a in anchors(page)]
            names = [Path(h).name for h in hrefs]
            assert names == [f"hotloop-0.1.0+{variant}-cp39-abi3-manylinux_2_28_x86_64.whl"]
            assert all((page.parent / h).is_file() for h in hrefs)


def test_landing_page_lists_variants_and_commands(tmp_path: Path, wheel_dir: Path) -> None:
    out = tmp_path / "site"
    index.build_index([wheel_dir], out, base_url="https://example.org/hotloop/")
    text = (out / "index.html").read_text()
    for variant in VARIANTS:
        assert f'<a href="{variant}/">{variant}</a>' in text
        assert f"--index-url https://example.org/hotloop/{variant}/simple/" in text
        assert f"-f https://example.org/hotloop/{variant}/" in text
    assert "<td>2.11</td><td>13.0</td>" in text
    assert "--index-url https://example.org/hotloop/simple/" in text


def test_rebuild_is_byte_identical(tmp_path: Path, wheel_dir: Path, site: Path) -> None:
    # Other input order (two sources, the same files once more), another folder, a rebuild
    # over an existing tree: the same bytes.
    copy = tmp_path / "elsewhere"
    shutil.copytree(wheel_dir, copy)
    again = tmp_path / "again"
    index.build_index([copy, wheel_dir], again)
    assert tree_bytes(again) == tree_bytes(site)
    index.build_index([wheel_dir], again)
    assert tree_bytes(again) == tree_bytes(site)


def test_new_build_replaces_stale_files(tmp_path: Path, wheel_dir: Path) -> None:
    out = tmp_path / "site"
    index.build_index([wheel_dir], out)
    only_one = tmp_path / "one"
    only_one.mkdir()
    shutil.copy(next(wheel_dir.glob("*pt214cu130*")), only_one)
    index.build_index([only_one], out)
    assert not (out / "pt211cu130").exists()
    assert [p.name for p in (out / "files").glob("*.whl")] == [
        "hotloop-0.1.0+pt214cu130-cp39-abi3-manylinux_2_28_x86_64.whl"
    ]


def test_project_names_are_normalised(tmp_path: Path) -> None:
    wheel = make_tiny_wheel(tmp_path / "w", "pt211cu130", name="Hot_Loop.Extras")
    index.build_index([wheel.parent], tmp_path / "site")
    assert [a["href"] for a in anchors(tmp_path / "site/simple/index.html")] == ["hot-loop-extras/"]
    assert (tmp_path / "site/simple/hot-loop-extras/index.html").is_file()


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (
            lambda d: make_tiny_wheel(d, "pt211cu130").rename(d / "hotloop-0.1.0-py3-none-any.whl"),
            "local label",
        ),
        (
            lambda d: (d / "hotloop-0.1.0+pt211cu130-py3-none-any.whl").write_bytes(b"not a zip"),
            "zip",
        ),
    ],
    ids=["no-variant", "not-a-wheel"],
)
def test_refuses_bad_wheels(tmp_path: Path, make: Callable[[Path], object], message: str) -> None:
    wheels = tmp_path / "w"
    wheels.mkdir()
    make(wheels)
    assert index.main(["--wheels", str(wheels), "--out", str(tmp_path / "site")]) == 1
    assert not (tmp_path / "site").exists()


def test_refuses_to_replace_a_folder_that_is_not_an_index(tmp_path: Path, wheel_dir: Path) -> None:
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "notes.txt").write_text("keep me")
    with pytest.raises(index.IndexBuildError, match="not an index"):
        index.build_index([wheel_dir], precious)
    assert (precious / "notes.txt").read_text() == "keep me"


def test_command_line_entry_point(tmp_path: Path, wheel_dir: Path, site: Path) -> None:
    """What the publish workflow runs on the CI artifacts."""
    out = tmp_path / "site"
    proc = run(
        [sys.executable, "-m", "scripts.index", "--wheels", wheel_dir, "--out", out], cwd=REPO
    )
    assert "pt211cu130: hotloop-0.1.0+pt211cu130" in proc.stdout
    assert tree_bytes(out) == tree_bytes(site)


# --------------------------------------------------------------------------- pip and uv over HTTP


@pytest.fixture(scope="module")
def uv(tmp_path_factory: pytest.TempPathFactory) -> str:
    return find_uv() or make_tool_venv(tmp_path_factory.mktemp("tools") / "venv")[1]


@pytest.fixture
def torch_venv(tmp_path: Path, uv: str) -> Path:
    """A fresh venv with pip and the real torch 2.11.0 (no hotloop)."""
    return make_torch_venv(tmp_path / "venv", uv)


@pytest.fixture(scope="module")
def served_site(site: Path, tmp_path_factory: pytest.TempPathFactory):
    log = tmp_path_factory.mktemp("logs") / "http.log"
    with static_server(site, log) as url:
        yield url, log


def test_pip_picks_the_variant_of_installed_torch(served_site, torch_venv: Path) -> None:
    url, log = served_site
    pip_install(torch_venv, "--index-url", f"{url}/simple/")
    assert installed_hotloop(torch_venv) == f"0.1.0+{TORCH_VARIANT}"
    # pip read the PEP 658 metadata file instead of downloading wheels to learn their pins.
    assert ".whl.metadata HTTP" in log.read_text()


def test_pip_with_the_per_variant_index(served_site, torch_venv: Path) -> None:
    url, _ = served_site
    wrong = pip_install(torch_venv, "--index-url", f"{url}/pt214cu130/simple/", check=False)
    assert wrong.returncode != 0
    assert "torch==2.14" in wrong.stdout + wrong.stderr
    pip_install(torch_venv, "--index-url", f"{url}/{TORCH_VARIANT}/simple/")
    assert installed_hotloop(torch_venv) == f"0.1.0+{TORCH_VARIANT}"


def test_pip_with_the_find_links_page(served_site, torch_venv: Path) -> None:
    url, _ = served_site
    pip_install(torch_venv, "--no-index", "-f", f"{url}/{TORCH_VARIANT}/")
    assert installed_hotloop(torch_venv) == f"0.1.0+{TORCH_VARIANT}"


def test_uv_picks_the_variant_of_installed_torch(served_site, torch_venv: Path, uv: str) -> None:
    url, _ = served_site
    uv_pip_install(uv, torch_venv, "--index-url", f"{url}/simple/")
    assert installed_hotloop(torch_venv) == f"0.1.0+{TORCH_VARIANT}"


def test_pip_refuses_a_wheel_changed_after_indexing(
    tmp_path: Path, site: Path, torch_venv: Path
) -> None:
    tampered = tmp_path / "tampered"
    shutil.copytree(site, tampered)
    wheel = next((tampered / "files").glob(f"*{TORCH_VARIANT}*.whl"))
    with zipfile.ZipFile(wheel, "a") as zf:  # still a valid wheel, other bytes
        zf.writestr("hotloop/injected.py", "print('not what was indexed')\n")
    with static_server(tampered, tmp_path / "http.log") as url:
        proc = pip_install(torch_venv, "--index-url", f"{url}/simple/", check=False)
    assert proc.returncode != 0
    assert "DO NOT MATCH THE HASHES" in proc.stderr + proc.stdout
    assert run([torch_venv, "-c", "import hotloop"], check=False).returncode != 0
