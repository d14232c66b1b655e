"""Whether a kernel change changed any bit of hotloop's results: a digest of every output over a
fixed grid of seeded inputs, dumped by each build in its own process, then compared.

    python benchmarks/output_digests.py dump OUT.json [--device cuda|cpu] [--quick]
    python benchmarks/output_digests.py compare BASE.json NEW.json [--out REPORT.md]

``dump`` runs rms_norm (forward, and backward through autograd), fused_add_rms_norm and
rms_norm_fp8_dynamic over dtypes, widths aligned and not, row counts, starts 0-3 elements off
the 16-byte boundary (neighbouring rows share vectors there), the three castings, and with and
without a weight. It writes the SHA-256 of each output's bytes, or the error a case raised.
``compare`` names each case whose outputs differ and exits 1 if any does. The kernels are
deterministic (no atomics), so a build compared with itself shows none; a change that only
moves work between threads must show none either, while one that changes a grid (and so the
order in which grad_weight's partial rows add) shows exactly those grad_weight outputs.
``device_run.sh same`` runs both dumps and the comparison on the GPU host (run O73 in
benchmarks/NOTES.md compared 4437 cases so).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from bench_rms_norm import DTYPES, EPS

import hotloop
from hotloop.ops import CASTINGS

FORMAT = 1
FULL_WIDTHS = (33, 257, 1000, 1001, 1024, 2047, 2048, 3001, 4095, 4096, 8192, 8193, 12288)
FULL_WIDE = (12289, 16384, 32768, 65536)
QUICK_WIDTHS = (33, 1000, 2047, 4096)


def grid(quick: bool) -> Iterator[tuple[str, int, int, int]]:
    """(dtype, width, rows, offset in elements) of every input."""
    dtypes = ("bfloat16", "float32") if quick else tuple(DTYPES)
    widths = QUICK_WIDTHS if quick else FULL_WIDTHS + FULL_WIDE
    for dtype in dtypes:
        for hidden in widths:
            for rows in (1, 7) if quick else (1, 7, 300 if hidden < 16384 else 40):
                for offset in (0, 1) if quick else (0, 1, 3):
                    yield dtype, hidden, rows, offset


def digest(t: torch.Tensor) -> str:
    t = t.detach().contiguous()
    raw = t.reshape(-1).view(torch.uint8).cpu().numpy().tobytes()
    return f"{hashlib.sha256(raw).hexdigest()[:24]} {tuple(t.shape)}"


def outcome(run: Callable[..., Sequence[torch.Tensor]], *args: Any) -> list[str] | str:
    """The digests of run(*args)'s outputs, or the error it raised (a build that refuses a case
    the other takes differs too)."""
    try:
        return [digest(t) for t in run(*args)]
    except (RuntimeError, ValueError, TypeError, NotImplementedError) as e:
        return f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"


def forward_backward(
    x: torch.Tensor, weight: torch.Tensor | None, grad: torch.Tensor, casting: str, offset: float
) -> list[torch.Tensor]:
    xr = x.detach().requires_grad_()
    wr = None if weight is None else weight.detach().requires_grad_()
    y = hotloop.rms_norm(xr, wr, EPS, casting=casting, offset=offset)
    return [y, *torch.autograd.grad(y, [t for t in (xr, wr) if t is not None], grad)]


def fused_add(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, casting: str, offset: float
) -> list[torch.Tensor]:
    out, residual = x.clone(), residual.clone()
    hotloop.fused_add_rms_norm(out, residual, weight, EPS, casting=casting, offset=offset)
    return [out, residual]


def fp8_dynamic(
    x: torch.Tensor, weight: torch.Tensor, casting: str, offset: float
) -> list[torch.Tensor]:
    q, scale = hotloop.rms_norm_fp8_dynamic(
        x.contiguous(), weight, EPS, casting=casting, offset=offset
    )
    return [q.view(torch.uint8), scale]


def cases(device: torch.device, quick: bool) -> Iterator[tuple[str, list[str] | str]]:
    for dtype_name, hidden, rows, offset in grid(quick):
        dtype = DTYPES[dtype_name]
        g = torch.Generator(device=device).manual_seed(hidden * 1009 + rows * 31 + offset)
        # Rows starting `offset` elements into a flat buffer: off the 16-byte boundary
        x, grad = (
            torch.randn(rows * hidden + offset, device=device, dtype=dtype, generator=g)[
                offset:
            ].view(rows, hidden)
            for _ in range(2)
        )
        weight = torch.rand(hidden, device=device, dtype=dtype, generator=g) + 0.5
        for casting in CASTINGS:
            w_offset = 1.0 if casting == "gemma" else 0.0
            shape = f"{dtype_name} {rows}x{hidden} +{offset} {casting}"
            for w, label in ((weight, "weight"), (None, "no weight")):
                yield (
                    f"rms_norm {shape} {label}: y, grad_x[, grad_weight]",
                    outcome(forward_backward, x, w, grad, casting, w_offset),
                )
            yield (
                f"fused_add_rms_norm {shape}: x, residual",
                outcome(fused_add, x, grad, weight, casting, w_offset),
            )
            if dtype != torch.float32 and offset == 0:
                yield (
                    f"rms_norm_fp8_dynamic {shape}: q, scale",
                    outcome(fp8_dynamic, x, weight, casting, w_offset),
                )


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return "cpu"


def refuse_existing(path: Path, what: str) -> bool:
    """Whether `path` exists, said on stderr: this tool writes only new files."""
    exists = path.exists()
    if exists:
        print(
            f"output_digests: {path} exists; pass a new path for the {what} (this tool does not "
            "overwrite files)",
            file=sys.stderr,
        )
    return exists


def dump(out: Path, device: torch.device, quick: bool) -> int:
    if refuse_existing(out, "dump"):
        return 2
    results = dict(cases(device, quick))
    errors = sum(isinstance(v, str) for v in results.values())
    out.write_text(
        json.dumps(
            {
                "format": FORMAT,
                "device": device_name(device),
                "hotloop": hotloop.__version__,
                "torch": torch.__version__,
                "quick": quick,
                "cases": results,
            },
            indent=1,
        )
        + "\n"
    )
    print(f"output_digests: {len(results)} cases ({errors} raised an error) -> {out}")
    return 0


def load(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: {e}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT or "cases" not in data:
        raise ValueError(f"{path}: not a dump of this tool (format {FORMAT})")
    return data


def compare(base_path: Path, new_path: Path, report: Path | None) -> int:
    if report is not None and refuse_existing(report, "report"):
        return 2
    try:
        base, new = load(base_path), load(new_path)
    except ValueError as e:
        print(f"output_digests: {e}", file=sys.stderr)
        return 2
    for key in ("device", "quick"):
        if base[key] != new[key]:
            print(
                f"output_digests: {base_path} has {key} {base[key]!r}, {new_path} {new[key]!r}: "
                "dumps compare only on one device and one grid",
                file=sys.stderr,
            )
            return 2
    lines = [f"# {new['hotloop']} against {base['hotloop']} on {base['device']}", ""]
    differ = []
    every_case = sorted(set(base["cases"]) | set(new["cases"]))
    for case in every_case:
        a, b = base["cases"].get(case), new["cases"].get(case)
        if a == b:
            continue
        if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
            which = ", ".join(str(i) for i, (x, y) in enumerate(zip(a, b)) if x != y)
            differ.append(f"- {case}: output(s) {which} differ")
        else:
            differ.append(f"- {case}: {a!r} against {b!r}")
    lines.append(f"{len(every_case)} cases, {len(differ)} differ.")
    lines += ["", *differ] if differ else []
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if report is not None:
        report.write_text(text)
    return 1 if differ else 0


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    d = sub.add_parser("dump", help="digests of this build's outputs")
    d.add_argument("out", type=Path, help="a new JSON file")
    d.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    d.add_argument("--quick", action="store_true", help="a small grid (the CPU tests)")
    c = sub.add_parser("compare", help="the cases whose outputs differ between two dumps")
    c.add_argument("base", type=Path)
    c.add_argument("new", type=Path)
    c.add_argument("--out", type=Path, default=None, help="also write the report here")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.command == "compare":
        return compare(args.base, args.new, args.out)
    if args.device == "cuda" and not torch.cuda.is_available():
        print(
            "output_digests: no CUDA device (torch.cuda.is_available() is False); "
            "pass --device cpu to digest the CPU kernels",
            file=sys.stderr,
        )
        return 2
    return dump(args.out, torch.device(args.device), args.quick)


if __name__ == "__main__":
    sys.exit(main())
