"""scripts/index.py: the static PEP 503 tree, its checks on what it is given and where it writes,
then pip and uv against it over HTTP on loopback."""

from __future__ import annotations

import fcntl
import hashlib
import html
import os
import re
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Callable
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import quote, unquote, urldefrag

import pytest
from index_helpers import (
    REPO,
    TORCH_INSTALLED,
    TORCH_VARIANT,
    VARIANTS,
    find_uv,
    installed_hotloop,
    make_fake_torch_wheel,
    make_tiny_wheel,
    make_tool_venv,
    make_torch_venv,
    make_variant_wheels,
    pip_install,
    run,
    run_shell,
    site_packages,
    static_server,
    torch_state,
    uninstall_hotloop,
    uv_pip_install,
    write_flat_index,
    write_wheel,
)

from scripts import index, wheelfile
from scripts.variant import parse_label

WHEEL_TAG = "cp39-abi3-manylinux_2_28_x86_64"


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


def linked_wheels(page: Path) -> list[str]:
    return [Path(unquote(urldefrag(a["href"] or "")[0])).name for a in anchors(page)]


def wheel_name(label: str) -> str:
    return f"hotloop-0.1.0+{label}-{WHEEL_TAG}.whl"


def tree_bytes(root: Path) -> dict[str, bytes]:
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def wheel_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_variant_wheels(tmp_path_factory.mktemp("wheels") / "wheelhouse")[0].parent


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory, wheel_dir: Path) -> Path:
    out = tmp_path_factory.mktemp("site") / "site"
    index.build_index([wheel_dir], out)
    return out


# --------------------------------------------------------------------------- the tree


def test_tree_layout(site: Path) -> None:
    files = set(tree_bytes(site))
    wheels = sorted(p.name for p in (site / "files").glob("*.whl"))
    assert wheels == sorted(wheel_name(v) for v in VARIANTS)
    folders = [*VARIANTS, "cu12", "cu13"]
    expected = {
        ".nojekyll",
        ".hotloop-index",
        "index.html",
        "SHA256SUMS",
        "simple/index.html",
        "simple/hotloop/index.html",
        *(f"files/{w}" for w in wheels),
        *(f"files/{w}.metadata" for w in wheels),
        *(f"{f}/index.html" for f in folders),
        *(f"{f}/simple/index.html" for f in folders),
        *(f"{f}/simple/hotloop/index.html" for f in folders),
    }
    assert files == expected
    assert [a["href"] for a in anchors(site / "simple" / "index.html")] == ["hotloop/"]
    assert (
        'name="pypi:repository-version" content="1.0"' in (site / "simple/index.html").read_text()
    )
    # The manifest lists every file of the tree but itself: what a rebuild may replace.
    listed = (site / ".hotloop-index").read_text().splitlines()[1:]
    assert set(listed) == expected - {".hotloop-index"}


def test_sha256sums_and_sboms_are_published(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    document = b'{"bomFormat": "CycloneDX", "specVersion": "1.6"}'
    with_sbom = make_tiny_wheel(
        wheels,
        "stable.cu13",
        extra_files={"hotloop-0.1.0+stable.cu13.dist-info/sboms/hotloop.cdx.json": document},
    )
    without = make_tiny_wheel(wheels, "pt29cu128")
    out = tmp_path / "site"
    index.build_index([wheels], out)
    assert (out / "files" / f"{with_sbom.name}.cdx.json").read_bytes() == document
    assert not (out / "files" / f"{without.name}.cdx.json").exists()
    sums = (out / "SHA256SUMS").read_text().splitlines()
    assert sums == [
        f"{hashlib.sha256(w.read_bytes()).hexdigest()}  files/{w.name}"
        for w in sorted((with_sbom, without), key=lambda w: w.name)
    ]
    check = subprocess.run(["sha256sum", "-c", "SHA256SUMS"], cwd=out, capture_output=True)
    assert check.returncode == 0, check.stdout + check.stderr
    landing = [a["href"] for a in anchors(out / "index.html")]
    assert "SHA256SUMS" in landing
    assert f"files/{quote(with_sbom.name)}.cdx.json" in landing


def test_links_carry_file_hash_requires_python_and_metadata(site: Path, wheel_dir: Path) -> None:
    page = site / "simple" / "hotloop" / "index.html"
    assert page.read_text().count('data-requires-python="&gt;=3.9"') == len(VARIANTS)
    links = anchors(page)
    assert len(links) == len(VARIANTS)
    for link in links:
        url, fragment = urldefrag(link["href"] or "")
        assert "%2B" in url
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
            assert linked_wheels(page) == [wheel_name(variant)]
            hrefs = [unquote(urldefrag(a["href"] or "")[0]) for a in anchors(page)]
            assert all((page.parent / h).is_file() for h in hrefs)


@pytest.mark.parametrize(
    ("group", "labels"),
    [("cu13", ["stable.cu13"]), ("cu12", ["pt28cu128", "pt29cu128", "stable.cu12"])],
)
def test_cuda_pages_hold_the_stable_and_pinned_wheels_of_one_cuda_major(
    site: Path, group: str, labels: list[str]
) -> None:
    for page in (site / group / "simple" / "hotloop" / "index.html", site / group / "index.html"):
        assert linked_wheels(page) == [wheel_name(label) for label in labels]


def test_cpu_wheels_get_their_own_page(tmp_path: Path) -> None:
    wheels = make_variant_wheels(tmp_path / "w", ("pt29cpu", "stable.cpu", "stable.cu13"))
    out = tmp_path / "site"
    index.build_index([wheels[0].parent], out)
    page = out / "cpu" / "simple" / "hotloop" / "index.html"
    assert linked_wheels(page) == [wheel_name("pt29cpu"), wheel_name("stable.cpu")]
    assert linked_wheels(out / "cu13" / "simple" / "hotloop" / "index.html") == [
        wheel_name("stable.cu13")
    ]
    assert "<td>CPU-only torch</td>" in (out / "index.html").read_text()


def test_landing_page_lists_variants_and_commands(tmp_path: Path, wheel_dir: Path) -> None:
    out = tmp_path / "site"
    index.build_index([wheel_dir], out, base_url="https://example.org/hotloop/")
    text = (out / "index.html").read_text()
    keep_torch = index.KEEP_TORCH.replace('"', "&quot;").replace("'", "&#x27;")
    for group in ("cu12", "cu13"):
        assert (
            f"python -m pip install hotloop {keep_torch} --index-url "
            f"https://example.org/hotloop/{group}/simple/<br>"
        ) in text
        assert (
            f"uv pip install hotloop {keep_torch} --default-index "
            f"https://example.org/hotloop/{group}/simple/</pre>"
        ) in text
    assert "pypi.org" not in text
    for variant in VARIANTS:
        assert f'<a href="{variant}/">{variant}</a>' in text
        assert f"--index-url https://example.org/hotloop/{variant}/simple/" in text
        assert f"--no-index -f https://example.org/hotloop/{variant}/" in text
    assert "<td>torch==2.9.*</td><td>12.8</td>" in text
    assert "<td>torch&gt;=2.10</td><td>13</td>" in text


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
    assert sorted(p.name for p in tmp_path.iterdir()) == ["again", "elsewhere"]


def test_new_build_replaces_stale_files(tmp_path: Path, wheel_dir: Path) -> None:
    out = tmp_path / "site"
    index.build_index([wheel_dir], out)
    only_one = tmp_path / "one"
    only_one.mkdir()
    shutil.copy(wheel_dir / wheel_name("stable.cu13"), only_one)
    index.build_index([only_one], out)
    assert not (out / "pt29cu128").exists()
    assert not (out / "cu12").exists()
    assert [p.name for p in (out / "files").glob("*.whl")] == [wheel_name("stable.cu13")]


def test_project_names_are_normalised(tmp_path: Path) -> None:
    wheel = make_tiny_wheel(tmp_path / "w", "stable.cu13", name="Hot_Loop.Extras")
    index.build_index([wheel.parent], tmp_path / "site")
    assert [a["href"] for a in anchors(tmp_path / "site/simple/index.html")] == ["hot-loop-extras/"]
    assert (tmp_path / "site/simple/hot-loop-extras/index.html").is_file()


def test_command_line_entry_point(tmp_path: Path, wheel_dir: Path, site: Path) -> None:
    """What the publish workflow runs on the CI artifacts."""
    out = tmp_path / "site"
    proc = run(
        [sys.executable, "-m", "scripts.index", "--wheels", wheel_dir, "--out", out], cwd=REPO
    )
    assert f"stable.cu13: {wheel_name('stable.cu13')}" in proc.stdout
    assert "cu12/simple/, cu13/simple/" in proc.stdout
    assert tree_bytes(out) == tree_bytes(site)


# --------------------------------------------------------------------------- refused wheels


def renamed(label: str, new_name: str) -> Callable[[Path], object]:
    return lambda d: make_tiny_wheel(d, label).rename(d / new_name)


def tiny_with_label(label: str, requires_torch: str = "torch>=2.10") -> Callable[[Path], object]:
    """A wheel whose file name and METADATA both carry ``label``, whatever it is."""
    return lambda d: make_tiny_wheel(d, label, requires_torch=requires_torch)


def tiny_with_version(version: str, filename: str) -> Callable[[Path], object]:
    def make(d: Path) -> Path:
        dist_info = f"hotloop-{version}.dist-info"
        metadata = f"Metadata-Version: 2.1\nName: hotloop\nVersion: {version}\n"
        return write_wheel(d / filename, {f"{dist_info}/METADATA": metadata}, dist_info)

    return make


REFUSED = {
    # item 8: names that are no wheel file name
    "space-and-parens": (renamed("stable.cu13", "X (1).whl"), "not a wheel file name"),
    "newline": (
        renamed("stable.cu13", f"hotloop-0.1.0+stable.cu13-{WHEEL_TAG}\n.whl"),
        "not a wheel file name",
    ),
    "non-canonical-version": (
        tiny_with_version("0.1.0+Stable.CU13", f"hotloop-0.1.0+Stable.CU13-{WHEEL_TAG}.whl"),
        "not a canonical PEP 440 version",
    ),
    "no-variant": (renamed("stable.cu13", "hotloop-0.1.0-py3-none-any.whl"), "local label"),
    "not-a-zip": (
        lambda d: (d / wheel_name("stable.cu13")).write_bytes(b"not a zip"),
        "not a readable zip",
    ),
    # item 8: the label promises one torch, the metadata asks for another
    "pinned-label-other-pin": (
        tiny_with_label("pt29cu128", requires_torch="torch==2.12.*"),
        "promises Requires-Dist: torch==2.9.*, but METADATA has torch==2.12.*",
    ),
    "stable-label-pinned": (
        tiny_with_label("stable.cu13", requires_torch="torch==2.11.*"),
        "promises Requires-Dist: torch>=2.10",
    ),
    # item 8: non-ASCII in Requires-Dist is read, not a crash; it is no torch requirement
    "non-ascii-requires-dist": (
        tiny_with_label("stable.cu13", requires_torch="tørch>=2.10"),
        "but METADATA has no requirement on torch",
    ),
    # item 6: labels that would be paths outside --out or over the index's own pages
    **{
        f"label-{name}": (tiny_with_version(f"0.1.0+{label}", wheel_name(label)), message)
        for name, label, message in [
            ("dotdot", "..", "not a canonical PEP 440 version"),
            ("dot", ".", "not a canonical PEP 440 version"),
            ("simple", "simple", "is not a hotloop variant label"),
            ("files", "files", "is not a hotloop variant label"),
            ("cu13", "cu13", "is not a hotloop variant label"),
        ]
    },
    # item 7: markup in a label or a project name
    "html-label": (
        tiny_with_version(
            "0.1.0+<script>", "hotloop-0.1.0+<script>alert(1)<%2Fscript>-py3-none-any.whl"
        ),
        "not a canonical PEP 440 version",
    ),
    "html-project": (
        lambda d: make_tiny_wheel(d, "stable.cu13", name="<img src=x onerror=alert(1)>"),
        "not a wheel file name",
    ),
}


@pytest.mark.parametrize(("make", "message"), REFUSED.values(), ids=REFUSED.keys())
def test_refuses_bad_wheels(
    tmp_path: Path, make: Callable[[Path], object], message: str, capsys: pytest.CaptureFixture
) -> None:
    wheels = tmp_path / "w"
    wheels.mkdir()
    make(wheels)
    user_page = tmp_path / "index.html"  # what a ".." label would overwrite
    user_page.write_text("the user's page")
    assert index.main(["--wheels", str(wheels), "--out", str(tmp_path / "site")]) == 1
    assert message in capsys.readouterr().err
    assert not (tmp_path / "site").exists()
    assert user_page.read_text() == "the user's page"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["index.html", "w"]


def test_non_ascii_metadata_is_kept_byte_for_byte(tmp_path: Path) -> None:
    wheel = make_tiny_wheel(
        tmp_path / "w", "stable.cu13", extra_metadata="Author: Zoë Ångström\nKeywords: naïve\n"
    )
    (described,) = index.build_index([wheel.parent], tmp_path / "site")
    assert described.requires_torch == "torch>=2.10"
    with zipfile.ZipFile(wheel) as zf:
        metadata = zf.read("hotloop-0.1.0+stable.cu13.dist-info/METADATA")
    assert "Zoë".encode() in metadata
    assert (tmp_path / "site/files" / f"{wheel.name}.metadata").read_bytes() == metadata


def test_pages_escape_everything_they_show() -> None:
    """Defence in depth behind the name checks: what reaches HTML is escaped."""
    hostile = '"><script>alert(1)</script>'
    wheel = wheelfile.WheelInfo(
        filename=f"hotloop-0.1.0+stable.cu13-{hostile}.whl",
        project=f"hotloop{hostile}",
        version="0.1.0+stable.cu13",
        label="stable.cu13",
        variant=parse_label("stable.cu13"),
        sha256="0" * 64,
        metadata=b"",
        metadata_sha256="0" * 64,
        requires_python=hostile,
        requires_torch="torch>=2.10",
        source=Path("unused"),
    )
    for path, data in index.render_tree([wheel]).items():
        if path.endswith(".html"):
            assert b"<script" not in data, path


@pytest.mark.parametrize(
    "base_url", ['https://x.org/"><script>', "https://x.org/$(rm -rf ~)", "ftp://x.org/"]
)
def test_base_url_that_is_not_a_plain_url_is_refused(tmp_path: Path, base_url: str) -> None:
    wheel = make_tiny_wheel(tmp_path / "w", "stable.cu13")
    with pytest.raises(index.IndexBuildError, match="not a plain http"):
        index.build_index([wheel.parent], tmp_path / "site", base_url)


def test_two_different_files_with_one_name_are_refused(tmp_path: Path) -> None:
    first = make_tiny_wheel(tmp_path / "a", "stable.cu13")
    make_tiny_wheel(tmp_path / "b", "stable.cu13", requires_python=">=3.10")
    with pytest.raises(
        wheelfile.WheelError, match=re.escape(f"two different files named '{first.name}'")
    ):
        index.build_index([tmp_path / "a", tmp_path / "b"], tmp_path / "site")


# VmHWM, not getrusage's ru_maxrss: Linux carries ru_maxrss over from the parent across
# fork and exec, so a pytest process that has imported torch would be measured instead.
_PEAK_RSS = """
import sys
from pathlib import Path
from scripts import index, wheelfile
index.build_index([Path(sys.argv[1])], Path(sys.argv[2]))
status = Path("/proc/self/status").read_text().splitlines()
print(next(int(line.split()[1]) for line in status if line.startswith("VmHWM:")) // 1024)
"""


def test_a_large_wheel_is_not_read_into_memory(tmp_path: Path) -> None:
    wheel = make_tiny_wheel(tmp_path / "w", "stable.cu13")
    size_mb = 160
    with zipfile.ZipFile(wheel, "a") as zf:
        info = zipfile.ZipInfo("hotloop/_C.abi3.so", (2026, 1, 1, 0, 0, 0))
        with zf.open(info, "w", force_zip64=True) as member:
            block = os.urandom(1 << 20)
            for _ in range(size_mb):
                member.write(block)
    proc = run([sys.executable, "-c", _PEAK_RSS, wheel.parent, tmp_path / "site"], cwd=REPO)
    peak_mb = int(proc.stdout.split()[-1])
    assert peak_mb < size_mb / 2, f"indexing a {size_mb} MB wheel took {peak_mb} MB"
    copied = tmp_path / "site" / "files" / wheel.name
    assert copied.read_bytes() == wheel.read_bytes()


# --------------------------------------------------------------------------- where it writes


def test_out_with_files_it_did_not_write_is_refused(tmp_path: Path, wheel_dir: Path) -> None:
    """A GitHub Pages folder with a CNAME, a README and docs: refused, nothing touched."""
    out = tmp_path / "site"
    index.build_index([wheel_dir], out)
    (out / "CNAME").write_text("wheels.example.org\n")
    (out / "README.md").write_text("keep me\n")
    (out / "docs").mkdir()
    (out / "docs" / "guide.md").write_text("keep me too\n")
    before = tree_bytes(out)
    with pytest.raises(index.IndexBuildError) as refused:
        index.build_index([wheel_dir], out)
    message = str(refused.value)
    assert "3 file(s) or folder(s) this tool did not write: CNAME, README.md, docs/" in message
    assert tree_bytes(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["site"]


def test_wheels_inside_out_are_never_deleted(tmp_path: Path, wheel_dir: Path) -> None:
    """``--wheels site/incoming --out site``: the incoming folder (and its notes) stay."""
    out = tmp_path / "site"
    index.build_index([wheel_dir], out)
    incoming = out / "incoming"
    shutil.copytree(wheel_dir, incoming)
    (incoming / "notes.txt").write_text("release notes\n")
    before = tree_bytes(out)
    assert index.main(["--wheels", str(incoming), "--out", str(out)]) == 1
    assert tree_bytes(out) == before


def test_a_folder_that_only_looks_like_an_index_is_refused(tmp_path: Path, wheel_dir: Path) -> None:
    """No manifest: the tool did not write it, even with a simple/index.html inside."""
    out = tmp_path / "site"
    (out / "simple").mkdir(parents=True)
    (out / "simple" / "index.html").write_text("someone else's index")
    with pytest.raises(index.IndexBuildError, match=r"did not write: simple/"):
        index.build_index([wheel_dir], out)
    assert (out / "simple" / "index.html").read_text() == "someone else's index"


def test_files_added_to_the_index_folders_are_refused(tmp_path: Path, wheel_dir: Path) -> None:
    out = tmp_path / "site"
    index.build_index([wheel_dir], out)
    (out / "files" / "extra.whl").write_text("uploaded by hand")
    with pytest.raises(index.IndexBuildError, match=r"did not write: files/extra\.whl"):
        index.build_index([wheel_dir], out)
    assert (out / "files" / "extra.whl").read_text() == "uploaded by hand"


def test_a_sibling_partial_folder_is_left_alone(tmp_path: Path, wheel_dir: Path) -> None:
    partial = tmp_path / "site.partial"
    partial.mkdir()
    (partial / "mine.txt").write_text("not the tool's")
    index.build_index([wheel_dir], tmp_path / "site")
    index.build_index([wheel_dir], tmp_path / "site")
    assert (partial / "mine.txt").read_text() == "not the tool's"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["site", "site.partial"]


def test_an_empty_out_folder_is_used(tmp_path: Path, wheel_dir: Path, site: Path) -> None:
    out = tmp_path / "site"
    out.mkdir()
    index.build_index([wheel_dir], out)
    assert tree_bytes(out) == tree_bytes(site)


@pytest.mark.parametrize("kind", ["file", "symlink-to-dir", "dangling-symlink"])
def test_out_that_is_a_file_or_a_symlink_is_a_clear_error(
    tmp_path: Path, wheel_dir: Path, kind: str, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "site"
    target = tmp_path / "real"
    if kind == "file":
        out.write_text("a file")
    else:
        if kind == "symlink-to-dir":
            target.mkdir()
        out.symlink_to(target)
    assert index.main(["--wheels", str(wheel_dir), "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("index: --out ")
    assert ("is a file" if kind == "file" else "is a symbolic link") in err
    assert "Traceback" not in err
    if kind == "file":
        assert out.read_text() == "a file"
    else:
        assert out.is_symlink()
        assert not target.exists() or not any(target.iterdir())


# --------------------------------------------------------------------------- atomic, one writer


def test_a_second_writer_is_refused(
    tmp_path: Path, wheel_dir: Path, site: Path, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "site"
    index.build_index([wheel_dir], out)
    fd = os.open(tmp_path, os.O_RDONLY)  # what a running build holds
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        assert index.main(["--wheels", str(wheel_dir), "--out", str(out)]) == 1
    finally:
        os.close(fd)
    assert "another python -m scripts.index is writing into" in capsys.readouterr().err
    assert tree_bytes(out) == tree_bytes(site)


def test_a_failed_build_leaves_the_previous_index(
    tmp_path: Path, wheel_dir: Path, site: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "site"
    index.build_index([wheel_dir], out)

    def disk_full(src: object, dst: Path) -> None:
        Path(dst).write_bytes(b"half")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(index.shutil, "copyfile", disk_full)
    with pytest.raises(OSError, match="No space left"):
        index.build_index([wheel_dir], out)
    assert tree_bytes(out) == tree_bytes(site)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["site"]  # no staging left behind


def test_replacing_without_an_atomic_exchange(
    tmp_path: Path, wheel_dir: Path, site: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where renameat2 is missing, two renames; nothing else changes."""
    out = tmp_path / "site"
    index.build_index([wheel_dir], out)
    monkeypatch.setattr(index, "_exchange", lambda a, b: False)
    index.build_index([wheel_dir], out)
    assert tree_bytes(out) == tree_bytes(site)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["site"]


def test_a_failed_swap_without_exchange_puts_the_old_index_back(
    tmp_path: Path, wheel_dir: Path, site: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "site"
    index.build_index([wheel_dir], out)
    monkeypatch.setattr(index, "_exchange", lambda a, b: False)
    rename = Path.rename

    def staging_cannot_move(self: Path, target: Path) -> Path:
        if self.name.endswith(".staging"):
            raise OSError(5, "Input/output error")
        return rename(self, target)

    monkeypatch.setattr(Path, "rename", staging_cannot_move)
    with pytest.raises(OSError, match="Input/output error"):
        index.build_index([wheel_dir], out)
    assert tree_bytes(out) == tree_bytes(site)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["site"]


def test_concurrent_runs_never_lose_the_index(tmp_path: Path, wheel_dir: Path, site: Path) -> None:
    out = tmp_path / "site"
    cmd = [sys.executable, "-m", "scripts.index", "--wheels", str(wheel_dir), "--out", str(out)]
    outcomes = set()
    for _ in range(5):
        procs = [
            subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            for _ in range(3)
        ]
        for proc in procs:
            _, err = proc.communicate(timeout=60)
            if proc.returncode == 0:
                outcomes.add("built")
            else:
                assert b"another python -m scripts.index is writing into" in err, err
                outcomes.add("refused")
        assert tree_bytes(out) == tree_bytes(site)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["site"]
    assert "built" in outcomes


# --------------------------------------------------------------------------- pip and uv over HTTP


@pytest.fixture(scope="module")
def uv(tmp_path_factory: pytest.TempPathFactory) -> str:
    return find_uv() or make_tool_venv(tmp_path_factory.mktemp("tools") / "venv")[1]


@pytest.fixture(scope="module")
def torch_venvs(tmp_path_factory: pytest.TempPathFactory, uv: str) -> dict[str, Path]:
    """One venv per torch release, made on first use and shared by the module's tests."""
    return LazyVenvs(tmp_path_factory, uv)


class LazyVenvs(dict):
    def __init__(self, factory: pytest.TempPathFactory, uv: str) -> None:
        super().__init__()
        self.factory, self.uv = factory, uv

    def __missing__(self, torch: str) -> Path:
        root = self.factory.mktemp(f"torch-{torch}") / "venv"
        self[torch] = python = make_torch_venv(root, self.uv, torch)
        return python


@pytest.fixture
def user(torch_venvs: dict[str, Path]):
    """``user(torch)``: the venv holding that torch, without hotloop after the test."""
    used: list[Path] = []

    def get(torch: str) -> Path:
        used.append(torch_venvs[torch])
        return used[-1]

    yield get
    for python in used:
        uninstall_hotloop(python)


@pytest.fixture(scope="module")
def served_site(site: Path, tmp_path_factory: pytest.TempPathFactory):
    log = tmp_path_factory.mktemp("logs") / "http.log"
    with static_server(site, log) as url:
        yield url, log


@pytest.fixture(scope="module")
def fake_pypi(tmp_path_factory: pytest.TempPathFactory):
    """A PyPI stand-in with torch releases a resolver could swap the user's torch for."""
    root = tmp_path_factory.mktemp("fake-pypi")
    wheels = [make_fake_torch_wheel(root / "dist", v) for v in ("2.8.0", "2.9.1", "2.16.0")]
    write_flat_index(root / "site", wheels)
    with static_server(root / "site", root / "http.log") as url:
        yield f"{url}/simple"


@pytest.fixture(scope="module")
def pypi_with_a_newer_hotloop(tmp_path_factory: pytest.TempPathFactory):
    """PyPI as it will be one day: a newer public hotloop (the CUDA 13 wheel, torch>=2.10, as
    scripts.pypi_release uploads it) beside torch releases."""
    root = tmp_path_factory.mktemp("newer-pypi")
    wheels = [make_fake_torch_wheel(root / "dist", v) for v in ("2.10.0", "2.16.0")]
    wheels.append(make_tiny_wheel(root / "dist", "", version="0.1.1", requires_torch="torch>=2.10"))
    write_flat_index(root / "site", wheels)
    with static_server(root / "site", root / "http.log") as url:
        yield f"{url}/simple"


def documented_commands(text: str, url: str, group: str) -> list[str]:
    """The install commands a page shows (indented blocks, ``\\`` continuations joined), with
    ``<index>`` and the base-URL placeholder at ``url`` and the CUDA page set to ``group``."""
    commands = []
    for block in re.findall(r"(?:^ {4,}\S.*\n?)+", text, flags=re.MULTILINE):
        joined = re.sub(r"\\\n\s*", "", block)
        for line in joined.splitlines():
            if "install hotloop" in line:
                line = line.strip().replace("<index>", url)
                commands.append(re.sub(r"/cu1[0-9]/simple/", f"/{group}/simple/", line))
    return commands


def landing_commands(site: Path, url: str, group: str) -> dict[str, str]:
    """The pip and uv commands the landing page shows for one CUDA group, for ``url``."""
    page = (site / "index.html").read_text()
    commands = {}
    for block in re.findall(r"<pre>(.*?)</pre>", page, flags=re.DOTALL):
        for command in html.unescape(block).split("<br>"):
            if f"/{group}/simple/" in command:
                installer = "pip" if command.startswith("python -m pip") else "uv"
                commands.setdefault(installer, command.replace(index.BASE_URL_PLACEHOLDER, url))
    assert set(commands) == {"pip", "uv"}, page
    return commands


def install_as_a_user(
    site: Path, url: str, group: str, installer: str, python: Path, uv: str, pypi: str
) -> subprocess.CompletedProcess[str]:
    """Run the landing page's command, PyPI replaced by the stand-in; torch must not change."""
    command = landing_commands(site, url, group)[installer]
    before = torch_state(python)
    proc = run_shell(command, python, uv, UV_DEFAULT_INDEX=pypi)
    assert torch_state(python) == before, f"{command}\n{proc.stdout}\n{proc.stderr}"
    return proc


INSTALLERS = ("pip", "uv")


@pytest.mark.slow
@pytest.mark.parametrize("installer", INSTALLERS)
@pytest.mark.parametrize(
    ("torch", "group", "variant"),
    [
        ("2.9.1", "cu12", "pt29cu128"),
        ("2.11.0", "cu13", "stable.cu13"),
        ("2.15.0", "cu13", "stable.cu13"),
    ],
)
def test_landing_page_command_fits_the_users_torch_and_keeps_it(
    site: Path, served_site, fake_pypi: str, user, uv: str,
    installer: str, torch: str, group: str, variant: str,
) -> None:  # fmt: skip
    python = user(torch)
    proc = install_as_a_user(site, served_site[0], group, installer, python, uv, fake_pypi)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert installed_hotloop(python) == f"0.1.0+{variant}"


@pytest.mark.slow
@pytest.mark.parametrize("installer", INSTALLERS)
def test_the_cuda_page_decides_what_metadata_cannot(
    site: Path, served_site, fake_pypi: str, user, uv: str, installer: str
) -> None:
    """torch 2.10.0 from PyPI is a CUDA 12.8 build. Both stable wheels say torch>=2.10, so the
    page of every variant gives it the higher label, stable.cu13, built for the other CUDA;
    the cu12 page gives stable.cu12 (and the cu13 page stable.cu13)."""
    python = user("2.10.0")
    torch_metadata = next(site_packages(python).glob("torch-*.dist-info")) / "METADATA"
    assert "Requires-Dist: nvidia-cuda-runtime-cu12==12.8" in torch_metadata.read_text()
    url = f"{served_site[0]}/simple/"
    if installer == "pip":
        pip_install(python, "--index-url", url)
    else:
        uv_pip_install(uv, python, "--index-url", url)
    assert installed_hotloop(python) == "0.1.0+stable.cu13"
    uninstall_hotloop(python)
    for group in ("cu12", "cu13"):
        proc = install_as_a_user(site, served_site[0], group, installer, python, uv, fake_pypi)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert installed_hotloop(python) == f"0.1.0+stable.{group}"
        uninstall_hotloop(python)


def every_cuda12_command(site: Path, url: str) -> list[str]:
    """What a CUDA 12 user may follow: the landing page's cu12 commands, its stable.cu12
    per-variant and find-links commands, and the README's and docs/installing.md's."""
    page = html.unescape((site / "index.html").read_text())
    commands = [
        *landing_commands(site, url, "cu12").values(),
        *(
            c.replace(index.BASE_URL_PLACEHOLDER, url)
            for c in re.findall(r"[^>\n]*install hotloop[^<\n]*", page)
            if "/stable.cu12/" in c
        ),
    ]
    for doc in (REPO / "README.md", REPO / "docs" / "installing.md"):
        found = documented_commands(doc.read_text(), url, "cu12")
        assert found, f"no install command in {doc}"
        commands += found
    return commands


@pytest.mark.slow
def test_a_newer_hotloop_on_pypi_never_replaces_the_cuda12_wheel(
    site: Path, served_site, pypi_with_a_newer_hotloop: str, user, uv: str
) -> None:
    """torch 2.10.0 is PyPI's CUDA 12.8 build. Once PyPI holds a newer public hotloop (a CUDA 13
    wheel), every documented command must still give the CUDA 12 wheel: pip takes the highest
    version across all its indexes, so hotloop's pages must be the only index it reads."""
    python = user("2.10.0")
    commands = every_cuda12_command(site, served_site[0])
    assert len(commands) >= 6, commands
    for command in commands:
        command = re.sub(r"https://pypi\.org/simple/?", pypi_with_a_newer_hotloop + "/", command)
        before = torch_state(python)
        # Where a command names no index, pip's and uv's default one is the stand-in PyPI.
        proc = run_shell(
            command, python, uv, PIP_INDEX_URL=pypi_with_a_newer_hotloop,
            UV_DEFAULT_INDEX=pypi_with_a_newer_hotloop,
        )  # fmt: skip
        assert proc.returncode == 0, f"{command}\n{proc.stdout}\n{proc.stderr}"
        assert installed_hotloop(python) == "0.1.0+stable.cu12", command
        assert torch_state(python) == before, command
        uninstall_hotloop(python)


@pytest.mark.slow
@pytest.mark.parametrize("installer", INSTALLERS)
def test_plain_install_from_every_variant_keeps_a_new_torch(
    served_site, fake_pypi: str, user, uv: str, installer: str
) -> None:
    """No torch pin, PyPI next to the index: the stable wheel sorts first (PEP 440 local
    labels), so torch 2.15 is never traded for the torch 2.9 or 2.8 of a pinned wheel."""
    python = user("2.15.0")
    before = torch_state(python)
    url = f"{served_site[0]}/simple/"
    if installer == "pip":
        proc = pip_install(python, "--index-url", url, "--extra-index-url", fake_pypi)
    else:
        proc = uv_pip_install(uv, python, "--index", url, "--default-index", fake_pypi)
    assert torch_state(python) == before, proc.stdout + proc.stderr
    assert installed_hotloop(python) == "0.1.0+stable.cu13"


@pytest.mark.slow
def test_without_the_pin_pip_would_replace_an_old_torch(served_site, fake_pypi: str, user) -> None:
    """Why the commands pin torch: for a torch 2.9 user the newest hotloop wants torch>=2.10,
    and pip would rather upgrade torch from PyPI than take the older pinned wheel."""
    python = user("2.9.1")
    proc = pip_install(
        python, "--dry-run", "--index-url", f"{served_site[0]}/simple/",
        "--extra-index-url", fake_pypi,
    )  # fmt: skip
    assert "Would install hotloop-0.1.0+stable.cu13 torch-2.16.0" in proc.stdout


@pytest.fixture(scope="module")
def site_without_a_fit(tmp_path_factory: pytest.TempPathFactory):
    """An index with the stable wheels and the torch 2.9 one, nothing for torch 2.8."""
    root = tmp_path_factory.mktemp("no-fit")
    wheels = make_variant_wheels(root / "wheels", ("pt29cu128", "stable.cu12", "stable.cu13"))
    index.build_index([wheels[0].parent], root / "site")
    with static_server(root / "site", root / "http.log") as url:
        yield root / "site", url


@pytest.mark.slow
@pytest.mark.parametrize(
    ("installer", "message"),
    [
        ("pip", "and torch==2.8.0 because these package versions have conflicting dependencies"),
        ("uv", "No solution found when resolving dependencies"),
    ],
)
def test_no_fitting_wheel_fails_and_keeps_torch(
    site_without_a_fit, fake_pypi: str, user, uv: str, installer: str, message: str
) -> None:
    site, url = site_without_a_fit
    python = user("2.8.0")
    proc = install_as_a_user(site, url, "cu12", installer, python, uv, fake_pypi)
    assert proc.returncode != 0
    assert message in proc.stdout + proc.stderr
    assert "torch==2.8.0" in proc.stdout + proc.stderr
    assert run([python, "-c", "import hotloop"], check=False).returncode != 0


def test_pip_reads_metadata_files_not_wheels(served_site, user) -> None:
    url, log = served_site
    python = user(TORCH_INSTALLED)
    pip_install(python, "--index-url", f"{url}/cu13/simple/")
    assert installed_hotloop(python) == f"0.1.0+{TORCH_VARIANT}"
    # PEP 658: pip learns each candidate's pins from .metadata and downloads one wheel.
    assert ".whl.metadata HTTP" in log.read_text()


def test_pip_with_the_per_variant_index(served_site, user) -> None:
    url, _ = served_site
    python = user(TORCH_INSTALLED)
    wrong = pip_install(python, "--index-url", f"{url}/pt29cu128/simple/", check=False)
    assert wrong.returncode != 0
    assert "torch==2.9" in wrong.stdout + wrong.stderr
    pip_install(python, "--index-url", f"{url}/{TORCH_VARIANT}/simple/")
    assert installed_hotloop(python) == f"0.1.0+{TORCH_VARIANT}"


def test_pip_with_the_find_links_page(served_site, user) -> None:
    url, _ = served_site
    python = user(TORCH_INSTALLED)
    pip_install(python, "--no-index", "-f", f"{url}/{TORCH_VARIANT}/")
    assert installed_hotloop(python) == f"0.1.0+{TORCH_VARIANT}"


def test_pip_refuses_a_wheel_changed_after_indexing(tmp_path: Path, site: Path, user) -> None:
    python = user(TORCH_INSTALLED)
    tampered = tmp_path / "tampered"
    shutil.copytree(site, tampered)
    wheel = next((tampered / "files").glob(f"*{TORCH_VARIANT}*.whl"))
    with zipfile.ZipFile(wheel, "a") as zf:  # still a valid wheel, other bytes
        zf.writestr("hotloop/injected.py", "print('not what was indexed')\n")
    with static_server(tampered, tmp_path / "http.log") as url:
        proc = pip_install(python, "--index-url", f"{url}/cu13/simple/", check=False)
    assert proc.returncode != 0
    assert "DO NOT MATCH THE HASHES" in proc.stderr + proc.stdout
    assert run([python, "-c", "import hotloop"], check=False).returncode != 0
