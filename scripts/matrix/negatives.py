"""Wrong-torch cells: a wheel next to a torch it does not serve must refuse it, clearly.

Each pair puts one of the matrix's wheels into a fresh venv holding another torch, all real
installs (no patched versions):

* where the wheel's ``Requires-Dist`` excludes that torch, real pip (``--no-index``, the venv's
  torch pinned as a user keeping it would) must refuse with a dependency conflict;
* forced in with ``--no-deps``, importing the package (the project table's ``import-name``)
  must raise the import guard's ImportError naming what it found and the install command,
  never a raw ``undefined symbol``.

The CUDA major and CPU-vs-CUDA are invisible to the metadata (``torch>=2.10`` admits torch
2.10.0, a CUDA 12.8 build, next to the CUDA 13 wheel): there the guard is the only check.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scripts import build, variant
from scripts.interpreters import Interpreter
from scripts.matrix.results import FAIL, NOT_RUN, PASS
from scripts.matrix.table import Row, build_rows
from scripts.project import own_project

# PyPI's Linux torch wheels are all CUDA builds; the CPU-only ones are on PyTorch's index.
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
NEGATIVE_PYTHON = "3.12"  # every torch the pairs install has a wheel for it


def probe(import_name: str) -> str:
    """The script a negative cell runs: import the package, say where from if it loads."""
    return f"import {import_name}\nprint('imported', {import_name}.__file__)\n"


@dataclass(frozen=True)
class NegativePair:
    """A wheel (by its variant label) and the torch of a matrix row in the venv."""

    variant: str  # the wheel: a variant the matrix builds, e.g. "stable.cu13"
    torch: str  # the venv's torch: a matrix row's release
    cpu: bool = False  # that release's CPU-only build, from CPU_INDEX

    @property
    def torch_version(self) -> str:
        return f"{self.torch}+cpu" if self.cpu else self.torch

    @property
    def name(self) -> str:
        return f"{self.variant}-torch{self.torch_version}"


DEFAULT_NEGATIVES = (
    # Below the stable-ABI floor: pip refuses through torch>=2.10, the guard after --no-deps.
    NegativePair("stable.cu13", "2.9.1"),
    # A pinned wheel next to a newer torch: pip refuses through torch==2.9.*, then the guard.
    NegativePair("pt29cu128", "2.11.0"),
    # torch 2.10.0 on PyPI is a CUDA 12.8 build: the metadata admits it, the guard must not.
    NegativePair("stable.cu13", "2.10.0"),
    # A CPU-only torch next to a CUDA wheel: again only the guard can tell.
    NegativePair("stable.cu13", "2.11.0", cpu=True),
    # The other way round: the CUDA 12 stable wheel next to the neighbouring row's CUDA 13
    # torch, which torch>=2.10 admits.
    NegativePair("stable.cu12", "2.11.0"),
)


@dataclass(frozen=True)
class NegativePlan:
    """A pair checked against the matrix, with what each check must see."""

    pair: NegativePair
    wheel_row: Row  # the row the wheel is built against
    torch_cuda: str | None  # CUDA of the venv's torch; None: a CPU-only build
    pip_refuses: bool  # whether the wheel's Requires-Dist excludes the venv's torch
    why: str  # why the wheel must refuse, in words
    guard_words: tuple[str, ...]  # what the guard's message must contain

    @property
    def requires_torch(self) -> str:
        return self.wheel_row.requires_torch

    @property
    def index_url(self) -> str | None:
        return CPU_INDEX if self.pair.cpu else None


def pin_admits(wheel: variant.Variant, torch_version: str) -> bool:
    """Whether the wheel's Requires-Dist on torch admits that release.

    The pin says nothing about CUDA: it is the variant's rule with the device left out.
    """
    admits: bool = dataclasses.replace(wheel, cuda=None).serves(torch_version, None)
    return admits


def plan_negatives(pairs: Sequence[NegativePair], rows: Sequence[Row]) -> list[NegativePlan]:
    """Check each pair against the matrix and say what must refuse it; ValueError if a pair
    names a wheel or torch the matrix lacks, or a torch the wheel does serve."""
    builders = {r.variant: r for r in build_rows(rows)}
    by_torch = {r.torch: r for r in rows}
    plans = []
    for pair in pairs:
        if pair.variant not in builders:
            raise ValueError(
                f"negative pair {pair.name}: the matrix builds no {pair.variant} wheel "
                f"(it builds {', '.join(builders)}); fix DEFAULT_NEGATIVES"
            )
        if pair.torch not in by_torch:
            raise ValueError(
                f"negative pair {pair.name}: torch {pair.torch} is no matrix row "
                f"(rows: {', '.join(by_torch)}); fix DEFAULT_NEGATIVES"
            )
        wheel = variant.parse_label(pair.variant)
        torch_cuda = None if pair.cpu else by_torch[pair.torch].cuda
        if wheel.serves(pair.torch_version, torch_cuda):
            raise ValueError(
                f"negative pair {pair.name}: the {pair.variant} wheel serves torch "
                f"{pair.torch_version} (CUDA {torch_cuda}); a negative pair needs one it refuses"
            )
        builder = builders[pair.variant]
        refuses = not pin_admits(wheel, pair.torch)
        words = ["ImportError", "pip install", builder.version, pair.torch]
        if refuses:
            why = f"torch {pair.torch} is outside {builder.requires_torch}"
        elif torch_cuda is None:
            why = f"a CPU-only torch next to a CUDA {wheel.cuda_major} wheel"
            words.append("CPU")
        else:
            why = f"a CUDA {torch_cuda} torch next to a CUDA {wheel.cuda_major} wheel"
            words += [f"CUDA {variant.cuda_major(torch_cuda)}", f"CUDA {wheel.cuda_major}"]
        plans.append(NegativePlan(pair, builder, torch_cuda, refuses, why, tuple(words)))
    return plans


def clean_pip_env() -> dict[str, str]:
    """Environment for real pip that ignores this machine's pip config and PIP_* settings."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("PIP_") and k not in ("PYTHONPATH", "VIRTUAL_ENV")
    }
    env["PIP_CONFIG_FILE"] = os.devnull
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def excerpt(text: str, needle: str, width: int = 160) -> str:
    for line in text.splitlines():
        if needle in line:
            return line.strip()[:width]
    return text.strip().splitlines()[-1][:width] if text.strip() else ""


def check_pip_refusal(
    output: str, returncode: int, requires_torch: str, venv_torch: str
) -> tuple[bool, str]:
    """pip must exit non-zero and blame the wheel's torch pin against the installed torch."""
    if returncode == 0:
        return False, "pip installed the wheel"
    missing = [s for s in (requires_torch, venv_torch) if s not in output]
    if missing:
        return False, f"pip failed, but its message lacks {missing}"
    if "conflict" not in output.lower() and "ResolutionImpossible" not in output:
        return False, "pip failed, but not with a dependency conflict"
    return True, "pip refused: " + excerpt(output, requires_torch)


def check_guard_error(output: str, returncode: int, words: Sequence[str]) -> tuple[bool, str]:
    """The import must raise the guard's ImportError, containing ``words``."""
    if returncode == 0:
        return False, f"import {own_project().import_name} succeeded"
    if "undefined symbol" in output:
        return False, "raw undefined symbol error instead of the guard's message"
    missing = [s for s in words if s not in output]
    if missing:
        return False, f"import failed, but the message lacks {missing}"
    line = next((ln for ln in output.splitlines() if ln.startswith("ImportError")), output)
    return True, line.strip()


def install_torch(plan: NegativePlan, interp: Interpreter, venv: Path) -> Path:
    """A fresh venv with the pair's torch; its python. CalledProcessError if that fails."""
    if venv.exists():
        shutil.rmtree(venv)
    uv = build.uv_exe()
    subprocess.run(
        [uv, "venv", "--quiet", "--seed", "--python", str(interp.path), str(venv)],
        check=True,
        env=build.uv_env(),
    )
    py = venv / "bin" / "python"
    index = ["--extra-index-url", plan.index_url] if plan.index_url else []
    subprocess.run(
        [
            *(uv, "pip", "install", "--quiet", "--python", str(py)),
            *index,
            f"torch=={plan.pair.torch_version}",
        ],
        check=True,
        env=build.uv_env(),
    )
    return py


def run_negative(
    plan: NegativePlan, wheel: Path, interp: Interpreter, workdir: Path
) -> list[dict[str, Any]]:
    """The checks of one pair, in one venv: pip's refusal where the pin excludes the torch,
    then the guard after a forced install."""
    start = time.monotonic()
    pair = plan.pair
    base: dict[str, Any] = {
        "wheel": wheel.name,
        "variant": pair.variant,
        "venv_torch": pair.torch_version,
        "python": interp.version,
    }
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        py = install_torch(plan, interp, workdir / "venv")
    except subprocess.CalledProcessError as exc:
        # An index other than PyPI may be out of reach (this machine has PyPI only): the cell
        # is then not run, not failed. A PyPI torch that fails to install is a failure.
        status = NOT_RUN if plan.index_url else FAIL
        where = f" from {plan.index_url}" if plan.index_url else ""
        # The exit status, not the command line: the table names no machine paths.
        detail = (
            f"torch {pair.torch_version}{where} could not be installed "
            f"(uv pip install exited {exc.returncode})"
        )
        return [{**base, "check": "venv set-up", "status": status, "detail": detail}]
    env = clean_pip_env()
    run_dir = workdir / "run"
    run_dir.mkdir(exist_ok=True)
    results: list[dict[str, Any]] = []
    pip = [str(py), "-m", "pip", "install", "--no-index", "--no-cache-dir"]
    if plan.pip_refuses:
        # The venv's torch pinned as a user keeping it would; --no-index: nothing to fetch.
        keep = f"torch=={pair.torch_version}"
        proc = subprocess.run(
            [*pip, str(wheel), keep], env=env, cwd=run_dir, capture_output=True, text=True
        )
        out = proc.stdout + proc.stderr
        (workdir / "pip.log").write_text(out)
        ok, detail = check_pip_refusal(out, proc.returncode, plan.requires_torch, pair.torch)
        results.append(
            {
                **base,
                "check": "pip refuses the torch pin",
                "expected": f"pip: {plan.requires_torch} conflicts with torch {pair.torch}",
                "status": PASS if ok else FAIL,
                "detail": detail,
            }
        )
    proc = subprocess.run(
        [*pip, "--no-deps", str(wheel)], env=env, cwd=run_dir, capture_output=True, text=True
    )
    if proc.returncode != 0:
        results.append(
            {
                **base,
                "check": "forced install",
                "expected": "pip install --no-deps succeeds",
                "status": FAIL,
                "detail": excerpt(proc.stdout + proc.stderr, "ERROR"),
            }
        )
        return results
    env_py = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env_py["PYTHONDONTWRITEBYTECODE"] = "1"
    proc = subprocess.run(
        [str(py), "-c", probe(own_project().import_name)],
        env=env_py,
        cwd=run_dir,
        capture_output=True,
        text=True,
    )
    out = proc.stdout + proc.stderr
    (workdir / "import.log").write_text(out)
    ok, detail = check_guard_error(out, proc.returncode, plan.guard_words)
    results.append(
        {
            **base,
            "check": "import guard after --no-deps",
            "expected": f"ImportError: {plan.why}",
            "status": PASS if ok else FAIL,
            "detail": detail,
        }
    )
    seconds = round(time.monotonic() - start, 1)
    for r in results:
        r["seconds"] = seconds
    return results


def not_run(plan: NegativePlan, reason: str, wheel: str | None = None) -> dict[str, Any]:
    """The table's line for a pair that did not run (no wheel, the deadline)."""
    return {
        "wheel": wheel,
        "variant": plan.pair.variant,
        "venv_torch": plan.pair.torch_version,
        "check": "-",
        "expected": ("pip refuses, then " if plan.pip_refuses else "") + f"ImportError: {plan.why}",
        "status": NOT_RUN,
        "detail": reason,
    }
