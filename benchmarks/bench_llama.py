"""A real model's step with hotloop's RMSNorm against the stock one (issue 29, item 4).

Builds transformers' ``LlamaForCausalLM`` from a small config with random weights (no
download), in bfloat16 on the GPU, twice from the same seed: the stock model, and a copy
whose ``LlamaRMSNorm`` layers are swapped for ``hotloop.RMSNorm.from_module`` (the weights
are shared, not copied). Before timing, it checks that both give the same logits within a
few bfloat16 ulps. Then, for both models in the same process, alternating:

* ``train eager`` / ``train compiled``: one training step (forward, cross-entropy loss,
  backward, AdamW step) at ``--batch`` x ``--seq`` tokens; compiled with ``torch.compile``
  of the model (one graph, Inductor for everything around the norms);
* ``generate eager``: ``model.generate`` of ``--new-tokens`` tokens, greedy, after a
  ``--prompt``-token prompt, at ``--gen-batch`` sequences (decode: small calls, where the
  host's time per call matters);
* ``generate compiled``: the same with transformers' static KV cache and
  ``torch.compile`` of the forward (``--no-compiled-generate`` skips it).

Compiled, hotloop's model is traced as the norms' arithmetic, which Inductor fuses (hotloop's
default under torch.compile); the compiled cases time a third step beside the two: hotloop's
model compiled under ``hotloop.set_compile_arithmetic(False)`` (``hotloop_op``), where Inductor
calls hotloop's op, against the same stock rounds.

A figure is the median over ``--rounds`` rounds of the two models taking turns (min and max
kept too), CUDA-synchronised wall time: the host's work is part of a step. Writes
``llama_step.json`` and ``llama_step.md`` to ``--out``, with the device, driver, torch,
CUDA, Triton and transformers versions.

Usage: python benchmarks/bench_llama.py --out DIR [--quick]
"""

from __future__ import annotations

import argparse
import copy
import datetime as _dt
import json
import platform
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import hotloop

# Its neighbour result_files, also where this file is loaded as a module (its test).
sys.path.insert(0, str(Path(__file__).resolve().parent))

from result_files import claim, driver_version, triton_version

# A Llama of 1B-class widths, cut to a few layers so that it builds and compiles quickly.
TOOL = "bench_llama"
CONFIG = dict(
    vocab_size=32000,
    hidden_size=2048,
    intermediate_size=5632,
    num_hidden_layers=4,
    num_attention_heads=16,
    num_key_value_heads=4,
    max_position_embeddings=4096,
    rms_norm_eps=1e-5,
)
MODELS = ("stock", "hotloop")
# The compiled cases' third step: hotloop's model, traced under set_compile_arithmetic(False).
OP_STEP = "hotloop_op"


def build_models(layers: int) -> dict[str, torch.nn.Module]:
    import transformers

    config = transformers.LlamaConfig(**{**CONFIG, "num_hidden_layers": layers})
    torch.manual_seed(0)
    stock = transformers.LlamaForCausalLM(config).to(device="cuda", dtype=torch.bfloat16)
    ours = copy.deepcopy(stock)
    swapped = hotloop.RMSNorm.replace_in(ours, "LlamaRMSNorm")
    if swapped != 2 * layers + 1:
        raise RuntimeError(
            f"bench_llama: swapped {swapped} LlamaRMSNorm layers, expected {2 * layers + 1} "
            "(two a decoder layer and the final norm); has transformers' Llama changed?"
        )
    return {"stock": stock, "hotloop": ours}


def check_logits(models: dict[str, torch.nn.Module], tokens: torch.Tensor) -> float:
    """Largest difference of the two models' logits, relative to the largest logit."""
    with torch.no_grad():
        ref = models["stock"](input_ids=tokens).logits.float()
        got = models["hotloop"](input_ids=tokens).logits.float()
    err = ((got - ref).abs().max() / ref.abs().max()).item()
    if err > 5e-2:
        raise RuntimeError(
            f"bench_llama: the swapped model's logits differ from the stock model's by {err:.3g} "
            "(relative to the largest logit; expected a few bfloat16 ulps, < 5e-2)"
        )
    return err


def timed(fn: Callable[[], Any]) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e3


def alternate(
    steps: dict[str, Callable[[], Any]], warmup: int, rounds: int
) -> dict[str, dict[str, float]]:
    """Median, min and max ms of each step, the steps taking turns round by round."""
    for fn in steps.values():
        for _ in range(warmup):
            fn()
    samples: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(rounds):
        for name, fn in steps.items():
            samples[name].append(timed(fn))
    return {
        name: {
            "ms": statistics.median(s),
            "ms_min": min(s),
            "ms_max": max(s),
            "rounds": len(s),
        }
        for name, s in samples.items()
    }


def step_models(
    models: dict[str, torch.nn.Module], compiled: bool
) -> dict[str, tuple[torch.nn.Module, bool | None]]:
    """The timed steps' names, each with its model and the ``hotloop.set_compile_arithmetic``
    it is traced under (None: the default): the compiled cases add hotloop's model under
    False, as hotloop's op."""
    steps: dict[str, tuple[torch.nn.Module, bool | None]] = {
        name: (model, None) for name, model in models.items()
    }
    if compiled:
        steps[OP_STEP] = (models["hotloop"], False)
    return steps


def train_steps(
    models: dict[str, torch.nn.Module], batch: int, seq: int, compiled: bool
) -> dict[str, Callable[[], Any]]:
    tokens = torch.randint(0, CONFIG["vocab_size"], (batch, seq), device="cuda")
    steps = {}
    for name, (model, arithmetic) in step_models(models, compiled).items():
        model.train()
        # foreach, not fused: the optimizer's kernels are then the same for both models
        # and cheap to set up; what differs between them is the norms.
        opt = torch.optim.AdamW(model.parameters(), lr=1e-5, foreach=True)
        forward = torch.compile(model) if compiled else model

        def step(
            forward: Any = forward, opt: Any = opt, arithmetic: bool | None = arithmetic
        ) -> None:
            # Dynamo guards on the setting: each step keeps its own graph.
            with hotloop.set_compile_arithmetic(arithmetic):
                out = forward(input_ids=tokens, labels=tokens)
            out.loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        steps[name] = step
    return steps


def generate_steps(
    models: dict[str, torch.nn.Module], batch: int, prompt: int, new_tokens: int, compiled: bool
) -> dict[str, Callable[[], Any]]:
    tokens = torch.randint(0, CONFIG["vocab_size"], (batch, prompt), device="cuda")
    mask = torch.ones_like(tokens)
    kwargs: dict[str, Any] = dict(
        max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False
    )
    for model in models.values():
        model.eval()
        if compiled:
            # Inductor without CUDA graphs: transformers' generate loop reads the static
            # cache between calls, which reduce-overhead's graphs overwrite (torch 2.11,
            # transformers 5.17: "accessing tensor output of CUDAGraphs that has been
            # overwritten by a subsequent run"). Once a model: the op's step traces the
            # same compiled forward again, under its setting.
            model.forward = torch.compile(model.forward, fullgraph=True)
    if compiled:
        kwargs["cache_implementation"] = "static"
    steps = {}
    for name, (model, arithmetic) in step_models(models, compiled).items():

        def step(model: Any = model, arithmetic: bool | None = arithmetic) -> None:
            with torch.inference_mode(), hotloop.set_compile_arithmetic(arithmetic):
                model.generate(input_ids=tokens, attention_mask=mask, **kwargs)

        steps[name] = step
    return steps


def metadata(args: argparse.Namespace, logits_err: float) -> dict[str, Any]:
    import transformers

    return {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name(0),
        "driver": driver_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "triton": triton_version(),
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "hotloop": hotloop.__version__,
        "hotloop_build": dict(getattr(hotloop, "BUILD_INFO", {}) or {}),
        "config": {**CONFIG, "num_hidden_layers": args.layers},
        "dtype": "bfloat16",
        "train_tokens": [args.batch, args.seq],
        "generate": {"batch": args.gen_batch, "prompt": args.prompt, "new_tokens": args.new_tokens},
        "rounds": args.rounds,
        "logits_max_rel_diff": logits_err,
    }


def table(results: dict[str, Any]) -> str:
    """One row a case, and for a compiled one a row more for hotloop's model compiled as
    hotloop's op (set_compile_arithmetic(False)), against the same stock rounds."""
    lines = [
        "| step | stock ms | hotloop ms | hotloop / stock |",
        "| --- | ---: | ---: | ---: |",
    ]
    for case, r in results.items():
        if "error" in r:
            lines.append(f"| {case} | error: {r['error']} | | |")
            continue
        stock = r["stock"]["ms"]
        for name, label in (("hotloop", case), (OP_STEP, f"{case}, hotloop's op")):
            if name in r:
                ours = r[name]["ms"]
                lines.append(f"| {label} | {stock:.2f} | {ours:.2f} | {ours / stock:.3f} |")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", type=Path, required=True, help="output folder")
    p.add_argument("--layers", type=int, default=CONFIG["num_hidden_layers"])
    p.add_argument("--batch", type=int, default=4, help="training batch (%(default)s)")
    p.add_argument("--seq", type=int, default=1024, help="training sequence length (%(default)s)")
    p.add_argument("--gen-batch", type=int, default=8, help="generate batch (%(default)s)")
    p.add_argument("--prompt", type=int, default=128, help="prompt tokens (%(default)s)")
    p.add_argument("--new-tokens", type=int, default=64, help="tokens generated (%(default)s)")
    p.add_argument("--rounds", type=int, default=10, help="timed rounds (%(default)s)")
    p.add_argument("--quick", action="store_true", help="3 rounds, 16 new tokens")
    p.add_argument("--no-compiled-generate", action="store_true")
    args = p.parse_args(argv)
    if args.quick:
        args.rounds, args.new_tokens = 3, 16
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    claim(args.out, ("llama_step.json", "llama_step.md"), TOOL)
    if not torch.cuda.is_available():
        print("bench_llama: no CUDA device; this benchmark needs a GPU", file=sys.stderr)
        return 2
    torch._dynamo.config.cache_size_limit = 64
    models = build_models(args.layers)
    err = check_logits(models, torch.randint(0, CONFIG["vocab_size"], (2, 64), device="cuda"))
    cases: list[tuple[str, Callable[[], dict[str, Callable[[], Any]]], int]] = [
        ("train eager", lambda: train_steps(models, args.batch, args.seq, False), 3),
        ("train compiled", lambda: train_steps(models, args.batch, args.seq, True), 3),
        (
            "generate eager",
            lambda: generate_steps(models, args.gen_batch, args.prompt, args.new_tokens, False),
            1,
        ),
    ]
    if not args.no_compiled_generate:
        cases.append(
            (
                "generate compiled",
                lambda: generate_steps(models, args.gen_batch, args.prompt, args.new_tokens, True),
                3,
            )
        )
    results: dict[str, Any] = {}
    for case, make, warmup in cases:
        t0 = time.perf_counter()
        try:
            results[case] = alternate(make(), warmup, args.rounds)
        except Exception as exc:  # record it and go on with the other cases
            traceback.print_exc()
            results[case] = {"error": f"{type(exc).__name__}: {exc}".splitlines()[0][:200]}
        results[case]["seconds"] = round(time.perf_counter() - t0, 1)
        print(f"{case}: {results[case]}", flush=True)
    meta = metadata(args, err)
    meta["tool"] = TOOL
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "llama_step.json").write_text(
        json.dumps({"meta": meta, "results": results}, indent=2) + "\n"
    )
    md = (
        f"{meta['device']}, driver {meta['driver']}, torch {meta['torch']}, CUDA {meta['cuda']}, "
        f"Triton {meta['triton']}, transformers {meta['transformers']}; Llama of "
        f"{args.layers} layers, hidden {CONFIG['hidden_size']}, bfloat16, random weights; "
        f"training at {args.batch} x {args.seq} tokens, generate {args.new_tokens} tokens "
        f"after {args.prompt} at batch {args.gen_batch}; median of {args.rounds} alternating "
        f"rounds.\n\n{table(results)}\n"
    )
    (args.out / "llama_step.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
