"""Release pipeline of hotloop: importable, unit-tested modules that ``noxfile.py`` calls."""
