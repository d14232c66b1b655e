"""``python -m scripts.matrix``: the compatibility run (``nox -s matrix``);
``python -m scripts.matrix --project PATH``: another project's (:mod:`scripts.project_matrix`);
``python -m scripts.matrix table ...``: the build matrix table itself."""

from __future__ import annotations

import sys

from scripts.matrix import table


def main(argv: list[str]) -> int:
    if argv[:1] == ["table"]:
        return table.main(argv[1:])
    if "--project" in argv or any(a.startswith("--project=") for a in argv):
        # another project's table (scripts/project_matrix.py): its wheels, its tests
        from scripts import project_matrix

        return project_matrix.main(argv)
    # The run needs the pipeline's tools; the table needs the standard library only.
    from scripts.matrix import run

    return run.main(argv)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
