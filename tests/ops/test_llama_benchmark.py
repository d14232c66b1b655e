"""benchmarks/bench_llama.py: the compiled cases time hotloop's model as hotloop's op
(set_compile_arithmetic(False)) beside the two models, which run under the default, against
the same stock rounds (its timings need a GPU; what is checked here is which steps it builds
and how the table reads them)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from op_testing import load_benchmark


@pytest.fixture
def bench_llama() -> Any:
    return load_benchmark("bench_llama")


def test_compiled_cases_add_the_op_step(bench_llama: Any) -> None:
    models = {name: torch.nn.Linear(2, 2) for name in bench_llama.MODELS}
    assert bench_llama.step_models(models, compiled=False) == {
        "stock": (models["stock"], None),
        "hotloop": (models["hotloop"], None),
    }
    compiled = bench_llama.step_models(models, compiled=True)
    assert compiled[bench_llama.OP_STEP] == (models["hotloop"], False)
    assert list(compiled) == ["stock", "hotloop", bench_llama.OP_STEP]


def test_table_sets_each_step_against_the_same_stock_rounds(bench_llama: Any) -> None:
    def ms(value: float) -> dict[str, float]:
        return {"ms": value}

    results = {
        "train eager": {"stock": ms(10.0), "hotloop": ms(9.0)},
        "train compiled": {"stock": ms(8.0), "hotloop": ms(8.4), bench_llama.OP_STEP: ms(7.6)},
        "generate compiled": {"error": "RuntimeError: boom"},
    }
    assert bench_llama.table(results).splitlines()[2:] == [
        "| train eager | 10.00 | 9.00 | 0.900 |",
        "| train compiled | 8.00 | 8.40 | 1.050 |",
        "| train compiled, hotloop's op | 8.00 | 7.60 | 0.950 |",
        "| generate compiled | error: RuntimeError: boom | | |",
    ]
