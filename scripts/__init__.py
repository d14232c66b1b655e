"""The release pipeline for a PyTorch extension described by a project table
(``scripts/project.py``): importable, unit-tested modules that ``noxfile.py`` calls."""
