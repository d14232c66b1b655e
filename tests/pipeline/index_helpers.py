"""Real parts for the index and publish tests: tiny installable wheels, tool and torch venvs
made with uv, and index servers bound to 127.0.0.1 that the fixtures start and stop.

The tiny wheels are real ``hotloop`` wheels in every way pip and uv look at (name, local
version label, ``cp39-abi3-manylinux_2_28_x86_64`` tag, ``Requires-Dist: torch==2.X.*``,
``Requires-Python``, RECORD) but hold one Python file, so the tests do not depend on the
CUDA wheels. Every pip/uv run is isolated from the machine's configuration (global pip.conf,
``PIP_*``/``UV_*`` variables) so it sees what a user's pip sees.
"""

from __future__ import annotations

import base64
import contextlib
import csv
import functools
import hashlib
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import venv
import zipfile
from collections.abc import Iterator, Sequence
from email.parser import Parser
from pathlib import Path
from urllib.parse import quote

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from scripts import publish, sbom
from scripts.variant import parse_label

REPO = Path(__file__).resolve().parents[2]

PACKAGE_VERSION = "0.1.0"
# The variants a release publishes, named like the real wheels: one stable-ABI wheel per CUDA
# major (torch>=2.10) and one pinned wheel per older torch minor.
VARIANTS = ("pt28cu128", "pt29cu128", "stable.cu12", "stable.cu13")
# torch release installed into the test venvs (uv's cache holds it; hardlinked, seconds).
TORCH_INSTALLED = "2.11.0"
TORCH_VARIANT = "stable.cu13"
SERVER_TOOLS = ("pypiserver[passlib]==2.4.2", "tomli; python_version < '3.11'")
RUN_TIMEOUT_S = 300
SERVER_START_TIMEOUT_S = 30
_ZIP_DATE = (2026, 1, 1, 0, 0, 0)


# --------------------------------------------------------------------------- wheels


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def write_wheel(path: Path, contents: dict[str, str | bytes], dist_info: str) -> Path:
    """A zip with ``contents`` and a RECORD that hashes them, as build backends write it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        record = []
        for member, text in contents.items():
            data = text.encode() if isinstance(text, str) else text
            zf.writestr(zipfile.ZipInfo(member, _ZIP_DATE), data)
            record.append(_record_line(member, data))
        record.append(f"{dist_info}/RECORD,,")
        zf.writestr(zipfile.ZipInfo(f"{dist_info}/RECORD", _ZIP_DATE), "\n".join(record) + "\n")
    return path


def make_tiny_wheel(
    directory: Path,
    variant: str,
    *,
    name: str = "hotloop",
    version: str = PACKAGE_VERSION,
    requires_python: str = ">=3.9",
    tag: str = "cp39-abi3-manylinux_2_28_x86_64",
    requires_torch: str | None = None,
    extra_metadata: str = "",
    extra_files: dict[str, str | bytes] | None = None,
) -> Path:
    """An installable ``<name>-<version>+<variant>-<tag>.whl``.

    Its ``Requires-Dist`` on torch is what the variant rule says for that label (``torch>=2.10``
    for ``stable.cu13``, ``torch==2.9.*`` for ``pt29cu128``) unless ``requires_torch`` says
    otherwise.
    """
    full_version = f"{version}+{variant}" if variant else version
    if requires_torch is None:
        requires_torch = parse_label(variant).requires_torch
    dist_name = name.replace("-", "_")
    package = dist_name.lower()
    dist_info = f"{dist_name}-{full_version}.dist-info"
    metadata = (
        "Metadata-Version: 2.1\n"
        f"Name: {name}\n"
        f"Version: {full_version}\n"
        "Summary: tiny stand-in for the CUDA wheel (index tests)\n"
        f"Requires-Python: {requires_python}\n"
        f"Requires-Dist: {requires_torch}\n"
        f"{extra_metadata}"
    )
    contents: dict[str, str | bytes] = {
        f"{package}/__init__.py": f'__version__ = "{full_version}"\nVARIANT = "{variant}"\n',
        **(extra_files or {}),
        f"{dist_info}/METADATA": metadata,
        f"{dist_info}/WHEEL": (
            f"Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: false\nTag: {tag}\n"
        ),
    }
    return write_wheel(directory / f"{dist_name}-{full_version}-{tag}.whl", contents, dist_info)


def release_members(variant: str, version: str = PACKAGE_VERSION) -> dict[str, str | bytes]:
    """What a release build adds to a wheel of ``variant``: ``hotloop/_build_info.py`` as
    setup.py writes it and the SBOM ``scripts.reproducible`` adds (``make_tiny_wheel``'s
    ``extra_files``)."""
    full_version = f"{version}+{variant}"
    info = {"version": full_version, "variant": variant, "torch_version": "2.11.0+cu130"}
    lines = ["BUILD_INFO = {", *(f"    {k!r}: {v!r}," for k, v in info.items()), "}", ""]
    document = sbom.build_sbom(
        sbom.SbomInputs(
            "hotloop",
            f"hotloop-{full_version}-cp39-abi3-manylinux_2_28_x86_64.whl", full_version,
            info["torch_version"], "13.0", None, (), (), (), (), 1700000000,
        )
    )  # fmt: skip
    return {
        "hotloop/_build_info.py": "\n".join(lines),
        f"hotloop-{full_version}.dist-info/{sbom.sbom_path('hotloop')}": document,
    }


def corrupt_member(wheel: Path, member: str, compression: int) -> Path:
    """``wheel`` rewritten with ``member``'s stored bytes damaged (a bad CRC, or a broken
    deflate stream), every other member intact."""
    with zipfile.ZipFile(wheel) as zf:
        members = [(i.filename, zf.read(i)) for i in zf.infolist()]
    marker = b"\x00" * 200 + b"damage here" + b"\x00" * 200
    with zipfile.ZipFile(wheel, "w") as zf:
        for name, data in members:
            extra = marker if name == member else b""
            zf.writestr(name, data + extra, compress_type=compression if extra else 8)
    raw = wheel.read_bytes()
    if compression == zipfile.ZIP_STORED:
        at = raw.index(b"damage here")
    else:  # somewhere inside the deflated member: its local header's name, then data
        at = raw.index(member.encode()) + len(member) + 8
    wheel.write_bytes(raw[:at] + bytes([raw[at] ^ 0xFF]) + raw[at + 1 :])
    return wheel


def make_variant_wheels(directory: Path, variants: Sequence[str] = VARIANTS) -> list[Path]:
    return [make_tiny_wheel(directory, v) for v in sorted(variants)]


def make_fake_torch_wheel(directory: Path, version: str) -> Path:
    """A dependency-free ``torch-<version>`` wheel: what a resolver could swap a user's torch
    for, if it were allowed to."""
    dist_info = f"torch-{version}.dist-info"
    contents = {
        "torch_stand_in.py": "",
        f"{dist_info}/METADATA": f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n",
        f"{dist_info}/WHEEL": (
            "Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    return write_wheel(directory / f"torch-{version}-py3-none-any.whl", contents, dist_info)


def write_flat_index(root: Path, wheels: Sequence[Path]) -> Path:
    """A minimal PEP 503 tree at ``root/simple/`` serving ``wheels`` (a stand-in for PyPI)."""
    projects: dict[str, list[Path]] = {}
    for wheel in wheels:
        projects.setdefault(wheel.name.split("-")[0].lower(), []).append(wheel)
    (root / "simple").mkdir(parents=True, exist_ok=True)
    links = "".join(f'<a href="{p}/">{p}</a>' for p in sorted(projects))
    (root / "simple" / "index.html").write_text(f"<html><body>{links}</body></html>")
    for project, files in projects.items():
        page = root / "simple" / project
        page.mkdir(exist_ok=True)
        anchors = []
        for wheel in files:
            shutil.copyfile(wheel, page / wheel.name)
            digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
            anchors.append(f'<a href="{quote(wheel.name)}#sha256={digest}">{wheel.name}</a>')
        (page / "index.html").write_text(f"<html><body>{''.join(anchors)}</body></html>")
    return root / "simple"


# --------------------------------------------------------------------------- environments


def isolated_env(**extra: str) -> dict[str, str]:
    """os.environ without pip/uv/twine settings, with config files switched off."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PIP_", "UV_", "TWINE_", "VIRTUAL_ENV", "PYTHONPATH"))
    }
    if "UV_CACHE_DIR" in os.environ:  # where uv's cached torch lives
        env["UV_CACHE_DIR"] = os.environ["UV_CACHE_DIR"]
    env.update(
        PIP_CONFIG_FILE=os.devnull,
        PIP_DISABLE_PIP_VERSION_CHECK="1",
        PIP_NO_INPUT="1",
        UV_NO_CONFIG="1",
        UV_PYTHON_DOWNLOADS="never",
    )
    env.update(extra)
    return env


def run(
    cmd: Sequence[str | Path], *, env: dict[str, str] | None = None, check: bool = True, **kwargs
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [str(c) for c in cmd],
        env=env if env is not None else isolated_env(),
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        **kwargs,
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"{' '.join(map(str, cmd))} -> {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
        )
    return proc


def venv_python(root: Path) -> Path:
    return root / "bin" / "python"


def find_uv() -> str | None:
    """uv from ``$UV``, PATH, next to this Python, or the ``uv`` package nox was installed with."""
    for candidate in (
        os.environ.get("UV"),
        shutil.which("uv"),
        str(Path(sys.executable).parent / "uv"),
    ):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return candidate
    with contextlib.suppress(ImportError, FileNotFoundError):
        from uv import find_uv_bin  # type: ignore[import-not-found]

        return str(find_uv_bin())
    return None


def make_tool_venv(root: Path) -> tuple[Path, str]:
    """A venv with twine (publish's pins) and pypiserver; returns (its python, a uv binary).

    With uv at hand it builds the venv (seconds); otherwise it bootstraps with the standard
    ``venv`` module and pip from the default index, and installs uv there too.
    """
    tools = [*publish.TOOLS, *SERVER_TOOLS]
    uv = find_uv()
    if uv is not None:
        run([uv, "venv", "-q", "-p", sys.executable, root])
        run([uv, "pip", "install", "-q", "-p", venv_python(root), *tools])
        return venv_python(root), uv
    venv.EnvBuilder(with_pip=True, clear=True).create(root)
    run([venv_python(root), "-m", "pip", "install", "-q", "uv", *tools])
    return venv_python(root), str(root / "bin" / "uv")


def make_torch_venv(root: Path, uv: str, torch: str = TORCH_INSTALLED) -> Path:
    """A fresh venv with pip (``--seed``) and the real ``torch==<torch>``; returns its python.

    torch goes in without its dependencies (the CUDA libraries are GBs and these tests never
    run torch); each of them is there as a metadata-only stand-in of the version torch asks
    for, so pip and uv see what they see in a user's complete environment (they check the
    dependencies of an installed torch too).
    """
    run([uv, "venv", "-q", "--seed", "-p", sys.executable, root])
    python = venv_python(root)
    run([uv, "pip", "install", "-q", "--no-deps", "-p", python, f"torch=={torch}"])
    add_dependency_stand_ins(python, "torch")
    return python


@functools.cache
def site_packages(python: Path) -> Path:
    code = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    return Path(run([python, "-c", code]).stdout.strip())


def _stand_in_version(requirement: Requirement) -> str:
    """The lowest version the requirement names, or 1.0 when it names none."""
    versions = [s.version for s in requirement.specifier if s.operator in ("==", ">=", "~=")]
    version = versions[0].removesuffix(".*") if versions else "1.0"
    if not requirement.specifier.contains(version, prereleases=True):
        raise AssertionError(f"no stand-in version for {requirement}: {version} does not fit")
    return version


def add_dependency_stand_ins(python: Path, dist: str) -> list[str]:
    """Install an empty distribution for every requirement of ``dist`` (in this interpreter's
    environment, extras included); return them as ``name==version``."""
    purelib = site_packages(python)
    metadata = next(purelib.glob(f"{dist}-*.dist-info")) / "METADATA"
    wanted: dict[str, tuple[str, set[str]]] = {}
    for value in Parser().parsestr(metadata.read_text()).get_all("Requires-Dist") or []:
        requirement = Requirement(value)
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue
        name = canonicalize_name(requirement.name)
        _, extras = wanted.get(name, ("", set()))
        wanted[name] = (_stand_in_version(requirement), extras | requirement.extras)
    for name, (version, extras) in wanted.items():
        dist_info = purelib / f"{name.replace('-', '_')}-{version}.dist-info"
        dist_info.mkdir()
        lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
        lines += [f"Provides-Extra: {extra}" for extra in sorted(extras)]
        (dist_info / "METADATA").write_text("\n".join(lines) + "\n")
        (dist_info / "INSTALLER").write_text("tests\n")
        relative = dist_info.name
        (dist_info / "RECORD").write_text(
            f"{relative}/METADATA,,\n{relative}/INSTALLER,,\n{relative}/RECORD,,\n"
        )
    return [f"{name}=={version}" for name, (version, _) in sorted(wanted.items())]


def torch_state(python: Path) -> dict[str, str]:
    """torch's dist-info name (its version), RECORD and every file's inode, mtime and size.

    A reinstall, even of the same version from uv's cache, writes a new RECORD file (new inode).
    Not the ctime: the files are hardlinks into uv's cache, and any other venv made from it
    changes their link count, hence their ctime."""
    purelib = site_packages(python)
    (dist_info,) = purelib.glob("torch-*.dist-info")
    record = (dist_info / "RECORD").read_text()
    files = hashlib.sha256()
    for row in csv.reader(record.splitlines()):
        st = os.lstat(purelib / row[0])
        files.update(f"{row[0]} {st.st_ino} {st.st_mtime_ns} {st.st_size}\n".encode())
    return {
        "dist_info": dist_info.name,
        "record": hashlib.sha256(record.encode()).hexdigest(),
        "installer": (dist_info / "INSTALLER").read_text(),
        "files": files.hexdigest(),
    }


def uninstall_hotloop(python: Path) -> None:
    run([python, "-m", "pip", "uninstall", "-y", "-q", "hotloop"], check=False)


def run_shell(
    command: str, python: Path, uv: str, **extra: str
) -> subprocess.CompletedProcess[str]:
    """A command as a user types it, in bash, with the venv active and pip/uv configs isolated."""
    venv = python.parent.parent
    path = os.pathsep.join([str(python.parent), str(Path(uv).parent), os.environ["PATH"]])
    env = isolated_env(
        PATH=path, VIRTUAL_ENV=str(venv), PIP_NO_CACHE_DIR="1", UV_NO_CACHE="1", **extra
    )
    return run(["bash", "-c", command], env=env, check=False)


def installed_hotloop(python: Path) -> str:
    """The hotloop version the venv imports (from the installed module, not just metadata)."""
    out = run([python, "-c", "import hotloop; print(hotloop.__version__)"])
    return out.stdout.strip()


def pip_install(python: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return run(
        [python, "-m", "pip", "install", "--no-cache-dir", *args, "hotloop"],
        check=check,
    )


def uv_pip_install(
    uv: str, python: Path, *args: str, check: bool = True
) -> subprocess.CompletedProcess[str]:
    return run([uv, "pip", "install", "--no-cache", "-p", python, *args, "hotloop"], check=check)


# --------------------------------------------------------------------------- servers


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_until_up(url: str, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + SERVER_START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}:\n{log.read_text()}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except urllib.error.HTTPError:
            return  # it answers
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"server not up after {SERVER_START_TIMEOUT_S}s:\n{log.read_text()}")


@contextlib.contextmanager
def serve(cmd: Sequence[str | Path], port: int, log: Path) -> Iterator[str]:
    """Run a server bound to 127.0.0.1:``port``; yield its base URL; stop it afterwards."""
    with log.open("w") as log_file:
        proc = subprocess.Popen(
            [str(c) for c in cmd],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env=isolated_env(),
            start_new_session=True,
        )
        base = f"http://127.0.0.1:{port}"
        try:
            _wait_until_up(base + "/", proc, log)
            yield base
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)


@contextlib.contextmanager
def silent_server() -> Iterator[str]:
    """A server on 127.0.0.1 that accepts connections and never answers; yields its URL."""
    listener = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            with contextlib.suppress(socket.timeout):
                accepted.append(listener.accept()[0])

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/"
    finally:
        stop.set()
        thread.join()
        for connection in accepted:
            connection.close()
        listener.close()


def static_server(site: Path, log: Path) -> contextlib.AbstractContextManager[str]:
    port = free_port()
    cmd = [sys.executable, "-m", "http.server", port, "--bind", "127.0.0.1", "--directory", site]
    return serve(cmd, port, log)


def write_htpasswd(tool_python: Path, path: Path, user: str, password: str) -> None:
    """An Apache htpasswd file written by passlib (what pypiserver reads it with)."""
    code = (
        "import sys\nfrom passlib.apache import HtpasswdFile\n"
        "f = HtpasswdFile(sys.argv[1], new=True, default_scheme='sha256_crypt')\n"
        "f.set_password(sys.argv[2], sys.stdin.read())\nf.save()\n"
    )
    run([tool_python, "-c", code, path, user], input=password)


def pypiserver(
    tool_python: Path, packages: Path, htpasswd: Path, log: Path
) -> contextlib.AbstractContextManager[str]:
    """pypiserver on 127.0.0.1: uploads need a password, downloads do not, no PyPI fallback."""
    port = free_port()
    cmd = [
        tool_python.parent / "pypi-server", "run",
        "--interface", "127.0.0.1", "--port", port,
        "--passwords", htpasswd, "--authenticate", "update",
        "--disable-fallback", "--hash-algo", "sha256",
        packages,
    ]  # fmt: skip
    return serve(cmd, port, log)
