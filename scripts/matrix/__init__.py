"""The build matrix, and ``nox -s matrix``: the run that proves it, cell by cell.

The table is imported from here (``from scripts import matrix; matrix.load_rows()``); it lives
in :mod:`scripts.matrix.table`, read from ``matrix.toml`` beside it and checked once, when it
is loaded, against the typed model of :mod:`scripts.matrix.model`. The compatibility run
(``python -m scripts.matrix``, which ``nox -s matrix`` calls) has one module per job:

* :mod:`scripts.matrix.plan`: which wheel file each (torch, Python) cell tests.
* :mod:`scripts.matrix.digests`: what a wheel and the op suite are made from (sha256).
* :mod:`scripts.matrix.reuse`: a wheel built from the current sources, else a build.
* :mod:`scripts.matrix.results`: cell statuses and the record of passed cells.
* :mod:`scripts.matrix.negatives`: wrong-torch cells, where the wheel must refuse.
* :mod:`scripts.matrix.schedule`: the job queue, its priorities and the deadline.
* :mod:`scripts.matrix.render`: ``docs/compatibility.json`` and its Markdown.
* :mod:`scripts.matrix.run`: the run and its command line.

Only the table and its model are imported here: they need the standard library alone (the
GitHub workflow reads the table with a bare Python), while the run needs the pipeline's tools.
"""

from scripts.matrix.model import MatrixTableError
from scripts.matrix.table import (
    MATRIX_FILE,
    PACKAGE_VERSION,
    Row,
    archs_from_list,
    build_row_of,
    build_rows,
    cmake_cuda_architectures,
    github_matrix,
    load_rows,
    select_rows,
    variant_label,
    variant_wheels,
)

__all__ = [
    "MATRIX_FILE",
    "PACKAGE_VERSION",
    "MatrixTableError",
    "Row",
    "archs_from_list",
    "build_row_of",
    "build_rows",
    "cmake_cuda_architectures",
    "github_matrix",
    "load_rows",
    "select_rows",
    "variant_label",
    "variant_wheels",
]
