"""Build a static package index (PEP 503) from a folder of wheels.

``python -m scripts.index --wheels wheelhouse --out site [--base-url URL]`` writes::

    site/index.html                           landing page: install commands that keep torch
    site/files/<wheel>.whl                    every wheel, copied once
    site/files/<wheel>.whl.metadata           its METADATA (PEP 658 / PEP 714)
    site/simple/<name>/index.html             every variant; pip and uv pick by the torch pin
    site/cu13/simple/<name>/index.html        the wheels for one CUDA major (``cu12``, ``cpu``)
    site/<variant>/simple/<name>/index.html   one variant (PyTorch's ``whl/cu130`` style)
    site/<variant>/index.html                 find-links page of one variant (PyG style)
    site/<MANIFEST>                           the list of files above (what a rebuild replaces)

``<variant>`` is the wheel's local version label (``stable.cu13``, ``pt29cu128``), so the folder
name and the ``+stable.cu13`` in the file name are the same string. The per-CUDA pages exist
because metadata cannot tell a CUDA 12 torch from a CUDA 13 one: both stable wheels say
``torch>=2.10``. Links are relative, so the tree works from any host and path. Each link
carries ``#sha256=``, ``data-requires-python`` and ``data-core-metadata`` /
``data-dist-info-metadata`` (the PEP 714 name and the PEP 658 one older pips read).

Every name that becomes a path is checked first (``scripts/wheelfile.py``: the file name, the
label against the variant grammar, the label's torch pin against the wheel's METADATA), and
everything that reaches HTML is escaped as well.

``--out`` is replaced as a whole and atomically (built in a unique staging folder, then
swapped in with one rename), and only when it is missing, empty or an index this tool wrote:
files it did not write (a ``CNAME``, a ``README.md``, a wheel folder) are never deleted; the
tool refuses and names them. A second run writing next to the same ``--out`` is refused while
the first holds the lock.

The same wheels always give byte-identical files: everything is sorted, nothing records a
time or a path outside the tree. Only the standard library is used, so any Python >= 3.9 on
Linux can build the site from CI artifacts.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import errno
import fcntl
import html
import os
import re
import secrets
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path, PurePosixPath
from urllib.parse import quote

from scripts.names import marker
from scripts.project import ProjectTableError, load_project
from scripts.wheelfile import (
    WheelError,
    WheelInfo,
    describe_wheel,
    find_wheels,
)

FILES_DIR = "files"
MANIFEST = marker("index")
# PEP 629: the simple API version these pages follow.
REPOSITORY_VERSION = "1.0"
BASE_URL_PLACEHOLDER = "https://INDEX-URL"
# The torch the user has, as a requirement: with it pip and uv must choose a wheel that
# fits that torch instead of replacing torch to fit the newest release (xformers#1052). The
# version comes from the installed metadata (no torch import) and keeps a local label
# (``2.11.0+cu130``), so it matches exactly the build installed.
KEEP_TORCH = (
    '"torch==$(python -c \'from importlib.metadata import version; print(version("torch"))\')"'
)
SHOW_TORCH_CUDA = "python -c 'import torch; print(torch.__version__, torch.version.cuda)'"

# Where the site will be served: shown in shell commands and HTML, so nothing a shell or a
# browser would read as syntax.
_BASE_URL = re.compile(r"https?://[A-Za-z0-9.-]+(?::[0-9]+)?(?:/[A-Za-z0-9._~%/-]*)?")


class IndexBuildError(WheelError):
    """A wheel the index cannot hold, or an ``--out`` it must not write to."""


# --------------------------------------------------------------------------- pages


def cuda_group(wheel: WheelInfo) -> str:
    """The per-CUDA page that lists a wheel: ``cu13``, ``cu12`` or ``cpu``."""
    assert wheel.variant is not None
    major = wheel.variant.cuda_major
    return f"cu{major}" if major else "cpu"


def _e(text: str) -> str:
    return html.escape(text, quote=True)


def _page(title: str, body_lines: Iterable[str], *, simple: bool = True) -> str:
    head = ["<!DOCTYPE html>", "<html>", "  <head>", '    <meta charset="utf-8">']
    if simple:
        head.append(f'    <meta name="pypi:repository-version" content="{REPOSITORY_VERSION}">')
    head += [f"    <title>{_e(title)}</title>", "  </head>", "  <body>"]
    return "\n".join([*head, *(f"    {line}" for line in body_lines), "  </body>", "</html>", ""])


def file_link(wheel: WheelInfo, href_prefix: str) -> str:
    """One anchor: ``#sha256=``, requires-python and the PEP 658/714 metadata hash."""
    # "+" percent-encoded as PyTorch's index does: some static hosts (S3) read a raw "+" as a space.
    href = href_prefix + quote(wheel.filename)
    attrs = [f'href="{_e(href)}#sha256={wheel.sha256}"']
    if wheel.requires_python:
        attrs.append(f'data-requires-python="{_e(wheel.requires_python)}"')
    attrs.append(f'data-dist-info-metadata="sha256={wheel.metadata_sha256}"')
    attrs.append(f'data-core-metadata="sha256={wheel.metadata_sha256}"')
    return f"<a {' '.join(attrs)}>{_e(wheel.filename)}</a><br>"


def simple_root(projects: Iterable[str]) -> str:
    links = (f'<a href="{_e(quote(p))}/">{_e(p)}</a><br>' for p in sorted(set(projects)))
    return _page("Simple index", links)


def project_page(project: str, wheels: Sequence[WheelInfo], href_prefix: str) -> str:
    return _page(f"Links for {project}", (file_link(w, href_prefix) for w in wheels))


def names_of(wheels: Iterable[WheelInfo]) -> str:
    """The project(s) the wheels are of, as the pages name them: ``mypkg``."""
    return " ".join(sorted({w.project for w in wheels}))


# The commands read these pages and nothing else. pip takes the highest version across all
# the indexes it reads: with PyPI beside them, a newer public release there (a CUDA 13
# wheel) would beat the CUDA 12 wheel of these pages. Nothing else is needed from an index:
# the project's one dependency is torch, and the installed torch satisfies the pin on it.
def pip_command(index_url: str, name: str) -> str:
    return f"python -m pip install {name} {KEEP_TORCH} --index-url {index_url}"


def uv_command(index_url: str, name: str) -> str:
    # --default-index, not --index: PyPI stays out whatever index strategy a user's uv.toml
    # sets, and the option beats a UV_DEFAULT_INDEX in the environment (--index-url does not).
    return f"uv pip install {name} {KEEP_TORCH} --default-index {index_url}"


def find_links_command(page_url: str, name: str) -> str:
    return f"python -m pip install {name} {KEEP_TORCH} --no-index -f {page_url}"


_GROUP_TITLES = {
    "cu13": "CUDA 13 torch (PyPI's default for torch 2.11 and later)",
    "cu12": "CUDA 12 torch (PyPI's default for torch 2.8 to 2.10, or a +cu12x build)",
    "cpu": "CPU-only torch",
}


def _group_title(group: str) -> str:
    return _GROUP_TITLES.get(group, f"CUDA {group[2:]} torch")


# Next to each wheel: the CycloneDX SBOM it carries (PEP 770), for reading without unzipping.
SBOM_SUFFIX = ".cdx.json"
# `sha256sum -c SHA256SUMS` from the site's root checks every wheel.
CHECKSUMS = "SHA256SUMS"


def checksums(wheels: Sequence[WheelInfo]) -> bytes:
    lines = [
        f"{w.sha256}  {FILES_DIR}/{w.filename}" for w in sorted(wheels, key=lambda w: w.filename)
    ]
    return ("\n".join(lines) + "\n").encode()


def files_table(wheels: Sequence[WheelInfo]) -> list[str]:
    rows = ["<table>", "<tr><th>wheel</th><th>sha256</th><th>SBOM</th></tr>"]
    for w in sorted(wheels, key=lambda w: w.filename):
        has_sbom = w.sbom is not None
        link = f"{FILES_DIR}/{quote(w.filename)}"
        sbom_cell = f'<a href="{_e(link)}{SBOM_SUFFIX}">CycloneDX</a>' if has_sbom else "none"
        rows.append(
            f'<tr><td><a href="{_e(link)}">{_e(w.filename)}</a></td>'
            f"<td><code>{_e(w.sha256)}</code></td><td>{sbom_cell}</td></tr>"
        )
    rows.append("</table>")
    return rows


def landing_page(wheels: Sequence[WheelInfo], base_url: str | None) -> str:
    base = base_url.rstrip("/") if base_url else BASE_URL_PLACEHOLDER
    name = names_of(wheels)
    lines = [
        f"<h1>{_e(name)} wheels</h1>",
        f"<p>Install {_e(name)} next to the torch you have. The commands pin torch to the "
        f"installed version, so pip and uv pick the {_e(name)} wheel that fits it and never "
        "replace torch; "
        "when none fits, they stop with a message. Which CUDA your torch is built for: "
        f"<code>{_e(SHOW_TORCH_CUDA)}</code></p>",
    ]
    if base_url is None:
        lines.append(f"<p>{BASE_URL_PLACEHOLDER} stands for the address of this page.</p>")
    lines += ["<table>", "<tr><th>your torch</th><th>index</th><th>install</th></tr>"]
    for cuda_group in _by_cuda_group(wheels):
        url = f"{base}/{cuda_group}/simple/"
        commands = [pip_command(url, name), uv_command(url, name)]
        lines.append(
            f"<tr><td>{_e(_group_title(cuda_group))}</td>"
            f'<td><a href="{_e(cuda_group)}/simple/">{_e(cuda_group)}/simple/</a></td>'
            f"<td><pre>{'<br>'.join(_e(c) for c in commands)}</pre></td></tr>"
        )
    lines += [
        "</table>",
        '<p><a href="simple/">simple/</a>: every variant (PEP 503, with PEP 658 metadata); '
        "pip and uv choose by the torch requirement, but cannot tell a CUDA 12 torch from a "
        "CUDA 13 one: use the pages above.</p>",
        "<table>",
        "<tr><th>variant</th><th>requires</th><th>CUDA</th><th>index</th><th>install</th></tr>",
    ]
    for label, group in _by_label(wheels).items():
        variant = group[0].variant
        assert variant is not None
        commands = [
            pip_command(f"{base}/{label}/simple/", name),
            find_links_command(f"{base}/{label}/", name),
        ]
        lines.append(
            f'<tr><td><a href="{_e(label)}/">{_e(label)}</a></td>'
            f"<td>{_e(variant.requires_torch)}</td>"
            f"<td>{_e(variant.cuda or 'CPU')}</td>"
            f'<td><a href="{_e(label)}/simple/">{_e(label)}/simple/</a></td>'
            f"<td><pre>{'<br>'.join(_e(c) for c in commands)}</pre></td></tr>"
        )
    lines.append("</table>")
    lines.append(
        f'<p>Every wheel, its sha256 (all in <a href="{CHECKSUMS}">{CHECKSUMS}</a>, for '
        f"<code>sha256sum -c {CHECKSUMS}</code>) and the CycloneDX SBOM it carries:</p>"
    )
    lines += files_table(wheels)
    return _page(f"{name} wheels", lines, simple=False)


def _grouped(
    wheels: Iterable[WheelInfo], key: Callable[[WheelInfo], str]
) -> dict[str, list[WheelInfo]]:
    groups: dict[str, list[WheelInfo]] = {}
    for wheel in sorted(wheels, key=lambda w: (key(w), w.filename)):
        groups.setdefault(key(wheel), []).append(wheel)
    return groups


def _by_label(wheels: Iterable[WheelInfo]) -> dict[str, list[WheelInfo]]:
    return _grouped(wheels, lambda w: w.label)


def _by_cuda_group(wheels: Iterable[WheelInfo]) -> dict[str, list[WheelInfo]]:
    return _grouped(wheels, lambda w: cuda_group(w))


def _by_project(wheels: Iterable[WheelInfo]) -> dict[str, list[WheelInfo]]:
    return _grouped(wheels, lambda w: w.project)


def render_tree(wheels: Sequence[WheelInfo], base_url: str | None = None) -> dict[str, bytes]:
    """Every file of the site except the wheels themselves: relative path -> bytes."""
    files: dict[str, bytes] = {
        ".nojekyll": b"",
        "index.html": landing_page(wheels, base_url).encode(),
    }
    for wheel in wheels:
        files[f"{FILES_DIR}/{wheel.filename}.metadata"] = wheel.metadata
        if wheel.sbom is not None:
            files[f"{FILES_DIR}/{wheel.filename}{SBOM_SUFFIX}"] = wheel.sbom
    files[CHECKSUMS] = checksums(wheels)

    def add_simple(prefix: str, subset: Sequence[WheelInfo], depth: int) -> None:
        projects = _by_project(subset)
        files[f"{prefix}simple/index.html"] = simple_root(projects).encode()
        up = "../" * (depth + 2)
        for project, group in projects.items():
            page = project_page(project, group, f"{up}{FILES_DIR}/")
            files[f"{prefix}simple/{project}/index.html"] = page.encode()

    def add_find_links(folder: str, subset: Sequence[WheelInfo]) -> None:
        links = (file_link(w, f"../{FILES_DIR}/") for w in subset)
        files[f"{folder}/index.html"] = _page(
            f"{names_of(subset)} {folder} wheels", links, simple=False
        ).encode()

    add_simple("", wheels, 0)
    for groups in (_by_cuda_group(wheels), _by_label(wheels)):
        for folder, group in groups.items():
            add_simple(f"{folder}/", group, 1)
            add_find_links(folder, group)
    return dict(sorted(files.items()))


# --------------------------------------------------------------------------- writing --out


def _manifest_text(paths: Iterable[str]) -> bytes:
    header = "# files written by python -m scripts.index; a rebuild replaces exactly these"
    return ("\n".join([header, *sorted(paths)]) + "\n").encode()


def _read_manifest(out: Path) -> set[str]:
    text = (out / MANIFEST).read_text(encoding="utf-8")
    return {line for line in text.splitlines() if line and not line.startswith("#")}


def check_out(out: Path) -> Path:
    """``--out`` as an absolute path; IndexBuildError for a symlink or a file."""
    if out.is_symlink():
        raise IndexBuildError(
            f"--out {out} is a symbolic link (to {os.readlink(out)}); give the real folder: "
            "the index is replaced as a whole and a link would be replaced, not its target"
        )
    if out.exists() and not out.is_dir():
        raise IndexBuildError(f"--out {out} is a file, not a folder; pick a folder for the site")
    return out.absolute()


def owned_files(out: Path) -> set[str]:
    """The files of an existing ``--out`` that a rebuild may replace.

    Empty for a missing or empty folder; the files of an index this tool wrote (found in the
    tree and listed in its manifest); IndexBuildError naming everything else, which is never
    touched.
    """
    if not out.exists():
        return set()
    listed = _read_manifest(out) if (out / MANIFEST).is_file() else set()
    listed_dirs = {str(parent) for path in listed for parent in PurePosixPath(path).parents}
    owned, foreign = set(), []
    for root, dirs, names in os.walk(out):
        relative_root = PurePosixPath(Path(root).relative_to(out).as_posix())
        for name in list(dirs):
            path = str(relative_root / name)
            if (Path(root) / name).is_symlink() or path not in listed_dirs:
                foreign.append(f"{path}/")
                dirs.remove(name)
        for name in names:
            path = str(relative_root / name)
            if path == MANIFEST or (path in listed and not (Path(root) / name).is_symlink()):
                owned.add(path)
            else:
                foreign.append(path)
    if foreign:
        shown = ", ".join(sorted(foreign)[:10]) + (" ..." if len(foreign) > 10 else "")
        raise IndexBuildError(
            f"--out {out} holds {len(foreign)} file(s) or folder(s) this tool did not write: "
            f"{shown}. It replaces --out as a whole and never deletes what it did not write: "
            "move them elsewhere or pick an empty or new folder for --out"
        )
    return owned


@contextlib.contextmanager
def writer_lock(folder: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``folder`` (the parent of ``--out``) or refuse at once."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise IndexBuildError(
                f"another python -m scripts.index is writing into {folder} right now; "
                "wait for it to finish (or give this run another --out folder)"
            ) from None
        yield
    finally:
        os.close(fd)  # releases the lock


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths in one step (Linux ``renameat2(RENAME_EXCHANGE)``); False where the
    system or file system cannot."""
    renameat2 = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if renameat2 is None:
        return False
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(code, os.strerror(code), str(a), None, str(b))


def _swap_in(staging: Path, out: Path) -> Path | None:
    """Make ``staging`` the new ``out``; return where the old tree now lies (None: no old tree)."""
    if not out.exists():
        staging.rename(out)
        return None
    if _exchange(staging, out):
        return staging
    # No atomic exchange here: two renames, with --out missing between them for an instant.
    aside = out.with_name(f".{out.name}.{secrets.token_hex(8)}.old")
    out.rename(aside)
    try:
        staging.rename(out)
    except BaseException:
        aside.rename(out)  # the old index back where it was
        raise
    return aside


def _remove_owned(root: Path, owned: set[str]) -> list[str]:
    """Delete the listed files under ``root``, then the folders they leave empty; return what
    stays (it appeared while the tool ran and is not the tool's)."""
    for relative in owned:
        with contextlib.suppress(FileNotFoundError):
            (root / relative).unlink()
    for folder, _, _ in sorted(os.walk(root), key=lambda entry: -len(entry[0])):
        with contextlib.suppress(OSError):
            os.rmdir(folder)
    return [str(p.relative_to(root)) for p in root.rglob("*")] if root.exists() else []


def _write_tree(staging: Path, wheels: Sequence[WheelInfo], base_url: str | None) -> None:
    tree = render_tree(wheels, base_url)
    for wheel in wheels:
        tree[f"{FILES_DIR}/{wheel.filename}"] = b""  # copied below; listed in the manifest
    tree[MANIFEST] = _manifest_text(tree)
    for relative, data in tree.items():
        target = staging / relative
        # Every part was validated; this keeps a bug from ever writing outside the staging tree.
        if ".." in PurePosixPath(relative).parts or not target.resolve().is_relative_to(staging):
            raise IndexBuildError(f"refusing to write {relative!r} outside {staging}")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    for wheel in wheels:
        shutil.copyfile(wheel.source, staging / FILES_DIR / wheel.filename)


def check_base_url(base_url: str | None) -> str | None:
    if base_url is not None and _BASE_URL.fullmatch(base_url) is None:
        raise IndexBuildError(
            f"--base-url {base_url!r} is not a plain http(s) URL (letters, digits, '.', '-', "
            "'_', '~', '%' and '/' only; it is shown in shell commands and HTML)"
        )
    return base_url


def build_index(sources: Sequence[Path], out: Path, base_url: str | None = None) -> list[WheelInfo]:
    """Write the site for the wheels under ``sources`` into ``out`` (replaced as a whole)."""
    out = check_out(out)
    check_base_url(base_url)
    paths = find_wheels(sources)
    if not paths:
        raise IndexBuildError(f"no wheels under {', '.join(map(str, sources))}")
    wheels = [describe_wheel(p) for p in paths]
    out.parent.mkdir(parents=True, exist_ok=True)
    with writer_lock(out.parent):
        owned = owned_files(out)
        staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".staging", dir=out.parent))
        try:
            _write_tree(staging, wheels, base_url)
            old = _swap_in(staging, out)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)  # made by mkdtemp above: ours alone
            raise
        if old is not None:
            left = _remove_owned(old, owned)
            if left:
                print(
                    f"index: kept {old}: it holds files written while the index was built: "
                    + ", ".join(left),
                    file=sys.stderr,
                )
    return wheels


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m scripts.index", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--wheels",
        type=Path,
        action="append",
        help="folder (searched recursively) or wheel file; repeat for several",
    )
    parser.add_argument(
        "--out", type=Path, help="site folder: new, empty or a previous index (replaced)"
    )
    parser.add_argument(
        "--project",
        type=Path,
        help="another project's checkout or table file: its `nox -s wheels -- --project` "
        "output is indexed into build/projects/<name>/index (unless --wheels/--out say else)",
    )
    parser.add_argument(
        "--base-url",
        help="where the site will be served, for the install commands on the landing page",
    )
    args = parser.parse_args(argv)
    if args.project is not None:
        try:
            table = load_project(args.project)
        except ProjectTableError as exc:
            print(f"index: {exc}", file=sys.stderr)
            return 2
        args.wheels = args.wheels or [table.output_dir("wheelhouse")]
        args.out = args.out or table.output_dir("index")
    if not args.wheels or not args.out:
        parser.error("give --wheels and --out, or --project")
    try:
        wheels = build_index(args.wheels, args.out, args.base_url)
    except (WheelError, OSError) as exc:
        print(f"index: {exc}", file=sys.stderr)
        return 1
    for label, group in _by_label(wheels).items():
        print(f"{label}: {', '.join(w.filename for w in group)}")
    groups = ", ".join(f"{g}/simple/" for g in _by_cuda_group(wheels))
    print(
        f"index: {len(wheels)} wheel(s) -> {args.out}/ "
        f"(simple/, {groups}, <variant>/simple/, <variant>/)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
