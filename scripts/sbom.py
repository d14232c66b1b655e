"""A CycloneDX SBOM for each wheel (PEP 770: ``<name>.dist-info/sboms/``), and its audit check.

The SBOM lists what went into the binary: the torch whose headers it was compiled against,
the CUDA version and the toolkit packages (versions and hashes), the sysroot's Debian
packages (versions and the ``.deb`` hashes), the compiler and the arch list. It is written
with ``cyclonedx-python-lib`` (:data:`TOOLS`), with a serial number and timestamp derived
from the wheel and ``SOURCE_DATE_EPOCH`` so that the SBOM is as reproducible as the wheel.

* :func:`collect_inputs` / :func:`build_sbom`: make the document for a repaired wheel
  (``scripts.reproducible.finalize_wheel`` adds it).
* :func:`check_sbom`: the audit rule ``sbom`` (stdlib only): present, parses as CycloneDX,
  names the torch and CUDA versions and the compilers that the wheel's build info names (the
  module of the project table's ``audit.build-info``, where setup.py records the compilers
  the build ran), and describes the version the build info names (version and purl).

The document's root component is the wheel's distribution, and its properties are named in
that distribution's namespace (``<name>:torch-version``); :func:`sbom_properties` reads
them back without it.
* :func:`describe_copy`: the SBOM of a wheel's copy under another version (the PyPI upload).
* :func:`read_sboms` / :func:`project_sbom`: the SBOM bytes of a wheel, for the index.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import re
import urllib.parse
import uuid
import zipfile
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from email.parser import Parser
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scripts import tools
from scripts.wheelfile import build_info_of, own_build_info_member, sbom_member

if TYPE_CHECKING:
    from cyclonedx.model.component import Component

    from scripts.matrix import Row

# The library that writes the SBOM, pinned with the pipeline's other tools.
TOOLS = tools.SBOM
# Names under which the SBOM states the build info's torch and CUDA versions (each in the
# distribution's namespace: ``<name>:torch-version``).
PROP_TORCH = "torch-version"
PROP_CUDA = "cuda-version"
PROP_ARCH_LIST = "cuda-arch-list"
PROP_ARCHS = "compiled-archs"
PROP_HASH_OF = "hash-of"
# A fixed namespace: the serial number is uuid5(NAMESPACE, wheel name + SOURCE_DATE_EPOCH).
NAMESPACE = uuid.UUID("5d3f1d0e-8f7c-4b0e-9a52-6c1f0d6b8a11")


@dataclass(frozen=True)
class Package:
    """One input package: ``kind`` is ``pypi`` or ``deb``; ``sha256`` of its archive or record."""

    kind: str
    name: str
    version: str
    sha256: str | None = None
    hash_of: str = ""  # what sha256 is the hash of, when not the package's own archive
    qualifiers: Mapping[str, str] = field(default_factory=dict)


def sbom_path(distribution: str) -> str:
    """The SBOM's member path relative to the .dist-info folder (PEP 770); the index reads it
    through scripts.wheelfile."""
    return sbom_member(distribution)


def sbom_name(distribution: str) -> str:
    """The SBOM's file name under ``.dist-info/sboms/``."""
    return sbom_path(distribution).rpartition("/")[2]


def distribution_of(wheel: Path | str) -> str:
    """The distribution part of a wheel file name (``my_ext`` of ``my_ext-0.1.0-….whl``)."""
    return Path(wheel).name.split("-")[0]


@dataclass(frozen=True)
class SbomInputs:
    name: str  # the distribution: the root component's name and the properties' namespace
    wheel_name: str  # the repaired wheel's file name
    version: str  # the wheel's version (0.1.0+stable.cu13)
    torch_version: str  # build info's torch_version: the headers compiled against
    cuda_version: str | None  # build info's cuda_version (None: CPU build)
    arch_list: str | None  # TORCH_CUDA_ARCH_LIST of the build
    archs: tuple[str, ...]  # build info's compiled archs
    compilers: tuple[tuple[str, str], ...]  # (name, version line)
    toolkit: tuple[Package, ...]
    sysroot: tuple[Package, ...]
    epoch: int


# --------------------------------------------------------------------------- collecting


def _dist_info(names: Sequence[str]) -> str:
    dirs = {n.split("/")[0] for n in names if n.split("/")[0].endswith(".dist-info")}
    if len(dirs) != 1:
        raise ValueError(f"expected one .dist-info folder, found {sorted(dirs)}")
    return dirs.pop()


def wheel_build_info(zf: zipfile.ZipFile, member: str | None = None) -> dict[str, Any] | None:
    """``BUILD_INFO`` of the build-info module ``member`` (default: this repository's table's
    ``audit.build-info``) in the wheel, read without importing it."""
    try:
        text = zf.read(member or own_build_info_member()).decode()
    except KeyError:
        return None
    return build_info_of(text)


def installed_distributions(site: Path) -> list[Package]:
    """``name==version`` of each ``*.dist-info`` in ``site``, hashed by its ``RECORD``.

    The toolkit is installed with ``--target``, which keeps no archive: the RECORD (every
    installed file with its sha256) identifies exactly what was installed.
    """
    found = []
    for info in sorted(site.glob("*.dist-info")):
        meta = Parser().parsestr((info / "METADATA").read_text(errors="replace"))
        record = info / "RECORD"
        digest = hashlib.sha256(record.read_bytes()).hexdigest() if record.is_file() else None
        found.append(Package("pypi", meta["Name"], meta["Version"], digest, "installed RECORD"))
    return found


DEB_NAME = re.compile(r"^(?P<name>[^_]+)_(?P<version>[^_]+)_(?P<arch>[^_.]+)\.deb$")


def deb_packages(debs: Sequence[Path], distro: str) -> list[Package]:
    """Packages from ``.deb`` files named as apt names them (``libc6_2.31-13+deb11u11_amd64``)."""
    out = []
    for deb in sorted(debs):
        match = DEB_NAME.match(deb.name)
        if not match:
            raise ValueError(f"{deb.name}: not a name_version_arch.deb file name")
        out.append(
            Package(
                "deb",
                match["name"],
                urllib.parse.unquote(match["version"]),
                hashlib.sha256(deb.read_bytes()).hexdigest(),
                qualifiers={"arch": match["arch"], "distro": distro},
            )
        )
    return out


def recorded_compilers(info: Mapping[str, Any]) -> list[tuple[str, str]]:
    """``(name, version line)`` of each compiler the build ran (build info ``compilers``);
    empty when the build info has none in that shape."""
    found = info.get("compilers")
    if not isinstance(found, list):
        return []
    pairs = [tuple(c) for c in found if isinstance(c, (list, tuple)) and len(c) == 2]
    if len(pairs) != len(found) or not all(isinstance(x, str) for p in pairs for x in p):
        return []
    return [(str(name), str(line)) for name, line in pairs]


def collect_inputs(
    row: Row,
    wheel: Path,
    cuda_home: Path | None,
    sysroot: Path | None,
    epoch: int,
    build_info: str | None = None,
) -> SbomInputs:
    """What a wheel built for ``row`` was made from.

    ``cuda_home``: the toolkit of a CUDA build (``toolchain.ensure_cuda_toolkit``; its
    ``site-packages`` sibling holds the PyPI packages). ``sysroot``: the glibc sysroot
    (``toolchain.ensure_sysroot``; the ``.deb`` files it was unpacked from lie in its
    sibling ``debs/``), ``None`` where the image's own glibc is the target. ``build_info``:
    the build-info module (default: this repository's table's).
    """
    from scripts import toolchain

    member = build_info or own_build_info_member()
    with zipfile.ZipFile(wheel) as zf:
        info = wheel_build_info(zf, member)
        metadata = Parser().parsestr(zf.read(f"{_dist_info(zf.namelist())}/METADATA").decode())
    if info is None:
        raise ValueError(f"{wheel.name}: no {member} to describe")
    # The compilers the build ran, as setup.py recorded them: this process's $CXX is not
    # necessarily the build's (the build gets the toolchain's), and may be any command line.
    compilers = recorded_compilers(info)
    if not compilers:
        raise ValueError(
            f"{wheel.name}: its build info records no compilers (setup.py writes them); "
            "rebuild it with this setup.py"
        )
    toolkit: list[Package] = []
    if cuda_home is not None:
        tk_site = cuda_home.resolve().parent / "site-packages"
        toolkit = installed_distributions(tk_site) if tk_site.is_dir() else []
    debs = sorted((sysroot.parent / "debs").glob("*.deb")) if sysroot is not None else []
    return SbomInputs(
        name=metadata["Name"],
        wheel_name=wheel.name,
        version=metadata["Version"],
        torch_version=info["torch_version"],
        cuda_version=info.get("cuda_version"),
        arch_list=row.arch_list if cuda_home is not None else None,
        archs=tuple(info.get("archs") or ()),
        compilers=tuple(compilers),
        toolkit=tuple(toolkit),
        sysroot=tuple(deb_packages(debs, f"debian-{toolchain.SYSROOT_SUITE}")),
        epoch=epoch,
    )


# --------------------------------------------------------------------------- writing


def _component(pkg: Package, description: str, namespace_of_props: str) -> Component:
    from cyclonedx.model import HashAlgorithm, HashType, Property
    from cyclonedx.model.component import Component, ComponentType
    from packageurl import PackageURL

    namespace = "debian" if pkg.kind == "deb" else None
    purl = PackageURL(
        type=pkg.kind,
        namespace=namespace,
        name=pkg.name,
        version=pkg.version,
        qualifiers=dict(pkg.qualifiers) or None,
    )
    hash_of = f"{namespace_of_props}:{PROP_HASH_OF}"
    props = [Property(name=hash_of, value=pkg.hash_of)] if pkg.hash_of else []
    return Component(
        name=pkg.name,
        version=pkg.version,
        type=ComponentType.LIBRARY,
        purl=purl,
        bom_ref=str(purl),
        description=description,
        hashes=[HashType(alg=HashAlgorithm.SHA_256, content=pkg.sha256)] if pkg.sha256 else [],
        properties=props,
    )


def serial_number(wheel_name: str, epoch: int) -> uuid.UUID:
    """The document's serial number: the same wheel and build time give the same one."""
    return uuid.uuid5(NAMESPACE, f"{wheel_name}@{epoch}")


def package_url(name: str, version: str) -> str:
    """The root component's purl, ``pkg:pypi/my-ext@0.1.0%2Bstable.cu13`` (as packageurl
    writes it: the name lower case, ``_`` and ``.`` as ``-``; standard library only, for the
    audit)."""
    purl_name = re.sub(r"[-_.]+", "-", name).lower()
    return f"pkg:pypi/{purl_name}@{urllib.parse.quote(version, safe='')}"


def _render(document: Mapping[str, Any]) -> bytes:
    return (json.dumps(document, indent=2, sort_keys=True) + "\n").encode()


def describe_copy(data: bytes, version: str, wheel_name: str) -> bytes:
    """The SBOM ``data`` of a wheel, for a copy of it named ``wheel_name`` under ``version``
    (``scripts.pypi_release``): the root component's version, purl and description and the
    serial number change; what went into the binary is the same."""
    document = json.loads(data)
    if not isinstance(document, dict) or shape_problems(document):
        raise ValueError(
            f"{sbom_path(distribution_of(wheel_name))} is not a CycloneDX document this "
            "pipeline wrote"
        )
    root = document["metadata"]["component"]
    stamp = datetime.datetime.fromisoformat(document["metadata"]["timestamp"])
    root.update(
        version=version,
        purl=package_url(str(root.get("name")), version),
        description=f"the wheel {wheel_name}",
    )
    document["serialNumber"] = serial_number(wheel_name, int(stamp.timestamp())).urn
    return _render(document)


def build_sbom(inputs: SbomInputs) -> bytes:
    """The CycloneDX 1.6 JSON document for ``inputs`` (same inputs, same bytes)."""
    from cyclonedx.model import Property
    from cyclonedx.model.bom import Bom, BomMetaData
    from cyclonedx.model.component import Component, ComponentType
    from cyclonedx.output.json import JsonV1Dot6
    from packageurl import PackageURL

    def prop(key: str, value: str) -> Property:
        return Property(name=f"{inputs.name}:{key}", value=value)

    props = [prop(PROP_TORCH, inputs.torch_version)]
    if inputs.cuda_version:
        props.append(prop(PROP_CUDA, inputs.cuda_version))
    if inputs.arch_list:
        props.append(prop(PROP_ARCH_LIST, inputs.arch_list))
    if inputs.archs:
        props.append(prop(PROP_ARCHS, ",".join(inputs.archs)))
    root = Component(
        name=inputs.name,
        version=inputs.version,
        type=ComponentType.LIBRARY,
        purl=PackageURL(type="pypi", name=inputs.name, version=inputs.version),
        bom_ref=inputs.name,
        description=f"the wheel {inputs.wheel_name}",
        properties=props,
    )
    torch_release = inputs.torch_version.split("+")[0]
    components = [
        Component(
            name="torch",
            version=inputs.torch_version,
            type=ComponentType.FRAMEWORK,
            purl=PackageURL(type="pypi", name="torch", version=torch_release),
            bom_ref="torch",
            description="headers the extension is compiled against; loaded at run time",
        )
    ]
    if inputs.cuda_version:
        components.append(
            Component(
                name="cuda",
                version=inputs.cuda_version,
                type=ComponentType.PLATFORM,
                bom_ref="cuda",
                description="CUDA version of the build's torch (torch.version.cuda)",
            )
        )
    components += [
        _component(p, "CUDA toolkit package (compiler, headers)", inputs.name)
        for p in inputs.toolkit
    ]
    components += [
        _component(p, "glibc sysroot package (headers, link stubs)", inputs.name)
        for p in inputs.sysroot
    ]
    for name, line in inputs.compilers:
        match = re.search(r"(\d+\.\d+(?:\.\d+)?)", line.split(")")[-1]) or re.search(
            r"(\d+\.\d+(?:\.\d+)?)", line
        )
        components.append(
            Component(
                name=name,
                version=match.group(1) if match else line,
                type=ComponentType.APPLICATION,
                bom_ref=f"compiler:{name}",
                description=line,
            )
        )
    stamp = datetime.datetime.fromtimestamp(inputs.epoch, tz=datetime.timezone.utc)
    bom = Bom(
        serial_number=serial_number(inputs.wheel_name, inputs.epoch),
        metadata=BomMetaData(component=root, timestamp=stamp),
        components=components,
    )
    # Everything listed went into the wheel's binary: the root depends on all of it.
    bom.register_dependency(root, components)
    text = JsonV1Dot6(bom).output_as_string(indent=2)
    # The library records itself as the tool; keep its output as it is, sorted for stability.
    return _render(json.loads(text))


# --------------------------------------------------------------------------- reading, checking


def read_sboms(wheel: Path) -> dict[str, bytes]:
    """Every SBOM in ``wheel``'s ``.dist-info/sboms/`` (ours and any auditwheel adds), by name."""
    with zipfile.ZipFile(wheel) as zf:
        prefix = f"{_dist_info(zf.namelist())}/sboms/"
        found = {}
        for name in sorted(zf.namelist()):
            if name.startswith(prefix) and not name.endswith("/"):
                try:
                    found[name[len(prefix) :]] = zf.read(name)
                # A damaged member (bad CRC, broken deflate stream) is the finding, not a crash.
                except (zipfile.BadZipFile, zlib.error, EOFError) as exc:
                    raise ValueError(f"{name} cannot be read from the zip ({exc})") from None
        return found


def project_sbom(wheel: Path) -> bytes:
    """The bytes of the project's own SBOM in ``wheel`` (what the index publishes next to it)."""
    sboms = read_sboms(wheel)
    name = sbom_name(distribution_of(wheel))
    if name not in sboms:
        raise ValueError(
            f"{wheel.name}: no .dist-info/{sbom_path(distribution_of(wheel))} (found "
            f"{sorted(sboms) or 'no SBOM'}); wheels get it from "
            "scripts.reproducible.finalize_wheel after auditwheel repair"
        )
    return sboms[name]


def sbom_properties(document: Mapping[str, Any]) -> dict[str, str]:
    """The root component's properties, by name without the root's namespace
    (``torch-version`` for ``<name>:torch-version``)."""
    component = document.get("metadata", {}).get("component", {})
    prefix = f"{component.get('name')}:"
    return {
        p["name"][len(prefix) :] if p["name"].startswith(prefix) else p["name"]: p.get("value", "")
        for p in component.get("properties", [])
    }


_JSON_KINDS: dict[type, str] = {dict: "an object", list: "a list", str: "a string"}


def _kind(value: object) -> str:
    return type(value).__name__


def shape_problems(document: Mapping[str, Any]) -> list[str]:
    """Where a CycloneDX document lacks the shape the checks read (objects, lists and strings
    where the schema has them); empty when :func:`check_sbom` can read it. A wheel's SBOM may
    be anything: its shape is a finding, never a crash that hides the wheel's other findings."""
    problems: list[str] = []

    def expect(value: object, kind: type, where: str) -> bool:
        if isinstance(value, kind):
            return True
        problems.append(f"{where} is a {_kind(value)}, need {_JSON_KINDS[kind]}")
        return False

    def strings(entry: Mapping[str, Any], where: str, required: str, optional: str) -> None:
        if required not in entry:
            problems.append(f"{where} has no {required}")
        for key in (required, optional):
            if key in entry:
                expect(entry[key], str, f"{where}.{key}")

    metadata = document.get("metadata", {})
    if expect(metadata, dict, "metadata"):
        component = metadata.get("component", {})
        if expect(component, dict, "metadata.component"):
            for key in ("version", "purl"):
                if key in component:
                    expect(component[key], str, f"metadata.component.{key}")
            properties = component.get("properties", [])
            if expect(properties, list, "metadata.component.properties"):
                for i, prop in enumerate(properties):
                    where = f"metadata.component.properties[{i}]"
                    if expect(prop, dict, where):
                        strings(prop, where, "name", "value")
    components = document.get("components", [])
    if expect(components, list, "components"):
        for i, entry in enumerate(components):
            if expect(entry, dict, f"components[{i}]"):
                strings(entry, f"components[{i}]", "name", "version")
    return problems


def check_sbom(wheel: Path, build_info: str | None = None) -> list[str]:
    """Audit rule ``sbom``: violations (empty when the wheel's SBOM is present and agrees).

    Present under ``.dist-info/sboms/``, parses as a CycloneDX JSON document, and names the
    torch version and the CUDA version that the build-info module ``build_info`` records
    (default: this repository's table's ``audit.build-info``).
    """
    member = build_info or own_build_info_member()
    path = sbom_path(distribution_of(wheel))
    try:
        data = project_sbom(wheel)
    except (ValueError, zipfile.BadZipFile) as exc:
        return [f"sbom: {exc}"]
    try:
        document = json.loads(data)
    except ValueError as exc:
        return [f"sbom: {path} is not JSON ({exc}); rebuild the wheel"]
    if not isinstance(document, dict) or document.get("bomFormat") != "CycloneDX":
        got = document.get("bomFormat") if isinstance(document, dict) else type(document).__name__
        return [f"sbom: {path} is not a CycloneDX document (bomFormat {got!r})"]
    shape = shape_problems(document)
    if shape:
        return [f"sbom: {path} is not a CycloneDX document as written: {p}" for p in shape]
    with zipfile.ZipFile(wheel) as zf:
        info = wheel_build_info(zf, member)
    if info is None:
        return [f"sbom: the wheel has no {member} to compare the SBOM with"]
    props = sbom_properties(document)
    torch_versions = {
        c.get("version") for c in document.get("components", []) if c.get("name") == "torch"
    }
    bad = []
    want_torch = info.get("torch_version")
    if props.get(PROP_TORCH) != want_torch or want_torch not in torch_versions:
        bad.append(
            f"sbom: names torch {props.get(PROP_TORCH)!r} (component {sorted(torch_versions)}), "
            f"the build info says {want_torch!r}"
        )
    want_compilers = recorded_compilers(info)
    listed = sorted(
        (str(c.get("name")), str(c.get("description")))
        for c in document.get("components", [])
        if str(c.get("bom-ref", "")).startswith("compiler:")
    )
    if want_compilers and listed != sorted(want_compilers):
        bad.append(
            f"sbom: names compilers {listed}, the build info says the build ran "
            f"{sorted(want_compilers)}"
        )
    want_cuda = info.get("cuda_version")
    if props.get(PROP_CUDA) != want_cuda:
        bad.append(f"sbom: names CUDA {props.get(PROP_CUDA)!r}, the build info says {want_cuda!r}")
    root = document.get("metadata", {}).get("component", {})
    want_version = str(info.get("version"))
    want_purl = package_url(str(root.get("name")), want_version)
    if (root.get("version"), root.get("purl")) != (want_version, want_purl):
        bad.append(
            f"sbom: describes {root.get('name')} {root.get('version')!r} (purl "
            f"{root.get('purl')!r}), the build info says {want_version!r} ({want_purl})"
        )
    return bad
