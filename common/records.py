"""The records a ``--data`` source names, whatever it is: a CSV or Parquet file (:func:`fedsbdt.common.data.load`)
or a query against a database (a :class:`~fedsbdt.common.sources.DataSource`,
:func:`fedsbdt.common.sqlread.load_query`), validated against the schema the same way.

The front door above both readers, so that the file reader (``data``) stays below the query reader
(``sqlread``), which builds on its validation.
"""
from __future__ import annotations

from pathlib import Path

from .data import Dataset
from .data import load as load_file
from .schema import Schema
from .sqlread import load_query


def load(source, schema: Schema, labels: bool = True, carry: tuple[str, ...] = ()) -> Dataset:
    """:func:`fedsbdt.common.data.load` for a file's path, :func:`fedsbdt.common.sqlread.load_query` for a
    :class:`~fedsbdt.common.sources.DataSource` (same arguments, same :class:`~fedsbdt.common.data.Dataset`)."""
    if isinstance(source, (str, Path)):
        return load_file(source, schema, labels, carry)
    return load_query(source, schema, labels, carry)
