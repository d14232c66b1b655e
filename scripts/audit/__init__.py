"""Repair and audit built wheels: auditwheel, abi3audit, torch-abi-audit and the pipeline's rules.

``nox -s wheels`` and cibuildwheel's repair step call ``repair_and_audit``; a wheel built or
downloaded elsewhere is checked with ``python -m scripts.audit WHEEL [WHEEL ...]``
(``--help`` lists the rules). Each failure reads ``<wheel>: <rule>: <what was found>``.

* ``wheelfile``   reading a wheel that may be broken or hostile
* ``rules``       the pipeline's rules, one function each, and ``check_wheel`` that runs them
* ``elf``         symbol versions an ELF needs (glibc, libstdc++)
* ``libraries``   which libraries a wheel must not bundle (torch's and CUDA's)
* ``stable_abi``  torch-abi-audit: libtorch symbols outside the stable ABI
* ``repair``      auditwheel repair and abi3audit
* ``command``     ``python -m scripts.audit``: a verdict per wheel and a summary
"""

from __future__ import annotations

from scripts.audit.command import audit_file, main, row_for_wheel
from scripts.audit.elf import MAX_SYMBOL_VERSIONS, elf_version_needs, max_versions, parse_version
from scripts.audit.libraries import torch_provided_libs
from scripts.audit.repair import (
    AUDITWHEEL_EXCLUDES,
    auditwheel_command,
    drop_search_paths,
    droppable_search_paths,
    repair_and_audit,
    repair_wheel,
    run_abi3audit,
)
from scripts.audit.rules import (
    PLATFORM,
    RULES,
    AuditReport,
    Inspection,
    Rule,
    check_wheel,
    raise_on_violations,
)
from scripts.audit.wheelfile import AuditError, Wheel, WheelReadError, wheel_name_parts

__all__ = [
    "AUDITWHEEL_EXCLUDES",
    "MAX_SYMBOL_VERSIONS",
    "PLATFORM",
    "RULES",
    "AuditError",
    "AuditReport",
    "Inspection",
    "Rule",
    "Wheel",
    "WheelReadError",
    "audit_file",
    "auditwheel_command",
    "check_wheel",
    "drop_search_paths",
    "droppable_search_paths",
    "elf_version_needs",
    "main",
    "max_versions",
    "parse_version",
    "raise_on_violations",
    "repair_and_audit",
    "repair_wheel",
    "row_for_wheel",
    "run_abi3audit",
    "torch_provided_libs",
    "wheel_name_parts",
]
