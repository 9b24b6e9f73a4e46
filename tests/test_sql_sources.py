"""SQL sources against a real PostgreSQL server (and embedded DuckDB): the same records, the same validation
and errors as files, credentials never on the command line (docs/data-sources.md)."""
import json
import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from fedsbdt.common.data import DataError
from fedsbdt.common.records import load
from fedsbdt.common.schema import Schema
from fedsbdt.common.sources import DataSource, SourceError, data_argument, source_identity

from postgres_server import PASSWORD, load_frame
from test_data import TOY

SCHEMA = TOY.replace('levels = ["A", "B"]', 'levels = ["A", "B", "8507"]') + """
[[features]]
pattern = "lab_{1..2}"
type = "numeric"
range = [0, 10]
allow_missing = true
"""
QUERY = "SELECT pid, age, ward, lab_1, lab_2, label FROM cohort ORDER BY pid"


def rows(n=40, seed=5):
    rng = np.random.default_rng(seed)
    return pd.DataFrame({
        "pid": np.arange(n) * 3 + 100,
        "age": rng.integers(0, 100, n).astype(float) + 0.5,
        "lab_1": np.where(rng.random(n) < 0.2, np.nan, rng.random(n) * 10),
        "lab_2": rng.random(n) * 10,
        "ward": rng.choice(["A", "B", "8507"], n),
        "label": rng.choice(["yes", "no"], n),
    })


@pytest.fixture
def toy(tmp_path):
    (tmp_path / "schema.toml").write_text(SCHEMA)
    return Schema.load(tmp_path / "schema.toml")


@pytest.fixture
def db(postgres, request):
    """A fresh database (named after the test) holding the table ``cohort``; yields (url, frame)."""
    name = "t_" + request.node.name.lower().replace("[", "_").replace("]", "").replace("-", "_")[:50]
    url = postgres.create_database(name)
    frame = rows()
    load_frame(url, "cohort", frame)
    return url, frame


def same(a, b):
    np.testing.assert_array_equal(a.X, b.X)
    np.testing.assert_array_equal(a.ids, b.ids)
    if a.y is not None or b.y is not None:
        np.testing.assert_array_equal(a.y, b.y)


def fedsbdt(*args, env=None):
    return subprocess.run([sys.executable, "-m", "fedsbdt.cli", *args], capture_output=True, text=True,
                          env=env)


def test_a_query_reads_the_same_records_as_the_file_in_batches(tmp_path, toy, db):
    url, frame = db
    frame.to_csv(tmp_path / "d.csv", index=False)
    ref = load(tmp_path / "d.csv", toy)
    for batch in (50_000, 7):  # one batch, and batches that split the rows (ids made from all of them at once)
        got = load(DataSource(url, QUERY, batch_rows=batch), toy)
        same(got, ref)
        assert got.source.startswith("postgresql://fedsbdt@/") and got.source.endswith(" (query)")
    assert np.isnan(ref.X[:, 2]).sum() > 0  # NULL kept as missing where the schema allows it


def test_errors_name_the_column_and_the_rows_id(tmp_path, toy, db, postgres):
    url, _ = db
    dbname = url.split("?")[0].rsplit("/", 1)[1]
    with postgres.connect(dbname) as c:
        c.execute("UPDATE cohort SET age = 130 WHERE pid = 130")  # row 11 (the 11th by pid)
        c.execute("UPDATE cohort SET ward = NULL WHERE pid = 154")  # row 19
        c.execute("UPDATE cohort SET ward = 'C' WHERE pid = 160")  # row 21
    for fix, needle in (("age = 1 WHERE pid = 130", "row 11 (pid 130), column 'age': 130 is outside the public "
                                                    "range [0, 120]"),
                        ("ward = 'A' WHERE pid = 154", "row 19 (pid 154), column 'ward': missing value (NULL or 'NA')")):
        with pytest.raises(DataError) as e:
            load(DataSource(url, QUERY, batch_rows=4), toy)  # the errors are in the 3rd and the 5th batch
        assert needle in str(e.value)
        with postgres.connect(dbname) as c:
            c.execute(f"UPDATE cohort SET {fix}")
    with pytest.raises(DataError, match=r"row 21 \(pid 160\), column 'ward': unknown category 'C'"):
        load(DataSource(url, QUERY), toy)
    with postgres.connect(dbname) as c:
        c.execute("UPDATE cohort SET ward = 'B' WHERE pid = 160")
    with pytest.raises(DataError, match=r"duplicate record ids: rows 1 \(pid 100\) and 41 \(pid 100\)"):  # duplicates across batches
        load(DataSource(url, QUERY.replace(" ORDER BY pid", "") + " UNION ALL SELECT 100, 1, 'A', 1, 1, 'no'",
                        batch_rows=8), toy)
    with pytest.raises(DataError, match="the query failed: relation \"nope\" does not exist"):
        load(DataSource(url, "SELECT * FROM nope"), toy)
    with pytest.raises(DataError, match=r"missing column\(s\) 'label'"):
        load(DataSource(url, "SELECT pid, age, lab_1, lab_2, ward FROM cohort"), toy)
    with pytest.raises(DataError, match="the query returned no rows"):
        load(DataSource(url, QUERY.replace("ORDER BY", "WHERE pid < 0 ORDER BY")), toy)
    with postgres.connect(dbname) as c:
        c.execute("CREATE SEQUENCE counter")
    with pytest.raises(DataError, match=r"the query failed: cannot execute nextval\(\) in a read-only transaction"):
        load(DataSource(url, QUERY.replace(" FROM", ", nextval('counter') AS n FROM")), toy)  # reads, never writes


def test_train_evaluate_predict_from_postgresql_equal_the_file(tmp_path, toy, db):
    url, frame = db
    frame.to_csv(tmp_path / "d.csv", index=False)
    (tmp_path / "q.sql").write_text(QUERY + ";\n")
    schema = str(tmp_path / "schema.toml")
    model = tmp_path / "m.json"
    p = fedsbdt("train", "--data", url, "--query-file", str(tmp_path / "q.sql"), "--schema", schema,
                "--out", str(model), "--trees", "3", "--json", "--quiet")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["rows"] == 40
    ev = [fedsbdt("evaluate", "--model", str(model), *data, "--json")
          for data in (["--data", url, "--query", QUERY], ["--data", str(tmp_path / "d.csv")])]
    assert all(e.returncode == 0 for e in ev), ev[0].stderr
    assert json.loads(ev[0].stdout) == json.loads(ev[1].stdout)
    for name, data in (("sql", ["--data", url, "--query", QUERY.replace("label, ", "")]),
                       ("csv", ["--data", str(tmp_path / "d.csv")])):
        p = fedsbdt("predict", "--model", str(model), *data, "--out", str(tmp_path / f"{name}.csv"))
        assert p.returncode == 0, p.stderr
    sql = (tmp_path / "sql.csv").read_text()
    assert sql == (tmp_path / "csv.csv").read_text() and sql.startswith("pid,probability,prediction\n100,")


def test_credentials_never_on_the_command_line(tmp_path, toy, postgres):
    url = postgres.create_database("creds")
    load_frame(url, "cohort", rows(5))
    tcp = postgres.tcp_url("creds")
    schema = str(tmp_path / "schema.toml")
    out = str(tmp_path / "m.json")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")} | {"PGPASSFILE": str(tmp_path / "none")}
    # a password in the URL: refused, one line, nothing written
    for bad in (tcp.replace("fedsbdt@", "fedsbdt:secret@"), tcp + "?password=secret"):
        p = fedsbdt("train", "--data", bad, "--query", QUERY, "--schema", schema, "--out", out, env=env)
        assert p.returncode == 2 and "holds a password" in p.stderr and "secret" not in p.stderr
        assert len(p.stderr.strip().splitlines()) == 1
    # no password anywhere: libpq's own refusal, with the ways to give one
    with pytest.raises(DataError, match="cannot connect: .*password.*--password-file"):
        load(DataSource(tcp, QUERY), toy)
    # --password-file: only a file its owner alone may read
    pw = tmp_path / "pw"
    pw.write_text(PASSWORD + "\n")
    pw.chmod(0o644)
    with pytest.raises(SourceError, match="others may read it .* chmod 600"):
        load(DataSource(tcp, QUERY, password_file=str(pw)), toy)
    pw.chmod(0o600)
    assert load(DataSource(tcp, QUERY, password_file=str(pw)), toy).n == 5
    # ~/.pgpass (here PGPASSFILE) and a service name
    pgpass = tmp_path / "pgpass"
    pgpass.write_text(f"127.0.0.1:{postgres.port}:creds:fedsbdt:{PASSWORD}\n")
    pgpass.chmod(0o600)
    service = tmp_path / "services"
    service.write_text(f"[clinic]\nhost=127.0.0.1\nport={postgres.port}\ndbname=creds\nuser=fedsbdt\n")
    env2 = env | {"PGPASSFILE": str(pgpass), "PGSERVICEFILE": str(service)}
    p = fedsbdt("train", "--data", "postgresql://?service=clinic", "--query", QUERY, "--schema", schema,
                "--out", out, "--trees", "2", "--json", "--quiet", env=env2)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["rows"] == 5


def test_source_arguments_and_identity(tmp_path):
    with pytest.raises(SourceError, match="needs the query"):
        data_argument("postgresql://a@h/db")
    with pytest.raises(SourceError, match="either --query or --query-file"):
        data_argument("postgresql://a@h/db", "SELECT 1", str(tmp_path / "q"))
    assert data_argument("d.csv") == "d.csv"
    f = tmp_path / "d.csv"
    f.write_text("x\n1\n")
    g = tmp_path / "e.csv"
    g.write_text("x\n1\n")
    assert source_identity(f) == source_identity(g) == "file:sha256:" + __import__("hashlib").sha256(b"x\n1\n").hexdigest()
    a = DataSource("postgresql://alice@DB.example:5432/cdm?sslmode=require&application_name=x",
                   "SELECT person_id,\n   age FROM p;")
    b = DataSource("postgresql://alice@db.example:5432/cdm?application_name=x&sslmode=require",
                   "SELECT person_id, age FROM p")
    assert source_identity(a) == source_identity(b) == (
        "sql:postgresql://alice@db.example:5432/cdm?application_name=x&sslmode=require\nSELECT person_id, age FROM p")
    sock = DataSource("postgresql://alice@/cdm?host=/run/postgresql&port=5433", "SELECT 1")
    assert source_identity(sock) == "sql:postgresql://alice@/cdm?host=/run/postgresql&port=5433\nSELECT 1"
    assert source_identity(a) != source_identity(DataSource(a.location, "SELECT person_id FROM p"))


def test_duckdb_over_files_without_a_server(tmp_path, toy):
    frame = rows()
    frame.to_csv(tmp_path / "d.csv", index=False)
    frame.to_parquet(tmp_path / "d.parquet")
    ref = load(tmp_path / "d.csv", toy)
    q = "SELECT * FROM data ORDER BY pid"
    same(load(DataSource(str(tmp_path / "d.csv"), q, batch_rows=9), toy), ref)
    same(load(DataSource(str(tmp_path / "d.parquet"), q), toy), ref)
    same(load(DataSource("duckdb:", f"SELECT * FROM read_parquet('{tmp_path / 'd.parquet'}')"), toy), ref)
    sub = load(DataSource(str(tmp_path / "d.parquet"), "SELECT * FROM data WHERE ward = 'A'"), toy)
    assert sub.n == (frame.ward == "A").sum()
    with pytest.raises(DataError, match="the query failed: .*nope"):
        load(DataSource("duckdb:", "SELECT * FROM nope"), toy)
    p = fedsbdt("train", "--data", str(tmp_path / "d.parquet"), "--query", q, "--schema",
                str(tmp_path / "schema.toml"), "--out", str(tmp_path / "m.json"), "--trees", "2", "--json", "--quiet")
    assert p.returncode == 0 and json.loads(p.stdout)["rows"] == 40, p.stderr


def test_a_site_needs_the_querys_id_column_for_its_ledger(tmp_path, toy):
    from fedsbdt.client.dataload import load_isolated

    frame = rows(6)
    frame.to_parquet(tmp_path / "d.parquet")
    src = DataSource(str(tmp_path / "d.parquet"), "SELECT * FROM data")
    assert load_isolated(src, toy).ids.tolist() == frame.pid.tolist()  # the child loader runs the query
    no_id = Schema.from_dict({k: v for k, v in toy.to_dict().items() if k != "id_column"})
    assert load(src, no_id).ids.tolist() == list(range(6))  # central use: row numbers, as for a file
    with pytest.raises(DataError, match="a query's records need a stable id: .* id_column"):
        load_isolated(src, no_id)
