"""Repair and audit a built wheel: auditwheel, abi3audit, and hotloop's own rules.

Each project rule has a name; a failure reads ``<wheel>: <rule>: <what was found>``.
``nox -s wheels`` and cibuildwheel's repair step run all of it; a wheel built or
downloaded elsewhere (a CI artifact, an index) is checked with

    python -m scripts.audit WHEEL [WHEEL ...] [--torch-site SITE_PACKAGES] [--skip-abi3audit]

which takes each wheel's matrix row from its local version label (``+pt211cu130``) and
exits 1 if any rule breaks. ``--torch-site`` (the site-packages of the row's torch) adds
the libraries torch installs to those the wheel must not bundle.

Rules (``check_wheel``):

* ``wheel-tag``        file name and WHEEL tags are ``cp39-abi3`` with ``manylinux_2_28_x86_64``
* ``version-label``    the wheel's version is the row's ``0.1.0+pt<..>cu<..>``
* ``requires-torch``   exactly one torch requirement, ``torch==<row minor>.*``
* ``build-info``       ``hotloop/_build_info.py`` agrees with the row (version, torch, CUDA, archs)
* ``glibc-version``    no ELF needs ``GLIBC_`` newer than 2.28 (what torch's own libs need)
* ``glibcxx-version``  no ELF needs ``GLIBCXX_`` newer than 3.4.22
* ``no-bundled-libs``  no torch or CUDA library inside the wheel (they come from torch at run time)
"""

from __future__ import annotations

import ast
import fnmatch
import io
import re
import subprocess
import sys
import zipfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from email.parser import Parser
from pathlib import Path, PurePosixPath

from scripts.matrix import Row, load_rows

PLATFORM = "manylinux_2_28_x86_64"
MAX_SYMBOL_VERSIONS = {"GLIBC": (2, 28), "GLIBCXX": (3, 4, 22)}
# Libraries that must never be inside the wheel: torch's and the CUDA runtime's.
FORBIDDEN_LIBS = (
    "libtorch*.so*",
    "libc10*.so*",
    "libshm*.so*",
    "libcudart*.so*",
    "libcuda.so*",
    "libcublas*.so*",
    "libcusparse*.so*",
    "libcudnn*.so*",
    "libnccl*.so*",
    "libnv*.so*",
    "libgomp*.so*",
)
# auditwheel --exclude patterns: the same families, matched against DT_NEEDED sonames.
AUDITWHEEL_EXCLUDES = ("libtorch*.so", "libc10*.so", "libcudart.so.*")


@dataclass
class AuditReport:
    wheel: str
    violations: list[str] = field(default_factory=list)
    max_versions: dict[str, str] = field(default_factory=dict)
    auditwheel_output: str = ""
    abi3audit_output: str = ""

    @property
    def ok(self) -> bool:
        return not self.violations


class AuditError(RuntimeError):
    pass


# --------------------------------------------------------------------------- ELF symbol versions


def elf_version_needs(data: bytes) -> set[str]:
    """Version names an ELF needs (``GLIBC_2.14``, ``GLIBCXX_3.4.21``, ...), via pyelftools."""
    from elftools.elf.elffile import ELFFile
    from elftools.elf.gnuversions import GNUVerNeedSection

    needs: set[str] = set()
    elf = ELFFile(io.BytesIO(data))
    for section in elf.iter_sections():
        if isinstance(section, GNUVerNeedSection):
            for _verneed, auxiliaries in section.iter_versions():
                needs.update(aux.name for aux in auxiliaries)
    return needs


def parse_version(name: str) -> tuple[str, tuple[int, ...]] | None:
    """``"GLIBC_2.14"`` -> ``("GLIBC", (2, 14))``; ``None`` for names like ``GLIBC_PRIVATE``."""
    match = re.fullmatch(r"([A-Z]+)_(\d+(?:\.\d+)*)", name)
    if not match:
        return None
    return match.group(1), tuple(int(p) for p in match.group(2).split("."))


def max_versions(needs: Iterable[str]) -> dict[str, tuple[int, ...]]:
    best: dict[str, tuple[int, ...]] = {}
    for name in needs:
        parsed = parse_version(name)
        if parsed and parsed[1] > best.get(parsed[0], ()):
            best[parsed[0]] = parsed[1]
    return best


def is_elf(data: bytes) -> bool:
    return data[:4] == b"\x7fELF"


# --------------------------------------------------------------------------- wheel contents


def wheel_name_parts(filename: str) -> dict[str, str]:
    """Split a wheel file name (PEP 427) into name, version, python, abi, platform."""
    stem = filename.removesuffix(".whl")
    parts = stem.split("-")
    if len(parts) == 6:  # build tag
        parts = [parts[0], parts[1], parts[3], parts[4], parts[5]]
    if len(parts) != 5:
        raise ValueError(f"not a wheel file name: {filename}")
    return dict(zip(("name", "version", "python", "abi", "platform"), parts))


def _dist_info(zf: zipfile.ZipFile) -> str:
    dirs = {n.split("/")[0] for n in zf.namelist() if n.split("/")[0].endswith(".dist-info")}
    if len(dirs) != 1:
        raise AuditError(f"expected one .dist-info folder, found {sorted(dirs)}")
    return dirs.pop()


def read_metadata(zf: zipfile.ZipFile):
    return Parser().parsestr(zf.read(f"{_dist_info(zf)}/METADATA").decode())


def read_build_info(zf: zipfile.ZipFile) -> dict | None:
    try:
        text = zf.read("hotloop/_build_info.py").decode()
    except KeyError:
        return None
    for node in ast.parse(text).body:
        if isinstance(node, ast.Assign) and any(
            getattr(t, "id", None) == "BUILD_INFO" for t in node.targets
        ):
            return ast.literal_eval(node.value)
    return None


def check_wheel(wheel: Path, row: Row, provided_by_torch: Iterable[str] = ()) -> AuditReport:
    """Apply the project's rules to a repaired wheel."""
    report = AuditReport(wheel.name)
    bad = report.violations
    provided = set(provided_by_torch)

    parts = wheel_name_parts(wheel.name)
    platforms = parts["platform"].split(".")
    if parts["python"] != "cp39" or parts["abi"] != "abi3" or PLATFORM not in platforms:
        bad.append(
            f"wheel-tag: file name says {parts['python']}-{parts['abi']}-{parts['platform']}, "
            f"need cp39-abi3 and {PLATFORM}"
        )
    if parts["version"] != row.version:
        bad.append(f"version-label: wheel version {parts['version']}, need {row.version}")

    with zipfile.ZipFile(wheel) as zf:
        dist_info = _dist_info(zf)
        wheel_meta = Parser().parsestr(zf.read(f"{dist_info}/WHEEL").decode())
        tags = wheel_meta.get_all("Tag") or []
        if (
            not tags
            or any(not t.startswith("cp39-abi3-") for t in tags)
            or f"cp39-abi3-{PLATFORM}" not in tags
        ):
            bad.append(f"wheel-tag: WHEEL lists tags {tags}, need cp39-abi3-{PLATFORM}")

        meta = read_metadata(zf)
        if meta.get("Version") != row.version:
            bad.append(f"version-label: METADATA Version {meta.get('Version')}, need {row.version}")
        torch_reqs = [
            r
            for r in meta.get_all("Requires-Dist") or []
            if re.match(r"torch\b(?![-_.\w])", r.strip())
        ]
        normalized = [re.sub(r"\s+", "", r.split(";")[0]) for r in torch_reqs]
        if normalized != [row.requires_torch]:
            bad.append(
                f"requires-torch: Requires-Dist {torch_reqs or 'has no torch'}, "
                f"need exactly {row.requires_torch}"
            )

        info = read_build_info(zf)
        if info is None:
            bad.append("build-info: hotloop/_build_info.py missing or has no BUILD_INFO dict")
        else:
            expected = {
                "version": row.version,
                "torch_minor": row.torch_minor,
                "cuda_version": row.cuda,
                "archs": row.archs,
            }
            got = dict(info)
            if isinstance(got.get("archs"), list):
                # a set of targets: setup.py may list compute_120 before sm_120
                got["archs"] = sorted(got["archs"])
                expected["archs"] = sorted(row.archs)
            for key, want in expected.items():
                if got.get(key) != want:
                    bad.append(f"build-info: {key} is {info.get(key)!r}, need {want!r}")
            if str(info.get("torch_version", "")).split("+")[0] != row.torch:
                bad.append(
                    f"build-info: torch_version is {info.get('torch_version')!r}, need {row.torch}"
                )

        needs_all: set[str] = set()
        for name in zf.namelist():
            base = PurePosixPath(name).name
            if any(fnmatch.fnmatch(base, pat) for pat in FORBIDDEN_LIBS) or base in provided:
                bad.append(
                    f"no-bundled-libs: {name} is a torch/CUDA library; "
                    "it must come from torch at run time"
                )
            data = zf.read(name)
            if not is_elf(data):
                continue
            needs = elf_version_needs(data)
            needs_all |= needs
            for family, found in max_versions(needs).items():
                limit = MAX_SYMBOL_VERSIONS.get(family)
                if limit and found > limit:
                    newer = sorted(
                        (
                            n
                            for n in needs
                            if (p := parse_version(n)) and p[0] == family and p[1] > limit
                        ),
                        key=lambda n: parse_version(n)[1],  # type: ignore[index]
                    )
                    rule = "glibc-version" if family == "GLIBC" else "glibcxx-version"
                    bad.append(
                        f"{rule}: {name} needs {', '.join(newer)}; "
                        f"limit is {family}_{'.'.join(map(str, limit))} (torch's own libs)"
                    )
        report.max_versions = {
            k: f"{k}_{'.'.join(map(str, v))}" for k, v in max_versions(needs_all).items()
        }
    return report


# --------------------------------------------------------------------------- external tools


def torch_provided_libs(site_packages: Path) -> list[str]:
    """Shared-library file names that torch's wheel and its nvidia deps install."""
    names: set[str] = set()
    for pattern in (
        "torch/lib/*.so*",
        "nvidia/**/lib/*.so*",
        "cusparselt/lib/*.so*",
        "triton/_C/*.so*",
    ):
        names.update(p.name for p in site_packages.glob(pattern))
    return sorted(names)


def auditwheel_command(wheel: Path, out_dir: Path, extra_excludes: Sequence[str] = ()) -> list[str]:
    cmd = [sys.executable, "-m", "auditwheel", "repair", "--plat", PLATFORM, "-w", str(out_dir)]
    for pattern in (*AUDITWHEEL_EXCLUDES, *extra_excludes):
        cmd += ["--exclude", pattern]
    return [*cmd, str(wheel)]


def repair_wheel(
    wheel: Path, out_dir: Path, provided_by_torch: Sequence[str] = ()
) -> tuple[Path, str]:
    """``auditwheel repair`` -> (repaired wheel, auditwheel's output)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for old in out_dir.glob("*.whl"):
        old.unlink()
    proc = subprocess.run(
        auditwheel_command(wheel, out_dir, provided_by_torch), capture_output=True, text=True
    )
    output = (proc.stdout + proc.stderr).strip()
    if proc.returncode != 0:
        raise AuditError(
            f"{wheel.name}: auditwheel: repair failed (exit {proc.returncode}):\n{output}"
        )
    wheels = sorted(out_dir.glob("*.whl"))
    if len(wheels) != 1:
        raise AuditError(
            f"{wheel.name}: auditwheel: expected one repaired wheel, got {[w.name for w in wheels]}"
        )
    return wheels[0], output


def run_abi3audit(wheel: Path) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "abi3audit", "--strict", "--report", str(wheel)],
        capture_output=True,
        text=True,
    )
    output = (proc.stdout + proc.stderr).strip()
    if proc.returncode != 0:
        raise AuditError(
            f"{wheel.name}: abi3audit: --strict failed (exit {proc.returncode}):\n{output}"
        )
    return output


def raise_on_violations(wheel_name: str, report: AuditReport) -> None:
    """Stop with every broken rule, each line naming the wheel and the rule."""
    if not report.ok:
        raise AuditError("\n".join(f"{wheel_name}: {v}" for v in report.violations))


def repair_and_audit(
    wheel: Path, out_dir: Path, row: Row, site_packages: Path
) -> tuple[Path, AuditReport]:
    provided = torch_provided_libs(site_packages)
    repaired, aw_output = repair_wheel(wheel, out_dir, provided)
    abi3 = run_abi3audit(repaired)
    report = check_wheel(repaired, row, provided)
    report.auditwheel_output = aw_output
    report.abi3audit_output = abi3
    raise_on_violations(repaired.name, report)
    return repaired, report


# ------------------------------------------------------------------------------- command


def row_for_wheel(wheel: Path, rows: Sequence[Row]) -> Row:
    """The matrix row whose variant is the wheel's local version label."""
    version = wheel_name_parts(wheel.name)["version"]
    label = version.partition("+")[2]
    for row in rows:
        if row.variant == label:
            return row
    known = ", ".join(r.variant for r in rows)
    raise AuditError(
        f"{wheel.name}: version-label: {version!r} names no matrix row (need +<variant>, "
        f"one of {known})"
    )


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m scripts.audit", description=__doc__)
    parser.add_argument("wheels", nargs="+", type=Path)
    parser.add_argument("--torch-site", type=Path, help="site-packages holding the row's torch")
    parser.add_argument("--skip-abi3audit", action="store_true")
    args = parser.parse_args(argv)
    provided = torch_provided_libs(args.torch_site) if args.torch_site else []
    rows = load_rows()
    failed = 0
    for wheel in args.wheels:
        try:
            if not args.skip_abi3audit:
                run_abi3audit(wheel)
            report = check_wheel(wheel, row_for_wheel(wheel, rows), provided)
            raise_on_violations(wheel.name, report)
        except AuditError as exc:
            failed += 1
            print(exc, file=sys.stderr)
            continue
        print(f"{wheel.name}: ok ({', '.join(sorted(report.max_versions.values()))})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
