"""IBM diffprivlib's DP models on the suite's classification sets at ε ∈ {0.1, 1, 4, 10}, beside ``auto``.

diffprivlib needs scikit-learn < 1.8, so it runs in a separate environment in two steps:

    python benchmarks/diffprivlib_compare.py --export            # this venv: the suite's splits → /tmp npz
    /path/to/dpl-venv/bin/python benchmarks/diffprivlib_compare.py --run   # diffprivlib env (numpy, sklearn<1.8)
    python benchmarks/diffprivlib_compare.py --table             # beside auto as shipped (results/auto_verify.jsonl)

The same 80/20 splits and public bounds as benchmarks/auto_grid.py (numeric: the schema range; categorical:
level codes in [0, levels − 1]).  RandomForestClassifier (10 trees, depth 5, the library's defaults otherwise)
and LogisticRegression (data_norm = the norm of the public bounds); scores are AUC (binary) and accuracy
(multi-class), one run each.  Results: results/diffprivlib.json; ``--table`` sets them beside the shipped rule's
scores (the mean of its runs per cell in results/auto_verify.jsonl) → results/diffprivlib_table.json.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
EXPORT = Path("/tmp/fedsbdt_diffprivlib")
EPSILONS = (0.1, 1.0, 4.0, 10.0)
DATASETS = ("adult", "fertility", "flights", "nasscds", "default", "cells", "breast_cancer", "digits", "wine",
            "penguins", "hpc", "diamonds_cut")


def export() -> None:
    sys.path.insert(0, str(HERE))
    import auto_grid as ag

    EXPORT.mkdir(exist_ok=True)
    for name in DATASETS:
        ds, tr, te = ag.load(name)
        lo, hi = public_bounds(ds.schema)
        np.savez(EXPORT / f"{name}.npz", Xtr=tr.X.astype(float), ytr=tr.y, Xte=te.X.astype(float), yte=te.y,
                 lo=lo, hi=hi, task=ds.schema.task)
        print(name, tr.n, te.n, file=sys.stderr)


def public_bounds(schema) -> tuple[np.ndarray, np.ndarray]:
    """Per feature the public (lo, hi) the schema declares: numeric its range, categorical the level codes
    [0, levels − 1] (the bounds every DP peer is given; benchmarks/dp_peers.py uses them too)."""
    lo = np.array([0.0 if f.is_categorical else f.lo for f in schema.features])
    hi = np.array([len(f.levels) - 1.0 if f.is_categorical else f.hi for f in schema.features])
    return lo, hi


def diffprivlib_models(task: str, eps: float, lo: np.ndarray, hi: np.ndarray, classes: np.ndarray | None = None,
                       y_bounds: tuple[float, float] | None = None) -> dict:
    """diffprivlib's models at ε with the public bounds: classification a random forest (10 trees, depth 5) and
    a logistic regression (data norm = the norm of the bounds); regression a linear regression (feature and
    target bounds).  ``classes`` (classification) and ``y_bounds`` (regression) are public."""
    from diffprivlib.models import LinearRegression, LogisticRegression, RandomForestClassifier

    if task == "regression":
        return {"linear_regression": LinearRegression(epsilon=eps, bounds_X=(lo, hi), bounds_y=y_bounds)}
    return {"random_forest": RandomForestClassifier(n_estimators=10, max_depth=5, epsilon=eps, bounds=(lo, hi),
                                                    classes=classes),
            "logistic_regression": LogisticRegression(epsilon=eps, data_norm=float(np.linalg.norm(
                np.maximum(np.abs(lo), np.abs(hi)))), max_iter=200)}


def auc(y, s) -> float:
    from sklearn.metrics import roc_auc_score

    return float(roc_auc_score(y, s))


def run() -> None:
    import warnings

    warnings.filterwarnings("ignore")
    out = []
    for name in DATASETS:
        d = np.load(EXPORT / f"{name}.npz")
        Xtr, ytr, Xte, yte, lo, hi = (d[k] for k in ("Xtr", "ytr", "Xte", "yte", "lo", "hi"))
        task = str(d["task"])
        Xtr, Xte = np.nan_to_num(np.clip(Xtr, lo, hi)), np.nan_to_num(np.clip(Xte, lo, hi))
        ytr, yte = ytr.astype(int), yte.astype(int)
        for eps in EPSILONS:
            row = {"dataset": name, "task": task, "epsilon": eps}
            models = diffprivlib_models(task, eps, lo, hi, classes=np.unique(np.concatenate([ytr, yte])))
            for key, m in models.items():
                try:
                    m.fit(Xtr, ytr)
                    p = m.predict_proba(Xte)
                    row[key] = auc(yte, p[:, 1]) if task == "binary" else float(np.mean(np.argmax(p, 1) == yte))
                except Exception as e:  # noqa: BLE001 - a model that fails is reported, not fatal
                    row[key] = None
                    row[key + "_error"] = f"{type(e).__name__}: {e}"[:200]
            out.append(row)
            print(json.dumps(row), flush=True)
    (HERE / "results" / "diffprivlib.json").write_text(json.dumps(out, indent=1) + "\n")


def table() -> list[dict]:
    """Per ε: the mean score over :data:`DATASETS` of ``auto`` as shipped (mean of its runs per cell) and of
    diffprivlib's two models, and on how many sets ``auto`` scores at least as well as both."""
    dpl = json.loads((HERE / "results" / "diffprivlib.json").read_text())
    runs: dict = {}
    for line in (HERE / "results" / "auto_verify.jsonl").read_text().splitlines():
        r = json.loads(line)
        if r["setting"] == "auto" and r["dataset"] in DATASETS:
            runs.setdefault((r["dataset"], r["epsilon"]), []).append(r["score"])
    out = []
    for eps in EPSILONS:
        cells = [(float(np.mean(runs[(r["dataset"], eps)])), r["random_forest"] or 0.0, r["logistic_regression"] or 0.0)
                 for r in dpl if r["epsilon"] == eps]
        a, rf, lr = (np.array(c) for c in zip(*cells))
        out.append({"epsilon": eps, "datasets": len(cells), "auto": round(float(a.mean()), 3),
                    "random_forest": round(float(rf.mean()), 3), "logistic_regression": round(float(lr.mean()), 3),
                    "auto_best": int(np.sum((a >= rf) & (a >= lr)))})
        print(json.dumps(out[-1]))
    (HERE / "results" / "diffprivlib_table.json").write_text(json.dumps(out, indent=1) + "\n")
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--export", action="store_true")
    ap.add_argument("--run", action="store_true")
    ap.add_argument("--table", action="store_true")
    a = ap.parse_args()
    if a.export:
        export()
    if a.run:
        run()
    if a.table:
        table()
