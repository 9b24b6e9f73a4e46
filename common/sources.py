"""Where a site's records come from: a file, or a SQL query against a database (docs/data-sources.md).

``--data`` names a CSV/Parquet file as before, or a database with a query:

* ``--data postgresql://USER@HOST:PORT/DB --query "SELECT …"`` (any libpq connection URI, e.g. a local socket
  directory ``postgresql://alice@/cdm?host=/run/postgresql&port=5432``, or a service ``postgresql://?service=cdm``),
  read through psycopg 3 with a server-side cursor in batches;
* ``--data duckdb: --query "SELECT … FROM 'cohort.parquet'"`` (DuckDB in memory, embedded: no server), or
  ``--data duckdb:FILE.duckdb`` (a DuckDB database file, opened read-only);
* ``--data cohort.parquet --query "SELECT … FROM data"``: the file (CSV as the schema's ``[format]`` describes
  it, or Parquet) is the table ``data`` of an in-memory DuckDB.

Credentials never appear on the command line: a password in the URL is refused; libpq finds it in its
environment (``PGPASSFILE``, ``PGSERVICEFILE``, …) or ``~/.pgpass``, or ``--password-file`` names a file
readable only by its owner.  This module only describes a source (it imports no driver); the readers live in
:mod:`fedsbdt.common.sqlread`.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import re
import stat
from dataclasses import asdict, dataclass
from pathlib import Path
from urllib.parse import parse_qsl, quote, unquote, urlsplit

from .data import DataError

#: rows fetched per batch from a database cursor
BATCH_ROWS = 50_000
_SCHEMES = ("postgresql://", "postgres://")


class SourceError(DataError):
    """A data source is described wrongly (the message is one line for the user)."""


@dataclass(frozen=True)
class DataSource:
    """A SQL data source: ``location`` (a libpq URI, ``duckdb:[FILE]``, or a CSV/Parquet file that the query
    reads as the table ``data``), the query, and where libpq finds the password (``password_file``)."""

    location: str
    query: str
    password_file: str | None = None
    batch_rows: int = BATCH_ROWS

    def __post_init__(self) -> None:
        if not self.query.strip():
            raise SourceError(f"{self.display}: the query is empty")
        if self.batch_rows < 1:
            raise SourceError("batch_rows must be at least 1")
        if self.kind == "postgresql":
            check_url(self.location)
        elif self.password_file is not None:
            raise SourceError("--password-file is for a PostgreSQL URL; DuckDB and files need none")

    @property
    def kind(self) -> str:
        """``"postgresql"``, ``"duckdb"`` (a DuckDB database or in memory) or ``"file"`` (DuckDB over a file)."""
        if self.location.startswith(_SCHEMES):
            return "postgresql"
        if self.location.startswith("duckdb:"):
            return "duckdb"
        return "file"

    @property
    def display(self) -> str:
        """How errors name the source: the URL without credentials (never a password), and ``(query)``."""
        where = normalised_url(self.location) if self.kind == "postgresql" else self.location
        return f"{where} (query)"

    def __str__(self) -> str:
        return self.display

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "DataSource":
        return cls(**d)


def is_url(data: str) -> bool:
    """True if ``--data`` names a database rather than a file."""
    return str(data).startswith(_SCHEMES + ("duckdb:",))


def check_url(url: str) -> None:
    """Refuse a PostgreSQL URI that carries a password (it would show in process listings and shell history)."""
    try:
        parts = urlsplit(url)
        netloc_password = "@" in parts.netloc and ":" in parts.netloc.rsplit("@", 1)[0]
        params = dict(parse_qsl(parts.query, keep_blank_values=True))
    except ValueError as e:
        raise SourceError(f"not a valid PostgreSQL URL ({e})") from None
    if netloc_password or "password" in params:
        raise SourceError("the database URL holds a password: credentials never go on the command line; use "
                          "~/.pgpass (or PGPASSFILE), --password-file FILE or a service name (?service=NAME)")


def normalised_url(url: str) -> str:
    """The URI in one canonical form without credentials: ``postgresql://user@host:port/db?k=v`` (parameters
    sorted; a socket directory given as ``?host=/dir`` stays a parameter)."""
    parts = urlsplit(url)
    netloc = parts.netloc.rsplit("@", 1)
    user = unquote(netloc[0].split(":", 1)[0]) if len(netloc) == 2 else ""
    hosts = netloc[-1]
    params = sorted((k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k != "password")
    query = "&".join(f"{quote(k, safe='')}={quote(v, safe='/')}" for k, v in params)
    return (f"postgresql://{quote(user, safe='')}{'@' if user else ''}{hosts.lower()}{parts.path or '/'}"
            + (f"?{query}" if query else ""))


def normalised_query(query: str) -> str:
    """The query with runs of white space made one space and a trailing semicolon removed."""
    return re.sub(r"\s+", " ", query).strip().rstrip(";").rstrip()


def file_digest(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def source_identity(source: "str | os.PathLike | DataSource") -> str:
    """A stable string that names the records a source holds, for keying a ledger across sessions.

    A file: ``file:sha256:<content digest>`` (the same bytes anywhere give the same identity).  A query:
    ``sql:<normalised URL without credentials>\\n<normalised query text>`` (for DuckDB over a file, the file's
    content digest stands for the URL).  It never holds a password.
    """
    if not isinstance(source, DataSource):
        return f"file:sha256:{file_digest(source)}"
    if source.kind == "postgresql":
        where = normalised_url(source.location)
    elif source.kind == "file":
        where = f"duckdb:file:sha256:{file_digest(source.location)}"
    else:
        path = source.location[len("duckdb:"):]
        where = f"duckdb:{Path(path).resolve()}" if path else "duckdb:"
    return f"sql:{where}\n{normalised_query(source.query)}"


def read_password_file(path: str) -> str:
    """The password in ``path`` (its first line), refusing a file that others may read (like libpq's .pgpass)."""
    p = Path(path)
    try:
        st = p.stat()
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise SourceError(f"--password-file {p}: cannot read it ({e.strerror})") from None
    if os.name == "posix" and st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise SourceError(f"--password-file {p}: others may read it (mode {stat.S_IMODE(st.st_mode):o}); "
                          f"run chmod 600 {p}")
    lines = text.splitlines()
    if not lines or not lines[0]:
        raise SourceError(f"--password-file {p}: the file is empty")
    return lines[0]


# ---------------------------------------------------------------------- command line


def add_source_flags(p: argparse.ArgumentParser) -> None:
    """``--query``, ``--query-file`` and ``--password-file`` beside a command's ``--data``."""
    g = p.add_argument_group("SQL sources (--data postgresql://USER@HOST:PORT/DB, duckdb:[FILE], or a file "
                             "read as the table 'data'; docs/data-sources.md)")
    g.add_argument("--query", metavar="SQL", help="the query that selects the records (one row per record, the "
                                                  "schema's columns by name; default: none, --data is a file)")
    g.add_argument("--query-file", metavar="FILE", help="read the query from FILE instead (default: none)")
    g.add_argument("--password-file", metavar="FILE",
                   help="file (mode 600) whose first line is the database password (default: libpq's own: "
                        "PGPASSFILE or ~/.pgpass, a service file, or no password)")


def data_argument(data: str | None, query: str | None = None, query_file: str | None = None,
                  password_file: str | None = None) -> "str | DataSource | None":
    """What ``--data`` with the source flags names: the file path unchanged (no query), or a :class:`DataSource`.
    Refuses (SourceError, one line) a database without a query, two queries, or a password in the URL."""
    if query is not None and query_file is not None:
        raise SourceError("give either --query or --query-file, not both")
    if query_file is not None:
        try:
            query = Path(query_file).read_text(encoding="utf-8")
        except OSError as e:
            raise SourceError(f"--query-file {query_file}: cannot read it ({e.strerror})") from None
    if data is None:
        if query is not None or password_file is not None:
            raise SourceError("--query, --query-file and --password-file need --data (the database URL)")
        return None
    if query is None:
        if is_url(data):
            raise SourceError(f"--data {normalised_url(data) if data.startswith(_SCHEMES) else data}: a database "
                              "needs the query that selects the records (--query SQL or --query-file FILE)")
        if password_file is not None:
            raise SourceError("--password-file is for a database URL (with --query)")
        return data
    return DataSource(str(data), query, password_file)


def source_from_args(args: argparse.Namespace, attr: str = "data") -> "str | DataSource | None":
    """:func:`data_argument` of a parsed command line (flags added by :func:`add_source_flags`)."""
    return data_argument(getattr(args, attr), getattr(args, "query", None), getattr(args, "query_file", None),
                         getattr(args, "password_file", None))
