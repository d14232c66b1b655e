"""The SBOM each wheel carries: what it lists, that it is stable, and the audit rule ``sbom``."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest
from index_helpers import corrupt_member

from scripts import audit, reproducible, sbom

TORCH = "2.11.0+cu130"
CUDA = "13.0"


def inputs(**changes: object) -> sbom.SbomInputs:
    base = {
        "name": "hotloop",
        "wheel_name": "hotloop-0.1.0+stable.cu13-cp39-abi3-manylinux_2_28_x86_64.whl",
        "version": "0.1.0+stable.cu13",
        "torch_version": TORCH,
        "cuda_version": CUDA,
        "arch_list": "8.0;9.0+PTX",
        "archs": ("sm_80", "sm_90", "compute_90"),
        "compilers": (
            ("g++", "g++ (Debian 12.2.0-14+deb12u1) 12.2.0"),
            ("nvcc", "Build cuda_13.0.r13.0/compiler.36424714_0"),
        ),
        "toolkit": (
            sbom.Package("pypi", "nvidia-cuda-nvcc", "13.0.88", "ab" * 32, "installed RECORD"),
        ),
        "sysroot": (
            sbom.Package(
                "deb",
                "libc6",
                "2.31-13+deb11u11",
                "cd" * 32,
                qualifiers={"arch": "amd64", "distro": "debian-bullseye"},
            ),
        ),
        "epoch": 1700000000,
    }
    base.update(changes)
    return sbom.SbomInputs(**base)  # type: ignore[arg-type]


def components(document: dict) -> dict[str, dict]:
    return {c["name"]: c for c in document["components"]}


def test_lists_what_went_into_the_binary():
    document = json.loads(sbom.build_sbom(inputs()))
    assert document["bomFormat"] == "CycloneDX"
    assert document["specVersion"] == "1.6"
    found = components(document)
    assert found["torch"]["version"] == TORCH
    assert found["cuda"]["version"] == CUDA
    nvcc_pkg = found["nvidia-cuda-nvcc"]
    assert nvcc_pkg["purl"] == "pkg:pypi/nvidia-cuda-nvcc@13.0.88"
    assert nvcc_pkg["hashes"] == [{"alg": "SHA-256", "content": "ab" * 32}]
    libc = found["libc6"]
    assert libc["purl"].startswith("pkg:deb/debian/libc6@2.31-13%2Bdeb11u11?")
    assert libc["hashes"][0]["content"] == "cd" * 32
    assert found["g++"]["version"] == "12.2.0"
    assert found["nvcc"]["description"].startswith("Build cuda_13.0")
    props = sbom.sbom_properties(document)
    assert props[sbom.PROP_ARCH_LIST] == "8.0;9.0+PTX"
    assert props[sbom.PROP_ARCHS] == "sm_80,sm_90,compute_90"


def test_same_inputs_same_bytes_and_time_from_epoch():
    first, second = sbom.build_sbom(inputs()), sbom.build_sbom(inputs())
    assert first == second
    document = json.loads(first)
    assert document["metadata"]["timestamp"].startswith("2023-11-14T22:13:20")
    other = json.loads(sbom.build_sbom(inputs(epoch=1700000001)))
    assert other["serialNumber"] != document["serialNumber"]


def test_cpu_build_names_no_cuda():
    document = json.loads(sbom.build_sbom(inputs(cuda_version=None, arch_list=None, archs=())))
    assert "cuda" not in components(document)
    assert sbom.PROP_CUDA not in sbom.sbom_properties(document)


def test_deb_packages_from_apt_file_names(tmp_path):
    deb = tmp_path / "libc6-dev_2.31-13+deb11u11_amd64.deb"
    deb.write_bytes(b"not really a deb")
    epoch_deb = tmp_path / "tzdata_1%3a2024a-0_all.deb"
    epoch_deb.write_bytes(b"x")
    found = sbom.deb_packages([deb, epoch_deb], "debian-bullseye")
    assert [(p.name, p.version, p.qualifiers["arch"]) for p in found] == [
        ("libc6-dev", "2.31-13+deb11u11", "amd64"),
        ("tzdata", "1:2024a-0", "all"),
    ]
    assert found[0].sha256 == __import__("hashlib").sha256(b"not really a deb").hexdigest()
    with pytest.raises(ValueError, match="name_version_arch"):
        sbom.deb_packages([tmp_path / "weird.deb"], "x")


def test_installed_distributions_hash_their_record(tmp_path):
    info = tmp_path / "nvidia_cuda_nvcc-13.0.88.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: nvidia-cuda-nvcc\nVersion: 13.0.88\n"
    )
    (info / "RECORD").write_text("nvidia/cu13/bin/nvcc,sha256=abc,1\n")
    (pkg,) = sbom.installed_distributions(tmp_path)
    assert (pkg.name, pkg.version, pkg.hash_of) == (
        "nvidia-cuda-nvcc",
        "13.0.88",
        "installed RECORD",
    )
    assert pkg.sha256 == __import__("hashlib").sha256((info / "RECORD").read_bytes()).hexdigest()


# ------------------------------------------------------------------------- audit rule and reading


def wheel_with_sbom(wheel_factory, tmp_path: Path, document: bytes | None) -> Path:
    """A synthetic wheel (build info of the newest row), finalized with ``document`` as SBOM."""
    raw = wheel_factory(with_sbom=False)
    out = tmp_path / "final" / raw.name
    extra = {sbom.sbom_path("hotloop"): document} if document is not None else {}
    return reproducible.finalize_wheel(raw, out, 1700000000, extra)


def build_info(wheel: Path) -> dict:
    with zipfile.ZipFile(wheel) as zf:
        info = sbom.wheel_build_info(zf)
    assert info is not None
    return info


def test_check_passes_when_sbom_agrees_with_build_info(wheel_factory, tmp_path):
    info = build_info(wheel_factory(with_sbom=False))
    document = sbom.build_sbom(
        inputs(torch_version=info["torch_version"], cuda_version=info["cuda_version"])
    )
    wheel = wheel_with_sbom(wheel_factory, tmp_path, document)
    assert sbom.check_sbom(wheel) == []
    assert sbom.project_sbom(wheel) == document
    assert list(sbom.read_sboms(wheel)) == [sbom.sbom_name("hotloop")]


def test_check_missing_sbom(wheel_factory, tmp_path):
    wheel = wheel_with_sbom(wheel_factory, tmp_path, None)
    (problem,) = sbom.check_sbom(wheel)
    assert problem.startswith("sbom: ")
    assert "no .dist-info/sboms/hotloop.cdx.json" in problem


def test_check_not_json(wheel_factory, tmp_path):
    wheel = wheel_with_sbom(wheel_factory, tmp_path, b"{not json")
    (problem,) = sbom.check_sbom(wheel)
    assert "is not JSON" in problem


def test_check_not_cyclonedx(wheel_factory, tmp_path):
    wheel = wheel_with_sbom(wheel_factory, tmp_path, b'{"spdxVersion": "SPDX-2.3"}')
    (problem,) = sbom.check_sbom(wheel)
    assert "not a CycloneDX document" in problem


def test_check_wrong_torch_and_cuda(wheel_factory, tmp_path):
    info = build_info(wheel_factory(with_sbom=False))
    document = sbom.build_sbom(inputs(torch_version="2.9.1+cu128", cuda_version="12.8"))
    wheel = wheel_with_sbom(wheel_factory, tmp_path, document)
    problems = sbom.check_sbom(wheel)
    assert len(problems) == 2
    assert "torch '2.9.1+cu128'" in problems[0]
    assert repr(info["torch_version"]) in problems[0]
    assert "CUDA '12.8'" in problems[1]
    assert repr(info["cuda_version"]) in problems[1]


def test_project_sbom_keeps_others(wheel_factory, tmp_path):
    raw = wheel_factory(with_sbom=False)
    out = tmp_path / "final" / raw.name
    wheel = reproducible.finalize_wheel(
        raw, out, 1700000000, {sbom.sbom_path("hotloop"): b"{}", "sboms/auditwheel.cdx.json": b"[]"}
    )
    assert sbom.read_sboms(wheel) == {
        "auditwheel.cdx.json": b"[]",
        sbom.sbom_name("hotloop"): b"{}",
    }


def odd(**document: object) -> bytes:
    return json.dumps({"bomFormat": "CycloneDX", **document}).encode()


ROOT = {"name": "hotloop", "properties": []}


@pytest.mark.parametrize(
    ("document", "finding"),
    [
        (odd(metadata=[]), "metadata is a list, need an object"),
        (odd(metadata={"component": "hotloop"}), "metadata.component is a str, need an object"),
        (odd(metadata={"component": {"properties": {}}}), "properties is a dict, need a list"),
        (
            odd(metadata={"component": {"properties": [{"value": "2.11.0"}]}}),
            "metadata.component.properties[0] has no name",
        ),
        (
            odd(metadata={"component": {"properties": [{"name": 5, "value": "x"}]}}),
            "metadata.component.properties[0].name is a int, need a string",
        ),
        (odd(metadata={"component": ROOT}, components=["torch"]), "components[0] is a str"),
        (odd(metadata={"component": ROOT}, components={"torch": {}}), "components is a dict"),
        (
            odd(metadata={"component": ROOT}, components=[{"name": "torch", "version": 2}]),
            "components[0].version is a int, need a string",
        ),
        (b"[]", "not a CycloneDX document (bomFormat 'list')"),
    ],
    ids=[
        "metadata-list", "component-str", "properties-dict", "property-no-name",
        "property-name-int", "component-entry-str", "components-dict", "version-int",
        "document-list",
    ],
)  # fmt: skip
def test_an_oddly_shaped_sbom_is_a_finding_not_a_crash(
    wheel_factory, newest_row, tmp_path, document, finding
):
    """The audit reports the SBOM's shape, and the wheel's other rules still get their turn."""
    wheel = wheel_with_sbom(wheel_factory, tmp_path, document)
    problems = sbom.check_sbom(wheel)
    assert any(finding in p for p in problems), problems
    assert all(p.startswith("sbom: ") for p in problems)
    raw = wheel_factory(with_sbom=False, requires=("torch",))  # a second, unrelated problem
    broken = reproducible.finalize_wheel(
        raw, tmp_path / "both" / raw.name, 1700000000, {sbom.sbom_path("hotloop"): document}
    )
    report = audit.check_wheel(broken, newest_row)
    found = {v.split(":", 1)[0] for v in report.violations}
    assert {"sbom", "requires-torch"} <= found, report.violations
    assert any(finding in v for v in report.violations)


BUILT_WITH = [
    ["g++", "g++ (Debian 12.2.0-14+deb12u1) 12.2.0"],
    ["nvcc", "Build cuda_13.0.r13.0/compiler.36424714_0"],
]


@pytest.mark.parametrize("cxx", ["fake", "ccache g++"])
def test_the_sbom_names_the_compilers_the_build_ran_not_the_callers_cxx(
    wheel_factory, newest_row, build_info_for, tmp_path, monkeypatch, cxx
):
    """The SBOM step runs in the caller's environment, where $CXX may be anything (a fake
    compiler, a launcher and a compiler): the build recorded what it ran, and that is used."""
    fake = tmp_path / "fake"
    fake.write_text("#!/bin/sh\necho 'fakecc 99.9 (not what built the wheel)'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("CXX", str(fake) if cxx == "fake" else cxx)
    wheel = wheel_factory(build_info=build_info_for(newest_row, compilers=BUILT_WITH))
    found = sbom.collect_inputs(newest_row, wheel, None, None, 1700000000)
    assert [list(c) for c in found.compilers] == BUILT_WITH
    document = json.loads(sbom.build_sbom(found))
    assert components(document)["g++"]["description"] == BUILT_WITH[0][1]
    assert "fakecc" not in json.dumps(document)


def test_a_wheel_without_recorded_compilers_gets_no_guessed_ones(
    wheel_factory, newest_row, tmp_path
):
    with pytest.raises(ValueError, match=r"records no compilers.*rebuild it with this setup\.py"):
        sbom.collect_inputs(newest_row, wheel_factory(), None, None, 1700000000)


def test_the_audit_compares_the_sboms_compilers_with_the_build_info(
    wheel_factory, newest_row, build_info_for, tmp_path
):
    info = build_info(wheel_factory(with_sbom=False))
    document = sbom.build_sbom(
        inputs(torch_version=info["torch_version"], cuda_version=info["cuda_version"])
    )
    other = [["g++", "g++ (GCC) 14.1.0"], BUILT_WITH[1]]
    raw = wheel_factory(with_sbom=False, build_info=build_info_for(newest_row, compilers=other))
    wheel = reproducible.finalize_wheel(
        raw, tmp_path / "c" / raw.name, 1700000000, {sbom.sbom_path("hotloop"): document}
    )
    (problem,) = sbom.check_sbom(wheel)
    assert "sbom: names compilers" in problem
    assert "g++ (GCC) 14.1.0" in problem


def test_a_damaged_sbom_member_is_a_finding(wheel_factory, newest_row, tmp_path):
    info = build_info(wheel_factory(with_sbom=False))
    document = sbom.build_sbom(
        inputs(torch_version=info["torch_version"], cuda_version=info["cuda_version"])
    )
    wheel = wheel_with_sbom(wheel_factory, tmp_path, document)
    dist_info = reproducible.dist_info_dir(zipfile.ZipFile(wheel).namelist())
    name = f"{dist_info}/{sbom.sbom_path('hotloop')}"
    corrupt_member(wheel, name, zipfile.ZIP_DEFLATED)
    (problem,) = sbom.check_sbom(wheel)
    assert problem.startswith("sbom: ")
    assert "cannot be read" in problem
    report = audit.check_wheel(wheel, newest_row)
    assert any(v.startswith("sbom: ") for v in report.violations), report.violations


def test_another_project_sbom_is_named_after_its_distribution():
    """No project's name is built in: the root component, its purl and the properties'
    namespace come from the wheel's distribution, and the audit's purl matches packageurl's."""
    document = json.loads(
        sbom.build_sbom(
            inputs(name="extension_cpp", wheel_name="extension_cpp-0.0.1+pt28cu128-x.whl")
        )
    )
    root = document["metadata"]["component"]
    assert (root["name"], root["bom-ref"]) == ("extension_cpp", "extension_cpp")
    assert root["purl"] == sbom.package_url("extension_cpp", "0.1.0+stable.cu13")
    assert root["purl"].startswith("pkg:pypi/extension-cpp@")
    assert {p["name"].split(":")[0] for p in root["properties"]} == {"extension_cpp"}
    assert sbom.sbom_properties(document)[sbom.PROP_TORCH] == TORCH
    assert sbom.sbom_path("extension_cpp") == "sboms/extension_cpp.cdx.json"
