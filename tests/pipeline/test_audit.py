"""Each audit rule, fed a synthetic wheel that breaks it; and the command's verdicts."""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import re
import shutil
import struct
import subprocess
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest

from scripts import audit, matrix, pypi_release, reproducible, sbom
from scripts.audit import elf, libraries, stable_abi
from scripts.project import own_project

ROWS = matrix.load_rows()
BUILD_ROWS = matrix.build_rows(ROWS)
# The wheels under test: the stable wheel's build row and the newest pinned row.
KIND_ROWS = {
    "stable": next(r for r in BUILD_ROWS if r.variant == "stable.cu13"),
    "pinned": [r for r in BUILD_ROWS if r.kind == "pinned"][-1],
}
EMPTY_SHA256 = "47DEQpj8HBSa-_TImW-5JCeuQeRkm5NMpJWZG3hSuFU"  # RECORD's form of sha256(b"")
STABLE_ONLY = pytest.mark.parametrize("newest_row", ["stable"], indirect=True)
PINNED_ONLY = pytest.mark.parametrize("newest_row", ["pinned"], indirect=True)

# What a stable-ABI extension links: the C shim only (the op registration and a tensor call).
STABLE_SHIM_CPP = """
#include <cstdint>
#include <cstring>
extern "C" {
void hotloop_copy(char* d, const char* s, unsigned long n) { memcpy(d, s, n); }
int aoti_torch_library_init_def(const char*, const char*, int, void**);
int aoti_torch_get_numel(void*, int64_t*);
int torch_call_dispatcher(const char*, const char*, void*, uint64_t, uint64_t);
int64_t hotloop_numel(void* t) { int64_t n = 0; aoti_torch_get_numel(t, &n); return n; }
int hotloop_register(void** lib) {
  return aoti_torch_library_init_def("hotloop", "", 0, lib) +
         torch_call_dispatcher("hotloop::f", "", nullptr, 0, 0);
}
}
"""
# What an ATen build links: c10:: and at:: C++ symbols, whose layout changes between torch.
UNSTABLE_CPP = """
#include <cstdint>
namespace c10 { void* get_default_device(); }
namespace at { struct Tensor; int64_t numel_of(const Tensor&); }
int64_t hotloop_numel(const at::Tensor& t) { c10::get_default_device(); return at::numel_of(t); }
"""
# torch_from_blob entered the shim in torch 2.11: such a library does not load in 2.10.
NEWER_SHIM_CPP = """
extern "C" int torch_from_blob(void*, int, void*, void*);
extern "C" int hotloop_wrap(void* p) { return torch_from_blob(p, 0, nullptr, nullptr); }
"""
# A shim symbol no torch-abi-audit table knows: newer than its data.
UNKNOWN_SHIM_CPP = """
extern "C" int torch_hotloop_made_up_shim(void*);
extern "C" int hotloop_call(void* p) { return torch_hotloop_made_up_shim(p); }
"""


def compile_cxx(tmp: Path, name: str, source: str, *link_flags: str) -> bytes:
    """A shared library from C++ ``source``; its libtorch symbols stay undefined."""
    if shutil.which("g++") is None:
        pytest.skip("g++ not installed")
    src = tmp / f"{name}.cpp"
    src.write_text(source)
    out = tmp / f"{name}.so"
    cmd = ["g++", "-O2", "-shared", "-fPIC", "-o", str(out), str(src), *link_flags]
    subprocess.run(cmd, check=True)
    return out.read_bytes()


@pytest.fixture(scope="session")
def elf_libs(elf_libs, tmp_path_factory, with_fatbin):
    """conftest's libraries plus torch-facing ones; "good" (every wheel's ops library) uses
    the shim, "cuda" (every wheel's _C) too, with device code."""
    tmp = tmp_path_factory.mktemp("torch_elf")
    libs = dict(elf_libs)
    libs["no_torch"] = elf_libs["good"]
    libs["good"] = compile_cxx(tmp, "stable_shim", STABLE_SHIM_CPP)
    libs["cuda"] = with_fatbin(libs["good"])
    libs["unstable"] = compile_cxx(tmp, "unstable", UNSTABLE_CPP)
    libs["newer_shim"] = compile_cxx(tmp, "newer_shim", NEWER_SHIM_CPP)
    libs["unknown_shim"] = compile_cxx(tmp, "unknown_shim", UNKNOWN_SHIM_CPP)
    # What a pyenv (--enable-shared) interpreter's LDSHARED adds to every extension it links.
    libs["build_runpath"] = compile_cxx(
        tmp, "build_runpath", STABLE_SHIM_CPP, "-Wl,-rpath,/root/.pyenv/versions/3.13.0/lib"
    )
    libs["old_rpath"] = compile_cxx(
        tmp, "old_rpath", STABLE_SHIM_CPP, "-Wl,--disable-new-dtags,-rpath,/opt/build/lib:$ORIGIN"
    )
    libs["origin_runpath"] = compile_cxx(
        tmp, "origin_runpath", STABLE_SHIM_CPP, "-Wl,-rpath,$ORIGIN/../hotloop.libs"
    )
    return libs


@pytest.fixture(params=sorted(KIND_ROWS))
def newest_row(request):
    """The row conftest's ``wheel_factory`` builds wheels for: here, one of each kind."""
    return KIND_ROWS[request.param]


def rules(report: audit.AuditReport) -> set[str]:
    return {v.split(":", 1)[0] for v in report.violations}


def rewrite_wheel(
    wheel: Path,
    change: Callable[[dict[str, bytes]], None],
    *,
    stored: bool = False,
) -> Path:
    """Rewrite ``wheel`` with ``change`` applied to its members (RECORD as ``change`` leaves it)."""
    with zipfile.ZipFile(wheel) as zf:
        members = {name: zf.read(name) for name in zf.namelist()}
    change(members)
    compression = zipfile.ZIP_STORED if stored else zipfile.ZIP_DEFLATED
    with zipfile.ZipFile(wheel, "w", compression) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return wheel


def record_of(row: matrix.Row) -> str:
    return f"hotloop-{row.version}.dist-info/RECORD"


def copy_to(wheel: Path, folder: Path) -> Path:
    """Keep a wheel the factory would overwrite (same name) by the next one."""
    folder.mkdir(parents=True, exist_ok=True)
    return Path(shutil.copy2(wheel, folder / wheel.name))


# ---------------------------------------------------------------------------- good wheels


def test_good_wheel_passes(wheel_factory, newest_row):
    report = audit.check_wheel(wheel_factory(), newest_row)
    assert report.violations == []
    assert report.max_versions["GLIBC"] <= "GLIBC_2.28"


def test_rules_have_ids_summaries_and_kinds():
    ids = [r.id for r in audit.RULES]
    assert len(ids) == len(set(ids))
    assert all(r.summary and set(r.kinds) <= {"stable", "pinned"} for r in audit.RULES)
    stable_only = {r.id for r in audit.RULES if r.kinds == ("stable",)}
    assert stable_only == {"torch-stable-abi", "stable-abi-floor"}


@STABLE_ONLY
def test_served_row_is_audited_against_its_build_row(wheel_factory, newest_row):
    # torch 2.15.0 is served by the stable wheel built against 2.11.0: same verdict.
    served = next(r for r in ROWS if r.torch == "2.15.0")
    assert not served.is_build
    wheel = wheel_factory()
    assert audit.check_wheel(wheel, served).violations == []


# ------------------------------------------------------------------------- name and metadata


def test_project_name(wheel_factory, newest_row):
    wheel = wheel_factory()

    def rename(members: dict[str, bytes]) -> None:
        meta = f"hotloop-{newest_row.version}.dist-info/METADATA"
        members[meta] = members[meta].replace(b"Name: hotloop", b"Name: hotl0op")

    report = audit.check_wheel(rewrite_wheel(wheel, rename), newest_row)
    assert "project-name" in rules(report)
    assert "METADATA Name is 'hotl0op'" in "\n".join(report.violations)


@pytest.mark.parametrize(
    "tag",
    [
        "cp312-cp312-manylinux_2_28_x86_64",
        "cp39-abi3-linux_x86_64",
        "cp39-abi3-manylinux_2_34_x86_64",
    ],
)
def test_wheel_tag(wheel_factory, newest_row, tag):
    report = audit.check_wheel(wheel_factory(tag=tag), newest_row)
    assert rules(report) == {"wheel-tag"}


def test_compressed_tag_set_is_accepted(wheel_factory, newest_row):
    # auditwheel names the wheel with every tag it satisfies; WHEEL then lists both.
    wheel = wheel_factory(tag="cp39-abi3-manylinux_2_24_x86_64.manylinux_2_28_x86_64")
    parts = audit.wheel_name_parts(wheel.name)
    assert parts["platform"] == "manylinux_2_24_x86_64.manylinux_2_28_x86_64"
    report = audit.check_wheel(wheel, newest_row)
    # make_wheel writes the compressed tag as one Tag line: only the file name rule applies.
    assert "version-label" not in rules(report)


def test_version_label_mismatch(wheel_factory, newest_row):
    report = audit.check_wheel(wheel_factory(version="0.1.0+pt214cu128"), newest_row)
    assert rules(report) == {"version-label"}
    assert f"need {newest_row.version}" in report.violations[0]


@pytest.mark.parametrize("label", ["cu130", "stable.cu130", "pt211", "stable"])
def test_version_label_outside_the_variant_grammar(wheel_factory, newest_row, label):
    report = audit.check_wheel(wheel_factory(version=f"0.1.0+{label}"), newest_row)
    assert rules(report) == {"version-label"}
    assert "is not a hotloop variant label" in report.violations[0]


def test_version_label_metadata_must_match_the_file_name(wheel_factory, newest_row):
    meta = f"hotloop-{newest_row.version}.dist-info/METADATA"

    def relabel(members: dict[str, bytes]) -> None:
        members[meta] = members[meta].replace(newest_row.version.encode(), b"0.1.0+pt28cpu")

    report = audit.check_wheel(rewrite_wheel(wheel_factory(), relabel), newest_row)
    assert "version-label" in rules(report)
    assert "METADATA Version is 0.1.0+pt28cpu" in "\n".join(report.violations)


@pytest.mark.parametrize(
    "requires",
    [(), ("torch>=2.14",), ("torch==2.13.*",), ("torch==2.14.*", "torch<3")],
    ids=["missing", "loose", "wrong-minor", "two"],
)
def test_requires_torch_pin(wheel_factory, newest_row, requires):
    report = audit.check_wheel(wheel_factory(requires=requires), newest_row)
    assert rules(report) == {"requires-torch"}
    assert f"need exactly {newest_row.requires_torch}" in report.violations[0]


def test_other_requirements_are_fine(wheel_factory, newest_row):
    report = audit.check_wheel(
        wheel_factory(requires=(newest_row.requires_torch, "torchvision; extra == 'x'")), newest_row
    )
    assert report.violations == []


@pytest.mark.parametrize(
    "change",
    [
        {"torch_minor": "2.13"},
        {"cuda_version": None},
        {"cuda_version": "11.8"},
        {"archs": ["sm_80"]},
        {"version": "0.1.0+pt214cpu"},
        {"torch_version": "2.13.0+cu130"},
    ],
)
def test_build_info_mismatch(wheel_factory, newest_row, build_info_for, change):
    wheel = wheel_factory(build_info=build_info_for(newest_row, **change))
    report = audit.check_wheel(wheel, newest_row)
    # The SBOM names the version, torch and CUDA the wheel was built with: it disagrees too.
    sbom_too = {"sbom"} if {"version", "torch_version", "cuda_version"} & set(change) else set()
    assert rules(report) == {"build-info"} | sbom_too
    assert next(iter(change)) in report.violations[0]


def test_build_info_arch_order_does_not_matter(wheel_factory, newest_row, build_info_for):
    archs = list(reversed(newest_row.archs))
    report = audit.check_wheel(
        wheel_factory(build_info=build_info_for(newest_row, archs=archs)), newest_row
    )
    assert report.violations == []


def test_sbom_missing_or_disagreeing(wheel_factory, newest_row):
    sbom_name = f"hotloop-{newest_row.version}.dist-info/sboms/hotloop.cdx.json"
    report = audit.check_wheel(wheel_factory(extra={sbom_name: "{}"}), newest_row)
    assert rules(report) == {"sbom"}
    assert "not a CycloneDX document" in report.violations[0]


@pytest.mark.parametrize(
    ("source", "finding"),
    [
        ("BUILD_INFO = {[]: 1}\n", "missing or has no BUILD_INFO dict"),
        ("BUILD_INFO = " + "[" * 5000 + "]" * 5000 + "\n", "missing or has no BUILD_INFO dict"),
        ("BUILD_INFO = {'archs': ['sm_90', 5]}\n", "archs is ['sm_90', 5]"),
    ],
    ids=["unhashable-key", "nested-too-deep", "mixed-archs"],
)
def test_an_oddly_shaped_build_info_is_a_finding_not_a_crash(
    wheel_factory, newest_row, source, finding
):
    report = audit.check_wheel(wheel_factory(build_info=source), newest_row)
    assert "build-info" in rules(report)
    assert any(finding in v for v in report.violations), report.violations


def test_build_info_missing(wheel_factory, newest_row):
    report = audit.check_wheel(wheel_factory(build_info="X = 1\n"), newest_row)
    assert rules(report) == {"build-info"}


# -------------------------------------------------------------------------------- the zip


@pytest.mark.parametrize(
    ("member", "reason"),
    [
        ("../../evil", "'..' climbs out"),
        ("hotloop/../../evil", "'..' climbs out"),
        ("/etc/evil", "absolute path"),
        ("hotloop\\evil.py", "backslash"),
        ("evil.pth", "runs code at every interpreter start"),
        ("torch/__init__.py", "overwrites torch's own files"),
        ("hotloop-{version}.data/purelib/sitecustomize.py", "a .data folder"),
        ("hotloop-{version}.data/scripts/hotloop", "a .data folder"),
        ("sitecustomize.py", "outside hotloop/"),
        ("hotloop_extra/x.py", "outside hotloop/"),
        ("hotloop-9.9.9.dist-info/METADATA", "outside hotloop/"),
        ("hotloop//x.py", "empty or '.' path segment"),
    ],
)
def test_member_paths(wheel_factory, newest_row, member, reason):
    name = member.format(version=newest_row.version)
    report = audit.check_wheel(wheel_factory(extra={name: "x = 1\n"}), newest_row)
    assert rules(report) == {"member-paths"}
    assert repr(name) in report.violations[0]
    assert reason in report.violations[0]


def test_libs_folder_and_dist_info_are_allowed(wheel_factory, newest_row, elf_libs):
    extra = {
        "hotloop.libs/libhelper-1a2b3c4d.so.1": elf_libs["no_torch"],
        f"hotloop-{newest_row.version}.dist-info/licenses/LICENSE": "BSD\n",
    }
    assert audit.check_wheel(wheel_factory(extra=extra), newest_row).violations == []


@pytest.mark.parametrize(
    "member", ["hotloop_cuda.cpython-312-x86_64-linux-gnu.so", "hotloop_cuda/__init__.py"]
)
def test_top_level_modules_the_table_names_are_allowed(wheel_factory, newest_row, elf_libs, member):
    """causal-conv1d, flash-attn and mamba build their extension as a top-level module
    (``causal_conv1d_cuda``) next to their package: the table names it, the audit takes it."""
    wheel = wheel_factory(extra={member: elf_libs["no_torch"]})
    refused = audit.check_wheel(wheel, newest_row)
    assert rules(refused) == {"member-paths"}
    table = dataclasses.replace(own_project(), top_level_modules=("hotloop_cuda",))
    assert audit.check_wheel(wheel, newest_row, project=table).violations == []


def test_an_import_name_that_is_a_lone_extension_module_is_allowed(
    wheel_factory, newest_row, elf_libs
):
    """flash-attention's csrc/rotary builds ``rotary_emb`` as one extension module and no
    package: ``import rotary_emb`` loads ``rotary_emb.cpython-312-x86_64-linux-gnu.so``."""
    table = dataclasses.replace(own_project(), import_name="hotloop_ext")
    wheel = wheel_factory(
        extra={"hotloop_ext.cpython-312-x86_64-linux-gnu.so": elf_libs["no_torch"]}
    )
    report = audit.check_wheel(wheel, newest_row, project=table)
    assert not [v for v in report.violations if "hotloop_ext.cpython" in v], report.violations
    # a module of another name, and a folder that is not the package, stay refused
    for other in ("hotloop_extra.cpython-312-x86_64-linux-gnu.so", "hotloop_ext.so.d/x.py"):
        report = audit.check_wheel(wheel_factory(extra={other: "x"}), newest_row, project=table)
        assert [v for v in report.violations if repr(other) in v], (other, report.violations)


def test_a_top_level_module_the_table_does_not_name_is_refused_naming_those_it_does(
    wheel_factory, newest_row
):
    table = dataclasses.replace(own_project(), top_level_modules=("hotloop_cuda",))
    wheel = wheel_factory(extra={"other_cuda.abi3.so": "x"})
    report = audit.check_wheel(wheel, newest_row, project=table)
    assert rules(report) == {"member-paths"}
    assert "or the top-level modules hotloop_cuda" in report.violations[0]


def test_duplicate_members(wheel_factory, newest_row):
    wheel = wheel_factory()
    with pytest.warns(UserWarning, match="Duplicate name"), zipfile.ZipFile(wheel, "a") as zf:
        zf.writestr("hotloop/__init__.py", "")  # same bytes: RECORD still matches
    report = audit.check_wheel(wheel, newest_row)
    assert rules(report) == {"no-duplicates"}
    assert "hotloop/__init__.py appears 2 times" in report.violations[0]


def test_record_hash_and_size_must_match(wheel_factory, newest_row):
    def tamper(members: dict[str, bytes]) -> None:
        members["hotloop/__init__.py"] = b"import os; os.system('evil')\n"

    report = audit.check_wheel(rewrite_wheel(wheel_factory(), tamper), newest_row)
    assert rules(report) == {"record"}
    text = "\n".join(report.violations)
    assert "hotloop/__init__.py: sha256 is" in text
    assert "hotloop/__init__.py: 29 bytes, RECORD says '0'" in text


def test_record_must_list_every_file(wheel_factory, newest_row):
    def add(members: dict[str, bytes]) -> None:
        members["hotloop/unlisted.py"] = b"x = 1\n"

    report = audit.check_wheel(rewrite_wheel(wheel_factory(), add), newest_row)
    assert report.violations == ["record: hotloop/unlisted.py is not listed in RECORD"]


def test_record_lists_a_missing_file(wheel_factory, newest_row):
    def drop(members: dict[str, bytes]) -> None:
        del members["hotloop/__init__.py"]

    report = audit.check_wheel(rewrite_wheel(wheel_factory(), drop), newest_row)
    assert report.violations == [
        "record: RECORD lists hotloop/__init__.py, which the wheel does not contain"
    ]


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("hotloop/__init__.py,md5=1B2M2Y8AsgTpgAmY7PhCfg,0", "need sha256="),
        ("hotloop/__init__.py,,0", "need sha256="),
        (
            "hotloop/__init__.py,sha256=47DEQpj8HBSa-_TImW-5JCeuQeRkm5NMpJWZG3hSuFU,7",
            "RECORD says '7'",
        ),
        ("hotloop/__init__.py,sha256", "has 2 fields"),
    ],
    ids=["md5", "no-hash", "size", "fields"],
)
def test_record_entries(wheel_factory, newest_row, entry, message):
    record = record_of(newest_row)

    def edit(members: dict[str, bytes]) -> None:
        lines = members[record].decode().splitlines()
        members[record] = "\n".join(
            entry if line.startswith("hotloop/__init__.py,") else line for line in lines
        ).encode()

    report = audit.check_wheel(rewrite_wheel(wheel_factory(), edit), newest_row)
    assert "record" in rules(report)
    assert message in "\n".join(report.violations)


def test_record_missing(wheel_factory, newest_row):
    record = record_of(newest_row)

    def drop(members: dict[str, bytes]) -> None:
        del members[record]

    report = audit.check_wheel(rewrite_wheel(wheel_factory(), drop), newest_row)
    assert report.violations == [f"record: {record} is missing"]


def test_corrupt_member_is_a_finding_not_a_crash(wheel_factory, newest_row):
    wheel = rewrite_wheel(wheel_factory(), lambda members: None, stored=True)
    data = bytearray(wheel.read_bytes())
    offset = data.index(b"BUILD_INFO = ")
    data[offset : offset + 5] = b"XXXXX"  # stored data changed under its CRC
    wheel.write_bytes(bytes(data))
    report = audit.check_wheel(wheel, newest_row)
    text = "\n".join(report.violations)
    assert "hotloop/_build_info.py cannot be read from the zip: Bad CRC-32" in text
    assert "record" in rules(report)


def test_truncated_zip_raises_a_clear_error(wheel_factory, newest_row):
    wheel = wheel_factory()
    wheel.write_bytes(wheel.read_bytes()[:300])
    with pytest.raises(audit.AuditError, match="not a readable zip archive"):
        audit.check_wheel(wheel, newest_row)


# ----------------------------------------------------------------------------- libraries


@pytest.mark.parametrize(
    "name",
    [
        "hotloop.libs/libtorch_cpu.so",
        "hotloop.libs/libc10-1a2b3c.so",
        "hotloop.libs/libcudart.so.13",
        "hotloop.libs/libcufft.so.12",
        "hotloop.libs/libcurand-1a2b3c4d.so.10",
        "hotloop.libs/libcusolver.so.12",
        "hotloop.libs/libnvJitLink.so.13",
        "hotloop.libs/libnccl.so.2",
        "hotloop.libs/libgomp-a34b3233.so.1",
    ],
)
def test_bundled_torch_or_cuda_lib(wheel_factory, newest_row, elf_libs, name):
    report = audit.check_wheel(wheel_factory(extra={name: elf_libs["no_torch"]}), newest_row)
    assert rules(report) == {"no-bundled-libs"}
    assert name in report.violations[0]


@pytest.mark.parametrize(
    "name",
    ["hotloop.libs/libfoo_from_torch.so.1", "hotloop.libs/libfoo_from_torch-0a1b2c3d.so.1"],
    ids=["plain", "auditwheel-renamed"],
)
def test_lib_that_torch_provides_is_caught_by_name(wheel_factory, newest_row, elf_libs, name):
    wheel = wheel_factory(extra={name: elf_libs["no_torch"]})
    report = audit.check_wheel(wheel, newest_row, provided_by_torch=["libfoo_from_torch.so.1"])
    assert rules(report) == {"no-bundled-libs"}
    assert "torch's installation provides libfoo_from_torch.so.1" in report.violations[0]


@pytest.mark.parametrize(
    "name", ["hotloop.libs/libcuda-1a2b3c4d.so.1", "hotloop.libs/libnvidia-ml.so.1"]
)
def test_a_bundled_driver_library_is_named_the_drivers(wheel_factory, newest_row, elf_libs, name):
    """An extension that links the driver API (-lcuda) or NVML needs them from the machine's
    driver: a copy in the wheel is the builder's driver, wrong on every other machine."""
    report = audit.check_wheel(wheel_factory(extra={name: elf_libs["no_torch"]}), newest_row)
    assert rules(report) == {"no-bundled-libs"}
    assert "the NVIDIA driver's" in report.violations[0]
    assert "from torch" not in report.violations[0]


def test_only_shared_libraries_are_judged_by_name():
    assert libraries.forbidden_reason("hotloop/libcufft_notes.txt", []) is None
    assert libraries.forbidden_reason("hotloop/_C.abi3.so", ["libc10.so"]) is None
    assert libraries.unhashed("libcufft-1a2b3c4d.so.11.0") == "libcufft.so.11.0"


def test_torch_provided_libs(tmp_path):
    for rel in (
        "torch/lib/libtorch_cpu.so",
        "torch/lib/libc10.so",
        "nvidia/cu13/lib/libcublas.so.13",
    ):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(b"")
    assert audit.torch_provided_libs(tmp_path) == [
        "libc10.so",
        "libcublas.so.13",
        "libtorch_cpu.so",
    ]


def _dist(site: Path, name: str, requires: tuple[str, ...], files: tuple[str, ...]) -> None:
    dist_info = site / f"{name}-1.0.dist-info"
    dist_info.mkdir(parents=True)
    headers = "".join(f"Requires-Dist: {r}\n" for r in requires)
    (dist_info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\n{headers}\nText\n")
    (dist_info / "RECORD").write_text("".join(f"{f},sha256=x,1\n" for f in files))


def test_torch_provided_libs_follow_torch_requirements_and_nvidia_packages(tmp_path):
    # Libraries in places no glob looks at: only the RECORDs can say they are torch's.
    # nvidia-cufft is required by nobody here, but it is an NVIDIA package: its libraries count.
    _dist(
        tmp_path,
        "torch",
        ("cuda-toolkit[cublas]==13.0.2; platform_system == 'Linux'", "filelock"),
        (
            "torch/lib/libtorch_cpu.so",
            "torch/__init__.py",
            "torch/_C.cpython-312-x86_64-linux-gnu.so",
        ),
    )
    _dist(tmp_path, "cuda_toolkit", ("nvidia-cublas==13.0.0; extra == 'cublas'",), ())
    _dist(tmp_path, "nvidia_cublas", (), ("nvidia/cu13/lib64/libcublas.so.13",))
    _dist(tmp_path, "nvidia_cufft", (), ("cufft_libs/libcufft.so.12", "cufft_libs/_x.abi3.so"))
    _dist(tmp_path, "filelock", (), ("filelock/__init__.py",))
    _dist(tmp_path, "numpy", (), ("numpy/_core/libopenblas.so",))  # not torch's
    assert audit.torch_provided_libs(tmp_path) == [
        "libcublas.so.13",
        "libcufft.so.12",
        "libtorch_cpu.so",
    ]


def test_auditwheel_command_excludes_torch_and_cuda(tmp_path):
    cmd = audit.auditwheel_command(tmp_path / "x.whl", tmp_path / "out", ["libcublas.so.13"])
    excludes = [cmd[i + 1] for i, a in enumerate(cmd) if a == "--exclude"]
    assert excludes == [
        "libtorch*.so",
        "libc10*.so",
        "libcudart.so.*",
        "libcuda.so.*",
        "libnvidia-ml.so.*",
        "libcublas.so.13",
    ]
    assert cmd[cmd.index("--plat") + 1] == "manylinux_2_28_x86_64"


@pytest.mark.parametrize("cut", [16, 200], ids=["header", "sections"])
def test_malformed_elf(wheel_factory, newest_row, elf_libs, cut):
    wheel = wheel_factory(extra={"hotloop/_helper.so": elf_libs["no_torch"][:cut]})
    report = audit.check_wheel(wheel, newest_row)
    assert rules(report) == {"elf-readable"}
    assert "hotloop/_helper.so is not a readable ELF file" in report.violations[0]


def test_glibc_too_new(wheel_factory, newest_row, elf_libs):
    wheel = wheel_factory(extra={"hotloop/_helper.so": elf_libs["new_glibc"]})
    report = audit.check_wheel(wheel, newest_row)
    assert rules(report) == {"glibc-version"}
    assert "GLIBC_2.32" in report.violations[0]
    assert "hotloop/_helper.so" in report.violations[0]


def test_glibcxx_too_new(wheel_factory, newest_row, elf_libs):
    wheel = wheel_factory(extra={"hotloop/_helper.so": elf_libs["new_glibcxx"]})
    report = audit.check_wheel(wheel, newest_row)
    assert rules(report) == {"glibcxx-version"}
    assert "GLIBCXX_3.4.26" in report.violations[0]


@pytest.mark.parametrize(
    ("lib", "found"),
    [
        ("build_runpath", "RUNPATH '/root/.pyenv/versions/3.13.0/lib'"),
        ("old_rpath", "RPATH '/opt/build/lib'"),
    ],
)
def test_library_search_path_outside_the_wheel(wheel_factory, newest_row, elf_libs, lib, found):
    # A wheel built with pyenv's Python carried the build interpreter's lib folder as RUNPATH:
    # a machine path, searched for torch's libraries on every user's machine.
    wheel = wheel_factory(extra={"hotloop/libhotloop_ops.so": elf_libs[lib]})
    report = audit.check_wheel(wheel, newest_row)
    assert rules(report) == {"search-path"}
    assert f"hotloop/libhotloop_ops.so has {found}" in report.violations[0]
    assert "$ORIGIN" in report.violations[0]


def test_the_builds_own_folders_leave_the_search_paths(wheel_factory, newest_row, tmp_path) -> None:
    """bitsandbytes' CMake left the pipeline's toolkit, where it linked libcudart, as its
    library's RUNPATH (CMake keeps a build's link folders in what it builds), and the audit
    refused the wheel for a folder of the builder; a project linking ${TORCH_LIBRARIES} got
    the build venv's torch/lib and torch's CMake config's /lib/intel64 too. Entries naming the
    folders the pipeline built in, and those, are dropped after the repair; any other entry
    stays for the search-path rule."""
    build = tmp_path / "builder"
    libs = {
        "toolkit_and_origin": f"-Wl,-rpath,{build}/cuda/lib64:$ORIGIN/../hotloop.libs",
        "cmake_torch": f"-Wl,-rpath,/lib/intel64:{build}/work/venv/torch/lib:/lib/win-x64",
        "old_rpath_of_the_sysroot": f"-Wl,--disable-new-dtags,-rpath,{build}/sysroot/lib:$ORIGIN",
        "elsewhere": "-Wl,-rpath,/opt/build/lib:/lib/intel64x",
    }
    extra = {
        f"hotloop/lib{name}.so": compile_cxx(tmp_path, name, STABLE_SHIM_CPP, flag)
        for name, flag in libs.items()
    }
    wheel = wheel_factory(extra=extra)
    folders = audit.droppable_search_paths([build / "cuda", build / "sysroot", build / "work"])
    ours, mkl = "(a folder of this build, which no user has)", "(from torch's CMake config, "
    dropped = audit.drop_search_paths(wheel, folders)
    assert [entry.split(" (")[0] for entry in dropped] == [
        "hotloop/libcmake_torch.so: RUNPATH '/lib/intel64'",
        f"hotloop/libcmake_torch.so: RUNPATH '{build}/work/venv/torch/lib'",
        "hotloop/libcmake_torch.so: RUNPATH '/lib/win-x64'",
        f"hotloop/libold_rpath_of_the_sysroot.so: RPATH '{build}/sysroot/lib'",
        f"hotloop/libtoolkit_and_origin.so: RUNPATH '{build}/cuda/lib64'",
    ]
    assert [ours in entry for entry in dropped] == [False, True, False, True, True]
    assert [mkl in entry for entry in dropped] == [True, False, True, False, False]
    with zipfile.ZipFile(wheel) as zf:
        paths = {name: elf.read_elf(zf.read(f"hotloop/lib{name}.so")).search_paths for name in libs}
    assert paths == {
        "toolkit_and_origin": (("RUNPATH", "$ORIGIN/../hotloop.libs"),),
        "cmake_torch": (),
        "old_rpath_of_the_sysroot": (("RPATH", "$ORIGIN"),),  # still the old kind
        "elsewhere": (("RUNPATH", "/opt/build/lib"), ("RUNPATH", "/lib/intel64x")),
    }
    report = audit.check_wheel(wheel, newest_row)
    assert rules(report) == {"search-path"}  # the RECORD matches the rewritten libraries
    assert ["/opt/build/lib" in v for v in report.violations] == [True, False]
    # a wheel with nothing to drop is left as it was
    before = wheel.read_bytes()
    assert audit.drop_search_paths(wheel, folders) == []
    assert wheel.read_bytes() == before


def test_library_search_path_inside_the_wheel_is_allowed(wheel_factory, newest_row, elf_libs):
    wheel = wheel_factory(extra={"hotloop/libhotloop_ops.so": elf_libs["origin_runpath"]})
    assert audit.check_wheel(wheel, newest_row).violations == []


def test_parse_version():
    assert audit.parse_version("GLIBC_2.2.5") == ("GLIBC", (2, 2, 5))
    assert audit.parse_version("GLIBC_PRIVATE") is None
    assert audit.max_versions(["GLIBC_2.2.5", "GLIBC_2.14", "GLIBCXX_3.4.9", "GLIBCXX_3.4.21"]) == {
        "GLIBC": (2, 14),
        "GLIBCXX": (3, 4, 21),
    }


# ----------------------------------------------------------------------- stable ABI


@STABLE_ONLY
@pytest.mark.parametrize("member", ["hotloop/libhotloop_ops.so", "hotloop/_helper.so"])
def test_stable_wheel_with_unstable_symbols(wheel_factory, newest_row, elf_libs, member):
    report = audit.check_wheel(wheel_factory(extra={member: elf_libs["unstable"]}), newest_row)
    assert rules(report) == {"torch-stable-abi"}
    message = report.violations[0]
    assert f"{member} references 2 libtorch symbol(s) outside the stable ABI" in message
    assert "at::numel_of(at::Tensor const&)" in message
    assert "c10::get_default_device()" in message


@PINNED_ONLY
def test_pinned_wheel_may_use_libtorch_cpp_symbols(wheel_factory, newest_row, elf_libs):
    wheel = wheel_factory(extra={"hotloop/libhotloop_ops.so": elf_libs["unstable"]})
    assert audit.check_wheel(wheel, newest_row).violations == []


@STABLE_ONLY
def test_stable_ops_library_must_use_the_shim(wheel_factory, newest_row, elf_libs):
    # An ops library without a single shim symbol is no stable build, or nm could not read it.
    report = audit.check_wheel(
        wheel_factory(extra={"hotloop/libhotloop_ops.so": elf_libs["no_torch"]}), newest_row
    )
    assert rules(report) == {"torch-stable-abi"}
    assert "references no stable-ABI shim symbol" in report.violations[0]


@STABLE_ONLY
def test_stable_wheel_needing_a_newer_torch(wheel_factory, newest_row, elf_libs):
    report = audit.check_wheel(
        wheel_factory(extra={"hotloop/_helper.so": elf_libs["newer_shim"]}), newest_row
    )
    assert rules(report) == {"stable-abi-floor"}
    assert (
        "hotloop/_helper.so needs torch >= 2.11.0 (for torch_from_blob)" in (report.violations[0])
    )
    assert "torch>=2.10" in report.violations[0]


@STABLE_ONLY
def test_stable_wheel_with_shims_newer_than_the_tool_knows(wheel_factory, newest_row, elf_libs):
    report = audit.check_wheel(
        wheel_factory(extra={"hotloop/_helper.so": elf_libs["unknown_shim"]}), newest_row
    )
    assert rules(report) == {"stable-abi-floor"}
    assert "torch_hotloop_made_up_shim" in report.violations[0]


@STABLE_ONLY
def test_stable_rules_fail_when_torch_abi_audit_cannot_run(wheel_factory, newest_row, monkeypatch):
    def not_installed(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(stable_abi.importlib.metadata, "version", not_installed)
    report = audit.check_wheel(wheel_factory(), newest_row)
    assert rules(report) == {"torch-stable-abi", "stable-abi-floor"}
    assert f"pip install '{stable_abi.REQUIREMENT}'" in report.violations[0]


@STABLE_ONLY
def test_stable_rules_need_the_pinned_torch_abi_audit(wheel_factory, newest_row, monkeypatch):
    monkeypatch.setattr(stable_abi, "PINNED_VERSION", "0.0.1")
    report = audit.check_wheel(wheel_factory(), newest_row)
    assert rules(report) == {"torch-stable-abi", "stable-abi-floor"}
    assert "the pipeline pins 0.0.1" in report.violations[0]


def test_torch_abi_audit_pin_is_installed_here():
    # The stable rules run in this environment: the pin in scripts/tools.py is what it has.
    assert importlib.metadata.version("torch-abi-audit") == stable_abi.PINNED_VERSION


# -------------------------------------------------------------------------------- command


def test_failure_names_wheel_and_rule(wheel_factory, newest_row, elf_libs):
    wheel = wheel_factory(extra={"hotloop/_helper.so": elf_libs["new_glibc"]}, requires=())
    report = audit.check_wheel(wheel, newest_row)
    with pytest.raises(audit.AuditError) as info:
        audit.raise_on_violations(wheel.name, report)
    lines = str(info.value).splitlines()
    assert {line.split(": ")[1] for line in lines} == {"glibc-version", "requires-torch"}
    assert all(line.startswith(wheel.name + ": ") for line in lines)


@pytest.mark.parametrize(
    ("label", "torch"),
    [("stable.cu13", "2.11.0"), ("stable.cu12", "2.10.0"), ("pt29cu128", "2.9.1")],
)
def test_row_for_wheel_is_the_build_row(label, torch):
    wheel = Path(f"hotloop-0.1.0+{label}-cp39-abi3-manylinux_2_28_x86_64.whl")
    row = audit.row_for_wheel(wheel, ROWS)
    assert (row.torch, row.is_build, row.variant) == (torch, True, label)


def test_command_audits_wheels_built_elsewhere(wheel_factory, elf_libs, tmp_path, capsys):
    # python -m scripts.audit: the row comes from the wheel's label; exit 1 on any rule.
    good = wheel_factory()
    assert audit.main([str(good), "--skip-abi3audit"]) == 0
    out = capsys.readouterr().out
    assert f"{good.name}: ok (GLIBC_" in out
    assert "audited 1 wheel(s): 1 ok, 0 failed" in out

    bad = wheel_factory(extra={"hotloop.libs/libcudart.so.13": elf_libs["no_torch"]})
    assert audit.main([str(bad), "--skip-abi3audit"]) == 1
    assert f"{bad.name}: no-bundled-libs: hotloop.libs/libcudart.so.13" in capsys.readouterr().err

    torch_site = tmp_path / "site"
    (torch_site / "torch" / "lib").mkdir(parents=True)
    (torch_site / "torch" / "lib" / "libfoo_from_torch.so.1").write_bytes(b"")
    provided = wheel_factory(extra={"hotloop.libs/libfoo_from_torch.so.1": elf_libs["no_torch"]})
    argv = [str(provided), "--skip-abi3audit", "--torch-site", str(torch_site)]
    assert audit.main(argv) == 1
    assert "libfoo_from_torch.so.1" in capsys.readouterr().err


def test_command_names_the_rows_when_the_label_is_unknown(wheel_factory, capsys):
    wheel = wheel_factory(version="0.1.0+pt299cu999")
    assert audit.main([str(wheel), "--skip-abi3audit"]) == 1
    err = capsys.readouterr().err
    assert "'0.1.0+pt299cu999' names no matrix row" in err
    assert "pt29cu128, stable.cu12, stable.cu13" in err


def test_command_gives_every_wheel_a_verdict(wheel_factory, elf_libs, tmp_path, capsys):
    truncated = copy_to(wheel_factory(), tmp_path / "truncated")
    truncated.write_bytes(truncated.read_bytes()[:400])
    broken_elf = copy_to(
        wheel_factory(extra={"hotloop/_helper.so": elf_libs["no_torch"][:200]}),
        tmp_path / "broken_elf",
    )
    good = copy_to(wheel_factory(), tmp_path / "good")
    missing = tmp_path / "gone" / good.name
    not_a_wheel = tmp_path / "notes.txt"
    not_a_wheel.write_text("x")
    folder = tmp_path / "folder.whl"
    folder.mkdir()
    paths = [truncated, broken_elf, missing, not_a_wheel, folder, good]

    assert audit.main([*map(str, paths), "--skip-abi3audit"]) == 1
    captured = capsys.readouterr()
    assert f"{good.name}: ok (" in captured.out
    assert "audited 6 wheel(s): 1 ok, 5 failed" in captured.out
    err = captured.err
    assert f"{truncated.name}: not a readable zip archive" in err
    assert f"{broken_elf.name}: elf-readable: hotloop/_helper.so is not a readable ELF" in err
    assert f"{missing.name}: no such file: {missing}" in err
    assert "notes.txt: not a wheel file name" in err
    assert "folder.whl: not a file" in err
    assert err.count(": FAILED") == 5


def test_command_reports_a_crash_and_goes_on(wheel_factory, tmp_path, monkeypatch, capsys):
    from scripts.audit import command

    first = copy_to(wheel_factory(), tmp_path / "first")
    second = copy_to(wheel_factory(), tmp_path / "second")
    calls: list[Path] = []
    real_check = command.check_wheel

    def check_once_then_crash(path: Path, *args: object) -> audit.AuditReport:
        calls.append(path)
        if len(calls) == 1:
            raise KeyError("a case no rule foresaw")
        return real_check(path, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(command, "check_wheel", check_once_then_crash)
    assert audit.main([str(first), str(second), "--skip-abi3audit"]) == 1
    captured = capsys.readouterr()
    assert f"{first.name}: audit crashed: KeyError" in captured.err
    assert "audited 2 wheel(s): 1 ok, 1 failed" in captured.out


def test_command_runs_abi3audit_unless_skipped(wheel_factory, monkeypatch, capsys):
    from scripts.audit import command

    seen: list[str] = []

    def fake_abi3audit(path: Path) -> str:
        seen.append(path.name)
        raise audit.AuditError(f"{path.name}: abi3audit: --strict failed (exit 1):\nPyFoo")

    monkeypatch.setattr(command, "run_abi3audit", fake_abi3audit)
    wheel = wheel_factory()
    assert audit.main([str(wheel)]) == 1
    assert seen == [wheel.name]
    assert f"{wheel.name}: abi3audit: --strict failed" in capsys.readouterr().err


def test_repair_refuses_a_folder_holding_wheels_it_did_not_write(wheel_factory, tmp_path):
    """auditwheel's output folder may hold the caller's wheels: they are never deleted."""
    out = tmp_path / "out"
    out.mkdir()
    theirs = out / "hotloop-0.0.9+stable.cu13-cp39-abi3-manylinux_2_28_x86_64.whl"
    theirs.write_bytes(b"an older release")
    with pytest.raises(audit.AuditError, match=r"holds .*hotloop-0\.0\.9.*\.whl.*empty folder"):
        audit.repair_wheel(wheel_factory(), out)
    assert theirs.read_bytes() == b"an older release"


# ----------------------------------------------------------------------- device code


def test_fatbin_targets_are_read_from_the_section(with_fatbin, elf_libs):
    library = with_fatbin(elf_libs["no_torch"], [(2, 80), (2, 90), (1, 90)])
    facts = audit.elf.read_elf(library)
    assert facts.device_code == ("compute_90", "sm_80", "sm_90")
    assert audit.elf.read_elf(elf_libs["no_torch"]).device_code == ()


def test_cuda_labelled_wheel_without_device_code_is_refused(wheel_factory, newest_row, elf_libs):
    # extension-cpp's setup.py builds CUDA only if torch.cuda.is_available(): on a builder
    # without a GPU it makes a CPU-only library that a CUDA label would misdescribe.
    wheel = wheel_factory(extra={"hotloop/_C.abi3.so": elf_libs["good"]})
    report = audit.check_wheel(wheel, newest_row)
    assert rules(report) == {"device-code"}
    message = report.violations[0]
    assert f"labelled for CUDA {newest_row._variant.cuda} ({newest_row.version})" in message
    assert "torch.cuda.is_available()" in message
    assert "FORCE_CUDA=1" in message
    assert "TORCH_CUDA_ARCH_LIST" in message


def test_cpu_labelled_wheel_needs_no_device_code(wheel_factory, newest_row, elf_libs):
    cpu_label = re.sub(r"cu[0-9]+$", "cpu", newest_row.variant)
    wheel = wheel_factory(
        extra={"hotloop/_C.abi3.so": elf_libs["good"]}, version=f"0.1.0+{cpu_label}"
    )
    report = audit.check_wheel(wheel, newest_row)
    assert "device-code" not in rules(report)
    assert "version-label" in rules(report)  # a CPU wheel is not the row's CUDA wheel


def test_cpu_labelled_wheel_with_device_code_is_refused(wheel_factory, newest_row, elf_libs):
    """A CPU build whose setup.py compiled CUDA anyway (the builder's own nvcc on PATH): its
    wheel would claim to be the CPU variant and hold kernels for a CUDA it never names."""
    cpu_label = re.sub(r"cu[0-9]+$", "cpu", newest_row.variant)
    wheel = wheel_factory(
        extra={"hotloop/_C.abi3.so": elf_libs["cuda"]}, version=f"0.1.0+{cpu_label}"
    )
    report = audit.check_wheel(wheel, newest_row)
    assert "device-code" in rules(report)
    [message] = [v for v in report.violations if "labelled for the CPU" in v]
    assert f"labelled for the CPU (0.1.0+{cpu_label}) but hotloop/_C.abi3.so holds" in message
    assert "builder's own" in message


def test_listed_library_missing(wheel_factory, newest_row):
    def drop_ops(members: dict[str, bytes]) -> None:
        del members["hotloop/libhotloop_ops.so"]

    report = audit.check_wheel(rewrite_wheel(wheel_factory(), drop_ops), newest_row)
    assert "libraries" in rules(report)
    assert "no member matches 'hotloop/libhotloop_ops.so'" in "\n".join(report.violations)


# ------------------------------------------------------------------- the PyPI upload's wheel


def release_wheel(wheel_factory, row, tmp_path: Path) -> Path:
    """A wheel as finalize_release writes it: the SBOM scripts.sbom makes for its build info."""
    raw = wheel_factory(with_sbom=False)
    with zipfile.ZipFile(raw) as zf:
        info = sbom.wheel_build_info(zf)
    inputs = sbom.SbomInputs(
        "hotloop",
        raw.name, row.version, info["torch_version"], info["cuda_version"], row.arch_list,
        tuple(info["archs"]), (("g++", "g++ (Debian 12.2.0-14+deb12u1) 12.2.0"),), (), (),
        1700000000,
    )  # fmt: skip
    document = sbom.build_sbom(inputs)
    return reproducible.finalize_wheel(
        raw, tmp_path / "final" / raw.name, 1700000000, {sbom.sbom_path("hotloop"): document}
    )


@STABLE_ONLY
def test_the_pypi_upload_describes_itself_and_passes_the_audit(wheel_factory, newest_row, tmp_path):
    source = release_wheel(wheel_factory, newest_row, tmp_path)
    assert audit.check_wheel(source, newest_row).violations == []
    public = pypi_release.public_wheel(source, tmp_path / "pypi")
    assert public.name == "hotloop-0.1.0-cp39-abi3-manylinux_2_28_x86_64.whl"
    # What gets uploaded passes the audit, from the command line too (no label to go by).
    assert audit.check_wheel(public, newest_row).violations == []
    assert audit.audit_file(public, matrix.load_rows(), [], abi3=False).problems == []
    with zipfile.ZipFile(source) as a, zipfile.ZipFile(public) as b:
        info = sbom.wheel_build_info(b)
        assert info is not None
        assert (info["version"], info["variant"]) == ("0.1.0", "stable.cu13")
        assert info == {**sbom.wheel_build_info(a), "version": "0.1.0"}
        root = json.loads(b.read(f"hotloop-0.1.0.dist-info/{sbom.sbom_path('hotloop')}"))[
            "metadata"
        ]
        assert root["component"]["version"] == "0.1.0"
        assert root["component"]["purl"] == "pkg:pypi/hotloop@0.1.0"
        assert public.name in root["component"]["description"]
        # The code is the stable wheel's, byte for byte.
        code = [n for n in a.namelist() if not n.startswith("hotloop-")]
        assert code == [n for n in b.namelist() if not n.startswith("hotloop-")]
        for name in code:
            if name != "hotloop/_build_info.py":
                assert a.read(name) == b.read(name), name
        old, new = a.read("hotloop/_build_info.py"), b.read("hotloop/_build_info.py")
        assert new == old.replace(b"'0.1.0+stable.cu13'", b"'0.1.0'", 1)


@STABLE_ONLY
@pytest.mark.parametrize(
    ("change", "finding"),
    [
        ({"version": "0.1.0+stable.cu13"}, "build-info: version is '0.1.0+stable.cu13'"),
        ({"version": "0.1.0", "variant": "stable.cu12"}, "build-info: variant is 'stable.cu12'"),
    ],
    ids=["labelled-build-info", "other-variant"],
)
def test_a_public_version_wheel_must_say_so_inside(
    wheel_factory, newest_row, build_info_for, change, finding
):
    wheel = wheel_factory(version="0.1.0", build_info=build_info_for(newest_row, **change))
    violations = audit.check_wheel(wheel, newest_row).violations
    assert any(v.startswith(finding) for v in violations), violations


@PINNED_ONLY
def test_only_the_pypi_variant_may_carry_the_public_version(wheel_factory, newest_row):
    wheel = wheel_factory(version="0.1.0")
    violations = audit.check_wheel(wheel, newest_row).violations
    assert any(v.startswith("version-label: file name '0.1.0'") for v in violations), violations


# The first 48 bytes of the entry header nvcc 13.0 wrote for each -gencode (a 16-byte payload
# stands in for the code): the arch- and family-specific targets differ only in the flags.
NVCC_13_ENTRY_HEADERS = {
    "sm_90": "0200010140000000100000000000000000000000000000000800010"
    "05a0000000000000000000000110000000000000000000000",
    "sm_90a": "0200010140000000100000000000000000000000000000000800010"
    "05a0000000000000000000000110010000000000000000000",
    "compute_90a": "0100010140000000100000000000000000000000000000000000090"
    "05a0000000000000000000000118010000000000000000000",
    "sm_100f": "0200010140000000100000000000000000000000000000000800010"
    "0640000000000000000000000110020010000000000000000",
}


def test_fatbin_names_arch_and_family_specific_targets() -> None:
    """sm_90a is not sm_90: a build for "9.0;9.0a" holds both, and the report says so."""
    body = b"".join(
        bytes.fromhex(header).ljust(64, b"\0") + b"\0" * 16
        for header in NVCC_13_ENTRY_HEADERS.values()
    )
    section = struct.pack("<IHHQ", 0xBA55ED50, 1, 16, len(body)) + body
    assert audit.elf.fatbin.device_targets(section) == tuple(sorted(NVCC_13_ENTRY_HEADERS))


# ----------------------------------------------------------------------- per-Python wheels


@pytest.mark.parametrize(
    ("python_abi", "refused"), [("abi3", True), ("per-python", False), ("auto", False)]
)
def test_per_python_tag_follows_the_table(wheel_factory, newest_row, python_abi, refused):
    table = dataclasses.replace(own_project(), python_abi=python_abi)
    wheel = wheel_factory(tag="cp312-cp312-manylinux_2_28_x86_64")
    report = audit.check_wheel(wheel, newest_row, project=table)
    assert ("wheel-tag" in rules(report)) is refused


def test_per_python_tag_must_be_one_of_the_rows_pythons(wheel_factory, newest_row):
    table = dataclasses.replace(own_project(), python_abi="per-python")
    wheel = wheel_factory(tag="cp38-cp38-manylinux_2_28_x86_64")
    report = audit.check_wheel(wheel, newest_row, project=table)
    assert rules(report) == {"wheel-tag"}
    assert "need cp310-cp310 or" in report.violations[0]


def test_auto_takes_an_abi3_wheel_too(wheel_factory, newest_row):
    table = dataclasses.replace(own_project(), python_abi="auto")
    assert audit.check_wheel(wheel_factory(), newest_row, project=table).violations == []
