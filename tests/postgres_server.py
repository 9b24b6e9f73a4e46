"""A throw-away PostgreSQL server for the tests: the Debian ``postgresql`` package's ``initdb`` and ``pg_ctl``
on a private socket directory (and a loopback TCP port with password authentication).

As root, ``initdb`` refuses to run: the server then runs as the ``postgres`` user that the Debian package
creates (through ``runuser``), in a directory of its own under ``/tmp``.  ``.ci/postgres-setup.sh``
installs the package; a machine without it fails these tests with the reason (nothing is skipped).
"""
from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

SUPERUSER = "fedsbdt"
PASSWORD = "correct horse battery staple"


def bin_dir() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]))
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    if initdb:
        return Path(initdb).parent
    raise RuntimeError("PostgreSQL is not installed (no /usr/lib/postgresql/*/bin/initdb): run "
                       "`bash .ci/postgres-setup.sh` (apt-get install postgresql)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class PgServer:
    root: Path  # data directory, socket and log below it
    port: int
    _as: list[str]

    @property
    def socket_dir(self) -> Path:
        return self.root / "sock"

    def url(self, db: str = "postgres", user: str = SUPERUSER) -> str:
        """A libpq URI through the private socket directory (trust authentication)."""
        return f"postgresql://{user}@/{db}?host={self.socket_dir}&port={self.port}"

    def tcp_url(self, db: str = "postgres", user: str = SUPERUSER) -> str:
        """A libpq URI over loopback TCP (password authentication, scram-sha-256)."""
        return f"postgresql://{user}@127.0.0.1:{self.port}/{db}"

    def connect(self, db: str = "postgres"):
        import psycopg

        return psycopg.connect(self.url(db), autocommit=True)

    def create_database(self, name: str) -> str:
        with self.connect() as c:
            c.execute(f'DROP DATABASE IF EXISTS "{name}"')
            c.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def stop(self) -> None:
        subprocess.run([*self._as, str(bin_dir() / "pg_ctl"), "-D", str(self.root / "data"), "-m", "immediate",
                        "stop"], capture_output=True, check=False)
        shutil.rmtree(self.root, ignore_errors=True)


def start() -> PgServer:
    """initdb and start a server; raises RuntimeError with the server's own words if it cannot."""
    bins = bin_dir()
    root = Path(tempfile.mkdtemp(prefix="fedsbdt-pg-"))
    run_as: list[str] = []
    if os.geteuid() == 0:  # initdb refuses root: run the server as the package's postgres user
        try:
            import pwd

            pw = pwd.getpwnam("postgres")
        except KeyError:
            raise RuntimeError("running as root, and there is no 'postgres' user to run the server as "
                               "(install the Debian postgresql package: bash .ci/postgres-setup.sh)") from None
        os.chown(root, pw.pw_uid, pw.pw_gid)
        run_as = ["runuser", "-u", "postgres", "--"]
    os.chmod(root, 0o755)  # the clients reach the socket directory below it
    (root / "pw").write_text(PASSWORD + "\n")
    if run_as:
        os.chown(root / "pw", pw.pw_uid, pw.pw_gid)

    def sh(*cmd: str) -> None:
        p = subprocess.run([*run_as, *cmd], capture_output=True, text=True, check=False)
        if p.returncode != 0:
            log = root / "log"
            tail = log.read_text()[-2000:] if log.exists() else ""
            raise RuntimeError(f"{Path(cmd[0]).name} failed (exit {p.returncode}): {p.stderr.strip()} {tail}")

    sh(str(bins / "initdb"), "-D", str(root / "data"), "-U", SUPERUSER, "--pwfile", str(root / "pw"),
       "--auth-local=trust", "--auth-host=scram-sha-256", "-E", "UTF8", "--no-sync", "--no-instructions")
    (root / "pw").unlink()
    sh("mkdir", "-m", "0755", str(root / "sock"))
    port = free_port()
    opts = (f"-k {root / 'sock'} -p {port} -c listen_addresses=127.0.0.1 -c fsync=off "
            "-c synchronous_commit=off -c full_page_writes=off -c shared_buffers=32MB")
    sh(str(bins / "pg_ctl"), "-D", str(root / "data"), "-o", opts, "-l", str(root / "log"), "-w", "-t", "60", "start")
    return PgServer(root, port, run_as)


def load_frame(url: str, table: str, frame, types: dict[str, str] | None = None) -> None:
    """Create ``table`` in the database at ``url`` and fill it with ``frame``'s rows (COPY): integer columns as
    bigint, floating point as double precision, anything else as text (or as ``types`` says)."""
    import io

    import psycopg

    def pg_type(c) -> str:
        if types and c in types:
            return types[c]
        kind = frame[c].dtype.kind
        return {"i": "bigint", "u": "bigint", "f": "double precision", "b": "boolean"}.get(kind, "text")

    cols = ", ".join(f'"{c}" {pg_type(c)}' for c in frame.columns)
    buf = io.StringIO()
    frame.to_csv(buf, index=False)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'DROP TABLE IF EXISTS "{table}"')
        conn.execute(f'CREATE TABLE "{table}" ({cols})')
        with conn.cursor().copy(f'COPY "{table}" FROM STDIN WITH (FORMAT csv, HEADER true)') as cp:
            cp.write(buf.getvalue())
