"""The local build image: what goes in it, that its tar is deterministic, and that it runs."""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from scripts import ci, container, matrix, mmdebstrap
from tests.pipeline.deb_helpers import build_deb

ROWS = matrix.load_rows()


def test_image_has_cibuildwheels_utility_python_and_every_build_identifiers():
    pythons = container.image_pythons(ROWS)
    assert pythons[0] == "3.9"  # cibuildwheel's own calls use /opt/python/cp39-cp39
    for row in matrix.build_rows(ROWS):
        python = row.build_python
        assert ci.build_identifier(row).split("-")[0] == container.python_tag(python)
        assert python in pythons


def test_key_follows_every_input():
    spec = container.image_spec({"3.9": "3.9.18", "3.10": "3.10.13"})
    key = container.image_key(spec)
    assert key == container.image_key(container.image_spec({"3.10": "3.10.13", "3.9": "3.9.18"}))
    assert key != container.image_key(container.image_spec({"3.9": "3.9.19", "3.10": "3.10.13"}))
    assert key != container.image_key({**spec, "packages": [*spec["packages"], "git"]})
    assert container.image_name(key) == f"localhost/hotloop-builder:{key}"


def test_mmdebstrap_command_names_suite_packages_and_mirror(tmp_path):
    cmd = container.mmdebstrap_command(
        tmp_path / "root", "http://deb.example/debian", tmp_path / "bin" / "mmdebstrap"
    )
    assert cmd[0] == str(tmp_path / "bin" / "mmdebstrap")
    assert "--variant=minbase" in cmd
    included = next(a for a in cmd if a.startswith("--include=")).split("=", 1)[1].split(",")
    assert set(included) == set(container.PACKAGES)
    assert {"gcc", "g++", "ca-certificates"} <= set(included)
    assert cmd[-3:] == [
        container.SUITE,
        str(tmp_path / "root"),
        f"deb http://deb.example/debian {container.SUITE} main",
    ]


def test_containers_conf_holds_the_settings_podman_needs_here(tmp_path, monkeypatch):
    monkeypatch.setenv("HOTLOOP_CACHE_DIR", str(tmp_path))
    env = container.podman_env({"PATH": "/bin"})
    conf = Path(env["CONTAINERS_CONF"])
    assert conf.parent == tmp_path / "podman"
    text = conf.read_text()
    for setting in (
        'runtime = "runc"',
        'cgroup_manager = "cgroupfs"',
        "default_ulimits = []",
        'netns = "host"',
    ):
        assert setting in text
    assert env["PATH"] == "/bin"


def fake_python_home(root: Path) -> Path:
    home = root / "versions" / "3.10.13"
    (home / "bin").mkdir(parents=True)
    (home / "bin" / "python3.10").write_bytes(b"\x7fELF fake")
    (home / "bin" / "pip3.10").write_text(f"#!{home}/bin/python3.10\nimport pip\n")
    (home / "bin" / "pip3").write_text(f"#!{home}/bin/python3.10\nimport pip\n")
    (home / "bin" / "python3").symlink_to("python3.10")
    lib = home / "lib" / "python3.10"
    (lib / "site-packages" / "pip").mkdir(parents=True)
    (lib / "site-packages" / "pip-23.0.1.dist-info").mkdir()
    (lib / "site-packages" / "torch").mkdir()
    (lib / "site-packages" / "host-only.pth").write_text("import sitecustomize\n")
    (lib / "os.py").write_text("")
    (lib / "__pycache__").mkdir()
    (lib / "__pycache__" / "os.cpython-310.pyc").write_bytes(b"")
    return home


def test_copy_interpreter_keeps_stdlib_and_pip_and_points_scripts_at_opt_python(tmp_path):
    home = fake_python_home(tmp_path)
    dest = tmp_path / "rootfs" / "opt" / "python" / "cp310-cp310"
    container.copy_interpreter(home, dest)
    site = dest / "lib" / "python3.10" / "site-packages"
    assert sorted(p.name for p in site.iterdir()) == ["pip", "pip-23.0.1.dist-info"]
    assert (dest / "lib" / "python3.10" / "os.py").is_file()
    assert not (dest / "lib" / "python3.10" / "__pycache__").exists()
    first_line = (dest / "bin" / "pip3.10").read_text().splitlines()[0]
    assert first_line == "#!/opt/python/cp310-cp310/bin/python3.10"
    assert os.readlink(dest / "bin" / "python") == "python3.10"
    assert os.readlink(dest / "bin" / "pip") == "pip3.10"
    assert (dest / "bin" / "python3.10").read_bytes() == b"\x7fELF fake"


def test_packed_rootfs_is_the_same_whatever_the_files_times(tmp_path):
    digests = []
    for n, when in enumerate((1_600_000_000, 1_700_000_000)):
        root = tmp_path / f"root{n}"
        (root / "etc").mkdir(parents=True)
        # Created in a different order each time: the tar sorts names.
        names = ["b", "a"] if n else ["a", "b"]
        for name in names:
            (root / "etc" / name).write_text(name)
            os.utime(root / "etc" / name, (when, when))
        (root / "bin").symlink_to("usr/bin")
        digests.append(container.pack_rootfs(root, tmp_path / f"root{n}.tar", 1_650_000_000))
    assert digests[0] == digests[1]
    with tarfile.open(tmp_path / "root0.tar") as tar:
        members = tar.getmembers()
    assert {m.mtime for m in members} == {1_650_000_000}
    assert [m.name for m in members] == [".", "./bin", "./etc", "./etc/a", "./etc/b"]


def test_volatile_files_are_removed_and_folders_kept(tmp_path):
    (tmp_path / "var" / "log" / "apt").mkdir(parents=True)
    (tmp_path / "var" / "log" / "dpkg.log").write_text("today")
    (tmp_path / "var" / "log" / "apt" / "history.log").write_text("today")
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "machine-id").write_text("abc")
    (tmp_path / "etc" / "hostname").write_text("keep")
    container.remove_volatile(tmp_path)
    assert list((tmp_path / "var" / "log").iterdir()) == []
    assert not (tmp_path / "etc" / "machine-id").exists()
    assert (tmp_path / "etc" / "hostname").read_text() == "keep"


def test_local_engine_environment_uses_podman_and_the_image(tmp_path, monkeypatch):
    monkeypatch.setenv("HOTLOOP_CACHE_DIR", str(tmp_path))
    env = ci.local_engine_environment("localhost/hotloop-builder:abc", {})
    assert env["CIBW_CONTAINER_ENGINE"] == "podman"
    assert env["CIBW_MANYLINUX_X86_64_IMAGE"] == "localhost/hotloop-builder:abc"
    assert Path(env["CONTAINERS_CONF"]).is_file()
    assert "CIBW_ENVIRONMENT_PASS_LINUX" not in env


def test_local_engine_environment_carries_the_hosts_ca_bundle(tmp_path, monkeypatch):
    monkeypatch.setenv("HOTLOOP_CACHE_DIR", str(tmp_path))
    bundle = tmp_path / "ca.crt"
    bundle.write_text("-----BEGIN CERTIFICATE-----\n")
    env = ci.local_engine_environment("img", {"SSL_CERT_FILE": str(bundle)})
    assert env["CIBW_CONTAINER_ENGINE"] == f"podman; create_args: --volume={bundle}:{bundle}:ro"
    passed = env["CIBW_ENVIRONMENT_PASS_LINUX"].split()
    assert passed == [*ci.ENVIRONMENT_PASS, "SSL_CERT_FILE"]


def test_cpu_environment_only_changes_hotloop_cuda():
    config = ci.pyproject_cibuildwheel()["linux"]["environment"]
    text = ci.cpu_environment(config)
    assert 'HOTLOOP_CUDA="0"' in text
    for key, value in config.items():
        if key != "HOTLOOP_CUDA":
            assert f'{key}="{value}"' in text


@pytest.mark.slow
def test_image_runs_the_interpreters_and_the_compiler():
    """Builds (or reuses) the image: several minutes and Debian's archive the first time."""
    if not (shutil.which("podman") and shutil.which("mmdebstrap")):
        pytest.skip("podman and mmdebstrap (Debian packages) are needed to build the image")
    image = container.ensure_image()
    script = (
        "set -e; for p in /opt/python/cp3*/bin/python; do "
        "$p -c 'import ssl, ctypes, sqlite3'; done; "
        "/opt/python/cp39-cp39/bin/pip --version; which tar mktemp; "
        'g++ --version | head -1; test -f "$HOTLOOP_SYSROOT/usr/include/stdio.h"'
    )
    proc = subprocess.run(
        ["podman", "run", "--rm", image, "/bin/bash", "-c", script],
        env=container.podman_env(),
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "g++" in proc.stdout


@pytest.mark.slow
def test_cibuildwheel_builds_repairs_and_tests_a_cpu_wheel_in_the_local_image(tmp_path):
    """The whole cibuildwheel configuration, hooks included, in podman (about 8 minutes).

    CPU only (``--cpu``): the same before-build, repair (auditwheel, abi3audit, SBOM, zip) and
    test-command as a CUDA cell, without nvcc's minutes per arch.
    """
    if not (shutil.which("podman") and shutil.which("mmdebstrap")):
        pytest.skip("podman and mmdebstrap (Debian packages) are needed to build the image")
    pytest.importorskip("cibuildwheel")
    from scripts import sbom

    row = matrix.build_row_of(ROWS[-1], ROWS)
    assert ci.run_cell(row, tmp_path, "local", cpu=True, cache=None) == 0
    (wheel,) = tmp_path.glob("*.whl")
    assert wheel.name.endswith("-cp39-abi3-manylinux_2_24_x86_64.manylinux_2_28_x86_64.whl")
    assert sbom.check_sbom(wheel) == []


def test_mmdebstrap_comes_from_the_debian_archive_when_it_is_not_installed(tmp_path, monkeypatch):
    """A fresh machine has no mmdebstrap: the pipeline brings Debian's package into the cache
    (private apt state, dpkg-deb -x), as the toolchain does, instead of a FileNotFoundError."""
    monkeypatch.setenv("HOTLOOP_CACHE_DIR", str(tmp_path / "cache"))
    real_which = shutil.which
    monkeypatch.setattr(
        shutil, "which", lambda name, *a, **k: None if name == "mmdebstrap" else real_which(name)
    )
    asked = []

    def download(packages, suite, workdir, *args, **kwargs):
        asked.append((list(packages), suite))
        (workdir / "debs").mkdir(parents=True, exist_ok=True)
        return [
            build_deb(
                workdir / "debs",
                "mmdebstrap",
                "1.3.5-7",
                {"usr/bin/mmdebstrap": "#!/bin/sh\necho made\n", "usr/bin/mmtarfilter": ""},
            )
        ]

    monkeypatch.setattr(mmdebstrap.apt, "apt_download", download)
    exe = mmdebstrap.ensure_mmdebstrap()
    assert asked == [(["mmdebstrap"], mmdebstrap.host_suite())]
    assert exe.is_file()
    assert (exe.parent / "mmtarfilter").is_file()
    assert str(exe).startswith(str(tmp_path / "cache"))
    # Cached: a second call downloads nothing.
    assert mmdebstrap.ensure_mmdebstrap() == exe
    assert len(asked) == 1
    # mmdebstrap runs its helpers (mmtarfilter) by name: its folder leads PATH.
    env = mmdebstrap.tool_env(exe, {"PATH": "/usr/bin"})
    assert env["PATH"] == f"{exe.parent}:/usr/bin"


def test_the_installed_mmdebstrap_is_used_when_there_is_one(tmp_path, monkeypatch):
    monkeypatch.setattr(
        shutil,
        "which",
        lambda name, *a, **k: "/usr/bin/mmdebstrap" if name == "mmdebstrap" else None,
    )
    assert mmdebstrap.ensure_mmdebstrap() == Path("/usr/bin/mmdebstrap")


def test_mmdebstrap_on_a_host_without_apt_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setenv("HOTLOOP_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None)
    with pytest.raises(SystemExit) as err:
        mmdebstrap.ensure_mmdebstrap()
    message = str(err.value)
    assert "apt-get, dpkg, dpkg-deb, perl" in message
    assert "apt-get install mmdebstrap" in message


@pytest.mark.parametrize(
    ("missing", "words"),
    [
        ({"podman", "runc"}, "podman and runc not found: apt-get install podman runc"),
        ({"runc"}, "runc not found: apt-get install runc"),
    ],
)
def test_image_checks_podman_and_runc_before_anything_else(tmp_path, monkeypatch, missing, words):
    """``nox -s cibuildwheel`` on a fresh machine: one message naming each missing command and
    the command that installs it, before interpreters are looked for or a root is made."""
    present = {name: f"/usr/bin/{name}" for name in container.ENGINE_COMMANDS}
    monkeypatch.setattr(
        shutil, "which", lambda name, *a, **k: None if name in missing else present.get(name)
    )

    def too_late(*args, **kwargs):
        raise AssertionError("the image's inputs were gathered before the check")

    monkeypatch.setattr(container, "image_inputs", too_late)
    with pytest.raises(SystemExit) as err:
        container.ensure_image(ROWS)
    assert words in str(err.value)
