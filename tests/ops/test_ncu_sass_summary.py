"""benchmarks/ncu_sass_summary.py over a source page shaped as `ncu --import REPORT --page source
--print-source sass --csv` writes it: a kernel's name line, its header, then one row an
instruction, for each kernel of the report."""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

import pytest
from op_testing import load_benchmark

HEADER = [
    "Address",
    "Source",
    "Warp Stall Sampling (All Samples)",
    "Instructions Executed",
    "stall_long_sb",
    "stall_wait",
    "stall_long_sb (Not Issued)",
]


@pytest.fixture(scope="module")
def summary() -> Any:
    return load_benchmark("ncu_sass_summary")


def source_page(path: Path, kernels: dict[str, list[tuple[str, int, int, int, int]]]) -> Path:
    """kernels: name -> (source, samples, executed, long_sb, wait) a row; ncu's warning first."""
    text = io.StringIO()
    text.write("==WARNING== Note: Running with unmodified GPU clocks.\n")
    writer = csv.writer(text, quoting=csv.QUOTE_ALL)
    for name, rows in kernels.items():
        text.write(f'"Kernel Name","{name}",\n')
        writer.writerow(HEADER)
        for i, (source, samples, executed, long_sb, wait) in enumerate(rows):
            writer.writerow([hex(16 * i), source, samples, executed, long_sb, wait, 99])
    path.write_text(text.getvalue())
    return path


def test_counts_by_opcode_stall_and_instruction(
    summary: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    page = source_page(
        tmp_path / "sass.csv",
        {
            "void span_kernel<bf16>(const T1 *)": [
                ("      @!P2  LDG.E.128.CONSTANT R8, desc[UR8][R10.64]", 5, 300, 4, 1),
                ("      @!P2  PRMT R26, R8, 0x7610, R26", 40, 300, 30, 10),
                ("      PRMT R25, R8, 0x7632, R25", 0, 200, 0, 0),
                ("      ISETP.GE.AND P0, PT, R1, R2, PT", 1, 100, 0, 1),
            ],
            "void vector_kernel<bf16>(const T1 *)": [("      EXIT", 2, 64, 2, 0)],
        },
    )
    kernels = summary.read_source_page(page)
    assert [k.name for k in kernels] == [
        "void span_kernel<bf16>(const T1 *)",
        "void vector_kernel<bf16>(const T1 *)",
    ]
    span = kernels[0]
    assert (span.executed, span.samples) == (900, 46)
    # The issued-only columns are a subset of the samples, not more of them
    assert span.stalls == {"long_sb": 34, "wait": 12}

    assert summary.main([str(page), "--kernel", "span_kernel", "--top", "2"]) == 0
    out = capsys.readouterr().out
    assert "900 warp instructions executed, 46 warp-stall samples." in out
    assert "| PRMT | 500 | 55.6 % |" in out  # predicate and modifiers off: one opcode
    assert "| LDG | 300 | 33.3 % |" in out
    assert "ISETP" not in out  # past --top
    assert "| long_sb | 34 | 73.9 % |" in out
    assert out.index("PRMT R26") < out.index("LDG.E.128")  # most samples first
    assert "vector_kernel" not in out


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("==PROF== nothing profiled\n", "no 'Kernel Name' line"),
        ('"Kernel Name","k",\n"Address","Source"\n', "lacks Instructions Executed"),
        (
            '"Kernel Name","k",\n'
            '"Source","Instructions Executed","Warp Stall Sampling (All Samples)"\n'
            '"EXIT","many","0"\n',
            "holds 'many', not a count",
        ),
    ],
)
def test_a_file_that_is_not_a_source_page_is_named(
    summary: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, message: str
) -> None:
    page = tmp_path / "sass.csv"
    page.write_text(text)
    assert summary.main([str(page)]) == 2
    err = capsys.readouterr().err
    assert str(page) in err
    assert message in err


def test_a_kernel_name_that_matches_none_lists_the_kernels(
    summary: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    page = source_page(tmp_path / "sass.csv", {"void vector_kernel<bf16>()": []})
    assert summary.main([str(page), "--kernel", "span"]) == 2
    assert "it has: void vector_kernel<bf16>()" in capsys.readouterr().err
