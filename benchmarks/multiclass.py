"""Multi-class S-BDT (softmax, K class trees per round) against non-private XGBoost, in the same run.

Datasets shipped inside the scikit-learn wheel (``sklearn/datasets/data``; scikit-learn is BSD-3-Clause,
the data sets are the UCI originals under CC BY 4.0):

* **wine** — Wine recognition (Aeberhard & Forina 1991): 178 wines, 13 features, K = 3 cultivars
  (public ranges: ``examples/wine/schema.toml``).
* **digits** — Optical Recognition of Handwritten Digits (Alpaydin & Kaynak 1998), scikit-learn's 8×8 copy:
  1,797 images, 64 pixel counts with the public range [0, 16], K = 10 digits.

Protocol: 5-fold CV repeated ``--repeats`` times with public shuffle seeds; every fold trains S-BDT at each
ε (secure randomness: OS CSPRNG, exact discrete samplers) and XGBoost (``multi:softprob``, 100 rounds,
depth 6, η = 0.3, its defaults otherwise, no privacy) on the same rows. Metrics on the held-out fold:
accuracy, macro one-vs-rest AUC, log-loss. S-BDT settings are fixed per data set before the run (below),
not tuned per ε.

Run:  python benchmarks/multiclass.py [--repeats N] [--quick]
Writes ``benchmarks/results/multiclass.json``.
"""
from __future__ import annotations

import argparse
import time

import numpy as np
from _util import ROOT, cv_runs, save, summary  # noqa: E402

from fedsbdt.common import multiclass  # noqa: E402
from fedsbdt.common.config import Hyperparameters  # noqa: E402
from fedsbdt.common.data import Dataset, load  # noqa: E402
from fedsbdt.common.engine import train  # noqa: E402
from fedsbdt.common.schema import Schema  # noqa: E402

EPSILONS = (0.5, 1.0, 3.0, 10.0)
SETTINGS = {  # fixed before the run: small data wants few, shallow trees on a large sample
    "wine": dict(trees=50, depth=2, subsample=0.5, learning_rate=0.3, cyclical=True),
    "digits": dict(trees=100, depth=4, subsample=0.3, learning_rate=0.3, cyclical=False),
}
XGB = dict(n_estimators=100, max_depth=6, learning_rate=0.3, objective="multi:softprob", tree_method="hist",
           n_jobs=1)


def load_wine() -> Dataset:
    schema = Schema.load(ROOT / "examples" / "wine" / "schema.toml")
    tr, te = (load(ROOT / "examples" / "wine" / f, schema) for f in ("wine_train.csv", "wine_test.csv"))
    return Dataset(np.vstack([tr.X, te.X]), np.concatenate([tr.y, te.y]), np.arange(tr.n + te.n), schema)


def load_digits() -> Dataset:
    from sklearn.datasets import load_digits as sk

    d = sk()
    schema = Schema.from_dict({
        "name": "digits", "task": "multiclass", "target": "digit", "classes": [str(k) for k in range(10)],
        "features": [{"name": f"pixel_{j}", "type": "numeric", "range": [0, 16]} for j in range(64)]})
    return Dataset.from_arrays(d.data, d.target.astype(str), schema, source="sklearn digits")


def run_xgboost(ds: Dataset, tr: np.ndarray, te: np.ndarray) -> dict:
    import xgboost as xgb

    model = xgb.XGBClassifier(**XGB, num_class=ds.schema.n_classes)
    model.fit(ds.X[tr], ds.y[tr].astype(int))
    prob = np.zeros((te.size, ds.schema.n_classes))
    prob[:, model.classes_] = model.predict_proba(ds.X[te])  # a fold may lack a class
    return multiclass.evaluate(ds.y[te], prob)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=4, help="repeats of 5-fold CV")
    ap.add_argument("--quick", action="store_true", help="one repeat, ε ∈ {1, 10}")
    args = ap.parse_args()
    repeats = 1 if args.quick else args.repeats
    epsilons = (1.0, 10.0) if args.quick else EPSILONS
    out = {"protocol": f"{repeats} x 5-fold CV, public shuffle seeds", "epsilons": list(epsilons),
           "settings": SETTINGS, "xgboost": XGB, "datasets": {}}
    t_all = time.perf_counter()
    for name, loader in (("wine", load_wine), ("digits", load_digits)):
        ds = loader()
        runs = {f"sbdt_eps{e:g}": [] for e in epsilons} | {"xgboost": []}
        seconds = {k: 0.0 for k in runs}
        for r, k, tr, te in cv_runs(ds.n, repeats):
            for e in epsilons:
                hp = Hyperparameters(epsilon=e, seed=1_000_003 * (r + 1) + k, **SETTINGS[name])
                t0 = time.perf_counter()
                model = train(ds.subset(tr), hp).model
                seconds[f"sbdt_eps{e:g}"] += time.perf_counter() - t0
                runs[f"sbdt_eps{e:g}"].append(multiclass.evaluate(ds.y[te], model.predict(ds.X[te])))
            t0 = time.perf_counter()
            runs["xgboost"].append(run_xgboost(ds, tr, te))
            seconds["xgboost"] += time.perf_counter() - t0
            print(f"{name} repeat {r} fold {k}: " + ", ".join(
                f"{m} acc {v[-1]['accuracy']:.3f}" for m, v in runs.items()), flush=True)
        out["datasets"][name] = {
            "rows": ds.n, "features": ds.schema.n_features, "classes": ds.schema.n_classes,
            "methods": {m: {metric: summary([v[metric] for v in vals]) for metric in ("accuracy", "macro_auc",
                                                                                      "log_loss")}
                        | {"seconds_per_fit": seconds[m] / len(vals)} for m, vals in runs.items()}}
    out["seconds"] = time.perf_counter() - t_all
    save("multiclass", out)
    for name, d in out["datasets"].items():
        print(f"\n{name} (n = {d['rows']}, K = {d['classes']})")
        for m, v in d["methods"].items():
            print(f"  {m:14s} accuracy {v['accuracy']['mean']:.3f} ± {v['accuracy']['se']:.3f}  "
                  f"macro-AUC {v['macro_auc']['mean']:.3f}  log-loss {v['log_loss']['mean']:.3f}  "
                  f"{v['seconds_per_fit']:.2f} s/fit")


if __name__ == "__main__":
    main()
