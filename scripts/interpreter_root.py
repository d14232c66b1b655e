"""Pythons this host cannot run, from a Debian root filesystem, for the compatibility cells.

Debian's newest interpreters (sid's ``python3.14``, ``python3.15``) need a newer glibc than a
bookworm host has, and pyenv cannot download CPython here. A root filesystem of Debian sid,
made by ``mmdebstrap`` (:mod:`scripts.mmdebstrap`: installed, or brought from the archive) and
cached under ``<cache>/pyroot/<key>``, carries them with their own glibc, plus g++ (torch.compile's
CPU backend compiles C++) and each Python's headers. The key hashes what the root is made of,
so a changed package list makes a new root and an unchanged one is reused.

A cell enters the root as root with ``unshare --mount`` + ``chroot``: the bind mounts (the
cell's folder and uv cache, the wheel, the op tests, uv itself, the host's CA bundle and DNS
configuration) live in a private mount namespace and vanish with it, so nothing on the host
changes. No podman is needed. Inside, uv makes a fresh venv with the root's interpreter,
installs the row's torch from PyPI and the wheel, and the test command runs, as in a host cell
(:mod:`scripts.wheeltest`): this repository's installed-wheel op suite, or another project's
``test-command`` (``nox -s matrix -- --project``).

    python -m scripts.interpreter_root            # make (or reuse) the root, list its Pythons
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from scripts import basics, build, diskspace, mmdebstrap, toolchain
from scripts.interpreters import CONTAINER, Interpreter
from scripts.toolchain.cache import stamp, stamped
from scripts.wheeltest import PythonTestResult, cell_paths, run_folder, run_summary

SUITE = "sid"
# The Pythons the root provides: the host has 3.9-3.13 (pyenv); sid has these.
PYTHONS = ("3.14", "3.15")
# g++ (and libc6-dev): torch.compile's CPU backend compiles its kernels with it.
BASE_PACKAGES = ("ca-certificates", "g++")
# Bump when the way the root is made changes (the key changes with it).
LAYOUT = "1"
# One timestamp for what mmdebstrap writes (SOURCE_DATE_EPOCH). 2026-11-01T00:00:00Z.
EPOCH = 1793491200
ROOT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

log = basics.logger("interpreter-root")


def packages(pythons: Sequence[str] = PYTHONS) -> list[str]:
    """Each Python with its headers and venv module, and the base packages."""
    return sorted(
        {*BASE_PACKAGES, *(f"python{v}{part}" for v in pythons for part in ("", "-dev", "-venv"))}
    )


def root_key(pythons: Sequence[str] = PYTHONS) -> str:
    spec = {"suite": SUITE, "packages": packages(pythons), "layout": LAYOUT, "epoch": EPOCH}
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]


def root_dir(pythons: Sequence[str] = PYTHONS) -> Path:
    return toolchain.cache_dir() / "pyroot" / f"{SUITE}-{root_key(pythons)}"


def cannot_enter() -> str | None:
    """Why a root cannot be entered on this machine, or None when it can."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "entering the Debian root (unshare --mount + chroot) needs root on this machine"
    missing = [tool for tool in ("unshare", "chroot", "mount") if shutil.which(tool) is None]
    if missing:
        return f"{', '.join(missing)} not found (util-linux, coreutils)"
    return None


def mmdebstrap_command(exe: Path, rootfs: Path, mirror: str, pythons: Sequence[str]) -> list[str]:
    return mmdebstrap.command(exe, SUITE, rootfs, mirror, packages(pythons))


def ensure_root(pythons: Sequence[str] = PYTHONS) -> Path:
    """The root filesystem with ``pythons``, made once and then reused."""
    base = root_dir(pythons)
    rootfs = base / "rootfs"
    key = f"{root_key(pythons)}\n"
    if stamped(base, key) and rootfs.is_dir():
        return rootfs
    diskspace.require_free_space(
        [base],
        diskspace.cache_download(
            f"a Debian {SUITE} root with Python {', '.join(pythons)}",
            diskspace.ROOT_BYTES,
            toolchain.cache_dir(),
        ),
    )
    exe = mmdebstrap.ensure_mmdebstrap()
    mirror = toolchain.debian_mirror(toolchain.system_apt_sources()).uri
    partial = base / "rootfs.partial"
    if partial.exists():
        shutil.rmtree(partial)  # our own, from an interrupted run
    base.mkdir(parents=True, exist_ok=True)
    log(f"mmdebstrap {SUITE} ({', '.join(packages(pythons))}) from {mirror} into {partial}")
    started = time.monotonic()
    env = mmdebstrap.tool_env(exe, {**os.environ, "SOURCE_DATE_EPOCH": str(EPOCH)})
    basics.run(mmdebstrap_command(exe, partial, mirror, pythons), env=env, log=log)
    if rootfs.exists():
        shutil.rmtree(rootfs)
    partial.rename(rootfs)
    stamp(base, key)
    log(f"root ready in {time.monotonic() - started:.0f}s: {rootfs}")
    return rootfs


def root_interpreters(
    versions: Sequence[str], make: bool = True
) -> tuple[dict[str, Interpreter], str | None]:
    """The root's interpreters among ``versions``, and why any are missing (None if none)."""
    wanted = [v for v in versions if v in PYTHONS]
    if not wanted:
        return {}, None
    reason = cannot_enter()
    if reason:
        return {}, reason
    try:
        rootfs = ensure_root() if make else root_dir() / "rootfs"
    except (subprocess.CalledProcessError, OSError, RuntimeError) as exc:
        return {}, f"the Debian {SUITE} root could not be made: {exc}"
    found = {}
    for version in wanted:
        exe = rootfs / "usr" / "bin" / f"python{version}"
        if exe.is_file():
            found[version] = Interpreter(
                version, Path("/usr/bin") / exe.name, CONTAINER, f"Debian {SUITE} root", rootfs
            )
    missing = [v for v in wanted if v not in found]
    why = f"Debian {SUITE}'s root has no python{', python'.join(missing)}" if missing else None
    return found, why


def _bind_lines(rootfs: Path, path: Path, writable: bool) -> list[str]:
    target = shlex.quote(str(rootfs) + str(path))
    source = shlex.quote(str(path))
    make = (
        f"mkdir -p {target}" if path.is_dir() else f"mkdir -p $(dirname {target}); touch {target}"
    )
    lines = [make, f"mount --bind {source} {target}"]
    if not writable:
        lines.append(f"mount -o remount,bind,ro {target}")
    return lines


def enter_command(
    rootfs: Path,
    argv: Sequence[str],
    binds: Mapping[Path, bool],
    env: Mapping[str, str],
    cwd: Path,
) -> list[str]:
    """``argv`` run in ``rootfs`` from ``cwd``, with ``binds`` (path -> writable) mounted at
    their own paths, the host's DNS configuration, and only ``env`` (plus PATH, HOME, LANG)."""
    lines = ["set -e"]
    for name in ("dev", "sys"):
        lines.append(f"mount --rbind /{name} {shlex.quote(str(rootfs / name))}")
    lines.append(f"mount -t proc proc {shlex.quote(str(rootfs / 'proc'))}")
    # What a cell writes outside its bound folder (torch.compile's /tmp/torchinductor_root)
    # goes with the namespace, so that the cached root stays as mmdebstrap made it.
    lines.append(f"mount -t tmpfs tmpfs {shlex.quote(str(rootfs / 'tmp'))}")
    for host_file in (Path("/etc/resolv.conf"), Path("/etc/hosts")):
        if host_file.is_file():
            lines += _bind_lines(rootfs, host_file, writable=False)
    bound: list[Path] = []
    for path, writable in sorted(binds.items(), key=lambda item: len(str(item[0]))):
        # A path inside one already bound is there (uv in the checkout's .nox, the wheel in
        # the cache); mounting over it would need a file made inside a read-only bind.
        if not any(path.is_relative_to(parent) for parent in bound):
            lines += _bind_lines(rootfs, path, writable)
            bound.append(path)
    variables = {"PATH": ROOT_PATH, "HOME": "/root", "LANG": "C.UTF-8", **env}
    inner = f"cd {shlex.quote(str(cwd))} && exec {shlex.join(argv)}"
    lines.append(
        f"exec chroot {shlex.quote(str(rootfs))} /usr/bin/env -i "
        + " ".join(shlex.quote(f"{k}={v}") for k, v in variables.items())
        + f" /bin/sh -c {shlex.quote(inner)}"
    )
    # A private mount namespace: every mount above is gone when the command ends.
    return [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "--fork",
        "sh",
        "-c",
        "\n".join(lines),
    ]


def ca_bundle_env(environ: Mapping[str, str]) -> tuple[dict[Path, bool], dict[str, str]]:
    """The host's CA bundle (``SSL_CERT_FILE``: a proxy that re-signs TLS), mounted at its own
    path so that uv in the root trusts what the host trusts."""
    cert = environ.get("SSL_CERT_FILE")
    if cert and Path(cert).is_file():
        return {Path(cert).resolve(): False}, {"SSL_CERT_FILE": str(Path(cert).resolve())}
    return {}, {}


def uv_cache() -> Path:
    """uv's cache for the root's venvs: inside the cache folder, which is bound into the root
    as one mount with the cells' folders, so that uv hardlinks torch into each venv instead of
    copying gigabytes (a hardlink cannot cross two bind mounts, even of one filesystem)."""
    return toolchain.cache_dir() / "uv-root"


def run_in_root(
    packages: Sequence[str],
    interp: Interpreter,
    workdir: Path,
    command: Callable[[Path], list[str]],
    env_extra: Mapping[str, str],
    reads: Sequence[Path],
) -> PythonTestResult:
    """:func:`scripts.wheeltest.run_in_fresh_venv` for a Python of the root: ``packages`` in a
    fresh venv of ``interp`` and ``command(venv python)`` from an empty folder, all inside the
    root, with ``reads`` (the checkout the command names, the wheel's folder) bound read-only at
    their own paths (``workdir`` must lie in the cache folder)."""
    assert interp.root is not None
    start = time.monotonic()
    cell, log_path = cell_paths(workdir, interp)
    if cell.exists():
        shutil.rmtree(cell)
    diskspace.require_free_space(
        [uv_cache()],
        diskspace.cache_download(
            diskspace.TORCH_WHAT + " of the roots", diskspace.TORCH_BYTES, toolchain.cache_dir()
        ),
    )
    run = run_folder(cell)
    venv = cell / "venv"
    uv = Path(build.uv_exe()).resolve()
    # Seeded like a user's `python -m venv` (as in a host cell).
    steps = [
        [str(uv), "venv", "--quiet", "--seed", "--python", str(interp.path), str(venv)],
        [str(uv), "pip", "install", "--quiet", "--python", str(venv / "bin" / "python"), *packages],
        command(venv / "bin" / "python"),
    ]
    script = " && ".join(shlex.join(step) for step in steps)
    shared = Path(os.path.commonpath([workdir.resolve(), uv_cache().resolve()]))
    binds = {shared: True, **{path.resolve(): False for path in reads}, uv: False}
    certs, cert_env = ca_bundle_env(os.environ)
    binds.update(certs)
    env = {
        **cert_env,
        "UV_CACHE_DIR": str(uv_cache().resolve()),
        "UV_PYTHON_DOWNLOADS": "never",
        **build.no_repository_around(cell),
        **env_extra,
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    entered = enter_command(interp.root, ["sh", "-c", script], binds, env, run)
    proc = subprocess.run(entered, capture_output=True, text=True)
    output = proc.stdout + proc.stderr
    log_path.write_text(output)
    return PythonTestResult(
        interp.version,
        "passed" if proc.returncode == 0 else "failed",
        str(interp.path),
        interp.origin,
        run_summary(proc.returncode, proc.stdout, proc.stderr),
        time.monotonic() - start,
        str(log_path),
    )


def main() -> int:
    found, why = root_interpreters(PYTHONS)
    for version in PYTHONS:
        interp = found.get(version)
        print(f"{version}: {interp.path} in {interp.root}" if interp else f"{version}: not found")
    if why:
        print(f"not available: {why}")
    return 0 if not why else 1


if __name__ == "__main__":
    raise SystemExit(main())
