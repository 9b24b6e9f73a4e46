"""How ``lifetime.sqlite`` here was written: by fedsbdt at commit 6a345f0 (the lifetime ledger's first schema,
before populations), run as ``python make_fixture.py`` in this folder.  tests/test_lifetime_population.py
opens a copy with the current code (the schema is upgraded in place, nothing lost).

It holds what that version wrote for ``cohort.csv`` (40 records, id column ``pid``): a federated plan's two tree
releases (the second read 30 records, as the individual filter would leave them) and a central
``fedsbdt train --ledger`` run (ε, δ) on the same file."""
import contextlib
import io
import os
import sqlite3

import numpy as np

from fedsbdt.cli import main
from fedsbdt.common.data import load
from fedsbdt.common.lifetime import LifetimeLedger, data_identity
from fedsbdt.common.schema import Schema

rng = np.random.default_rng(7)
lines = ["pid,age,ward,label"] + [f"{100 + 3 * i},{rng.integers(0, 100) + 0.5},{rng.choice(['A', 'B'])},"
                                  f"{rng.choice(['yes', 'no'])}" for i in range(40)]
with open("cohort.csv", "w") as f:
    f.write("\n".join(lines) + "\n")
with open("schema.toml", "w") as f:
    f.write('name = "toy"\ntask = "binary"\ntarget = "label"\npositive = ["yes"]\nnegative = ["no"]\n'
            'id_column = "pid"\n[format]\nheader = true\nseparator = ","\nmissing = "NA"\n'
            '[[features]]\nname = "age"\ntype = "numeric"\nrange = [0, 120]\n'
            '[[features]]\nname = "ward"\ntype = "categorical"\nlevels = ["A", "B"]\n')
for p in ("lifetime.sqlite", "lifetime.sqlite-wal", "lifetime.sqlite-shm"):
    with contextlib.suppress(FileNotFoundError):
        os.remove(p)
ds = load("cohort.csv", Schema.load("schema.toml"))
lt = LifetimeLedger(".")
key = lt.dataset("train", data_identity("cohort.csv"), ds.ids)
plan = "ab" * 32
tree = {"type": "poisson", "rate": 0.5, "event": {"type": "gaussian", "noise_multiplier": 1.5}}
lt.charge(key, "tree", tree, 5e-8, None, plan, 0, None, 1)
lt.charge(key, "tree", tree, 5e-8, np.arange(40) < 30, plan, 1, None, 2)
lt.close()
with contextlib.redirect_stdout(io.StringIO()):
    assert main(["train", "--data", "cohort.csv", "--schema", "schema.toml", "--out", "model.json", "--settings",
                 "paper", "--trees", "2", "--depth", "2", "--epsilon", "0.5", "--quiet", "--ledger", "."]) == 0
os.remove("model.json")
db = sqlite3.connect("lifetime.sqlite")
db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
db.execute("PRAGMA journal_mode=DELETE")  # one file
db.close()
