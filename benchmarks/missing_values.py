"""Missing values kept vs rows dropped: UCI Adult at ε = 0.1 and 1 (docs/missing-values.md).

* **keep**: every one of the 32,561 ``adult.data`` rows; a ``?`` is a missing value routed by each
  split's default direction (random trees: a public coin from the split seed; greedy trees: chosen with
  the split by the exponential mechanism).
* **drop**: the 30,162 rows without ``?`` (the stock ``examples/adult/schema.toml``, ``on_missing =
  "drop"``), trained with the same public split seeds, so each keep/drop pair differs only in the rows.

Both models are evaluated on all 16,281 ``adult.test`` rows with their missing values kept (the drop
model routes them by the same public default directions: its trees are trained under the keep schema on
the complete rows), and separately on the 1,221 test rows that miss something and on the 15,060 that
do not.  Random trees: S-BDT defaults (100 trees, depth 3, γ = 0.1, cyclical); greedy trees (DP-XGB,
exponential mechanism): 20 trees of depth 3, every record, learning rate 0.3.  All noise from
``SecureRandomness``; AUC mean ± standard error over the runs, and the paired keep − drop difference.

Run:  python benchmarks/missing_values.py [--runs N]
Writes ``benchmarks/results/missing_values.json``.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
import time

import numpy as np
from _util import DATASETS, ROOT, fmt_pm, save, summary  # noqa: E402

from fedsbdt.common.config import Hyperparameters  # noqa: E402
from fedsbdt.common.modes.greedy import GREEDY_DEFAULTS  # noqa: E402
from fedsbdt.common.data import load  # noqa: E402
from fedsbdt.common.engine import train  # noqa: E402
from fedsbdt.common.metrics import auc  # noqa: E402
from fedsbdt.common.schema import Schema  # noqa: E402

EPSILONS = (0.1, 1.0)
METHODS = {
    "random": {},
    "greedy": dict(GREEDY_DEFAULTS, tree_builder="greedy", trees=20, depth=3, learning_rate=0.3),
}
SEED = 20261123  # public: run r uses split seed SEED + r for both variants


def adult_file(name: str):
    shared = DATASETS / name
    return shared if shared.exists() else ROOT / "examples" / "adult" / name


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=10, help="repetitions per cell (default 10)")
    args = ap.parse_args()
    stock = Schema.load(ROOT / "examples" / "adult" / "schema.toml")
    keep = Schema.from_dict(stock.to_dict() | {"format": stock.format.to_dict() | {"on_missing": "keep"}})
    train_keep = load(adult_file("adult.data"), keep)
    complete = ~np.isnan(train_keep.X).any(axis=1)
    train_drop = train_keep.subset(np.flatnonzero(complete))
    assert train_drop.n == load(adult_file("adult.data"), stock).n  # the stock schema drops exactly these
    test = load(adult_file("adult.test"), keep)
    test_missing = np.isnan(test.X).any(axis=1)
    print(f"train: keep {train_keep.n} rows, drop {train_drop.n}; test {test.n} rows, "
          f"{int(test_missing.sum())} with a missing value", file=sys.stderr)
    parts = {"all": np.ones(test.n, bool), "with_missing": test_missing, "complete": ~test_missing}
    cells = []
    t0 = time.perf_counter()
    for method, extra in METHODS.items():
        for eps in EPSILONS:
            per = {v: {p: [] for p in parts} for v in ("keep", "drop")}
            for r in range(args.runs):
                hp = Hyperparameters(**(extra | {"epsilon": eps, "seed": SEED + r}))
                for variant, ds in (("keep", train_keep), ("drop", train_drop)):
                    margin = train(ds, hp).model.predict_margin(test.X)
                    for p, rows in parts.items():
                        per[variant][p].append(auc(test.y[rows], margin[rows]))
            cell = {"method": method, "epsilon": eps, "runs": args.runs,
                    "hyperparameters": dataclasses.asdict(hp) | {"seed": "SEED + run"}}
            for p in parts:
                k, d = np.array(per["keep"][p]), np.array(per["drop"][p])
                cell[p] = {"keep": summary(k), "drop": summary(d), "keep_minus_drop": summary(k - d)}
                cell[p]["keep"]["values"], cell[p]["drop"]["values"] = k.tolist(), d.tolist()
            cells.append(cell)
            a = cell["all"]
            print(f"{method:6s} ε={eps:<4g} AUC keep {fmt_pm(a['keep']['mean'], a['keep']['se'])}  drop "
                  f"{fmt_pm(a['drop']['mean'], a['drop']['se'])}  keep−drop "
                  f"{fmt_pm(a['keep_minus_drop']['mean'], a['keep_minus_drop']['se'], 4)}  | missing rows: keep "
                  f"{cell['with_missing']['keep']['mean']:.3f} drop {cell['with_missing']['drop']['mean']:.3f}",
                  flush=True)
    path = save("missing_values", {
        "description": "Adult: '?' rows kept (missing values routed by default directions) vs dropped; test AUC "
                       "on adult.test with its missing rows kept (all), and on its rows with/without a missing "
                       "value",
        "train_rows": {"keep": train_keep.n, "drop": train_drop.n},
        "test_rows": {p: int(rows.sum()) for p, rows in parts.items()},
        "cells": cells, "wall_seconds": time.perf_counter() - t0})
    print(f"wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
