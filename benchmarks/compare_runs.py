"""Compare runs of bench_rms_norm.py made with different wheels on one GPU.

Timings compare only within one machine, two builds of one extension cannot load in one
process, and a GPU's speed drifts over minutes, so a before/after measurement runs the
benchmark once per wheel, in turns, for a few rounds, each in its own process, and compares
the medians:

    for round in 1 2; do for label in main new; do
      PYTHONPATH=site-$label python benchmarks/bench_rms_norm.py --hidden 4096,12288 \\
        --rms-norm-only --no-small-batch --no-plot --out runs/$label-$round
    done; done
    python benchmarks/compare_runs.py --label main runs/main-*/rms_norm.json \\
        --label new runs/new-*/rms_norm.json --out runs/compare

Every result row that each label's runs measured (op, mode, implementation, shape, dtype)
gets each label's median % of copy bandwidth, the runs' range, and its difference from the
first label's median. The table goes to stdout, and with --out to ``compare_runs.md`` and
``compare_runs.json``. Runs of different GPUs (by name, and by UUID where the runs record
one) are refused: their figures do not compare.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from result_files import claim

TOOL = "compare_runs"
BENCHMARK = "bench_rms_norm"
Key = tuple[str, str, str, tuple[int, ...], str]


def load_run(path: Path) -> dict[str, Any]:
    """A bench_rms_norm record, or SystemExit saying what the file is instead."""
    try:
        doc = json.loads(path.read_text())
    except OSError as exc:
        raise SystemExit(f"{TOOL}: cannot read {path}: {exc.strerror}") from None
    except ValueError:
        raise SystemExit(f"{TOOL}: {path} is not JSON; expected a {BENCHMARK} record") from None
    meta = doc.get("meta") if isinstance(doc, dict) else None
    tool = meta.get("tool") if isinstance(meta, dict) else None
    if tool != BENCHMARK or not isinstance(doc.get("results"), list):
        raise SystemExit(
            f"{TOOL}: {path} was written by {tool or 'something else'}, not {BENCHMARK} "
            f"(meta.tool); pass the rms_norm.json of each run"
        )
    return doc


def row_key(result: dict[str, Any]) -> Key:
    return (
        result["op"],
        result["mode"],
        result["impl"],
        tuple(result["shape"]),
        result["dtype"],
    )


def compare(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Medians per label of every row all labels measured, in the first label's row order."""
    devices = {
        (run["meta"].get("device"), run["meta"].get("device_uuid"))
        for label_runs in runs.values()
        for run in label_runs
    }
    if len(devices) != 1:
        found = ", ".join(sorted(f"{name} {uuid or ''}".strip() for name, uuid in devices))
        raise SystemExit(
            f"{TOOL}: the runs come from different GPUs ({found}); timings compare only "
            "within one machine: compare runs of one device"
        )
    per_label: dict[str, dict[Key, list[float]]] = {}
    for label, label_runs in runs.items():
        rows: dict[Key, list[float]] = {}
        for run in label_runs:
            for result in run["results"]:
                if result.get("status") == "ok" and result.get("pct_copy") is not None:
                    rows.setdefault(row_key(result), []).append(float(result["pct_copy"]))
        per_label[label] = rows
    labels = list(runs)
    first = labels[0]
    rows_out = []
    for key in per_label[first]:
        if not all(key in per_label[label] for label in labels):
            continue
        base = statistics.median(per_label[first][key])
        cells = {}
        for label in labels:
            values = per_label[label][key]
            median = statistics.median(values)
            cells[label] = {
                "median": median,
                "min": min(values),
                "max": max(values),
                "runs": len(values),
                "diff": median - base,
            }
        op, mode, impl, shape, dtype = key
        rows_out.append(
            {"op": op, "mode": mode, "impl": impl, "shape": list(shape), "dtype": dtype, **cells}
        )
    return {
        "meta": {"tool": TOOL, "device": next(iter(devices))[0], "labels": labels},
        "runs": {label: len(label_runs) for label, label_runs in runs.items()},
        "rows": rows_out,
    }


def markdown(report: dict[str, Any]) -> str:
    labels = report["meta"]["labels"]
    head = ["op", "mode", "implementation", "shape", "dtype"] + [
        f"{label} % copy ({report['runs'][label]} runs)" for label in labels
    ]
    lines = [
        f"{report['meta']['device']}: median % of copy bandwidth (min-max), difference from "
        f"{labels[0]}",
        "",
        "| " + " | ".join(head) + " |",
        "| " + " | ".join(["---"] * 5 + ["---:"] * len(labels)) + " |",
    ]
    for row in report["rows"]:
        cells = [row["op"], row["mode"], row["impl"], str(tuple(row["shape"])), row["dtype"]]
        for i, label in enumerate(labels):
            c = row[label]
            text = f"{c['median']:.1f} ({c['min']:.1f}-{c['max']:.1f})"
            cells.append(text if i == 0 else f"{text} {c['diff']:+.1f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--label",
        nargs="+",
        action="append",
        required=True,
        metavar=("LABEL", "JSON"),
        help="a label, then the rms_norm.json of each of its runs (repeat for each wheel)",
    )
    p.add_argument("--out", type=Path, help="also write compare_runs.md and .json here")
    args = p.parse_args(argv)
    labels = [group[0] for group in args.label]
    if len(set(labels)) != len(labels):
        p.error(f"each --label needs its own name; got {', '.join(labels)}")
    for group in args.label:
        if len(group) < 2:
            p.error(f"--label {group[0]} names no run: give the rms_norm.json of its runs")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.out is not None:
        claim(args.out, ["compare_runs.json", "compare_runs.md"], TOOL)
    runs = {group[0]: [load_run(Path(p)) for p in group[1:]] for group in args.label}
    report = compare(runs)
    text = markdown(report)
    sys.stdout.write(text)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "compare_runs.json").write_text(json.dumps(report, indent=1) + "\n")
        (args.out / "compare_runs.md").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
