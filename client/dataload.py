"""Parse and validate the site's private data in a short-lived child process.

The site daemon runs for the whole session; parsing a CSV/Parquet file needs
pandas and pyarrow (about 90 MB once imported, plus the parser's garbage,
which the allocator does not hand back).  :func:`load_isolated` runs
:func:`fedsbdt.common.data.load` in a child Python process instead and receives only
the validated arrays (an ``.npz`` stream on the child's stdout), so the
daemon process never imports pandas.  The result and every
:class:`~fedsbdt.common.data.DataError` message are exactly those of ``load``.

Child protocol (:mod:`fedsbdt.client.child`): :func:`_child` (``PATH``) with the schema as JSON
(``Schema.to_dict``, and for a SQL source its ``DataSource.to_dict``, never a password) on stdin; exit 0 with the arrays on stdout, or exit 2
with the DataError message on stderr.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from fedsbdt.common.data import DataError, Dataset
from fedsbdt.common.schema import Schema
from fedsbdt.common.sources import DataSource

from .child import run_child, write_arrays

EXIT_DATA_ERROR = 2


def as_source(data: str | Path | DataSource) -> Path | DataSource:
    """A site's ``--data``: a file's path, or a :class:`~fedsbdt.common.sources.DataSource` (a SQL query)."""
    return data if isinstance(data, DataSource) else Path(data)


def load_isolated(path: str | Path | DataSource, schema: Schema) -> Dataset:
    """``fedsbdt.common.records.load(path, schema)``, parsed in a child process (see the module docstring); a
    :class:`~fedsbdt.common.sources.DataSource` is queried there too (the daemon never imports a database
    driver; the child inherits libpq's environment, and reads a ``--password-file`` itself)."""
    spec = {"schema": schema.to_dict(), "digest": schema.digest()}
    if isinstance(path, DataSource):
        if schema.id_column is None:  # a query's row order is no identity: the ledger needs the record's own id
            raise DataError(f"{path}: a query's records need a stable id: the plan's schema must name the query's "
                            "record id column as id_column (e.g. OMOP person_id), so the ledger charges the same "
                            "person in every session")
        spec["source"] = path.to_dict()
    z = run_child("fedsbdt.client.dataload", "_child", (str(path),), json.dumps(spec).encode(),
                  rejected_exit=EXIT_DATA_ERROR, rejected=DataError, what=f"the data loader for {path}")
    arrival = z["arrival"] if bool(z["has_arrival"]) else None
    return Dataset(z["X"], z["y"], z["ids"], schema, str(z["source"]), int(z["dropped"]), arrival)


def _child(path: str) -> int:
    from fedsbdt.common.records import load

    spec = json.loads(sys.stdin.buffer.read())
    schema = Schema.from_dict(spec["schema"])
    if schema.digest() != spec["digest"]:
        print("the schema changed in transit to the data loader (digest mismatch)", file=sys.stderr)
        return 1
    try:
        ds = load(DataSource.from_dict(spec["source"]) if "source" in spec else path, schema)
    except DataError as e:
        print(str(e), file=sys.stderr)
        return EXIT_DATA_ERROR
    return write_arrays(X=ds.X, y=ds.y, ids=ds.ids, source=np.array(ds.source), dropped=np.array(ds.dropped),
                        has_arrival=np.array(ds.arrival is not None),
                        arrival=ds.arrival if ds.arrival is not None else np.zeros(0, np.int64))
