"""Where a kernel's instructions and stalls go, from Nsight Compute's source page:

    ncu --import report.ncu-rep --page source --print-source sass --csv > sass.csv
    python benchmarks/ncu_sass_summary.py sass.csv [--kernel NAME] [--top N] > sass.md

For each kernel of the report: the instructions its warps executed, split by opcode, its
warp-stall samples by reason, and the instructions holding the most samples. ``device_run.sh
ncu`` writes it next to each width's report. Two widths side by side show what one of them
executes that the other does not: at H = 2047 on an H200 the span kernels ran 404 instructions
a warp a row against 303 at 2048, mostly in per-element edge branches and the reduction's loop
(benchmarks/NOTES.md, run O73).
"""

from __future__ import annotations

import argparse
import csv
import sys
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

KERNEL = "Kernel Name"
SOURCE = "Source"
EXECUTED = "Instructions Executed"
SAMPLES = "Warp Stall Sampling (All Samples)"
STALL_PREFIX = "stall_"
NOT_ISSUED = "(Not Issued)"


@dataclass
class Instruction:
    source: str
    executed: int
    samples: int

    @property
    def opcode(self) -> str:
        """The opcode without its predicate and modifiers: `@!P2 LDG.E.128 R8, ...` -> LDG."""
        words = [w for w in self.source.split() if not w.startswith("@")]
        return words[0].split(".")[0] if words else "?"


@dataclass
class Kernel:
    name: str
    instructions: list[Instruction] = field(default_factory=list)
    stalls: Counter[str] = field(default_factory=Counter)

    @property
    def executed(self) -> int:
        return sum(i.executed for i in self.instructions)

    @property
    def samples(self) -> int:
        return sum(i.samples for i in self.instructions)


class SourcePageError(ValueError):
    pass


def _number(text: str, column: str, where: str) -> int:
    try:
        return int(text.replace(",", "") or 0)
    except ValueError:
        raise SourcePageError(f"{where}: column '{column}' holds {text!r}, not a count") from None


def read_source_page(path: Path) -> list[Kernel]:
    """The kernels of `ncu --page source --print-source sass --csv` output, in its order."""
    kernels: list[Kernel] = []
    header: list[str] | None = None
    with path.open(newline="") as f:
        for line_number, row in enumerate(csv.reader(f), start=1):
            where = f"{path}:{line_number}"
            if not row:
                continue
            if row[0] == KERNEL:
                kernels.append(Kernel(row[1] if len(row) > 1 else "?"))
                header = None
            elif not kernels:
                continue  # ncu's warnings before the first kernel
            elif header is None:
                missing = [c for c in (SOURCE, EXECUTED, SAMPLES) if c not in row]
                if missing:
                    raise SourcePageError(
                        f"{where}: the header after kernel '{kernels[-1].name}' lacks "
                        f"{', '.join(missing)}; expected ncu's source page with the full set "
                        "of sections (ncu --set full ... then --page source --csv)"
                    )
                header = row
            else:
                cells = dict(zip(header, row))
                kernels[-1].instructions.append(
                    Instruction(
                        cells[SOURCE].strip(),
                        _number(cells[EXECUTED], EXECUTED, where),
                        _number(cells[SAMPLES], SAMPLES, where),
                    )
                )
                for column, value in cells.items():
                    if column.startswith(STALL_PREFIX) and NOT_ISSUED not in column:
                        kernels[-1].stalls[column[len(STALL_PREFIX) :]] += _number(
                            value, column, where
                        )
    if not kernels:
        raise SourcePageError(
            f"{path}: no '{KERNEL}' line; expected the output of ncu --import REPORT --page "
            "source --print-source sass --csv"
        )
    return kernels


def _share(part: int, whole: int) -> str:
    return f"{100 * part / whole:.1f} %" if whole else "-"


def summarize(kernel: Kernel, top: int) -> Iterator[str]:
    executed, samples = kernel.executed, kernel.samples
    yield f"## {kernel.name}"
    yield ""
    yield f"{executed:,} warp instructions executed, {samples:,} warp-stall samples."
    yield ""
    yield "| opcode | executed | share |"
    yield "| --- | ---: | ---: |"
    by_opcode: Counter[str] = Counter()
    for instruction in kernel.instructions:
        by_opcode[instruction.opcode] += instruction.executed
    for opcode, count in by_opcode.most_common(top):
        yield f"| {opcode} | {count:,} | {_share(count, executed)} |"
    yield ""
    yield "| stall reason | samples | share |"
    yield "| --- | ---: | ---: |"
    stall_total = sum(kernel.stalls.values())
    for reason, count in kernel.stalls.most_common(top):
        if count:
            yield f"| {reason} | {count:,} | {_share(count, stall_total)} |"
    yield ""
    yield "| instruction (most stall samples first) | executed | samples |"
    yield "| --- | ---: | ---: |"
    hottest = sorted(kernel.instructions, key=lambda i: i.samples, reverse=True)[:top]
    for instruction in hottest:
        if instruction.samples:
            source = instruction.source.replace("|", "\\|")
            yield f"| `{source}` | {instruction.executed:,} | {instruction.samples:,} |"
    yield ""


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("csv", type=Path, help="ncu --page source --print-source sass --csv output")
    p.add_argument("--kernel", default=None, help="only the kernels whose name holds this text")
    p.add_argument("--top", type=int, default=15, help="rows per table (%(default)s)")
    args = p.parse_args(argv)
    if args.top < 1:
        p.error(f"--top {args.top}: expected 1 or more")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        kernels = read_source_page(args.csv)
    except (OSError, SourcePageError) as e:
        print(f"ncu_sass_summary: {e}", file=sys.stderr)
        return 2
    chosen = [k for k in kernels if args.kernel is None or args.kernel in k.name]
    if not chosen:
        names = "; ".join(k.name for k in kernels)
        print(
            f"ncu_sass_summary: no kernel of {args.csv} holds '{args.kernel}'; it has: {names}",
            file=sys.stderr,
        )
        return 2
    for kernel in chosen:
        print("\n".join(summarize(kernel, args.top)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
