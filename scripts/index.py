"""Build a static package index (PEP 503) from a folder of wheels.

``python -m scripts.index --wheels wheelhouse --out site [--base-url URL]`` writes::

    site/index.html                           landing page: variants and their install commands
    site/files/<wheel>.whl                    every wheel, copied once
    site/files/<wheel>.whl.metadata           its METADATA (PEP 658 / PEP 714)
    site/simple/index.html                    PEP 503 root: every project
    site/simple/hotloop/index.html            every variant; pip and uv pick by the torch pin
    site/<variant>/simple/hotloop/index.html  one variant (PyTorch's ``whl/cu130`` style)
    site/<variant>/index.html                 find-links page of one variant (PyG style)

``<variant>`` is the wheel's local version label (``pt211cu130``), so the folder name and the
``+pt211cu130`` in the file name are the same string. Links are relative, so the tree works
from any host and path (GitHub Pages, ``python -m http.server``, a bucket). Each link carries
``#sha256=``, ``data-requires-python`` and ``data-core-metadata`` /
``data-dist-info-metadata`` (the PEP 714 name and the PEP 658 one older pips read).

The same wheels always give byte-identical files: everything is sorted, nothing records a
time or a path outside the tree. Only the standard library is used, so any Python >= 3.9 can
build the site from CI artifacts.
"""

from __future__ import annotations

import argparse
import hashlib
import html
import re
import shutil
import sys
import zipfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from email.parser import BytesHeaderParser
from pathlib import Path
from urllib.parse import quote

from scripts.audit import wheel_name_parts

FILES_DIR = "files"
# PEP 629: the simple API version these pages follow.
REPOSITORY_VERSION = "1.0"
BASE_URL_PLACEHOLDER = "https://INDEX-URL"
_TORCH_PIN = re.compile(r"^torch\s*==\s*(\d+\.\d+)\.\*\s*$")
_CUDA_LABEL = re.compile(r"cu(\d+)(\d)$")


class IndexBuildError(RuntimeError):
    """A wheel the index cannot hold (bad name, no METADATA, two files with one name)."""


@dataclass(frozen=True)
class IndexedWheel:
    filename: str
    project: str  # PEP 503 normalised
    version: str
    variant: str  # local version label, e.g. "pt211cu130"
    sha256: str
    metadata: bytes  # the wheel's .dist-info/METADATA, byte for byte
    metadata_sha256: str
    requires_python: str | None
    requires_torch: str | None  # "2.11" from "torch==2.11.*"
    source: Path


def normalize(name: str) -> str:
    """PEP 503 normalised project name: runs of ``-_.`` become ``-``, lower case."""
    return re.sub(r"[-_.]+", "-", name).lower()


def sha256_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def read_wheel_metadata(path: Path) -> bytes:
    """The raw bytes of the wheel's one top-level ``*.dist-info/METADATA``."""
    with zipfile.ZipFile(path) as zf:
        names = [
            n
            for n in zf.namelist()
            if n.count("/") == 1
            and n.endswith("/METADATA")
            and n.split("/")[0].endswith(".dist-info")
        ]
        if len(names) != 1:
            raise IndexBuildError(f"{path.name}: expected one .dist-info/METADATA, found {names}")
        return zf.read(names[0])


def describe_wheel(path: Path) -> IndexedWheel:
    parts = wheel_name_parts(path.name)
    version = parts["version"]
    if "+" not in version:
        raise IndexBuildError(
            f"{path.name}: version {version!r} has no local label; every wheel in this index "
            "carries its variant (e.g. 0.1.0+pt211cu130)"
        )
    data = path.read_bytes()
    metadata = read_wheel_metadata(path)
    headers = BytesHeaderParser().parsebytes(metadata)
    if normalize(headers.get("Name", "")) != normalize(parts["name"]):
        raise IndexBuildError(f"{path.name}: METADATA names {headers.get('Name')!r}")
    if headers.get("Version") != version:
        raise IndexBuildError(f"{path.name}: METADATA has version {headers.get('Version')!r}")
    torch_pins = [
        m.group(1)
        for r in headers.get_all("Requires-Dist") or []
        if (m := _TORCH_PIN.match(r.split(";")[0]))
    ]
    return IndexedWheel(
        filename=path.name,
        project=normalize(parts["name"]),
        version=version,
        variant=version.split("+", 1)[1],
        sha256=sha256_of(data),
        metadata=metadata,
        metadata_sha256=sha256_of(metadata),
        requires_python=headers.get("Requires-Python"),
        requires_torch=torch_pins[0] if len(torch_pins) == 1 else None,
        source=path,
    )


def find_wheels(sources: Iterable[Path]) -> list[Path]:
    """Wheel files under each source (a folder, searched recursively, or a file), by name.

    CI artifacts arrive one folder per matrix cell; the same file in two of them is kept
    once, two different files with one name are an error.
    """
    by_name: dict[str, Path] = {}
    for source in sources:
        found = [source] if source.is_file() else sorted(source.rglob("*.whl"))
        for path in found:
            seen = by_name.get(path.name)
            if seen is not None and seen.read_bytes() != path.read_bytes():
                raise IndexBuildError(f"two different files named {path.name}: {seen} and {path}")
            by_name.setdefault(path.name, path)
    return [by_name[name] for name in sorted(by_name)]


# --------------------------------------------------------------------------- pages


def _page(title: str, body_lines: Iterable[str], *, simple: bool = True) -> str:
    head = ["<!DOCTYPE html>", "<html>", "  <head>", '    <meta charset="utf-8">']
    if simple:
        head.append(f'    <meta name="pypi:repository-version" content="{REPOSITORY_VERSION}">')
    head += [f"    <title>{html.escape(title)}</title>", "  </head>", "  <body>"]
    return "\n".join([*head, *(f"    {line}" for line in body_lines), "  </body>", "</html>", ""])


def file_link(wheel: IndexedWheel, href_prefix: str) -> str:
    """One anchor: ``#sha256=``, requires-python and the PEP 658/714 metadata hash."""
    # "+" percent-encoded as PyTorch's index does: some static hosts (S3) read a raw "+" as a space.
    href = href_prefix + quote(wheel.filename)
    attrs = [f'href="{html.escape(href)}#sha256={wheel.sha256}"']
    if wheel.requires_python:
        attrs.append(f'data-requires-python="{html.escape(wheel.requires_python)}"')
    attrs.append(f'data-dist-info-metadata="sha256={wheel.metadata_sha256}"')
    attrs.append(f'data-core-metadata="sha256={wheel.metadata_sha256}"')
    return f"<a {' '.join(attrs)}>{html.escape(wheel.filename)}</a><br>"


def simple_root(projects: Iterable[str]) -> str:
    return _page("Simple index", (f'<a href="{p}/">{p}</a><br>' for p in sorted(set(projects))))


def project_page(project: str, wheels: Sequence[IndexedWheel], href_prefix: str) -> str:
    return _page(f"Links for {project}", (file_link(w, href_prefix) for w in wheels))


def cuda_of(variant: str) -> str | None:
    """``"13.0"`` from ``pt211cu130``; ``None`` for CPU variants."""
    match = _CUDA_LABEL.search(variant)
    return f"{match.group(1)}.{match.group(2)}" if match else None


def install_commands(base_url: str, variant: str) -> list[str]:
    return [
        f"pip install hotloop --index-url {base_url}/{variant}/simple/ "
        "--extra-index-url https://pypi.org/simple/",
        f"pip install hotloop -f {base_url}/{variant}/",
    ]


def landing_page(wheels: Sequence[IndexedWheel], base_url: str | None) -> str:
    base = base_url.rstrip("/") if base_url else BASE_URL_PLACEHOLDER
    lines = [
        "<h1>hotloop wheels</h1>",
        "<p>One wheel per torch minor version. With torch already installed, pip and uv pick "
        "the matching wheel from the index that holds every variant:</p>",
        f"<pre>pip install hotloop --index-url {html.escape(base)}/simple/ "
        "--extra-index-url https://pypi.org/simple/</pre>",
    ]
    if base_url is None:
        lines.append(f"<p>{BASE_URL_PLACEHOLDER} stands for the address of this page.</p>")
    lines += [
        '<p><a href="simple/">simple/</a>: every variant (PEP 503, with PEP 658 metadata).</p>',
        "<table>",
        "<tr><th>variant</th><th>torch</th><th>CUDA</th><th>files</th><th>install</th></tr>",
    ]
    for variant, group in _by_variant(wheels).items():
        torch_minors = sorted({w.requires_torch or "?" for w in group})
        commands = "<br>".join(html.escape(c) for c in install_commands(base, variant))
        lines.append(
            f'<tr><td><a href="{variant}/">{variant}</a></td>'
            f"<td>{html.escape(', '.join(torch_minors))}</td>"
            f"<td>{cuda_of(variant) or 'CPU'}</td>"
            f'<td><a href="{variant}/simple/">{variant}/simple/</a></td>'
            f"<td><code>{commands}</code></td></tr>"
        )
    lines.append("</table>")
    return _page("hotloop wheels", lines, simple=False)


def _by_variant(wheels: Iterable[IndexedWheel]) -> dict[str, list[IndexedWheel]]:
    groups: dict[str, list[IndexedWheel]] = {}
    for wheel in sorted(wheels, key=lambda w: (w.variant, w.filename)):
        groups.setdefault(wheel.variant, []).append(wheel)
    return groups


def _by_project(wheels: Iterable[IndexedWheel]) -> dict[str, list[IndexedWheel]]:
    groups: dict[str, list[IndexedWheel]] = {}
    for wheel in sorted(wheels, key=lambda w: (w.project, w.filename)):
        groups.setdefault(wheel.project, []).append(wheel)
    return groups


def render_tree(wheels: Sequence[IndexedWheel], base_url: str | None = None) -> dict[str, bytes]:
    """Every file of the site except the wheels themselves: relative path -> bytes."""
    files: dict[str, bytes] = {
        ".nojekyll": b"",
        "index.html": landing_page(wheels, base_url).encode(),
    }
    for wheel in wheels:
        files[f"{FILES_DIR}/{wheel.filename}.metadata"] = wheel.metadata

    def add_simple(prefix: str, subset: Sequence[IndexedWheel], depth: int) -> None:
        projects = _by_project(subset)
        files[f"{prefix}simple/index.html"] = simple_root(projects).encode()
        up = "../" * (depth + 2)
        for project, group in projects.items():
            page = project_page(project, group, f"{up}{FILES_DIR}/")
            files[f"{prefix}simple/{project}/index.html"] = page.encode()

    add_simple("", wheels, 0)
    for variant, group in _by_variant(wheels).items():
        add_simple(f"{variant}/", group, 1)
        links = _page(
            f"hotloop {variant} wheels",
            (file_link(w, f"../{FILES_DIR}/") for w in group),
            simple=False,
        )
        files[f"{variant}/index.html"] = links.encode()
    return dict(sorted(files.items()))


def _looks_like_index(out: Path) -> bool:
    return not out.exists() or not any(out.iterdir()) or (out / "simple" / "index.html").is_file()


def build_index(
    sources: Sequence[Path], out: Path, base_url: str | None = None
) -> list[IndexedWheel]:
    """Write the site for the wheels under ``sources`` into ``out`` (replaced as a whole)."""
    paths = find_wheels(sources)
    if not paths:
        raise IndexBuildError(f"no wheels under {', '.join(map(str, sources))}")
    wheels = [describe_wheel(p) for p in paths]
    if not _looks_like_index(out):
        raise IndexBuildError(
            f"{out} holds files that are not an index built here; pick an empty folder"
        )
    staging = out.with_name(out.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    for relative, data in render_tree(wheels, base_url).items():
        target = staging / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    for wheel in wheels:
        shutil.copyfile(wheel.source, staging / FILES_DIR / wheel.filename)
    shutil.rmtree(out, ignore_errors=True)
    staging.rename(out)
    return wheels


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m scripts.index", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--wheels",
        type=Path,
        action="append",
        required=True,
        help="folder (searched recursively) or wheel file; repeat for several",
    )
    parser.add_argument("--out", type=Path, required=True, help="site folder (replaced)")
    parser.add_argument(
        "--base-url",
        help="where the site will be served, for the install commands on the landing page",
    )
    args = parser.parse_args(argv)
    try:
        wheels = build_index(args.wheels, args.out, args.base_url)
    except (IndexBuildError, ValueError, zipfile.BadZipFile) as exc:
        print(f"index: {exc}", file=sys.stderr)
        return 1
    for variant, group in _by_variant(wheels).items():
        print(f"{variant}: {', '.join(w.filename for w in group)}")
    print(f"index: {len(wheels)} wheel(s) -> {args.out}/ (simple/, <variant>/simple/, <variant>/)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
