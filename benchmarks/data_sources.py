"""Reading records: PostgreSQL against the same rows from CSV, Parquet and DuckDB (docs/data-sources.md).

A synthetic table of ``--rows`` rows (default 1,000,000): an integer id, 8 numeric features, 2 categorical
features (text levels) and a binary label, written as CSV and Parquet and loaded into a throw-away PostgreSQL
server (``tests/postgres_server.py``: the Debian package's initdb/pg_ctl on a private socket).  Each source
is read with ``fedsbdt.common.data.load`` (parse + validate against the schema into the arrays the trees use)
in a fresh subprocess: rows per second (best and median of ``--repeats``) and the peak resident memory while
reading (``ru_maxrss`` minus the resident size after the imports).

Run:  python benchmarks/data_sources.py [--rows 1000000] [--repeats 3] [--batch-rows 50000]
Writes ``benchmarks/results/data_sources.json``.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _util import ROOT, save  # noqa: E402

SCHEMA = {
    "name": "bench", "task": "binary", "target": "label", "positive": ["1"], "negative": ["0"], "id_column": "rid",
    "format": {"header": True},
    "features": [{"pattern": "x{1..8}", "type": "numeric", "range": [0, 100]},
                 {"names": ["ward", "sex"], "type": "categorical", "levels": ["a", "b", "c", "d"]}],
}
QUERY = "SELECT * FROM cohort"


def make(n: int, folder: Path):
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(1)
    frame = pd.DataFrame({"rid": np.arange(n, dtype=np.int64) * 3 + 7})
    for k in range(1, 9):
        frame[f"x{k}"] = (rng.random(n) * 100).round(3)
    for c in ("ward", "sex"):
        frame[c] = rng.choice(["a", "b", "c", "d"], n)
    frame["label"] = (rng.random(n) < 0.3).astype(np.int64)
    frame.to_csv(folder / "t.csv", index=False)
    frame.to_parquet(folder / "t.parquet")
    return frame


def rss_now() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def one(kind: str, location: str, batch_rows: int) -> None:
    """Child: read one source once; print a JSON line."""
    import fedsbdt.common.sqlread  # noqa: F401 (imports outside the measurement)
    import pandas  # noqa: F401
    import psycopg  # noqa: F401
    import duckdb  # noqa: F401
    import pyarrow.parquet  # noqa: F401
    from fedsbdt.common.data import load
    from fedsbdt.common.schema import Schema
    from fedsbdt.common.sources import DataSource

    schema = Schema.from_dict(SCHEMA)
    src = location if kind in ("csv", "parquet") else DataSource(location, QUERY if kind == "postgresql" else
                                                               "SELECT * FROM data", batch_rows=batch_rows)
    base = rss_now()
    t0 = time.perf_counter()
    ds = load(src, schema)
    sec = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"rows": ds.n, "seconds": sec, "base_mb": base / 2**20, "peak_mb": peak / 2**20,
                      "reading_mb": (peak - base) / 2**20, "arrays_mb": (ds.X.nbytes + ds.y.nbytes) / 2**20}))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batch-rows", type=int, default=50_000, help="rows per database batch (default: 50000)")
    ap.add_argument("--one", nargs=2, metavar=("KIND", "LOCATION"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one:
        one(*a.one, a.batch_rows)
        return 0
    sys.path.insert(0, str(ROOT / "tests"))
    from postgres_server import load_frame, start

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        t0 = time.perf_counter()
        frame = make(a.rows, folder)
        server = start()
        try:
            url = server.create_database("bench")
            load_frame(url, "cohort", frame, types={"label": "integer"})
            del frame
            print(f"{a.rows} rows written to CSV, Parquet and PostgreSQL in {time.perf_counter() - t0:.1f}s")
            sources = {"csv": str(folder / "t.csv"), "parquet": str(folder / "t.parquet"), "postgresql": url,
                       "duckdb-parquet": str(folder / "t.parquet")}
            results = {}
            for kind, loc in sources.items():
                runs = []
                for _ in range(a.repeats):
                    p = subprocess.run([sys.executable, __file__, "--one", kind.split("-")[0] if kind != "duckdb-parquet"
                                        else "duckdb", loc, "--batch-rows", str(a.batch_rows)],
                                       capture_output=True, text=True, cwd=ROOT)
                    if p.returncode != 0:
                        raise SystemExit(f"{kind}: {p.stderr.strip()}")
                    runs.append(json.loads(p.stdout.strip().splitlines()[-1]))
                secs = [r["seconds"] for r in runs]
                results[kind] = {"rows": runs[0]["rows"], "best_seconds": min(secs),
                                 "median_seconds": statistics.median(secs),
                                 "rows_per_second_best": runs[0]["rows"] / min(secs),
                                 "rows_per_second_median": runs[0]["rows"] / statistics.median(secs),
                                 "reading_mb_max": max(r["reading_mb"] for r in runs),
                                 "peak_mb_max": max(r["peak_mb"] for r in runs), "arrays_mb": runs[0]["arrays_mb"]}
        finally:
            server.stop()
    print(f"{'source':16} {'rows/s best':>12} {'rows/s median':>14} {'peak MB':>8} {'reading MB':>11} {'arrays MB':>10}")
    for kind, r in results.items():
        print(f"{kind:16} {r['rows_per_second_best']:12,.0f} {r['rows_per_second_median']:14,.0f} "
              f"{r['peak_mb_max']:8.0f} {r['reading_mb_max']:11.0f} {r['arrays_mb']:10.0f}")
    path = save("data_sources", {"rows": a.rows, "repeats": a.repeats, "batch_rows": a.batch_rows,
                                 "schema": SCHEMA, "results": results})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
