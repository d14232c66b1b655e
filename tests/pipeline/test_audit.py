"""Each project audit rule, fed a synthetic wheel that breaks it."""

from __future__ import annotations

import pytest

from scripts import audit


def rules(report: audit.AuditReport) -> set[str]:
    return {v.split(":", 1)[0] for v in report.violations}


def test_good_wheel_passes(wheel_factory, newest_row):
    report = audit.check_wheel(wheel_factory(), newest_row)
    assert report.violations == []
    assert report.max_versions["GLIBC"] <= "GLIBC_2.28"


def test_glibc_too_new(wheel_factory, newest_row, elf_libs):
    wheel = wheel_factory(extra={"hotloop/_C.abi3.so": elf_libs["new_glibc"]})
    report = audit.check_wheel(wheel, newest_row)
    assert rules(report) == {"glibc-version"}
    assert "GLIBC_2.32" in report.violations[0]
    assert "hotloop/_C.abi3.so" in report.violations[0]


def test_glibcxx_too_new(wheel_factory, newest_row, elf_libs):
    wheel = wheel_factory(extra={"hotloop/_helper.so": elf_libs["new_glibcxx"]})
    report = audit.check_wheel(wheel, newest_row)
    assert rules(report) == {"glibcxx-version"}
    assert "GLIBCXX_3.4.26" in report.violations[0]


@pytest.mark.parametrize(
    "name",
    [
        "hotloop.libs/libtorch_cpu.so",
        "hotloop.libs/libc10-1a2b3c.so",
        "hotloop.libs/libcudart.so.13",
    ],
)
def test_bundled_torch_or_cuda_lib(wheel_factory, newest_row, elf_libs, name):
    report = audit.check_wheel(wheel_factory(extra={name: elf_libs["good"]}), newest_row)
    assert rules(report) == {"no-bundled-libs"}
    assert name in report.violations[0]


def test_lib_that_torch_provides_is_caught_by_name(wheel_factory, newest_row, elf_libs):
    wheel = wheel_factory(extra={"hotloop.libs/libfoo_from_torch.so.1": elf_libs["good"]})
    report = audit.check_wheel(wheel, newest_row, provided_by_torch=["libfoo_from_torch.so.1"])
    assert rules(report) == {"no-bundled-libs"}


@pytest.mark.parametrize(
    "requires",
    [(), ("torch>=2.14",), ("torch==2.13.*",), ("torch==2.14.*", "torch<3")],
    ids=["missing", "loose", "wrong-minor", "two"],
)
def test_requires_torch_pin(wheel_factory, newest_row, requires):
    report = audit.check_wheel(wheel_factory(requires=requires), newest_row)
    assert rules(report) == {"requires-torch"}


def test_other_requirements_are_fine(wheel_factory, newest_row):
    report = audit.check_wheel(
        wheel_factory(requires=(newest_row.requires_torch, "torchvision; extra == 'x'")), newest_row
    )
    assert report.violations == []


def test_version_label_mismatch(wheel_factory, newest_row):
    report = audit.check_wheel(wheel_factory(version="0.1.0+pt214cu128"), newest_row)
    assert "version-label" in rules(report)


@pytest.mark.parametrize(
    "change",
    [
        {"torch_minor": "2.13"},
        {"cuda_version": None},
        {"cuda_version": "12.8"},
        {"archs": ["sm_80"]},
        {"version": "0.1.0+pt214cpu"},
        {"torch_version": "2.13.0+cu130"},
    ],
)
def test_build_info_mismatch(wheel_factory, newest_row, build_info_for, change):
    wheel = wheel_factory(build_info=build_info_for(newest_row, **change))
    report = audit.check_wheel(wheel, newest_row)
    assert rules(report) == {"build-info"}
    assert next(iter(change)) in report.violations[0]


def test_build_info_arch_order_does_not_matter(wheel_factory, newest_row, build_info_for):
    archs = list(reversed(newest_row.archs))
    report = audit.check_wheel(
        wheel_factory(build_info=build_info_for(newest_row, archs=archs)), newest_row
    )
    assert report.violations == []


def test_build_info_missing(wheel_factory, newest_row):
    report = audit.check_wheel(wheel_factory(build_info="X = 1\n"), newest_row)
    assert rules(report) == {"build-info"}


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


def test_failure_names_wheel_and_rule(wheel_factory, newest_row, elf_libs):
    wheel = wheel_factory(extra={"hotloop/_C.abi3.so": elf_libs["new_glibc"]}, requires=())
    report = audit.check_wheel(wheel, newest_row)
    with pytest.raises(audit.AuditError) as info:
        audit.raise_on_violations(wheel.name, report)
    lines = str(info.value).splitlines()
    assert {line.split(": ")[1] for line in lines} == {"glibc-version", "requires-torch"}
    assert all(line.startswith(wheel.name + ": ") for line in lines)


def test_parse_version():
    assert audit.parse_version("GLIBC_2.2.5") == ("GLIBC", (2, 2, 5))
    assert audit.parse_version("GLIBC_PRIVATE") is None
    assert audit.max_versions(["GLIBC_2.2.5", "GLIBC_2.14", "GLIBCXX_3.4.9", "GLIBCXX_3.4.21"]) == {
        "GLIBC": (2, 14),
        "GLIBCXX": (3, 4, 21),
    }


def test_auditwheel_command_excludes_torch_and_cuda(tmp_path):
    cmd = audit.auditwheel_command(tmp_path / "x.whl", tmp_path / "out", ["libcublas.so.13"])
    excludes = [cmd[i + 1] for i, a in enumerate(cmd) if a == "--exclude"]
    assert excludes == ["libtorch*.so", "libc10*.so", "libcudart.so.*", "libcublas.so.13"]
    assert cmd[cmd.index("--plat") + 1] == "manylinux_2_28_x86_64"


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


def test_command_audits_wheels_built_elsewhere(wheel_factory, elf_libs, tmp_path, capsys):
    # python -m scripts.audit: the row comes from the wheel's label; exit 1 on any rule.
    good = wheel_factory()
    assert audit.main([str(good), "--skip-abi3audit"]) == 0
    assert f"{good.name}: ok (GLIBC_" in capsys.readouterr().out

    bad = wheel_factory(extra={"hotloop.libs/libcudart.so.13": elf_libs["good"]})
    assert audit.main([str(bad), "--skip-abi3audit"]) == 1
    assert f"{bad.name}: no-bundled-libs: hotloop.libs/libcudart.so.13" in capsys.readouterr().err

    torch_site = tmp_path / "site"
    (torch_site / "torch" / "lib").mkdir(parents=True)
    (torch_site / "torch" / "lib" / "libfoo_from_torch.so.1").write_bytes(b"")
    provided = wheel_factory(extra={"hotloop.libs/libfoo_from_torch.so.1": elf_libs["good"]})
    argv = [str(provided), "--skip-abi3audit", "--torch-site", str(torch_site)]
    assert audit.main(argv) == 1
    assert "libfoo_from_torch.so.1" in capsys.readouterr().err


def test_command_names_the_rows_when_the_label_is_unknown(wheel_factory, capsys):
    wheel = wheel_factory(version="0.1.0+pt299cu999")
    assert audit.main([str(wheel), "--skip-abi3audit"]) == 1
    err = capsys.readouterr().err
    assert "'0.1.0+pt299cu999' names no matrix row" in err
    assert "pt211cu130" in err
