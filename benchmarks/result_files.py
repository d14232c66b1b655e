"""The benchmarks' output files: each tool overwrites only files it wrote itself.

A benchmark writes fixed names (``rms_norm.json``, ``host_overhead.md``, ...) into the folder
given by ``--out``. A folder of the user's may already hold a file of that name that has
nothing to do with the benchmark, and a run of many minutes must not end by replacing it.
Every JSON a benchmark writes records the tool in ``meta.tool``; a Markdown table or a plot
belongs to the tool that wrote the JSON of the same stem beside it. ``claim`` checks all of a
run's outputs before anything is measured. ``driver_version`` and ``triton_version`` are what
each records of the GPU's driver and of Triton.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterable
from pathlib import Path


def written_by(path: Path, tool: str) -> bool:
    """Whether *path* is an output of *tool*: its own JSON record, or the one beside it."""
    record = path.with_suffix(".json")
    try:
        meta = json.loads(record.read_text()).get("meta")
    except (OSError, ValueError, AttributeError):
        return False
    return isinstance(meta, dict) and meta.get("tool") == tool


def claim(out: Path, names: Iterable[str], tool: str) -> None:
    """Refuse to run when *out* holds one of *names* that *tool* did not write."""
    if out.exists() and not out.is_dir():
        raise SystemExit(
            f"{tool}: --out {out} is a file; expected a folder (it is created if missing)."
        )
    foreign = [out / n for n in names if (out / n).exists() and not written_by(out / n, tool)]
    if foreign:
        listed = ", ".join(str(p) for p in foreign)
        raise SystemExit(
            f"{tool}: {listed} already exist{'s' if len(foreign) == 1 else ''} and "
            f"{'was' if len(foreign) == 1 else 'were'} not written by {tool} (no JSON beside "
            f"it whose meta.tool is {tool!r}); this run would overwrite "
            f"{'it' if len(foreign) == 1 else 'them'}. Pass another --out folder, or move "
            "those files away."
        )


def driver_version() -> str | None:
    """The NVIDIA driver's version from nvidia-smi, None where it can't be read."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        ).stdout
        return out.strip().splitlines()[0]
    except Exception:
        return None


def triton_version() -> str | None:
    """Triton's version, None where it is not installed (CPU builds of torch)."""
    try:
        import triton
    except ImportError:
        return None
    return str(triton.__version__)
