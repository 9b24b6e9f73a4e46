"""Parse and validate the site's private data in a short-lived child process.

The site daemon runs for the whole session; parsing a CSV/Parquet file needs
pandas and pyarrow (about 90 MB once imported, plus the parser's garbage,
which the allocator does not hand back).  :func:`load_isolated` runs
:func:`common.data.load` in a child Python process instead and receives only
the validated arrays (an ``.npz`` stream on the child's stdout), so the
daemon process never imports pandas.  The result and every
:class:`~common.data.DataError` message are exactly those of ``load``.

Child protocol: :func:`_child` (``PATH``) with the schema as JSON
(``Schema.to_dict``) on stdin; exit 0 with the arrays on stdout, or exit 2
with the DataError message on stderr.
"""
from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

from common.data import DataError, Dataset
from common.schema import Schema

EXIT_DATA_ERROR = 2
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[1])
_CHILD = "import sys; sys.path.insert(0, sys.argv[1]); from client.dataload import _child; sys.exit(_child(sys.argv[2]))"


def load_isolated(path: str | Path, schema: Schema) -> Dataset:
    """``common.data.load(path, schema)``, parsed in a child process (see the module docstring)."""
    spec = json.dumps({"schema": schema.to_dict(), "digest": schema.digest()}).encode()
    # -P and an explicit path: the child runs this very package, never a ``client`` in the working directory
    proc = subprocess.run([sys.executable, "-P", "-c", _CHILD, _PACKAGE_ROOT, str(path)], input=spec,
                          capture_output=True, check=False)
    if proc.returncode == EXIT_DATA_ERROR:
        raise DataError(proc.stderr.decode("utf-8", "replace").strip())
    if proc.returncode != 0 or not proc.stdout:
        tail = proc.stderr.decode("utf-8", "replace").strip().splitlines()[-3:]
        raise RuntimeError(f"the data loader for {path} failed (exit {proc.returncode}): {' | '.join(tail)}")
    with np.load(io.BytesIO(proc.stdout), allow_pickle=False) as z:
        arrival = z["arrival"] if bool(z["has_arrival"]) else None
        return Dataset(z["X"], z["y"], z["ids"], schema, str(z["source"]), int(z["dropped"]), arrival)


def _child(path: str) -> int:
    from common.data import load

    spec = json.loads(sys.stdin.buffer.read())
    schema = Schema.from_dict(spec["schema"])
    if schema.digest() != spec["digest"]:
        print("the schema changed in transit to the data loader (digest mismatch)", file=sys.stderr)
        return 1
    try:
        ds = load(path, schema)
    except DataError as e:
        print(str(e), file=sys.stderr)
        return EXIT_DATA_ERROR
    buf = io.BytesIO()
    np.savez(buf, X=ds.X, y=ds.y, ids=ds.ids, source=np.array(ds.source), dropped=np.array(ds.dropped),
             has_arrival=np.array(ds.arrival is not None),
             arrival=ds.arrival if ds.arrival is not None else np.zeros(0, np.int64))
    sys.stdout.buffer.write(buf.getvalue())
    sys.stdout.buffer.flush()
    return 0
