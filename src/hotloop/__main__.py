"""``python -m hotloop``: what this install was built for, what it runs on, and whether it works."""

from __future__ import annotations

import re
import sys
from typing import Any

# A compiled target as nvcc names it: sm_90 (a cubin) or compute_90 (PTX), with the suffix of
# an arch-specific target (90a: wgmma on Hopper) or a family-specific one (100f, CUDA 12.9+).
_ARCH = re.compile(r"(?P<kind>sm|compute)_(?P<major>[0-9]+)(?P<minor>[0-9])(?P<suffix>[af]?)")


def parse_arch(arch: str) -> tuple[str, tuple[int, int], str] | None:
    """``"sm_90a"`` -> ``("sm", (9, 0), "a")``; None for a name that is no nvcc target."""
    match = _ARCH.fullmatch(arch)
    if match is None:
        return None
    return match["kind"], (int(match["major"]), int(match["minor"])), match["suffix"]


def runs_on(arch: str, capability: tuple[int, int]) -> bool:
    """Whether a GPU of this compute capability runs this compiled target.

    A cubin (sm_XY) runs on the same major with an equal or higher minor; PTX (compute_XY)
    is JIT-compiled by the driver for any equal or newer GPU. Arch-specific targets (sm_90a,
    compute_90a) run on exactly that compute capability; family-specific ones (sm_100f,
    compute_100f) on its major, from that minor on, PTX included.
    """
    parsed = parse_arch(arch)
    if parsed is None:
        return False
    kind, target, suffix = parsed
    if suffix == "a":
        return capability == target
    if kind == "sm" or suffix == "f":
        return capability[0] == target[0] and capability[1] >= target[1]
    return capability >= target


def kernel_for_capability(archs: list[str], capability: tuple[int, int]) -> str | None:
    """The compiled arch that runs on a GPU of this compute capability, or None: the newest
    cubin that runs there (an arch-specific one before a generic one of the same number),
    else the newest PTX to JIT-compile from."""

    def preference(arch: str) -> tuple[bool, tuple[int, int], str]:
        kind, target, suffix = parse_arch(arch) or ("", (0, 0), "")
        return kind == "sm", target, suffix

    fitting = [a for a in archs if runs_on(a, capability)]
    return max(fitting, key=preference, default=None)


def describe_arch(arch: str) -> str:
    """An arch as the report lists it: what an arch- or family-specific target is limited to."""
    parsed = parse_arch(arch)
    if parsed is None or not parsed[2]:
        return arch
    _, (major, minor), suffix = parsed
    if suffix == "a":
        return f"{arch} (arch-specific: compute capability {major}.{minor} only)"
    return f"{arch} (family-specific: compute capability {major}.{minor} to {major}.x)"


def ops_for_capability(capability: tuple[int, int]) -> tuple[list[str], list[str]]:
    """(the ops a GPU of this compute capability runs, those it does not).

    Every op runs wherever a kernel for the GPU does, except the FP8 ones, which need
    ``ops.FP8_MIN_CAPABILITY`` (8.9: Ada, Hopper and newer).
    """
    from hotloop import ops

    if capability >= ops.FP8_MIN_CAPABILITY:
        return list(ops.__all__), []
    return [n for n in ops.__all__ if n not in ops.FP8_OPS], list(ops.FP8_OPS)


def describe_ops(capability: tuple[int, int]) -> str:
    """What the ``ops`` line of the report says for a GPU of this compute capability."""
    from hotloop import ops

    runs, refused = ops_for_capability(capability)
    if not refused:
        return f"all {len(runs)} run on it ({', '.join(runs)})"
    minimum = ".".join(map(str, ops.FP8_MIN_CAPABILITY))
    return (
        f"{', '.join(runs)} run on it; not {', '.join(refused)}: they need compute "
        f"capability {minimum} or newer, this GPU has {capability[0]}.{capability[1]}"
    )


def fp8_matches_reference(device: str) -> bool:
    """rms_norm_fp8 on `device`, dequantised, within one e4m3 rounding of the reference."""
    import torch

    import hotloop

    x = torch.randn(4, 64, device=device)
    scale = torch.tensor([0.01], device=device)
    reference = torch.nn.functional.rms_norm(x, (64,)).clamp(-4.48, 4.48)
    got = hotloop.rms_norm_fp8(x, torch.ones(64, device=device), scale).float() * scale
    return bool(((got - reference).abs() <= reference.abs() / 8 + 2**-9 * scale).all())


def describe_kind(info: dict[str, Any]) -> str:
    """Which kind of wheel this is and which torch releases it serves."""
    if info.get("abi") == "stable":
        return (
            f"stable ABI: loads into every torch {info['requires_torch'].removeprefix('torch')} "
            f"with CUDA {(info['cuda_version'] or 'none').split('.')[0]} (one wheel per CUDA major)"
        )
    return f"pinned: loads only into torch {info['torch_minor']}.* ({info['requires_torch']})"


def report() -> int:
    import torch

    print(f"torch        {torch.__version__} (CUDA {torch.version.cuda or 'none: CPU build'})")
    try:
        import hotloop
    except ImportError as err:  # no build info at all: an unbuilt source tree
        print(f"hotloop      cannot be imported:\n  {err}")
        print("verdict      BROKEN")
        return 1
    info = hotloop.BUILD_INFO
    print(f"hotloop      {info['version']} from {hotloop.__file__}")
    print(f"kind         {describe_kind(info)}")
    print(f"built with   torch {info['torch_version']}, CUDA {info['cuda_version'] or 'none'}")
    archs = ", ".join(describe_arch(a) for a in info["archs"])
    print(f"archs        {archs or 'none (CPU kernels only)'}")
    print(f"C++11 ABI    {info['cxx11_abi']}")
    commit, dirty, _ = info["git_commit"].partition("-dirty")
    # The suffix says the build's tree differed from the commit: it must survive the short form.
    print(f"commit       {commit[:12]}{dirty}, built {info['build_time']}")

    if hotloop.LOAD_ERROR is not None:
        print(f"problem      the ops can't load into this torch:\n  {hotloop.LOAD_ERROR}")
        print("verdict      BROKEN")
        return 1
    print(f"library      {hotloop.library_path()}")

    problems = []
    x = torch.randn(4, 8)
    if not torch.allclose(hotloop.rms_norm(x), torch.nn.functional.rms_norm(x, (8,)), atol=1e-5):
        problems.append("the CPU rms_norm kernel gave a wrong result")
    if not fp8_matches_reference("cpu"):
        problems.append("the CPU rms_norm_fp8 kernel gave a wrong result")

    if not torch.cuda.is_available():
        print("GPU          none visible")
    else:
        name = torch.cuda.get_device_name()
        capability = torch.cuda.get_device_capability()
        kernel = kernel_for_capability(info["archs"], capability)
        how = "NO kernel for it" if kernel is None else f"runs {kernel}"
        if kernel and kernel.startswith("compute_"):
            how += " (PTX, JIT-compiled by the driver on first use)"
        print(f"GPU          {name}, sm_{capability[0]}{capability[1]}: {how}")
        if kernel is None:
            problems.append(
                f"this wheel has no kernel for sm_{capability[0]}{capability[1]} "
                f"(compiled: {', '.join(info['archs']) or 'none'})"
            )
        else:
            y = torch.randn(4, 8, device="cuda")
            expected = torch.nn.functional.rms_norm(y, (8,))
            if not torch.allclose(hotloop.rms_norm(y), expected, atol=1e-5):
                problems.append("the CUDA rms_norm kernel gave a wrong result")
            print(f"ops          {describe_ops(capability)}")
            if not ops_for_capability(capability)[1] and not fp8_matches_reference("cuda"):
                problems.append("the CUDA rms_norm_fp8 kernel gave a wrong result")

    for problem in problems:
        print(f"problem      {problem}")
    print(f"verdict      {'BROKEN' if problems else 'OK'}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(report())
