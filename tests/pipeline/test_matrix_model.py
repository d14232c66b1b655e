"""scripts.matrix.model: matrix.toml is checked once, when it is loaded, and a bad table is one
error naming the file, the row or table, the key and the value."""

from __future__ import annotations

from pathlib import Path

import pytest

from scripts import matrix
from scripts.matrix import model
from scripts.typed_toml import field_docs, table_fields

SMALL = """\
arch_list = "8.0;9.0+PTX"

[toolkits."13.0"]
packages = ["nvidia-cuda-nvcc==13.0.88"]

[toolkits."12.8"]
nvcc = "12.4"
arch_list = "8.0;9.0+PTX"

[toolkits."12.8".debian]
suite = "trixie"
components = ["main", "non-free"]
packages = [{ name = "nvidia-cuda-toolkit", version = "12.4.131~12.4.1-2", sha256 = "SHA" }]

[[row]]
torch = "2.10.0"
cuda = "12.8"
pythons = ["3.10", "3.11"]

[[row]]
torch = "2.11.0"
cuda = "13.0"
pythons = ["3.10", "3.11", "3.12"]
""".replace("SHA", "a" * 64)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "matrix.toml"
    path.write_text(text)
    return path


def load_error(tmp_path: Path, text: str) -> str:
    path = write(tmp_path, text)
    with pytest.raises(matrix.MatrixTableError) as err:
        matrix.load_rows(path)
    message = str(err.value)
    assert message.startswith(f"{path}: "), message
    return message


def test_the_small_table_loads(tmp_path: Path) -> None:
    rows = matrix.load_rows(write(tmp_path, SMALL))
    assert [(r.torch, r.variant, r.pythons) for r in rows] == [
        ("2.10.0", "stable.cu12", ("3.10", "3.11")),
        ("2.11.0", "stable.cu13", ("3.10", "3.11", "3.12")),
    ]
    assert rows[0].toolkit.nvcc == "12.4"
    assert rows[1].arch_list == "8.0;9.0+PTX"


def test_two_rows_for_one_torch_release_are_refused(tmp_path: Path) -> None:
    """PyPI serves one CUDA build per torch release (what ``torch==X`` installs and every cell
    tests), and the plan keys rows by torch: a second row for 2.11.0 used to make the CUDA 13
    wheel vanish from the GitHub matrix and the release."""
    text = matrix.MATRIX_FILE.read_text() + '\n[[row]]\ntorch = "2.11.0"\ncuda = "12.8"\n'
    text += 'pythons = ["3.10", "3.11", "3.12", "3.13"]\n'
    message = load_error(tmp_path, text)
    assert "[[row]] 9 (torch 2.11.0): torch = '2.11.0'" in message
    assert "row 4 (CUDA 13.0)" in message
    assert "download.pytorch.org" in message  # where the other CUDA builds come from


def test_the_same_row_twice_is_refused(tmp_path: Path) -> None:
    text = SMALL + '\n[[row]]\ntorch = "2.11.0"\ncuda = "13.0"\npythons = ["3.12"]\n'
    assert "[[row]] 3 (torch 2.11.0): torch = '2.11.0'" in load_error(tmp_path, text)


ROW_CASES = {
    # (what the second row's lines become, the words the error must carry)
    "pythons-string": (
        ('pythons = ["3.10", "3.11", "3.12"]', 'pythons = "3.10"'),
        "pythons = '3.10': expected a list of strings",
    ),
    "pythons-empty": (
        ('pythons = ["3.10", "3.11", "3.12"]', "pythons = []"),
        "pythons = []: expected at least one Python",
    ),
    "pythons-number": (
        ('pythons = ["3.10", "3.11", "3.12"]', "pythons = [3.10, 3.11]"),
        "pythons = [3.1, 3.11]: expected a list of strings",
    ),
    "pythons-bad-version": (
        ('pythons = ["3.10", "3.11", "3.12"]', 'pythons = ["3.10", "3"]'),
        "pythons = ['3.10', '3']: '3' is not a CPython minor version (3.N)",
    ),
    "pythons-duplicate": (
        ('pythons = ["3.10", "3.11", "3.12"]', 'pythons = ["3.10", "3.11", "3.10"]'),
        "'3.10' is listed twice",
    ),
    "pythons-unordered": (
        ('pythons = ["3.10", "3.11", "3.12"]', 'pythons = ["3.12", "3.10"]'),
        "expected oldest first",
    ),
    "pythons-free-threaded": (
        ('pythons = ["3.10", "3.11", "3.12"]', 'pythons = ["3.12", "3.14t"]'),
        "free-threaded",
    ),
    "torch-pre-release": (
        ('torch = "2.11.0"', 'torch = "2.16.0rc1"'),
        "torch = '2.16.0rc1': a pre-release",
    ),
    "torch-local-label": (
        ('torch = "2.11.0"', 'torch = "2.11.0+cu130"'),
        "torch = '2.11.0+cu130': expected a final release",
    ),
    "torch-two-parts": (
        ('torch = "2.11.0"', 'torch = "2.11"'),
        "torch = '2.11': expected a final release",
    ),
    "cuda-number": (('cuda = "13.0"', "cuda = 13.0"), "cuda = 13.0: expected a string"),
    "cuda-shape": (('cuda = "13.0"', 'cuda = "cu130"'), "cuda = 'cu130': expected"),
    "missing-cuda": (('cuda = "13.0"\n', ""), "cuda = None: required, not set"),
    "missing-pythons": (('pythons = ["3.10", "3.11", "3.12"]\n', ""), "pythons = None: required"),
    "unknown-key": (
        ('pythons = ["3.10", "3.11", "3.12"]', 'pythons = ["3.12"]\npython = ["3.12"]'),
        "python = ['3.12']: unknown key (known: torch, cuda, pythons, arch_list); "
        "did you mean pythons?",
    ),
    "arch-list-sm": (
        ('pythons = ["3.10", "3.11", "3.12"]', 'pythons = ["3.12"]\narch_list = "sm_90"'),
        "arch_list = 'sm_90': 'sm_90' is not",
    ),
    "arch-list-list": (
        ('pythons = ["3.10", "3.11", "3.12"]', 'pythons = ["3.12"]\narch_list = ["9.0"]'),
        "arch_list = ['9.0']: expected a string",
    ),
    "stable-build-without-audit-python": (
        ('pythons = ["3.10", "3.11", "3.12"]', 'pythons = ["3.10"]'),
        "builds the stable.cu13 wheel",
    ),
    "no-toolkit": (('cuda = "13.0"', 'cuda = "13.2"'), 'no [toolkits."13.2"]'),
}


@pytest.mark.parametrize("case", ROW_CASES)
def test_a_malformed_row_names_the_file_row_key_and_value(tmp_path: Path, case: str) -> None:
    (old, new), words = ROW_CASES[case]
    head, sep, second_row = SMALL.rpartition("[[row]]")
    assert old in second_row
    message = load_error(tmp_path, head + sep + second_row.replace(old, new))
    assert "[[row]] 2" in message, message
    assert words in message, message


TOP_ARCH = 'arch_list = "8.0;9.0+PTX"\n\n[toolkits."13.0"]'
TABLE_CASES = {
    "arch-list-entry": (
        (
            'arch_list = "8.0;9.0+PTX"\n\n[toolkits."13.0"]',
            'arch_list = "8.0;sm_90"\n\n[toolkits."13.0"]',
        ),
        "top level: arch_list = '8.0;sm_90': 'sm_90' is not",
    ),
    "arch-list-empty": (
        (TOP_ARCH, 'arch_list = ";"\n\n[toolkits."13.0"]'),
        "top level: arch_list = ';': expected at least one architecture",
    ),
    "missing-arch-list": (
        (TOP_ARCH, '[toolkits."13.0"]'),
        "top level: arch_list = None: required, not set",
    ),
    "toolkit-packages-string": (
        ('packages = ["nvidia-cuda-nvcc==13.0.88"]', 'packages = "nvidia-cuda-nvcc==13.0.88"'),
        "[toolkits.\"13.0\"]: packages = 'nvidia-cuda-nvcc==13.0.88': expected a list of strings",
    ),
    "toolkit-package-unpinned": (
        ('packages = ["nvidia-cuda-nvcc==13.0.88"]', 'packages = ["nvidia-cuda-nvcc>=13.0"]'),
        "'nvidia-cuda-nvcc>=13.0' is not pinned exactly (NAME==VERSION)",
    ),
    "toolkit-nothing": (
        ('packages = ["nvidia-cuda-nvcc==13.0.88"]', ""),
        '[toolkits."13.0"]: needs exactly one of packages',
    ),
    "toolkit-nvcc-newer": (
        ('nvcc = "12.4"', 'nvcc = "12.9"'),
        "nvcc = '12.9': expected a 12.x release no newer than 12.8",
    ),
    "toolkit-nvcc-other-major": (('nvcc = "12.4"', 'nvcc = "13.0"'), "nvcc = '13.0': "),
    "toolkit-key": (
        ('[toolkits."13.0"]', '[toolkits."cu130"]'),
        "top level: toolkits = 'cu130': a toolkit's key is a CUDA MAJOR.MINOR",
    ),
    "debian-sha256": (
        ("a" * 64, "abc"),
        "[toolkits.\"12.8\".debian] packages 1: sha256 = 'abc': expected 64 hex digits",
    ),
    "debian-no-suite": (('suite = "trixie"\n', ""), "suite = None: required, not set"),
    "debian-components-empty": (
        ('components = ["main", "non-free"]', "components = []"),
        "components = []: expected at least one component",
    ),
    "debian-unknown-key": (
        ('suite = "trixie"', 'suite = "trixie"\nsuites = ["sid"]'),
        "did you mean suite?",
    ),
    "no-rows": (("[[row]]", "[[notrow]]"), "top level: notrow"),
    "not-toml": (("[[row]]", "[[row"), "not valid TOML"),
}


@pytest.mark.parametrize("case", TABLE_CASES)
def test_a_malformed_table_names_the_file_table_key_and_value(tmp_path: Path, case: str) -> None:
    (old, new), words = TABLE_CASES[case]
    assert old in SMALL
    message = load_error(tmp_path, SMALL.replace(old, new, 1))
    assert words in message, message


@pytest.mark.parametrize(
    ("rows", "words"),
    [
        ('row = "2.11.0"', "top level: row = '2.11.0': expected an array of tables ([[row]])"),
        ("row = []", "top level: row = []: expected at least one [[row]]"),
    ],
)
def test_rows_that_are_no_array_of_tables(tmp_path: Path, rows: str, words: str) -> None:
    text = rows + "\n" + SMALL[: SMALL.index("[[row]]")]
    assert words in load_error(tmp_path, text)


def test_the_real_table_is_valid() -> None:
    spec = model.load_matrix(matrix.MATRIX_FILE)
    assert [r.torch for r in spec.row] == [r.torch for r in matrix.load_rows()]


def test_every_field_has_a_docstring() -> None:
    for cls in (model.MatrixSpec, model.RowSpec, model.ToolkitSpec, model.DebianSpec):
        docs = field_docs(cls)
        assert set(docs) == {f.name for f in table_fields(cls)}, cls
