"""A small random Llama with its RMSNorm layers swapped for hotloop.RMSNorm."""

from __future__ import annotations

import copy

import pytest
import torch
from op_testing import MODEL_TOLERANCE, requires_compile

import hotloop

transformers = pytest.importorskip("transformers")


def tiny_llama(device: str) -> torch.nn.Module:
    config = transformers.LlamaConfig(
        vocab_size=256,
        hidden_size=96,  # not a multiple of the 16-byte vector width in bf16 x 8
        intermediate_size=192,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        rms_norm_eps=1e-5,
    )
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).to(device=device, dtype=torch.bfloat16)


@pytest.mark.parametrize(
    ("compiled", "arithmetic"),
    [
        pytest.param(False, None, id="eager"),
        # by default Inductor fuses the norms' arithmetic
        pytest.param(True, None, id="compiled", marks=requires_compile),
        # hotloop.set_compile_arithmetic(False): it calls hotloop's op instead
        pytest.param(True, False, id="compiled-op", marks=requires_compile),
    ],
)
def test_swapped_llama_matches(device: str, compiled: bool, arithmetic: bool | None) -> None:
    if compiled and device == "cpu":
        pytest.skip("minutes of inductor C++ compilation on the CPU; compile is covered on CUDA")
    reference = tiny_llama(device)
    ours = copy.deepcopy(reference)
    assert (
        hotloop.RMSNorm.replace_in(ours, "LlamaRMSNorm") == 2 * 2 + 1
    )  # two per layer and the final norm
    assert not any(type(m).__name__ == "LlamaRMSNorm" for m in ours.modules())
    tokens = torch.randint(0, 256, (2, 24), device=device)

    def run(model: torch.nn.Module) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        forward = torch.compile(model, fullgraph=True) if compiled else model
        with hotloop.set_compile_arithmetic(arithmetic):
            logits = forward(input_ids=tokens).logits
        logits.float().pow(2).mean().backward()
        grads = {n: p.grad.float() for n, p in model.named_parameters() if p.grad is not None}
        return logits.float(), grads

    ref_logits, ref_grads = run(reference)
    our_logits, our_grads = run(ours)
    # bfloat16 end to end: a relative error of a few bf16 ulps over the model
    torch.testing.assert_close(our_logits, ref_logits, **MODEL_TOLERANCE)
    assert ref_grads.keys() == our_grads.keys()
    for name, grad in ref_grads.items():
        err = (our_grads[name] - grad).norm() / grad.norm().clamp_min(1e-12)
        assert err < 5e-2, f"{name}: relative gradient error {err:.3g}"


@requires_compile
def test_compiled_swapped_llama_gives_inductor_the_stock_graphs(device: str) -> None:
    # Compiled, the norms are traced as their casting's arithmetic, which is LlamaRMSNorm's op
    # for op: AOTAutograd's forward and backward graphs of a training step (what Inductor
    # compiles) are the stock model's, so a compiled step's time can only differ by noise.
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    reference = tiny_llama(device)
    ours = copy.deepcopy(reference)
    hotloop.RMSNorm.replace_in(ours, "LlamaRMSNorm")
    tokens = torch.randint(0, 256, (2, 24), device=device)

    def graphs(model: torch.nn.Module) -> list[str]:
        codes: list[str] = []

        def record(gm: torch.fx.GraphModule, example_inputs: object) -> object:
            codes.append(gm.code)
            return make_boxed_func(gm.forward)

        torch._dynamo.reset()
        compiled = torch.compile(
            model, backend=aot_autograd(fw_compiler=record, bw_compiler=record)
        )
        compiled(input_ids=tokens, labels=tokens).loss.backward()
        return codes

    stock = graphs(reference)
    assert len(stock) == 2  # one forward graph and its backward
    assert graphs(ours) == stock


def test_swapped_llama_generates_the_stock_tokens(device: str) -> None:
    # from_module picks the "llama" casting, which rounds where LlamaRMSNorm rounds: greedy
    # decoding then picks the stock model's tokens. Trained-looking norm weights (not the
    # initial ones, with which every casting rounds alike).
    reference = tiny_llama(device)
    gen = torch.Generator(device="cpu").manual_seed(1)
    with torch.no_grad():
        for module in reference.modules():
            if type(module).__name__ == "LlamaRMSNorm":
                noise = 0.2 * torch.randn(module.weight.shape, generator=gen)
                module.weight.add_(noise.to(device=device, dtype=module.weight.dtype))
    ours = copy.deepcopy(reference)
    hotloop.RMSNorm.replace_in(ours, "LlamaRMSNorm")
    assert {m.casting for m in ours.modules() if isinstance(m, hotloop.RMSNorm)} == {"llama"}
    prompt = torch.randint(0, 256, (4, 8), generator=gen.manual_seed(2)).to(device)
    settings = {"max_new_tokens": 24, "do_sample": False, "pad_token_id": 0}
    with torch.no_grad():
        expected = reference.generate(prompt, attention_mask=torch.ones_like(prompt), **settings)
        got = ours.generate(prompt, attention_mask=torch.ones_like(prompt), **settings)
    assert torch.equal(got, expected)
