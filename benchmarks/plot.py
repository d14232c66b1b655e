"""Plot benchmarks/results/rms_norm.json: achieved bandwidth against hidden size.

Two panels (RMSNorm forward, forward+backward; bfloat16, tensors of about the headline
shape's size), one line per implementation, and the measured device-to-device copy
bandwidth as the roofline. Runs anywhere matplotlib is installed, no GPU needed:

    python benchmarks/plot.py [benchmarks/results/rms_norm.json] [-o rms_norm.png]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from result_files import claim

HERE = Path(__file__).resolve().parent
DEFAULT_JSON = HERE / "results" / "rms_norm.json"

# Fixed colours and markers so that an implementation looks the same in every figure.
STYLE = {
    "pytorch (Llama)": ("tab:gray", "o"),
    "F.rms_norm": ("tab:brown", "v"),
    "torch.compile": ("tab:blue", "s"),
    "Liger-Kernel": ("tab:purple", "D"),
    "hotloop CUDA": ("tab:red", "^"),
    "hotloop Triton": ("tab:green", "P"),
}


def sweep_points(results: list[dict[str, Any]], mode: str) -> dict[str, list[tuple[int, float]]]:
    """impl -> sorted (hidden, GB/s) of the bfloat16 RMSNorm runs that passed."""
    lines: dict[str, list[tuple[int, float]]] = {}
    for r in results:
        if r["op"] != "rms_norm" or r["mode"] != mode or r["dtype"] != "bfloat16":
            continue
        if r["status"] != "ok" or r.get("gbps") is None:
            continue
        if "casting" in r.get("tags", []):  # the casting modes stay off the sweep's lines
            continue
        lines.setdefault(r["impl"], []).append((int(r["hidden"]), float(r["gbps"])))
    return {impl: sorted(pts) for impl, pts in lines.items()}


def plot(json_path: Path, png_path: Path | None = None) -> Path:
    doc = json.loads(Path(json_path).read_text())
    png_path = Path(png_path) if png_path else Path(json_path).with_suffix(".png")
    claim(png_path.parent, [png_path.name], "bench_rms_norm")
    meta = doc.get("meta", {})
    copy_gbps = float(doc["copy_bandwidth"]["gbps"])
    results = doc["results"]

    # The swept sizes at even spacing (1000 next to 1024 and 4095 next to 4096 would
    # overlap on a log axis), the same positions in both panels.
    hidden = sorted(
        {
            h
            for mode in ("fwd", "fwd+bwd")
            for pts in sweep_points(results, mode).values()
            for h, _ in pts
        }
    )
    position = {h: i for i, h in enumerate(hidden)}

    fig, axes = plt.subplots(1, 2, figsize=(13, 5.2), sharey=True)
    for ax, mode, title in zip(
        axes, ("fwd", "fwd+bwd"), ("RMSNorm forward", "RMSNorm forward + backward")
    ):
        ax.axhline(copy_gbps, color="black", linestyle="--", linewidth=1.2)
        ax.text(
            0.01,
            copy_gbps,
            f" device-to-device copy {copy_gbps:.0f} GB/s",
            transform=ax.get_yaxis_transform(),
            va="bottom",
            fontsize=8,
        )
        for impl, pts in sweep_points(results, mode).items():
            colour, marker = STYLE.get(impl, (None, "x"))
            xs = [position[h] for h, _ in pts]
            ys = [g for _, g in pts]
            ax.plot(xs, ys, marker=marker, color=colour, label=impl, linewidth=1.5, markersize=5)
        ax.set_xticks(range(len(hidden)))
        ax.set_xticklabels([str(h) for h in hidden], fontsize=8)
        ax.set_xlabel("hidden size H (rows adjusted to keep the tensor size)")
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
        ax.set_ylim(bottom=0, top=copy_gbps * 1.12)
    axes[0].set_ylabel("achieved bandwidth (GB/s, bytes read + written)")
    axes[1].legend(loc="lower right", fontsize=8)
    shape = doc.get("headline_shape")
    total = f"{shape[0] * shape[1] * shape[2]:,} elements" if shape and len(shape) == 3 else ""
    versions = (
        f"torch {meta.get('torch', '?')}, CUDA {meta.get('cuda', '?')}, "
        f"Triton {meta.get('triton', '?')}, driver {meta.get('driver', '?')}"
    )
    fig.suptitle(
        f"{meta.get('device', '?')} · bfloat16, {total} per tensor · {versions} · "
        f"{meta.get('date', '')}",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(png_path, dpi=130)
    plt.close(fig)
    return png_path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("json", nargs="?", type=Path, default=DEFAULT_JSON)
    p.add_argument("-o", "--out", type=Path, default=None, help="PNG path (beside the JSON)")
    args = p.parse_args(argv)
    print(plot(args.json, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
