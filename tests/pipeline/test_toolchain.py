"""Toolchain helpers that need no network: apt sources, symlinks, CUDA trees, Debian toolkits.

The Debian CUDA toolkit is exercised with small ``.deb`` files built here by ``dpkg-deb``
that have the real packages' layout; ``test_toolchain_slow.py`` fetches the real ones.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from scripts import diskspace, matrix, reproducible, toolchain
from tests.pipeline.deb_helpers import build_deb
from tests.pipeline.disk_helpers import fake_statvfs

DEB822 = """\
Types: deb
# http://snapshot.debian.org/archive/debian/20250520T000000Z
URIs: http://mirror.example/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://mirror.example/debian-security
Suites: bookworm-security
Components: main
"""


def test_deb822_mirror_becomes_bullseye():
    mirror = toolchain.debian_mirror(toolchain.parse_deb822(DEB822))
    assert mirror.uri == "http://mirror.example/debian"
    assert toolchain.debian_sources_line(mirror, toolchain.SYSROOT_SUITE) == (
        "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] "
        "http://mirror.example/debian bullseye main\n"
    )


def test_sources_line_for_a_suite_with_non_free():
    mirror = toolchain.debian_mirror(toolchain.parse_deb822(DEB822))
    assert toolchain.debian_sources_line(mirror, "trixie", ("main", "non-free")) == (
        "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] "
        "http://mirror.example/debian trixie main non-free\n"
    )


def test_one_line_sources():
    text = (
        "# comment\ndeb-src http://x/debian bookworm main\n"
        "deb [arch=amd64] http://x/debian/ bookworm main contrib\n"
    )
    (src,) = toolchain.parse_one_line(text)
    assert (src.uri, src.suites, src.components) == (
        "http://x/debian",
        ("bookworm",),
        ("main", "contrib"),
    )


def test_no_mirror_is_a_clear_error():
    with pytest.raises(RuntimeError, match="no Debian archive"):
        toolchain.debian_mirror(toolchain.parse_deb822(DEB822.split("\n\n")[1]))


def test_system_sources_parse(tmp_path):
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list.d" / "debian.sources").write_text(DEB822)
    assert (
        toolchain.debian_mirror(toolchain.system_apt_sources(tmp_path)).uri
        == "http://mirror.example/debian"
    )


def test_relativize_symlinks(tmp_path):
    (tmp_path / "lib/x86_64-linux-gnu").mkdir(parents=True)
    (tmp_path / "lib/x86_64-linux-gnu/libm.so.6").write_text("")
    (tmp_path / "usr/lib/x86_64-linux-gnu").mkdir(parents=True)
    link = tmp_path / "usr/lib/x86_64-linux-gnu/libm.so"
    link.symlink_to("/lib/x86_64-linux-gnu/libm.so.6")
    assert toolchain.relativize_symlinks(tmp_path) == 1
    assert os.readlink(link) == "../../../lib/x86_64-linux-gnu/libm.so.6"
    assert link.resolve() == (tmp_path / "lib/x86_64-linux-gnu/libm.so.6").resolve()


def test_merge_split_cuda12_components(tmp_path):
    site = tmp_path / "site"
    for rel in (
        "nvidia/cuda_nvcc/bin/nvcc",
        "nvidia/cuda_runtime/include/cuda_runtime.h",
        "nvidia/cuda_runtime/lib/libcudart.so.12",
        "nvidia/cuda_cccl/include/cub/cub.cuh",
    ):
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_text(rel)
    home = tmp_path / "home"
    for component in toolchain.component_roots(site):
        toolchain.cuda_pypi.merge_tree(component, home)
    assert sorted(str(p.relative_to(home)) for p in home.rglob("*") if p.is_file()) == [
        "bin/nvcc", "include/cub/cub.cuh", "include/cuda_runtime.h", "lib/libcudart.so.12",
    ]  # fmt: skip


def test_torch_cuda_include_dirs(tmp_path):
    for rel in ("nvidia/cu13/include", "nvidia/cudnn/include", "nvidia/cu13/lib"):
        (tmp_path / rel).mkdir(parents=True)
    assert toolchain.torch_cuda_include_dirs(tmp_path) == [
        tmp_path / "nvidia/cu13/include",
        tmp_path / "nvidia/cudnn/include",
    ]


def test_torch_cuda_library_links(tmp_path):
    """torch's nvidia-* wheels ship run-time names alone (libcublas.so.12): the links give the
    link-time ones, except for what the toolkit has itself (its runtime is the one linked)."""
    site, toolkit, dest = tmp_path / "site", tmp_path / "cuda", tmp_path / "links"
    for rel in (
        "nvidia/cublas/lib/libcublas.so.12",
        "nvidia/cublas/lib/libcublasLt.so.12",
        "nvidia/cuda_runtime/lib/libcudart.so.12",
        "nvidia/cu13/lib/libnvrtc-builtins.so.13.0",
        "nvidia/cu13/lib/libcheckpoint.so",
        "nvidia/cudnn/include/cudnn.h",
        "toolkit/lib64/libcudart.so",
    ):
        target = (toolkit if rel.startswith("toolkit/") else site) / rel.removeprefix("toolkit/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.touch()
    dest.mkdir()
    (dest / "libstale.so").touch()  # a previous build's: the folder is the build's own
    linked = toolchain.torch_cuda_library_links(site, toolkit, dest)
    assert linked == ["libcheckpoint.so", "libcublas.so", "libcublasLt.so", "libnvrtc-builtins.so"]
    assert sorted(p.name for p in dest.iterdir()) == linked
    assert (dest / "libcublas.so").resolve() == (site / "nvidia/cublas/lib/libcublas.so.12")
    assert (dest / "libnvrtc-builtins.so").resolve().name == "libnvrtc-builtins.so.13.0"
    assert toolchain.torch_cuda_library_links(tmp_path / "no-site", toolkit, dest) == []


def test_cache_dir_honours_env(tmp_path, monkeypatch):
    monkeypatch.setenv("HOTLOOP_CACHE_DIR", str(tmp_path / "c"))
    assert toolchain.cache_dir() == tmp_path / "c"
    assert (tmp_path / "c").is_dir()


def test_compiler_wrappers(tmp_path, monkeypatch):
    monkeypatch.setenv("HOTLOOP_CACHE_DIR", str(tmp_path))
    env = toolchain.compiler_wrappers(tmp_path / "ccbin", tmp_path / "cuda", source_name="hotloop")
    assert {Path(v).name for v in env.values()} == {"gcc", "g++", "nvcc"}
    assert str(tmp_path / "cuda/bin/nvcc") in Path(env["PYTORCH_NVCC"]).read_text()


def test_compiler_wrappers_of_another_revision_do_not_replace_these(tmp_path, monkeypatch):
    """The cache folder is shared with checkouts of other revisions that build at the same
    time: wrappers that differ (here: another ccache) get a folder of their own, and calling
    again with the same ones leaves the running scripts untouched."""
    monkeypatch.setenv("HOTLOOP_CACHE_DIR", str(tmp_path))
    ours = toolchain.compiler_wrappers(tmp_path / "ccbin", tmp_path / "cuda", source_name="hotloop")
    nvcc = Path(ours["PYTORCH_NVCC"])
    text, inode = nvcc.read_text(), nvcc.stat().st_ino
    theirs = toolchain.compiler_wrappers(
        tmp_path / "other-ccbin", tmp_path / "cuda", source_name="hotloop"
    )
    assert Path(theirs["PYTORCH_NVCC"]).parent != nvcc.parent
    assert nvcc.read_text() == text
    again = toolchain.compiler_wrappers(
        tmp_path / "ccbin", tmp_path / "cuda", source_name="hotloop"
    )
    assert again == ours
    assert nvcc.stat().st_ino == inode  # not rewritten
    assert not [p for p in nvcc.parent.iterdir() if p.name.startswith(".")]


def test_nvcc_wrapper_hands_ccache_the_short_dependency_options(tmp_path, monkeypatch):
    """torch's ninja rule passes nvcc --generate-dependencies-with-compile --dependency-output
    F; ccache 4.7 takes F for a second source file and caches nothing (ccache issue 1663). The
    same options spelled -MD -MF F (nvcc's short names) it caches. Everything else unchanged."""
    monkeypatch.setenv("HOTLOOP_CACHE_DIR", str(tmp_path))
    ccbin = tmp_path / "ccbin"
    ccbin.mkdir()
    fake = ccbin / "ccache"  # prints the arguments it was given, one a line
    fake.write_text('#!/bin/sh\nfor a do printf "%s\\n" "$a"; done\n')
    fake.chmod(0o755)
    env = toolchain.compiler_wrappers(ccbin, tmp_path / "cuda", source_name="hotloop")
    args = [
        "--generate-dependencies-with-compile",
        "--dependency-output",
        "/b/x y.o.d",
        "-c",
        "/s/a.cu",
        "-o",
        "/b/x y.o",
        "-Xcompiler",
        "-fPIC",
        "--dependency-output=/b/z.o.d",
        "",
    ]
    out = subprocess.run([env["PYTORCH_NVCC"], *args], capture_output=True, text=True, check=True)
    assert out.stdout.split("\n")[:-1] == [
        str(tmp_path / "cuda/bin/nvcc"),
        "-MD",
        "-MF",
        "/b/x y.o.d",
        "-c",
        "/s/a.cu",
        "-o",
        "/b/x y.o",
        "-Xcompiler",
        "-fPIC",
        "-MF",
        "/b/z.o.d",
        "",
    ]
    # gcc and g++ pass everything through.
    out = subprocess.run([env["CXX"], *args], capture_output=True, text=True, check=True)
    assert out.stdout.split("\n")[1:-1] == args


@pytest.fixture
def echoing_ccache(tmp_path, monkeypatch) -> Path:
    """A ``ccache`` in a folder of its own that drops the compiler and prints the arguments
    it was given, one a line; the cache (and so the wrappers' folder) in ``tmp_path``."""
    monkeypatch.setenv("HOTLOOP_CACHE_DIR", str(tmp_path))
    fake = tmp_path / "ccbin" / "ccache"
    fake.parent.mkdir()
    fake.write_text('#!/bin/sh\nshift\nfor a do printf "%s\\n" "$a"; done\n')
    fake.chmod(0o755)
    return fake


def test_release_nvcc_wrapper_names_the_source_as_the_reproducibility_check_does(
    tmp_path, echoing_ccache
):
    """`nox -s wheels` compiles through the ccache wrapper, `nox -s reproducible` without it:
    both must hand nvcc the build-folder-free source name, or the wheel a release ships is not
    the one the check proves reproducible (its CUDA objects hash the build folder)."""
    ccbin = echoing_ccache.parent
    release = toolchain.compiler_wrappers(ccbin, tmp_path / "cuda", source_name="hotloop")[
        "PYTORCH_NVCC"
    ]
    check = reproducible.write_nvcc_wrapper(
        tmp_path / "check" / "nvcc", tmp_path / "cuda/bin/nvcc", launcher=str(echoing_ccache)
    )
    build_copy = tmp_path / "some" / "build" / "folder" / "src"
    (build_copy / "csrc" / "rms_norm").mkdir(parents=True)
    (build_copy / "setup.py").write_text("")
    source = str(build_copy / "csrc" / "rms_norm" / "rms_norm_cuda.cu")
    outputs = [
        subprocess.run(
            [wrapper, "-c", source, "-o", "x.o"], capture_output=True, text=True, check=True
        ).stdout.splitlines()
        for wrapper in (release, str(check))
    ]
    assert (
        outputs[0]
        == outputs[1]
        == [
            "-c",
            source,
            "-o",
            "x.o",
            "-Xcudafe=--orig_src_path_name=hotloop/csrc/rms_norm/rms_norm_cuda.cu",
        ]
    )


@pytest.mark.parametrize(
    ("source", "name"),
    [
        ("csrc/ops/scan_cuda.cu", "myext/csrc/ops/scan_cuda.cu"),
        ("myext/kernels/scan.cu", "myext/myext/kernels/scan.cu"),
    ],
    ids=["csrc", "kernels-in-the-package"],
)
def test_nvcc_wrapper_names_another_projects_sources_after_that_project(
    tmp_path, echoing_ccache, source, name
):
    """Another project's CUDA sources get its own import name and their path from the folder
    holding its setup.py (what a project build copies), whatever folder they sit in: never
    hotloop's name, never the build folder."""
    ccbin = echoing_ccache.parent
    build_dir = tmp_path / "projects" / "myext" / "stable.cu13" / "checkout" / "myext"
    (build_dir / source).parent.mkdir(parents=True)
    (build_dir / "setup.py").write_text("")
    nvcc = toolchain.compiler_wrappers(ccbin, tmp_path / "cuda", source_name="myext")
    out = subprocess.run(
        [nvcc["PYTORCH_NVCC"], "-c", str(build_dir / source)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    assert out == ["-c", str(build_dir / source), f"-Xcudafe=--orig_src_path_name={name}"]


# --------------------------------------------------------------------------- Debian toolkit

DEBIAN_TABLE = {
    "nvcc": "12.4",
    "arch_list": "8.0;9.0+PTX",
    "debian": {
        "suite": "trixie",
        "components": ["main", "non-free"],
        "packages": [{"name": "nvidia-cuda-toolkit", "version": "12.4-1", "sha256": "0" * 64}],
    },
}


def test_toolkit_from_a_debian_table():
    toolkit = toolchain.Toolkit.from_table("12.8", DEBIAN_TABLE)
    assert toolkit.nvcc == "12.4"
    assert toolkit.arch_list == "8.0;9.0+PTX"
    assert (toolkit.suite, toolkit.components) == ("trixie", ("main", "non-free"))
    assert [pin.spec for pin in toolkit.debs] == ["nvidia-cuda-toolkit=12.4-1"]
    assert toolkit.packages == ()


def test_toolkit_from_a_pypi_table_is_its_row_cuda():
    toolkit = toolchain.Toolkit.from_table("13.0", {"packages": ["nvidia-cuda-nvcc==13.0.88"]})
    assert (toolkit.nvcc, toolkit.packages, toolkit.debs) == (
        "13.0",
        ("nvidia-cuda-nvcc==13.0.88",),
        (),
    )
    assert toolkit.arch_list is None


@pytest.mark.parametrize(
    ("table", "error"),
    [
        ({}, "exactly one of"),
        ({**DEBIAN_TABLE, "packages": ["nvidia-cuda-nvcc-cu12==12.8.93"]}, "exactly one of"),
        ({"debian": {**DEBIAN_TABLE["debian"], "suite": ""}}, "no suite"),
    ],
    ids=["neither", "both", "no-suite"],
)
def test_toolkit_table_errors(table, error):
    with pytest.raises(ValueError, match=error):
        toolchain.Toolkit.from_table("12.8", table)


def test_cuda12_rows_build_with_debian_nvcc_12_4_for_sm80_to_sm90_and_ptx():
    """nvcc 12.4 knows no sm_100/sm_120: Blackwell runs the compute_90 PTX."""
    for row in matrix.load_rows():
        if row.cuda.startswith("12."):
            assert row.toolkit.nvcc == "12.4", row
            assert row.toolkit.debs, row
            assert row.archs == ["sm_80", "sm_86", "sm_89", "sm_90", "compute_90"], row
        else:
            assert "sm_120" in row.archs, row


@pytest.mark.parametrize(
    ("member", "target"),
    [
        ("./usr/lib/nvidia-cuda-toolkit/bin/nvcc", "bin/nvcc"),
        ("./usr/lib/nvidia-cuda-toolkit/bin/cicc", "bin/cicc"),
        ("./usr/lib/nvidia-cuda-toolkit/bin/crt/link.stub", "bin/crt/link.stub"),
        ("./usr/lib/nvidia-cuda-toolkit/bin/g++", None),  # Debian's compiler picker
        ("./usr/lib/nvidia-cuda-toolkit/bin/nvcc.profile", None),  # -> /etc/nvcc.profile
        ("./usr/lib/nvidia-cuda-toolkit/libdevice/libdevice.10.bc",
         "nvvm/libdevice/libdevice.10.bc"),
        ("./usr/lib/nvidia-cuda-toolkit/compute-sanitizer/x.so", None),
        ("./usr/bin/ptxas", "bin/ptxas"),
        ("./usr/bin/cudafe++", "bin/cudafe++"),
        ("./usr/bin/nvcc", None),  # the shell wrapper with absolute paths
        ("./usr/bin/compute-sanitizer", None),
        ("./usr/include/cuda_runtime.h", "include/cuda_runtime.h"),
        ("./usr/include/crt/host_config.h", "include/crt/host_config.h"),
        ("./usr/include/cub/cub.cuh", "include/cub/cub.cuh"),
        ("./usr/include/nv/target", "include/nv/target"),
        ("./usr/include/cublas_v2.h", None),  # torch's nvidia-cublas-cu12 has the 12.8 one
        ("./usr/include/cusparse.h", None),
        ("./usr/lib/x86_64-linux-gnu/libcudart.so", "lib64/libcudart.so"),
        ("./usr/lib/x86_64-linux-gnu/libcudart.so.12", "lib64/libcudart.so.12"),
        ("./usr/lib/x86_64-linux-gnu/stubs/libcuda.so", "lib64/stubs/libcuda.so"),
        ("./usr/lib/x86_64-linux-gnu/stubs/libcublas.so", None),
        ("./usr/lib/x86_64-linux-gnu/libcublas_static.a", None),
        ("./usr/share/doc/nvidia-cuda-dev/copyright", None),
        ("./etc/nvcc.profile", None),
    ],
)  # fmt: skip
def test_deb_member_target(member, target):
    assert toolchain.deb_member_target(member) == target


def fake_nvcc(release: str) -> str:
    return f'#!/bin/sh\necho "Cuda compilation tools, release {release}, V{release}.131"\n'


def fake_cuda_debs(out_dir: Path, release: str = "12.4", with_cudart: bool = True) -> list[Path]:
    """The real packages' layout in miniature: what the toolkit keeps and what it drops."""
    out_dir.mkdir(parents=True, exist_ok=True)
    debs = [
        build_deb(
            out_dir,
            "nvidia-cuda-toolkit",
            "12.4.131~12.4.1-2",
            {
                "usr/bin/nvcc": '#!/bin/sh\nexec /usr/lib/nvidia-cuda-toolkit/bin/nvcc "$@"\n',
                "usr/bin/ptxas": "ptxas",
                "usr/lib/nvidia-cuda-toolkit/bin/nvcc": fake_nvcc(release),
                "usr/lib/nvidia-cuda-toolkit/bin/g++": "#!/bin/sh\n",
                "usr/lib/nvidia-cuda-toolkit/bin/nvcc.profile": Path("/etc/nvcc.profile"),
                "usr/lib/nvidia-cuda-toolkit/bin/crt/link.stub": "stub",
                "usr/lib/nvidia-cuda-toolkit/libdevice/libdevice.10.bc": "bc",
                "etc/nvcc.profile": "INCLUDES += -I/usr/include\n",
            },
        ),
        build_deb(
            out_dir,
            "nvidia-cuda-dev",
            "12.4.127~12.4.1-2",
            {
                "usr/include/cuda_runtime.h": "// runtime",
                "usr/include/cublas_v2.h": "// cublas",
                "usr/lib/x86_64-linux-gnu/libcudart.so": Path("libcudart.so.12"),
                "usr/lib/x86_64-linux-gnu/libcublas_static.a": "big",
                "usr/share/doc/nvidia-cuda-dev/copyright": "text",
            },
        ),
    ]
    if with_cudart:
        debs.append(
            build_deb(
                out_dir,
                "libcudart12",
                "12.4.127~12.4.1-2",
                {
                    "usr/lib/x86_64-linux-gnu/libcudart.so.12": Path("libcudart.so.12.4.127"),
                    "usr/lib/x86_64-linux-gnu/libcudart.so.12.4.127": "ELF",
                },
            )
        )
    return debs


def pins_for(debs: list[Path]) -> tuple[toolchain.DebPin, ...]:
    pins = []
    for deb in debs:
        name, version = toolchain.deb_fields(deb)
        pins.append(toolchain.DebPin(name, version, hashlib.sha256(deb.read_bytes()).hexdigest()))
    return tuple(pins)


def files_under(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if not p.is_dir())


def test_extract_keeps_only_what_cuda_home_needs(tmp_path):
    home = tmp_path / "home"
    for deb in fake_cuda_debs(tmp_path / "debs"):
        toolchain.extract_deb_members(deb, home)
    assert files_under(home) == [
        "bin/crt/link.stub",
        "bin/nvcc",
        "bin/ptxas",
        "include/cuda_runtime.h",
        "lib64/libcudart.so",
        "lib64/libcudart.so.12",
        "lib64/libcudart.so.12.4.127",
        "nvvm/libdevice/libdevice.10.bc",
    ]
    # The real driver, not Debian's wrapper; links stay relative inside the tree.
    assert "release 12.4" in (home / "bin/nvcc").read_text()
    assert os.access(home / "bin/nvcc", os.X_OK)
    assert (home / "lib64/libcudart.so").resolve() == (home / "lib64/libcudart.so.12.4.127")


def test_check_debs_accepts_the_pins(tmp_path):
    debs = fake_cuda_debs(tmp_path)
    toolchain.check_debs(debs, pins_for(debs))


def test_check_debs_says_what_differs(tmp_path):
    debs = fake_cuda_debs(tmp_path)
    pins = list(pins_for(debs))
    pins[0] = toolchain.DebPin(pins[0].name, pins[0].version, "f" * 64)
    pins[1] = toolchain.DebPin(pins[1].name, "12.4.127~12.4.1-3", pins[1].sha256)
    pins.append(toolchain.DebPin("libcub-dev", "2.3.2-2", "a" * 64))
    with pytest.raises(toolchain.ToolkitError) as err:
        toolchain.check_debs(debs[:2] + debs[2:], pins[:2] + pins[3:])
    msg = str(err.value)
    assert f"nvidia-cuda-toolkit 12.4.131~12.4.1-2: sha256 {pins_for(debs)[0].sha256}" in msg
    assert f"pinned {'f' * 64}" in msg
    assert "nvidia-cuda-dev: got version 12.4.127~12.4.1-2, pinned 12.4.127~12.4.1-3" in msg
    assert "package libcudart12 is not pinned" in msg
    assert "libcub-dev: pinned but not downloaded" in msg
    assert "update version and sha256" in msg


@pytest.fixture
def debian_toolkit(tmp_path, monkeypatch):
    """A Debian toolkit whose ``apt_download`` serves fake ``.deb`` files (and counts calls)."""

    def make(release: str = "12.4", with_cudart: bool = True):
        source = fake_cuda_debs(tmp_path / "archive", release, with_cudart)
        calls = []

        def fake_download(packages, suite, workdir, mirror=None, components=("main",)):
            calls.append((tuple(packages), suite, tuple(components)))
            (workdir / "debs").mkdir(parents=True, exist_ok=True)
            return [Path(shutil.copy2(deb, workdir / "debs" / deb.name)) for deb in source]

        monkeypatch.setenv("HOTLOOP_CACHE_DIR", str(tmp_path / "cache"))
        monkeypatch.delenv("HOTLOOP_CUDA_HOME_12_8", raising=False)
        monkeypatch.setattr(toolchain.cuda_debian, "apt_download", fake_download)
        toolkit = toolchain.Toolkit(
            nvcc="12.4", debs=pins_for(source), suite="trixie", components=("main", "non-free")
        )
        return toolkit, calls

    return make


def test_debian_toolkit_is_assembled_once_and_reused(debian_toolkit):
    toolkit, calls = debian_toolkit()
    home = toolchain.ensure_cuda_toolkit("12.8", toolkit)
    assert calls == [
        (tuple(pin.spec for pin in toolkit.debs), "trixie", ("main", "non-free")),
    ]
    profile = (home / "bin/nvcc.profile").read_text()
    assert "$(_HERE_)" in profile
    assert "/usr/lib" not in profile
    assert "-I$(TOP)/include" in profile
    assert "NVVMIR_LIBRARY_DIR = $(TOP)/nvvm/libdevice" in profile
    # The downloaded .deb files are gone; only the kept tree stays in the cache.
    assert not list(home.parent.glob("debs/*.deb"))
    assert toolchain.ensure_cuda_toolkit("12.8", toolkit) == home
    assert len(calls) == 1


def test_debian_toolkit_is_not_downloaded_without_room_for_it(debian_toolkit, monkeypatch):
    toolkit, calls = debian_toolkit()
    monkeypatch.setattr(diskspace.os, "statvfs", fake_statvfs(diskspace.GIB))
    with pytest.raises(
        diskspace.DiskSpaceError,
        match=r"1\.0 GiB free, but Debian's CUDA 12\.4 toolkit .* needs up to 2\.0 GiB.*"
        r"HOTLOOP_CACHE_DIR=<folder>",
    ):
        toolchain.ensure_cuda_toolkit("12.8", toolkit)
    assert calls == []


def test_pypi_toolkit_is_not_downloaded_without_room_for_it(tmp_path, monkeypatch):
    commands = []
    monkeypatch.setenv("HOTLOOP_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("HOTLOOP_CUDA_HOME_13_0", raising=False)
    monkeypatch.setattr(toolchain.cuda_pypi.basics, "run", lambda cmd, **kw: commands.append(cmd))
    monkeypatch.setattr(diskspace.os, "statvfs", fake_statvfs(diskspace.GIB))
    toolkit = toolchain.Toolkit(nvcc="13.0.88", packages=("nvidia-cuda-nvcc==13.0.88",))
    with pytest.raises(diskspace.DiskSpaceError, match=r"the CUDA 13\.0\.88 toolkit"):
        toolchain.ensure_cuda_toolkit("13.0", toolkit)
    assert commands == []


def test_debian_toolkit_of_the_wrong_release_is_refused(debian_toolkit):
    toolkit, _ = debian_toolkit(release="12.6")
    with pytest.raises(toolchain.ToolkitError, match=r"is not CUDA 12\.4"):
        toolchain.ensure_cuda_toolkit("12.8", toolkit)


def test_debian_toolkit_without_libcudart_is_a_clear_error(debian_toolkit):
    toolkit, _ = debian_toolkit(with_cudart=False)
    with pytest.raises(
        toolchain.ToolkitError, match=r"libcudart\.so does not resolve.*libcudart12"
    ):
        toolchain.ensure_cuda_toolkit("12.8", toolkit)


def fake_home(root: Path, release: str) -> Path:
    (root / "bin").mkdir(parents=True)
    (root / "bin/nvcc").write_text(fake_nvcc(release))
    (root / "bin/nvcc").chmod(0o755)
    return root


def test_override_wins_when_it_is_the_rows_release(tmp_path, monkeypatch):
    home = fake_home(tmp_path / "cuda-12.8", "12.8")
    monkeypatch.setenv("HOTLOOP_CUDA_HOME_12_8", str(home))
    toolkit = toolchain.Toolkit.from_table("12.8", DEBIAN_TABLE)
    assert toolchain.ensure_cuda_toolkit("12.8", toolkit) == home


def test_override_of_another_release_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("HOTLOOP_CUDA_HOME_12_8", str(fake_home(tmp_path / "c", "12.4")))
    with pytest.raises(toolchain.ToolkitError, match=r"HOTLOOP_CUDA_HOME_12_8.*is not CUDA 12\.8"):
        toolchain.ensure_cuda_toolkit("12.8", toolchain.Toolkit.from_table("12.8", DEBIAN_TABLE))


def test_debian_toolkit_download_failure_says_what_to_pin(debian_toolkit, monkeypatch):
    toolkit, _ = debian_toolkit()

    def refused(packages, suite, workdir, mirror=None, components=("main",)):
        raise subprocess.CalledProcessError(100, ["apt-get", "download", *packages])

    monkeypatch.setattr(toolchain.cuda_debian, "apt_download", refused)
    with pytest.raises(toolchain.ToolkitError) as err:
        toolchain.ensure_cuda_toolkit("12.8", toolkit)
    assert "nvidia-cuda-toolkit=12.4.131~12.4.1-2" in str(err.value)
    assert "from Debian trixie (main non-free): exit 100" in str(err.value)
    assert "pin those in scripts/matrix.toml" in str(err.value)


# --------------------------------------------------------------------------- the whole toolchain


@pytest.fixture
def fetched_pieces(tmp_path, monkeypatch):
    """ensure_* replaced by folders in tmp_path; the test sets what ensure_ccache finds."""
    monkeypatch.setenv("HOTLOOP_CACHE_DIR", str(tmp_path / "cache"))
    asked: list[str] = []

    def cuda_toolkit(cuda, toolkit):
        asked.append(f"cuda {cuda}")
        return tmp_path / "cuda"

    def sysroot():
        asked.append("sysroot")
        return tmp_path / "sysroot"

    monkeypatch.setattr(toolchain, "ensure_cuda_toolkit", cuda_toolkit)
    monkeypatch.setattr(toolchain, "ensure_sysroot", sysroot)
    monkeypatch.setattr(toolchain, "ensure_ccache", lambda: tmp_path / "ccbin")
    return asked


def test_assemble_wraps_every_compiler_in_ccache(fetched_pieces, tmp_path, newest_row):
    tools = toolchain.assemble(newest_row.cuda, newest_row.toolkit, source_name="hotloop")
    assert fetched_pieces == [f"cuda {newest_row.cuda}", "sysroot"]
    assert tools.cuda_home == tmp_path / "cuda"
    assert tools.sysroot == tmp_path / "sysroot"
    assert sorted(tools.compilers) == ["CC", "CXX", "PYTORCH_NVCC"]
    assert all("ccache" in Path(path).read_text() for path in tools.compilers.values())
    env = tools.environment()
    assert env["CUDA_HOME"] == str(tmp_path / "cuda")
    assert env["HOTLOOP_SYSROOT"] == str(tmp_path / "sysroot")
    assert env["CCACHE_DIR"] == str(tmp_path / "cache" / "ccache")
    assert env["PYTORCH_NVCC"] == tools.compilers["PYTORCH_NVCC"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        tools.sysroot = tmp_path  # type: ignore[misc]


def test_assemble_without_ccache_uses_the_plain_compilers(fetched_pieces, newest_row):
    tools = toolchain.assemble(
        newest_row.cuda, newest_row.toolkit, source_name="hotloop", ccache=False
    )
    assert tools.compilers == toolchain.plain_compilers()
    assert tools.ccache_env == {}
    assert not any(name.startswith("CCACHE_") for name in tools.environment())


def test_assemble_for_a_cpu_build_fetches_no_toolkit(fetched_pieces, newest_row):
    tools = toolchain.assemble(
        newest_row.cuda, newest_row.toolkit, source_name="hotloop", with_cuda=False
    )
    assert fetched_pieces == ["sysroot"]
    assert tools.cuda_home is None
    assert sorted(tools.compilers) == ["CC", "CXX"]
    assert "CUDA_HOME" not in tools.environment()


def test_build_env_of_a_cpu_toolchain_builds_for_the_cpu(fetched_pieces, newest_row, tmp_path):
    from scripts import build

    tools = toolchain.assemble(
        newest_row.cuda, newest_row.toolkit, source_name="hotloop", with_cuda=False
    )
    env = build.build_env(newest_row, tools, tmp_path / "site")
    assert env["HOTLOOP_CUDA"] == "0"
    for var in ("CUDA_HOME", "TORCH_CUDA_ARCH_LIST", "CPATH", "PYTORCH_NVCC"):
        assert var not in env


@pytest.mark.parametrize(
    "flags",
    [["-march=native"], ["-mtune=native", "-march=native"], ["-mcpu=native"]],
    ids=["march", "mtune-and-march", "mcpu"],
)
def test_sysroot_compilers_build_for_any_cpu_not_this_ones(tmp_path, monkeypatch, flags):
    """A project's -march=native (flash-attention's csrc/rotary asked for it)
    would build the wheel's host code for this builder's CPU: on one without its instructions
    (AVX-512 here) the wheel dies of SIGILL. The wrappers leave such flags out, and say so."""
    from scripts.toolchain.sysroot import sysroot_compilers

    monkeypatch.setenv("HOTLOOP_CACHE_DIR", str(tmp_path / "cache"))
    echo = tmp_path / "echo-gcc"
    echo.write_text('#!/bin/sh\nprintf "%s\\n" "$@"\n')
    echo.chmod(0o755)
    wrappers = sysroot_compilers(tmp_path / "sysroot", {"CC": str(echo), "CXX": str(echo)})
    for variable in ("CC", "CXX"):
        run = subprocess.run(
            [wrappers[variable], "-O3", *flags, "-march=x86-64-v2", "-c", "op.cpp"],
            capture_output=True,
            text=True,
            check=True,
        )
        args = run.stdout.splitlines()
        assert not [a for a in args if a.endswith("=native")]
        assert args[-4:] == ["-O3", "-march=x86-64-v2", "-c", "op.cpp"]  # the rest, in order
        for flag in flags:
            assert f"torch-wheels: left out {flag}" in run.stderr


def test_the_flags_left_out_are_read_back_from_the_build_log():
    from scripts.toolchain.sysroot import host_tuned_flags_left_out

    log = (
        "[1/2] g++ -O3 -c rotary.cpp\n"
        "torch-wheels: left out -march=native, which builds for this machine's CPU alone: ...\n"
        "[2/2] nvcc -c rotary_cuda.cu\n"
        "torch-wheels: left out -march=native, which builds for this machine's CPU alone: ...\n"
        "torch-wheels: left out -mtune=native, which builds for this machine's CPU alone: ...\n"
    )
    assert host_tuned_flags_left_out(log) == ["-march=native", "-mtune=native"]
    assert host_tuned_flags_left_out("[1/1] g++ -march=native -c op.cpp\n") == []
