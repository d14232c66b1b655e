"""``python -m scripts.audit WHEEL...``: a verdict for every wheel, a summary, an exit status."""

from __future__ import annotations

import argparse
import sys
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from scripts import variant
from scripts.audit.libraries import torch_provided_libs
from scripts.audit.repair import run_abi3audit
from scripts.audit.rules import RULES, check_wheel
from scripts.audit.wheelfile import AuditError, require_wheel_file, wheel_name_parts
from scripts.matrix import Row, build_rows, load_rows

USAGE = """Audit built wheels: abi3audit --strict and the pipeline's rules.

A wheel built or downloaded elsewhere (a CI artifact, an index) is checked against the
matrix row its local version label names (+stable.cu13: the stable wheel's build row;
+pt29cu128: that pinned row; a public version such as 0.1.0: the variant PyPI serves,
stable.cu13). Every wheel gets a verdict; the exit status is 1 if any
failed. --torch-site (the site-packages of the row's torch) adds the libraries that torch
and its requirements install to those the wheel must not bundle.
"""


def row_for_wheel(wheel: Path, rows: Sequence[Row]) -> Row:
    """The build row of the wheel's variant: the row its wheel is compiled against."""
    version = wheel_name_parts(wheel.name)["version"]
    # A public version is PyPI's copy of one variant's wheel (scripts.pypi_release).
    pypi = variant.PYPI_VARIANT
    label = pypi.label if version == variant.public_version(pypi.version) else ""
    if not label:
        try:
            variant.parse_version(version)
        except ValueError as exc:
            raise AuditError(f"{wheel.name}: version-label: {exc}") from None
        label = version.partition("+")[2]
    for row in build_rows(rows):
        if row.variant == label:
            return row
    known = ", ".join(sorted({r.variant for r in rows}))
    raise AuditError(
        f"{wheel.name}: version-label: {version!r} names no matrix row; the matrix builds {known}"
    )


@dataclass
class Verdict:
    """One wheel's outcome: ``problems`` are full ``<wheel>: <rule>: <message>`` lines."""

    wheel: str
    problems: list[str] = field(default_factory=list)
    max_versions: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.problems


def audit_file(path: Path, rows: Sequence[Row], provided: Sequence[str], abi3: bool) -> Verdict:
    """Every check for one wheel file; never raises for anything about the file."""
    verdict = Verdict(path.name or str(path))
    try:
        require_wheel_file(path)
        report = check_wheel(path, row_for_wheel(path, rows), provided)
        verdict.problems += [f"{path.name}: {v}" for v in report.violations]
        verdict.max_versions = report.max_versions
        if abi3:
            run_abi3audit(path)
    except AuditError as exc:
        verdict.problems += str(exc).splitlines()
    # A wheel no rule foresaw must still get a verdict and leave the others their turn.
    except Exception as exc:
        verdict.problems.append(f"{verdict.wheel}: audit crashed: {type(exc).__name__}: {exc}")
        verdict.problems += traceback.format_exc().rstrip().splitlines()
    return verdict


def rule_list() -> str:
    width = max(len(r.id) for r in RULES)
    lines = []
    for r in RULES:
        kinds = "" if len(r.kinds) > 1 else f" [{r.kinds[0]} wheels]"
        lines.append(f"  {r.id:<{width}}  {r.summary}{kinds}")
    return "rules:\n" + "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m scripts.audit",
        description=USAGE,
        epilog=rule_list(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("wheels", nargs="+", type=Path)
    parser.add_argument("--torch-site", type=Path, help="site-packages holding the row's torch")
    parser.add_argument("--skip-abi3audit", action="store_true")
    args = parser.parse_args(argv)
    provided = torch_provided_libs(args.torch_site) if args.torch_site else []
    rows = load_rows()
    verdicts = []
    for path in args.wheels:
        verdict = audit_file(path, rows, provided, abi3=not args.skip_abi3audit)
        verdicts.append(verdict)
        if verdict.ok:
            needs = ", ".join(sorted(verdict.max_versions.values()))
            # flush: a wheel's verdict stays in order with the failures on stderr
            print(f"{verdict.wheel}: ok ({needs})", flush=True)
        else:
            print("\n".join(verdict.problems), file=sys.stderr)
            print(f"{verdict.wheel}: FAILED", file=sys.stderr, flush=True)
    failed = [v.wheel for v in verdicts if not v.ok]
    passed = len(verdicts) - len(failed)
    print(f"audited {len(verdicts)} wheel(s): {passed} ok, {len(failed)} failed")
    if failed:
        print("failed: " + ", ".join(failed))
    return 1 if failed else 0
