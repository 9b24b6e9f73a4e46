"""The bundled examples, installed as ``fedsbdt.examples``: data files only (the demo's data and the
documented schemas; licences in README.md).  A package so that the demo finds them in a wheel and in an
editable install alike (setup.py)."""
