"""Reading a :class:`~fedsbdt.common.sources.DataSource`: a query's rows, streamed in batches and validated
against the public schema exactly as a file's rows are (docs/data-sources.md).

PostgreSQL through psycopg 3: a read-only transaction and a server-side (named) cursor, so the server sends
``batch_rows`` rows at a time and the site never holds the query's whole result as Python objects; each batch
is validated into the numeric arrays the trees use, then dropped.  DuckDB (embedded, no server) streams Arrow
record batches the same way.  Errors name the source (its URL without credentials), the row number in the
query's result and the row's id, and the column.  A NULL is a missing value (``allow_missing`` keeps it,
``format.on_missing`` drops or refuses its row).
"""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np

from .data import DataError, Dataset, _num_str, _validate, ids_of
from .schema import Schema
from .sources import DataSource, read_password_file


class RowLabels:
    """How an error names a query's row: ``17 (person_id 1234)`` (its 1-based number in the result and its id)."""

    def __init__(self, rows: np.ndarray, ids: np.ndarray | None, id_name: str | None):
        self.rows, self.ids, self.id_name = rows, ids, id_name

    def __getitem__(self, i):
        if isinstance(i, (int, np.integer)):
            if self.ids is None:
                return str(int(self.rows[i]))
            v = self.ids[i]
            v = v.item() if isinstance(v, np.generic) else v
            return f"{int(self.rows[i])} ({self.id_name} {v if isinstance(v, int) else repr(v)})"
        return RowLabels(self.rows[i], None if self.ids is None else self.ids[i], self.id_name)

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def size(self) -> int:
        return len(self.rows)


def load_query(src: DataSource, schema: Schema, labels: bool = True, carry: tuple[str, ...] = ()) -> Dataset:
    """The records of ``src``'s query, validated against ``schema`` (``labels=False``: for prediction;
    ``carry``: further columns kept as returned, :func:`fedsbdt.common.data.load`)."""
    where = src.display
    id_col = schema.id_column
    parts: list[tuple[Dataset, int]] = []
    offset = 0
    for frame in _batches(src, schema):
        if offset == 0:
            dup = sorted({c for c in frame.columns if list(frame.columns).count(c) > 1})
            if dup:
                raise DataError(f"{where}: the query returns the column(s) {', '.join(map(repr, dup))} more than "
                                "once; give each a distinct name (AS …)")
        frame = _as_text(frame, schema)
        n = len(frame)
        lab = RowLabels(np.arange(offset + 1, offset + n + 1),
                        frame[id_col].to_numpy() if id_col in frame.columns else None, id_col)
        parts.append((_validate(frame, schema, where, lab, id_col, "row", labels, batch=True, carry=carry), offset))
        offset += n
    if offset == 0:
        raise DataError(f"{where}: the query returned no rows")
    kept = np.concatenate([ds.ids + off for ds, off in parts])  # 0-based row numbers of the kept rows
    dropped = sum(ds.dropped for ds, _ in parts)
    if kept.size == 0:
        raise DataError(f"{where}: no rows left after dropping {dropped} with missing values")
    X = np.ascontiguousarray(np.concatenate([ds.X for ds, _ in parts]))
    y = np.concatenate([ds.y for ds, _ in parts]) if labels else None
    arrival = np.concatenate([ds.arrival for ds, _ in parts]) if schema.arrival_column else None
    id_values = None
    if id_col:
        import pandas as pd

        id_values = np.concatenate([ds.id_values for ds, _ in parts])
        lab = RowLabels(kept + 1, id_values, id_col)
        ids = ids_of(pd.Series(id_values), id_col, where, lab, "row")
    else:
        ids = kept.astype(np.int64)  # without an id column: the row number in the result, from 0
    carried = tuple((c, np.concatenate([dict(ds.carried)[c] for ds, _ in parts])) for c in carry)
    return Dataset(X, y, ids, schema, where, dropped, arrival, id_values, carried)


def read_frame(src: DataSource, schema: Schema):
    """The query's rows as one pandas frame, unvalidated (categorical features as text, as :func:`load_query`
    compares them): for ``fedsbdt demo``, which deals the rows to throw-away sites as CSV lines."""
    import pandas as pd

    frames = [_as_text(f, schema) for f in _batches(src, schema)]
    if not frames:
        raise DataError(f"{src.display}: the query returned no rows")
    return pd.concat(frames, ignore_index=True)


def _as_text(frame, schema: Schema):
    """Categorical features typed as numbers in the database compare with the schema's levels as text (as a
    file's fields do): 8507 and 8507.0 both read ``"8507"``; NULL stays NULL."""
    for f in schema.features:
        if f.is_categorical and f.name in frame.columns and frame[f.name].dtype.kind in "iufb":
            col = frame[f.name]
            text = [None if x != x else ("true" if x is True else "false" if x is False else _num_str(x))
                    for x in col.to_numpy(dtype=object)]
            frame[f.name] = np.array(text, dtype=object)
    return frame


def _batches(src: DataSource, schema: Schema) -> Iterator:
    if src.kind == "postgresql":
        return _postgres_batches(src)
    return _duckdb_batches(src, schema)


def _first_line(e: Exception) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__


def _postgres_batches(src: DataSource):
    import pandas as pd
    import psycopg
    from psycopg.types.numeric import FloatLoader

    where = src.display
    kw = {"password": read_password_file(src.password_file)} if src.password_file else {}
    try:
        conn = psycopg.connect(src.location, **kw)
    except psycopg.Error as e:
        msg = _first_line(e)
        hint = (" (libpq reads the password from PGPASSFILE or ~/.pgpass, or a service file; or pass "
                "--password-file)" if "password" in msg else "")
        raise DataError(f"{where}: cannot connect: {msg}{hint}") from None
    try:
        conn.read_only = True  # the query can read the warehouse, never change it
        conn.adapters.register_loader("numeric", FloatLoader)  # NUMERIC as float, not Decimal
        with conn.transaction(), conn.cursor(name="fedsbdt_records") as cur:
            cur.execute(src.query)
            names = [d.name for d in cur.description]
            while rows := cur.fetchmany(src.batch_rows):
                yield pd.DataFrame.from_records(rows, columns=names)
    except psycopg.Error as e:
        raise DataError(f"{where}: the query failed: {_first_line(e)}") from None
    finally:
        conn.close()


def _duckdb_batches(src: DataSource, schema: Schema):
    import duckdb

    where = src.display
    try:
        if src.kind == "file":  # the file is the table `data` of an in-memory database
            p = Path(src.location)
            if not p.is_file():
                raise DataError(f"data file not found: {p}")
            con = duckdb.connect(":memory:")
            if p.suffix.lower() in (".parquet", ".pq"):
                rel = con.read_parquet(str(p))
            else:
                fmt = schema.format
                kw = {"header": fmt.header, "sep": fmt.separator}
                if not fmt.header:
                    kw["names"] = list(schema.columns)
                with open(p, encoding="utf-8", errors="replace") as fh:
                    present = set(schema.columns) if not fmt.header else {
                        c.strip().strip('"') for c in fh.readline().rstrip("\r\n").split(fmt.separator.strip() or ",")}
                text = [f.name for f in schema.features if f.is_categorical] + [schema.target, schema.id_column]
                # levels, labels and ids as written ("yes" is no boolean); the other columns typed for natural SQL
                kw["dtype"] = {c: "VARCHAR" for c in text if c in present}
                rel = con.read_csv(str(p), **kw)
            rel.create_view("data")
        else:
            path = src.location[len("duckdb:"):]
            if path and not Path(path).is_file():
                raise DataError(f"DuckDB database not found: {path}")
            con = duckdb.connect(path or ":memory:", read_only=bool(path))
        try:
            rel = con.sql(src.query)
            if rel is None:
                raise DataError(f"{where}: the query returns no table")
            reader = getattr(rel, "to_arrow_reader", None) or rel.fetch_arrow_reader  # DuckDB ≥ 2 / 1.x
            for rb in reader(src.batch_rows):
                if rb.num_rows:
                    yield rb.to_pandas()
        finally:
            con.close()
    except duckdb.Error as e:
        raise DataError(f"{where}: the query failed: {_first_line(e)}") from None
