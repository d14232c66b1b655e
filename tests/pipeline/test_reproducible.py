"""Deterministic wheel rewrite and the comparison that names what differs."""

from __future__ import annotations

import csv
import io
import subprocess
import zipfile
from pathlib import Path

import pytest

from scripts import audit, build, reproducible, sbom

EPOCH = 1700000000


def rewrite_with(wheel: Path, dest: Path, *, reverse: bool, mode: int, when: tuple) -> Path:
    """The same members as ``wheel`` in another order, with other times and permissions."""
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(dest, "w") as out:
        infos = src.infolist()
        for info in reversed(infos) if reverse else infos:
            new = zipfile.ZipInfo(info.filename, date_time=when)
            new.external_attr = mode << 16
            out.writestr(new, src.read(info), compress_type=zipfile.ZIP_STORED)
    return dest


def test_finalize_erases_order_times_and_modes(wheel_factory, tmp_path):
    raw = wheel_factory(with_sbom=False)
    (tmp_path / "x").mkdir()
    (tmp_path / "y").mkdir()
    a = rewrite_with(
        raw, tmp_path / "x" / raw.name, reverse=False, mode=0o100600, when=(2020, 1, 2, 3, 4, 6)
    )
    b = rewrite_with(
        raw, tmp_path / "y" / raw.name, reverse=True, mode=0o100664, when=(2024, 5, 6, 7, 8, 10)
    )
    assert reproducible.differing_members(a, b) != []
    fa = reproducible.finalize_wheel(a, tmp_path / "fa" / raw.name, EPOCH)
    fb = reproducible.finalize_wheel(b, tmp_path / "fb" / raw.name, EPOCH)
    assert reproducible.differing_members(fa, fb) == []
    assert reproducible.sha256_file(fa) == reproducible.sha256_file(fb)


def test_finalized_wheel_layout(wheel_factory, tmp_path):
    raw = wheel_factory(with_sbom=False)
    final = reproducible.finalize_wheel(
        raw, tmp_path / "out" / raw.name, EPOCH, {"sboms/a.json": b"{}"}
    )
    with zipfile.ZipFile(final) as zf:
        names = zf.namelist()
        dist_info = reproducible.dist_info_dir(names)
        assert names[-1] == f"{dist_info}/RECORD"
        assert names.index("hotloop/_C.abi3.so") < names.index(f"{dist_info}/METADATA")
        assert {i.date_time for i in zf.infolist()} == {(2023, 11, 14, 22, 13, 20)}
        assert {i.external_attr >> 16 for i in zf.infolist()} == {reproducible.FILE_MODE}
        rows = list(csv.reader(io.StringIO(zf.read(f"{dist_info}/RECORD").decode())))
        recorded = {r[0]: r[1] for r in rows}
        assert recorded[f"{dist_info}/sboms/a.json"] == reproducible.record_hash(b"{}")
        for name in names[:-1]:
            assert recorded[name] == reproducible.record_hash(zf.read(name)), name
        assert recorded[f"{dist_info}/RECORD"] == ""


def test_finalize_keeps_executable_bit(wheel_factory, tmp_path):
    raw = wheel_factory(with_sbom=False)
    src = tmp_path / "src" / raw.name
    src.parent.mkdir()
    rewrite_with(raw, src, reverse=False, mode=0o100755, when=(2020, 1, 1, 0, 0, 0))
    final = reproducible.finalize_wheel(src, tmp_path / "out" / raw.name, EPOCH)
    with zipfile.ZipFile(final) as zf:
        assert {i.external_attr >> 16 for i in zf.infolist()} == {reproducible.EXEC_MODE}


def test_finalize_refuses_to_replace_a_member(wheel_factory, tmp_path):
    raw = wheel_factory(with_sbom=False)
    final = reproducible.finalize_wheel(
        raw, tmp_path / "one" / raw.name, EPOCH, {"sboms/x.json": b"1"}
    )
    with pytest.raises(ValueError, match=r"already holds .*sboms/x\.json"):
        reproducible.finalize_wheel(
            final, tmp_path / "two" / raw.name, EPOCH, {"sboms/x.json": b"2"}
        )


def test_old_epoch_is_clamped_to_1980():
    assert reproducible.zip_time(0) == (1980, 1, 1, 0, 0, 0)


def test_differing_members_names_the_member(wheel_factory, tmp_path, elf_libs):
    first = wheel_factory(with_sbom=False)
    a = tmp_path / "a" / first.name
    a.parent.mkdir()
    first.rename(a)
    b = wheel_factory(
        with_sbom=False, extra={"hotloop/_C.abi3.so": elf_libs["good"] + b"/tmp/build-path\0"}
    )
    fa = reproducible.finalize_wheel(a, tmp_path / "fa" / a.name, EPOCH)
    fb = reproducible.finalize_wheel(b, tmp_path / "fb" / a.name, EPOCH)
    diffs = reproducible.differing_members(fa, fb)
    dist_info = reproducible.dist_info_dir(zipfile.ZipFile(fa).namelist())
    # The binary differs, and so does RECORD, which holds its hash.
    assert diffs == ["hotloop/_C.abi3.so", f"{dist_info}/RECORD"]


def test_differing_members_only_in_one(wheel_factory, tmp_path):
    a = wheel_factory(with_sbom=False)
    fa = reproducible.finalize_wheel(a, tmp_path / "fa" / a.name, EPOCH)
    fb = reproducible.finalize_wheel(a, tmp_path / "fb" / a.name, EPOCH, {"sboms/x.json": b"{}"})
    diffs = reproducible.differing_members(fa, fb)
    assert any(d.startswith("hotloop-") and "sboms/x.json (only in" in d for d in diffs)


def test_differing_zip_entry_only(wheel_factory, tmp_path):
    raw = wheel_factory(with_sbom=False)
    (tmp_path / "x").mkdir()
    (tmp_path / "y").mkdir()
    a = rewrite_with(
        raw, tmp_path / "x" / raw.name, reverse=False, mode=0o100644, when=(2020, 1, 1, 0, 0, 0)
    )
    b = rewrite_with(
        raw, tmp_path / "y" / raw.name, reverse=False, mode=0o100644, when=(2021, 1, 1, 0, 0, 0)
    )
    diffs = reproducible.differing_members(a, b)
    assert diffs
    assert all(d.endswith("(zip entry: date_time)") for d in diffs)


def fake_inputs(torch_version: str):
    def collect(row, wheel, cuda_home, sysroot, epoch):
        return sbom.SbomInputs(
            "hotloop",
            wheel.name, row.version, torch_version, row.cuda, row.arch_list,
            tuple(row.archs), (), (), (), epoch,
        )  # fmt: skip

    return collect


def test_finalize_release_adds_a_checked_sbom(wheel_factory, newest_row, tmp_path, monkeypatch):
    raw = wheel_factory(with_sbom=False)
    with zipfile.ZipFile(raw) as zf:
        torch_version = sbom.wheel_build_info(zf)["torch_version"]
    monkeypatch.setattr(sbom, "collect_inputs", fake_inputs(torch_version))
    final = reproducible.finalize_release(newest_row, raw, tmp_path / "out", None, None, EPOCH)
    assert final == tmp_path / "out" / raw.name
    assert sbom.check_sbom(final) == []


def test_finalize_release_leaves_no_wheel_when_the_sbom_disagrees(
    wheel_factory, newest_row, tmp_path, monkeypatch
):
    raw = wheel_factory(with_sbom=False)
    monkeypatch.setattr(sbom, "collect_inputs", fake_inputs("1.0.0"))
    with pytest.raises(audit.AuditError, match=r"sbom: names torch '1\.0\.0'"):
        reproducible.finalize_release(newest_row, raw, tmp_path / "out", None, None, EPOCH)
    assert list((tmp_path / "out").iterdir()) == []


def hotloop_copy(root: Path) -> Path:
    """A build's copy of this repository's package under ``root``: its setup.py, a csrc/."""
    (root / "csrc" / "muladd").mkdir(parents=True)
    (root / "setup.py").write_text("")
    return root


@pytest.mark.parametrize("with_source", [True, False], ids=["cu-file", "no-source"])
def test_nvcc_wrapper_names_the_source_without_the_build_folder(tmp_path, with_source):
    fake = tmp_path / "real-nvcc"
    fake.write_text('#!/bin/sh\nfor a in "$@"; do echo "$a"; done\n')
    fake.chmod(0o755)
    source = hotloop_copy(tmp_path / "a" / "first" / "src") / "csrc/muladd/muladd_cuda.cu"
    args = ["-c", str(source), "-o", "x.o"] if with_source else ["--version"]
    added = ["-Xcudafe=--orig_src_path_name=hotloop/csrc/muladd/muladd_cuda.cu"]
    wrapper = reproducible.write_nvcc_wrapper(tmp_path / "bin" / "nvcc", fake)
    out = subprocess.run([str(wrapper), *args], capture_output=True, text=True, check=True)
    assert out.stdout.splitlines() == [*args, *(added if with_source else [])]


def test_nvcc_wrapper_runs_through_a_launcher(tmp_path):
    fake = tmp_path / "real-nvcc"
    fake.write_text('#!/bin/sh\nfor a in "$@"; do echo "$a"; done\n')
    launcher = tmp_path / "ccache"
    launcher.write_text('#!/bin/sh\necho launcher\nexec "$@"\n')
    for script in (fake, launcher):
        script.chmod(0o755)
    source = str(hotloop_copy(tmp_path / "p") / "csrc" / "x.cu")
    wrapper = reproducible.write_nvcc_wrapper(tmp_path / "nvcc", fake, str(launcher))
    out = subprocess.run([str(wrapper), source], capture_output=True, text=True, check=True)
    assert out.stdout.splitlines() == [
        "launcher",
        source,
        "-Xcudafe=--orig_src_path_name=hotloop/csrc/x.cu",
    ]


def fake_builds(monkeypatch, built: list[Path]) -> None:
    """build_once/release_wheel that write a small wheel where the real ones would."""

    def build_once(row, workdir, with_cuda, python=None, provenance=None):
        assert not workdir.exists() or not any(workdir.iterdir()), f"{workdir} not fresh"
        (workdir / "dist").mkdir(parents=True)
        wheel = workdir / "dist" / "hotloop-0.1.0-cp39-abi3-linux_x86_64.whl"
        with zipfile.ZipFile(wheel, "w") as zf:
            zf.writestr("hotloop/__init__.py", "")
        built.append(workdir)
        return wheel, Path("python")

    def release_wheel(row, wheel, python, out_dir, epoch, with_cuda):
        return wheel

    monkeypatch.setattr(reproducible, "build_once", build_once)
    monkeypatch.setattr(reproducible, "release_wheel", release_wheel)
    monkeypatch.setattr(build, "source_date_epoch", lambda: str(EPOCH))
    monkeypatch.setattr(build, "git_commit", lambda: "0" * 40)


def test_build_twice_leaves_what_it_did_not_create(newest_row, tmp_path, monkeypatch):
    """--work ~ must not remove ~/first or ~/second-build-tree: the builds get fresh folders."""
    work = tmp_path / "home"
    mine = {"first/notes.txt": "keep", "second-build-tree/deeper/x": "keep", "diffoscope.txt": "k"}
    for rel, text in mine.items():
        (work / rel).parent.mkdir(parents=True, exist_ok=True)
        (work / rel).write_text(text)
    built: list[Path] = []
    fake_builds(monkeypatch, built)
    a, b = reproducible.build_twice(newest_row, work, with_cuda=False)
    for rel, text in mine.items():
        assert (work / rel).read_text() == text, rel
    assert len(built) == 2
    assert all(work in p.parents for p in built)
    assert len(str(built[0])) != len(str(built[1]))  # the paths differ in length too
    # A second run gets folders of its own again.
    reproducible.build_twice(newest_row, work, with_cuda=False)
    assert len(set(built)) == 4
    assert a.wheel.is_file()
    assert b.wheel.is_file()


def test_a_reproducible_run_removes_its_own_build_folders_unless_kept(
    tmp_path, monkeypatch, capsys
):
    # Each run's two cold builds used to stay in the cache for good (hundreds of MB a run).
    work = tmp_path / "work"
    (work / "mine.txt").parent.mkdir(parents=True)
    (work / "mine.txt").write_text("keep")
    fake_builds(monkeypatch, [])
    assert reproducible.main(["--cpu", "--work", str(work)]) == 0
    assert sorted(p.name for p in work.iterdir()) == ["mine.txt"]
    assert reproducible.main(["--cpu", "--work", str(work), "--keep"]) == 0
    kept = [p for p in work.iterdir() if p.name.startswith("run-")]
    assert len(kept) == 1
    assert str(kept[0]) in capsys.readouterr().err


def test_a_run_that_is_not_reproducible_keeps_its_builds_to_compare(tmp_path, monkeypatch):
    work = tmp_path / "work"
    fake_builds(monkeypatch, [])
    monkeypatch.setattr(reproducible, "differing_members", lambda a, b: ["hotloop/_C.so"])
    monkeypatch.setattr(reproducible, "diffoscope_report", lambda a, b, out: None)
    assert reproducible.main(["--cpu", "--work", str(work)]) == 1
    assert [p.name.startswith("run-") for p in work.iterdir()] == [True]
