"""pyproject.toml's ``filterwarnings``: the op suites turn every warning into an error, except
torch's own known ones; these run pytest with that configuration on small test files that warn
as torch or as hotloop would (``warnings.warn_explicit`` names the module a warning comes from,
which is what a filter's module field matches)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from scripts.basics import REPO

SCRIPT_METHOD_314 = (
    "`torch.jit.script_method` is not supported in Python 3.14+ and may break. "
    "Please switch to `torch.compile` or `torch.export`."
)
SCRIPT_314 = (
    "`torch.jit.script` is not supported in Python 3.14+ and may break. "
    "Please switch to `torch.compile` or `torch.export`."
)


# (message, category, module raising it, whether the suite passes).
CASES = {
    # torch's own use of torch.jit on Python 3.14+: Inductor (script_method) and forward AD
    # (script), DeprecationWarning in torch 2.11/2.12, FutureWarning in 2.15.
    "torch-script-method-deprecation": (
        SCRIPT_METHOD_314,
        "DeprecationWarning",
        "torch.jit._script",
        "passed",
    ),
    "torch-script-method-future": (
        SCRIPT_METHOD_314,
        "FutureWarning",
        "torch.jit._script",
        "passed",
    ),
    "torch-script-deprecation": (SCRIPT_314, "DeprecationWarning", "torch.jit._script", "passed"),
    "torch-script-future": (SCRIPT_314, "FutureWarning", "torch.jit._script", "passed"),
    # The same words from anywhere but torch.jit._script.
    "hotloop-script-method": (SCRIPT_METHOD_314, "DeprecationWarning", "hotloop.ops.api", "failed"),
    "hotloop-script": (SCRIPT_314, "FutureWarning", "hotloop", "failed"),
    "other-torch-module": (SCRIPT_314, "FutureWarning", "torch.jit._script_other", "failed"),
    # hotloop's own warnings.
    "hotloop-deprecation": ("eps is deprecated", "DeprecationWarning", "hotloop.ops.api", "failed"),
    "hotloop-user": ("slow path", "UserWarning", "hotloop.modules", "failed"),
}


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Each case's outcome under the repository's pytest configuration: one pytest run over
    a file with one test per case."""
    folder = tmp_path_factory.mktemp("warns")
    lines = ["import warnings", ""]
    for i, (message, category, module, _) in enumerate(CASES.values()):
        lines += [
            "",
            f"def test_case_{i}():",
            f"    warnings.warn_explicit({message!r}, {category}, 'x.py', 1, module={module!r})",
        ]
    (folder / "test_warns.py").write_text("\n".join(lines) + "\n")
    command = [sys.executable, "-m", "pytest", "test_warns.py", "-q", "-rA", "-pno:cacheprovider"]
    config = ["-c", str(REPO / "pyproject.toml"), "--rootdir", str(folder)]
    proc = subprocess.run(
        [*command, *config],
        cwd=folder,
        capture_output=True,
        text=True,
    )
    summary = re.findall(r"^(PASSED|FAILED) test_warns\.py::test_case_(\d+)", proc.stdout, re.M)
    by_index = {index: status.lower() for status, index in summary}
    assert len(by_index) == len(CASES), proc.stdout + proc.stderr
    return {name: by_index[str(i)] for i, name in enumerate(CASES)}


@pytest.mark.parametrize("case", CASES)
def test_only_torchs_own_jit_warning_on_python_314_is_ignored(
    outcomes: dict[str, str], case: str
) -> None:
    message, category, module, expected = CASES[case]
    assert outcomes[case] == expected, f"{category}({message!r}) from {module}"


def test_hotloop_never_uses_torch_jit() -> None:
    """The 3.14 filter matches torch.jit._script whoever calls it: it hides nothing of
    hotloop's only while hotloop itself never scripts anything."""
    users = [
        str(path.relative_to(REPO))
        for path in sorted((REPO / "src" / "hotloop").rglob("*.py"))
        if "torch.jit" in path.read_text()
    ]
    assert users == [], f"hotloop calls torch.jit in {users}; narrow the 3.14 warning filter"
