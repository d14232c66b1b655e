"""The pipeline's own rules for a built wheel: one function per rule, each with an id and a test.

A rule is a function of an ``Inspection`` (one open wheel, the matrix row it was built for
and the project table that describes its package) that yields one message per problem;
``@rule("id")`` registers it, its docstring's first line is its summary (``python -m
scripts.audit --help`` lists them). ``check_wheel`` runs every rule that applies to the
wheel's kind and reports ``<rule>: <message>`` lines; a part of the wheel that cannot be read
becomes a finding of the rule that needed it.
"""

from __future__ import annotations

import base64
import csv
import fnmatch
import hashlib
import io
import re
import zipfile
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from scripts import sbom, variant
from scripts.audit import elf, libraries, stable_abi
from scripts.audit.wheelfile import AuditError, Wheel, WheelReadError
from scripts.matrix import Row, build_row_of, load_rows
from scripts.project import Project, own_project

PLATFORM = "manylinux_2_28_x86_64"
# Shown per library when torch-abi-audit finds unstable symbols; the count says the rest.
SHOWN_SYMBOLS = 5


@dataclass
class AuditReport:
    wheel: str
    violations: list[str] = field(default_factory=list)
    max_versions: dict[str, str] = field(default_factory=dict)
    auditwheel_output: str = ""
    abi3audit_output: str = ""
    # RPATH/RUNPATH entries naming the build's own folders, dropped after the repair.
    dropped_search_paths: list[str] = field(default_factory=list)
    # The GPU targets each library's fat binary holds: what was compiled, whatever was asked.
    device_code: dict[str, list[str]] = field(default_factory=dict)

    @property
    def archs(self) -> list[str]:
        """Every GPU target compiled into the wheel, sorted (``compute_90``, ``sm_80``, ...)."""
        return sorted({a for targets in self.device_code.values() for a in targets})

    @property
    def ok(self) -> bool:
        return not self.violations


class Inspection:
    """One open wheel, the build row it must match, and what the rules share about it."""

    def __init__(
        self,
        wheel: Wheel,
        row: Row,
        provided_by_torch: Iterable[str] = (),
        project: Project | None = None,
    ) -> None:
        self.wheel = wheel
        self.row = row
        self.provided_by_torch = frozenset(provided_by_torch)
        self.project = project or own_project()

    @property
    def name(self) -> str:
        """The distribution the project table names."""
        return self.project.distribution

    @property
    def expected_version(self) -> str:
        """The project's own version with the row's label: ``0.1.0+stable.cu13``."""
        return f"{self.wheel.version.split('+')[0]}+{self.row.variant}"

    def required_library(self, member: str) -> bool:
        """Whether ``member`` is one of the libraries the table says every wheel holds."""
        return any(fnmatch.fnmatchcase(member, p) for p in self.project.audit.libraries)

    @cached_property
    def _elf_scan(self) -> tuple[dict[str, elf.ElfFacts], dict[str, str]]:
        facts: dict[str, elf.ElfFacts] = {}
        errors: dict[str, str] = {}
        for info in self.wheel.files():
            try:
                if not elf.is_elf(self.wheel.head(info, 4)):
                    continue
                facts[info.filename] = elf.read_elf(self.wheel.read(info))
            except (WheelReadError, elf.ElfReadError) as exc:
                errors[info.filename] = str(exc)
        return facts, errors

    @property
    def elf_facts(self) -> dict[str, elf.ElfFacts]:
        """Readable ELF members -> what the rules judge in each."""
        return self._elf_scan[0]

    @cached_property
    def elf_needs(self) -> dict[str, frozenset[str]]:
        """Readable ELF members -> the symbol versions each needs."""
        return {name: facts.version_needs for name, facts in self.elf_facts.items()}

    @property
    def elf_errors(self) -> dict[str, str]:
        """ELF members pyelftools (or the zip) could not read -> why."""
        return self._elf_scan[1]

    @cached_property
    def torch_abi(self) -> dict[str, stable_abi.LibraryAbi]:
        """torch-abi-audit's findings per readable ELF member (ToolUnavailable if it can't run)."""
        return stable_abi.torch_abi({name: self.wheel.read(name) for name in self.elf_needs})

    @property
    def versions(self) -> tuple[str, ...]:
        """The versions the wheel may carry: the row's, and for the variant PyPI serves also
        the public one (``scripts.pypi_release``'s copy)."""
        if self.row.variant == variant.PYPI_VARIANT.label:
            return (self.expected_version, variant.public_version(self.expected_version))
        return (self.expected_version,)

    @property
    def version(self) -> str:
        """The version the wheel's insides must name: its own, when it is one it may carry."""
        return self.wheel.version if self.wheel.version in self.versions else self.expected_version

    def max_versions(self) -> dict[str, str]:
        """The newest glibc/libstdc++ versions any ELF needs: ``{"GLIBC": "GLIBC_2.17"}``."""
        every: set[str] = set().union(*self.elf_needs.values())
        return {k: elf.version_text(k, v) for k, v in elf.max_versions(every).items()}


Check = Callable[[Inspection], Iterable[str]]


@dataclass(frozen=True)
class Rule:
    id: str
    check: Check
    kinds: tuple[str, ...]

    @property
    def summary(self) -> str:
        return ((self.check.__doc__ or "").strip().splitlines() or [""])[0]


RULES: list[Rule] = []


def rule(
    rule_id: str, kinds: tuple[str, ...] = (variant.STABLE, variant.PINNED)
) -> Callable[[Check], Check]:
    """Register a rule for the wheel kinds it applies to (both unless said otherwise)."""

    def register(check: Check) -> Check:
        RULES.append(Rule(rule_id, check, kinds))
        return check

    return register


def rules_for(kind: str) -> list[Rule]:
    return [r for r in RULES if kind in r.kinds]


# ------------------------------------------------------------------------ name and metadata


@rule("project-name")
def check_project_name(it: Inspection) -> Iterator[str]:
    """The file name and METADATA name the project table's distribution."""
    if it.wheel.parts["name"] != it.name:
        yield f"file name says {it.wheel.parts['name']!r}, need {it.name!r}"
    name = it.wheel.metadata().get("Name")
    if name != it.name:
        yield f"METADATA Name is {name!r}, need {it.name!r}"


@rule("wheel-tag")
def check_wheel_tag(it: Inspection) -> Iterator[str]:
    """File name and WHEEL tags are cp39-abi3 (or, per Python, cpXY-cpXY of a row's Python)
    with manylinux_2_28_x86_64."""
    parts = it.wheel.parts
    platforms = parts["platform"].split(".")
    python_abi = it.project.python_abi
    if python_abi == "auto":  # the build decided: judge the wheel by what it says it is
        python_abi = "abi3" if parts["abi"] == "abi3" else "per-python"
    if python_abi == "abi3":
        python, abi, allowed = "cp39", "abi3", ["cp39"]
    else:
        python = abi = parts["python"]
        allowed = ["cp" + p.replace(".", "") for p in it.row.pythons]
    need = f"{python}-{abi}"
    if parts["python"] not in allowed or parts["abi"] != abi or PLATFORM not in platforms:
        yield (
            f"file name says {parts['python']}-{parts['abi']}-{parts['platform']}, "
            f"need {need if abi == 'abi3' else ' or '.join(f'{p}-{p}' for p in allowed)} "
            f"and {PLATFORM}"
        )
    tags = it.wheel.wheel_metadata().get_all("Tag") or []
    if (
        not tags
        or any(not t.startswith(f"{need}-") for t in tags)
        or f"{need}-{PLATFORM}" not in tags
    ):
        yield f"WHEEL lists tags {tags}, need {need}-{PLATFORM}"


@rule("version-label")
def check_version_label(it: Inspection) -> Iterator[str]:
    """The version is the row's: 0.1.0+stable.cu13 (stable) or 0.1.0+pt29cu128 (pinned);
    PyPI's copy of the stable CUDA 13 wheel carries the public 0.1.0."""
    found = (
        ("file name", it.wheel.version),
        ("METADATA Version", str(it.wheel.metadata().get("Version"))),
    )
    for where, version in found:
        if version in it.versions:
            continue
        try:
            variant.parse_version(version)
        except ValueError as exc:
            yield f"{where} {version!r}: {exc}"
            continue
        yield (
            f"{where} is {version}, need {' or '.join(it.versions)} "
            f"(the {it.row.kind} wheel built against torch {it.row.torch})"
        )
    if found[0][1] != found[1][1]:
        yield f"the file name says {found[0][1]}, METADATA Version {found[1][1]}"


@rule("requires-torch")
def check_requires_torch(it: Inspection) -> Iterator[str]:
    """Exactly one torch requirement: torch>=2.10 (stable) or torch==<minor>.* (pinned)."""
    requirements = [str(r) for r in it.wheel.metadata().get_all("Requires-Dist") or []]
    torch_reqs = [r for r in requirements if re.match(r"torch\b(?![-_.\w])", r.strip())]
    normalized = [re.sub(r"\s+", "", r.split(";")[0]) for r in torch_reqs]
    if normalized != [it.row.requires_torch]:
        yield (
            f"Requires-Dist {torch_reqs or 'has no torch'}, need exactly {it.row.requires_torch}"
        )


@rule("build-info")
def check_build_info(it: Inspection) -> Iterator[str]:
    """The table's build-info module agrees with the wheel and its build row (version,
    variant, torch, CUDA, archs)."""
    member = it.project.audit.build_info
    if not member:
        return  # the project records no build info
    info = it.wheel.build_info(member)
    if info is None:
        yield f"{member} missing or has no BUILD_INFO dict"
        return
    row = it.row
    expected = {
        "version": it.version,
        "variant": row.variant,
        "torch_minor": row.torch_minor,
        "cuda_version": row.cuda,
        "archs": row.archs,
    }
    got = dict(info)
    if isinstance(got.get("archs"), list):
        # a set of targets: setup.py may list compute_120 before sm_120 (repr: a hostile
        # list may mix types, which do not compare)
        got["archs"] = sorted(got["archs"], key=repr)
        expected["archs"] = sorted(row.archs, key=repr)
    for key, want in expected.items():
        if got.get(key) != want:
            yield f"{key} is {info.get(key)!r}, need {want!r}"
    if str(info.get("torch_version", "")).split("+")[0] != row.torch:
        yield f"torch_version is {info.get('torch_version')!r}, need {row.torch}"


# ------------------------------------------------------------------------------ the zip


def path_problem(
    name: str, dist_info: str, package: str, modules: Sequence[str] = ()
) -> str | None:
    """Why a member name must not be in the wheel of import package ``package`` (and the
    top-level ``modules``), or None if it may."""
    if name.startswith("/") or re.match(r"[A-Za-z]:", name):
        return "absolute path: an installer would write it outside site-packages"
    if "\\" in name:
        return "backslash in the name: a Windows separator that installers read differently"
    segments = name.rstrip("/").split("/")
    if ".." in segments:
        return "'..' climbs out of site-packages"
    if any(s in ("", ".") for s in segments):
        return "empty or '.' path segment"
    top = segments[0]
    if len(segments) == 1 and top.endswith(".pth"):
        return "a top-level .pth file runs code at every interpreter start"
    if top == "torch":
        return "a top-level torch/ overwrites torch's own files on install"
    if top.endswith(".data"):
        return (
            "a .data folder installs outside the package's folders (purelib/platlib at the "
            "top of site-packages, scripts on PATH)"
        )
    roots = (f"{package}/", f"{package}.libs/", f"{dist_info}/")
    if name.startswith(roots):
        return None
    # A top-level file is the module it names (NAME.py, NAME.cpython-312-x86_64-linux-gnu.so):
    # the import name itself (an extension that is no package) or one the table names; a
    # top-level folder, a package the table names.
    if len(segments) == 1 and top.split(".", 1)[0] in (package, *modules):
        return None
    if len(segments) > 1 and top in modules:
        return None
    also = f" or the top-level modules {', '.join(modules)}" if modules else ""
    return f"outside {', '.join(roots)}, {package}.*{also}"


@rule("member-paths")
def check_member_paths(it: Inspection) -> Iterator[str]:
    """Every member is under <import>/, <import>.libs/, <distribution>-<version>.dist-info/,
    is the module <import> itself (<import>.*) or a top-level module the table names."""
    dist_info = f"{it.name}-{it.wheel.version}.dist-info"
    for info in it.wheel.infos():
        problem = path_problem(
            info.filename, dist_info, it.project.import_name, it.project.top_level_modules
        )
        if problem:
            yield f"{info.filename!r}: {problem}"


@rule("no-duplicates")
def check_no_duplicates(it: Inspection) -> Iterator[str]:
    """No member name appears twice in the zip."""
    counts = Counter(info.filename for info in it.wheel.infos())
    for name, count in sorted(counts.items()):
        if count > 1:
            yield f"{name} appears {count} times; which copy lands on disk depends on the installer"


def _sha256(it: Inspection, info: zipfile.ZipInfo) -> tuple[str, int]:
    digest = hashlib.sha256()
    size = 0
    for chunk in it.wheel.chunks(info):
        digest.update(chunk)
        size += len(chunk)
    return base64.urlsafe_b64encode(digest.digest()).rstrip(b"=").decode(), size


@rule("record")
def check_record(it: Inspection) -> Iterator[str]:
    """RECORD lists every file, each with its right sha256 and size, and nothing else."""
    record = f"{it.wheel.dist_info}/RECORD"
    entries: dict[str, tuple[str, str]] = {}
    for fields in csv.reader(io.StringIO(it.wheel.text(record))):
        if not fields:
            continue
        if len(fields) != 3:
            yield f"RECORD line {fields!r} has {len(fields)} fields, need path,hash,size"
            continue
        if fields[0] in entries:
            yield f"RECORD lists {fields[0]} twice"
        entries[fields[0]] = (fields[1], fields[2])
    # The wheel spec leaves RECORD and its signatures out of the hashed set.
    unhashed = {record, f"{record}.jws", f"{record}.p7s"}
    members = set()
    for info in it.wheel.files():
        name = info.filename
        members.add(name)
        if name in unhashed:
            continue
        if name not in entries:
            yield f"{name} is not listed in RECORD"
            continue
        listed, listed_size = entries[name]
        algorithm, _, listed_digest = listed.partition("=")
        if algorithm != "sha256" or not listed_digest:
            yield f"{name}: RECORD has hash {listed!r}, need sha256=<urlsafe base64>"
            continue
        try:
            digest, size = _sha256(it, info)
        except WheelReadError as exc:
            yield str(exc)
            continue
        if digest != listed_digest:
            yield f"{name}: sha256 is {digest}, RECORD says {listed_digest} (changed after RECORD)"
        if listed_size != str(size):
            yield f"{name}: {size} bytes, RECORD says {listed_size!r}"
    for name in sorted(entries.keys() - members):
        yield f"RECORD lists {name}, which the wheel does not contain"


# ----------------------------------------------------------------------------- libraries


@rule("no-bundled-libs")
def check_no_bundled_libs(it: Inspection) -> Iterator[str]:
    """No torch, CUDA or NVIDIA driver library inside the wheel (they come from torch, or the
    machine's driver, at run time)."""
    for info in it.wheel.files():
        reason = libraries.forbidden_reason(info.filename, it.provided_by_torch)
        if reason:
            yield f"{info.filename} is {reason}"


@rule("elf-readable")
def check_elf_readable(it: Inspection) -> Iterator[str]:
    """Every ELF file in the wheel can be read (the other library rules need it)."""
    for name, problem in sorted(it.elf_errors.items()):
        yield f"{name} is not a readable ELF file ({problem}); build the wheel again"


@rule("libraries")
def check_libraries(it: Inspection) -> Iterator[str]:
    """The table's ``audit.libraries`` are there (else at least one shared library)."""
    names = [info.filename for info in it.wheel.files()]
    for pattern in it.project.audit.libraries:
        if not any(fnmatch.fnmatchcase(name, pattern) for name in names):
            yield (
                f"no member matches {pattern!r} (the project table's audit.libraries): the build "
                "left that library out"
            )
    if not it.project.audit.libraries and not any(name.endswith(".so") for name in names):
        yield "no shared library at all: the build compiled no extension"


def labelled_variant(version: str) -> variant.Variant | None:
    """The variant a wheel's version label names; None without a label one can read."""
    try:
        labelled: variant.Variant = variant.parse_version(version)
        return labelled
    except ValueError:
        return None  # version-label reports it


@rule("device-code")
def check_device_code(it: Inspection) -> Iterator[str]:
    """A CUDA-labelled wheel holds device code: a cubin or PTX in some library's .nv_fatbin;
    a CPU-labelled one holds none."""
    labelled = labelled_variant(it.wheel.version)
    if labelled is None:
        return
    if labelled.cuda is None:
        for name, facts in sorted(it.elf_facts.items()):
            if facts.device_code:
                yield (
                    f"labelled for the CPU ({it.wheel.version}) but {name} holds device code "
                    f"({', '.join(facts.device_code)}): the build found a CUDA toolkit of the "
                    "builder's own and compiled for it, as torch's cpp_extension does with any "
                    "nvcc on PATH. Make the project build CPU-only when its CUDA switch is 0 "
                    "({cuda} in the table's build-env), or leave the CPU build out"
                )
        return
    if not it.project.audit.device_code:
        return
    if any(facts.device_code for facts in it.elf_facts.values()):
        return
    yield (
        f"labelled for CUDA {labelled.cuda} ({it.wheel.version}) but no library holds device "
        "code (no cubin or PTX in an .nv_fatbin section): the build compiled no CUDA source. "
        "A setup.py "
        "that picks CUDA with torch.cuda.is_available() builds CPU-only on a builder without "
        "a GPU; make it build CUDA regardless (FORCE_CUDA=1 or the project's own switch, set "
        "in the project table's build-env) and give the archs in TORCH_CUDA_ARCH_LIST"
    )


@rule("search-path")
def check_search_paths(it: Inspection) -> Iterator[str]:
    """No ELF has an RPATH/RUNPATH entry outside the wheel (only $ORIGIN-relative ones)."""
    for name, facts in sorted(it.elf_facts.items()):
        for kind, entry in facts.search_paths:
            if elf.outside_the_wheel(entry):
                yield (
                    f"{name} has {kind} {entry!r}, a folder of the build machine that the loader "
                    "would search on every user's; link without it (torch's libraries are "
                    "already loaded when the package's are) or use a $ORIGIN-relative path"
                )


def _symbol_versions(it: Inspection, family: str) -> Iterator[str]:
    limit = elf.MAX_SYMBOL_VERSIONS[family]
    for name, needs in sorted(it.elf_needs.items()):
        newer = elf.newer_than(needs, family, limit)
        if newer:
            yield (
                f"{name} needs {', '.join(newer)}; limit is {elf.version_text(family, limit)} "
                "(torch's own libs)"
            )


@rule("glibc-version")
def check_glibc_version(it: Inspection) -> Iterator[str]:
    """No ELF needs GLIBC_ newer than 2.28 (what torch's own libs need)."""
    return _symbol_versions(it, "GLIBC")


@rule("glibcxx-version")
def check_glibcxx_version(it: Inspection) -> Iterator[str]:
    """No ELF needs GLIBCXX_ newer than 3.4.22 (what torch's own libs need)."""
    return _symbol_versions(it, "GLIBCXX")


@rule("sbom")
def check_sbom(it: Inspection) -> Iterator[str]:
    """A CycloneDX SBOM under .dist-info/sboms/ that names the build info's torch and CUDA
    (for projects whose table names a build-info module: the SBOM is made from it)."""
    if not it.project.audit.build_info:
        return
    dist_infos = {name.split("/")[0] for name in it.wheel.zip.namelist() if ".dist-info/" in name}
    if len(dist_infos) != 1:
        return  # member-paths reports the extra folder; the SBOM's place is ambiguous
    try:
        problems = sbom.check_sbom(it.wheel.path, it.project.audit.build_info)
    except (zipfile.BadZipFile, ValueError, SyntaxError):
        return  # a member that can't be read is the record and build-info rules' finding
    missing_info = f"sbom: the wheel has no {it.project.audit.build_info}"
    yield from (p for p in problems if not p.startswith(missing_info))


@rule("torch-stable-abi", kinds=(variant.STABLE,))
def check_torch_stable_abi(it: Inspection) -> Iterator[str]:
    """No library uses a libtorch symbol outside the stable ABI (torch-abi-audit)."""
    for name, abi in sorted(it.torch_abi.items()):
        if abi.unstable_symbols:
            shown = ", ".join(abi.unstable_symbols[:SHOWN_SYMBOLS])
            more = len(abi.unstable_symbols) - SHOWN_SYMBOLS
            yield (
                f"{name} references {len(abi.unstable_symbols)} libtorch symbol(s) outside the "
                f"stable ABI: {shown}{f' and {more} more' if more > 0 else ''}; a stable wheel "
                "reaches torch only through torch/csrc/stable and the aoti_torch_* shim "
                "(build with -DTORCH_STABLE_ONLY)"
            )
        elif it.required_library(name) and abi.stable_shim_count == 0:
            yield (
                f"{name} references no stable-ABI shim symbol (aoti_torch_*, torch_*), yet a "
                "stable wheel's libraries reach torch through that shim: either this is "
                "not a stable build, or nm could not read the file (GNU binutils >= 2.37)"
            )


@rule("stable-abi-floor", kinds=(variant.STABLE,))
def check_stable_abi_floor(it: Inspection) -> Iterator[str]:
    """No library needs a shim newer than the torch floor the wheel declares."""
    floor = variant.STABLE_ABI_FLOOR
    for name, abi in sorted(it.torch_abi.items()):
        if abi.unknown_shim_symbols:
            yield (
                f"{name} uses shim symbols newer than torch-abi-audit {stable_abi.PINNED_VERSION} "
                f"knows ({', '.join(abi.unknown_shim_symbols)}): it needs a torch newer than "
                f"{variant.minor_text(floor)}, the wheel declares {it.row.requires_torch}"
            )
        elif abi.min_torch_version and variant.torch_minor(abi.min_torch_version) > floor:
            yield (
                f"{name} needs torch >= {abi.min_torch_version} (for "
                f"{', '.join(abi.version_defining_symbols)}), the wheel declares "
                f"{it.row.requires_torch}: build with TORCH_TARGET_VERSION "
                f"{variant.minor_text(floor)}"
            )


# --------------------------------------------------------------------------------- run all


def _build_row(row: Row) -> Row:
    """A served row's wheel is the one built against its build row: audit against that."""
    if row.is_build:
        return row
    try:
        return build_row_of(row, load_rows())
    except StopIteration:
        raise AuditError(
            f"torch {row.torch} is served by the wheel built against torch {row.build_torch}, "
            "which has no matrix row"
        ) from None


def check_wheel(
    wheel: Path, row: Row, provided_by_torch: Iterable[str] = (), project: Project | None = None
) -> AuditReport:
    """Run every rule for the wheel's kind; AuditError if the file cannot be opened at all.

    ``row`` is the matrix row the wheel serves or is built for; ``provided_by_torch`` are
    library file names torch's installation provides (``torch_provided_libs``); ``project``
    the table of the wheel's package (default: this repository's).
    """
    row = _build_row(row)
    report = AuditReport(wheel.name)
    with Wheel.open(wheel) as opened:
        inspection = Inspection(opened, row, provided_by_torch, project)
        for checked in rules_for(row.kind):
            try:
                for message in checked.check(inspection):
                    report.violations.append(f"{checked.id}: {message}")
            except AuditError as exc:  # a member it needed is unreadable, or a tool is missing
                report.violations.append(f"{checked.id}: {exc}")
        report.max_versions = inspection.max_versions()
        report.device_code = {
            name: list(facts.device_code)
            for name, facts in sorted(inspection.elf_facts.items())
            if facts.device_code
        }
    return report


def raise_on_violations(wheel_name: str, report: AuditReport) -> None:
    """Stop with every broken rule, each line naming the wheel and the rule."""
    if not report.ok:
        raise AuditError("\n".join(f"{wheel_name}: {v}" for v in report.violations))
