"""The grid behind the ``auto`` rule (docs/auto.md): every suite dataset × ε × 28 settings, plus XGBoost.

One 80/20 split per dataset (public seed), one training per (dataset, ε, setting), fresh OS noise.  Scores
are "higher is better": AUC (binary), accuracy (multi-class), R² (regression).  Results are appended line
by line to ``results/auto_grid.jsonl`` (a rerun skips what is there), so the run can be stopped and resumed.

    nice python benchmarks/auto_grid.py --datasets adult,flights      # some datasets
    nice python benchmarks/auto_grid.py                                # all of them
    nice python benchmarks/auto_grid.py --settings focused --datasets nafld,olive --out results/auto_grid_v3_a.jsonl
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import suite  # noqa: E402

from fedsbdt.common.config import Hyperparameters  # noqa: E402
from fedsbdt.common.engine import train  # noqa: E402
from fedsbdt.common.metrics import accuracy, auc  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
OUT = RESULTS / "auto_grid.jsonl"
EPSILONS = (0.1, 1.0, 4.0, 10.0)
#: rows kept per dataset (public-seed subsample): the two ≥ 100K-row sets keep 100K, the others of the first 22
#: 20K, the 48 added for issue 39 10K (suite.ADDED_MAX_ROWS)
MAX_ROWS = {"flights": 100_000, "fertility": 100_000, **suite.MAX_ROWS}
DEFAULT_MAX_ROWS = 20_000
SPLIT_SEED = 20261127
#: (trees, depth, subsample γ, learning rate η, cyclical) — 22 settings around the paper's default (g01)
GRID = {
    "g01": (100, 3, 0.1, 0.1, True), "g02": (50, 3, 0.1, 0.1, True), "g03": (20, 3, 0.5, 0.3, False),
    "g04": (20, 4, 1.0, 0.3, False), "g05": (10, 3, 1.0, 0.5, False), "g06": (50, 2, 0.5, 0.3, False),
    "g07": (50, 4, 0.3, 0.2, False), "g08": (50, 4, 0.3, 0.2, True), "g09": (100, 3, 0.1, 0.1, False),
    "g10": (100, 4, 0.3, 0.1, False), "g11": (100, 6, 0.3, 0.1, False), "g12": (100, 6, 0.5, 0.3, False),
    "g13": (200, 3, 0.2, 0.2, True), "g14": (200, 4, 0.2, 0.1, False), "g15": (200, 6, 0.3, 0.1, False),
    "g16": (200, 6, 0.5, 0.2, False), "g17": (300, 5, 0.3, 0.1, True), "g18": (300, 6, 0.3, 0.1, False),
    "g19": (500, 6, 0.3, 0.1, False), "g20": (300, 6, 0.5, 0.2, False),
    # added with the 22-dataset suite: the settings the hand-tuned runs used at large ε·n
    "g21": (1000, 6, 0.3, 0.1, False), "g22": (500, 6, 0.5, 0.2, False),
    # added with the 70-dataset suite (issue 39): the cyclical / non-cyclical twins of the table's settings
    "g23": (20, 4, 1.0, 0.3, True), "g24": (300, 5, 0.3, 0.1, False), "g25": (1000, 6, 0.3, 0.1, True),
    "g26": (50, 3, 0.1, 0.1, False), "g27": (200, 4, 0.2, 0.1, True), "g28": (500, 6, 0.3, 0.1, True),
}
#: the focused grid run on the 48 added datasets (and g23–g28 on the first 22): the table's settings before issue
#: 39 (g01 = the paper's settings, g02, g04, g14, g17, g19, g21), their twins (g09, g23–g28) and the deeper
#: non-cyclical g18 — the candidates of the rule since then (benchmarks/auto_rule.py CANDIDATES)
FOCUSED = ("g01", "g02", "g04", "g09", "g14", "g17", "g18", "g19", "g21", "g23", "g24", "g25", "g26", "g27", "g28")


def settings(key: str) -> dict:
    t, d, g, eta, cyc = GRID[key]
    return dict(trees=t, depth=d, subsample=g, learning_rate=eta, cyclical=cyc)


def split(ds):
    perm = np.random.default_rng(SPLIT_SEED).permutation(ds.n)
    cut = int(0.8 * ds.n)
    return ds.subset(np.sort(perm[:cut])), ds.subset(np.sort(perm[cut:]))


def score(task: str, y: np.ndarray, pred: np.ndarray) -> dict:
    """Higher-is-better score of a prediction (probabilities, class probabilities or values)."""
    if task == "binary":
        return {"score": auc(y, pred), "accuracy": accuracy(y, pred), "mean_p": float(np.mean(pred)),
                "base_rate": float(np.mean(y))}
    if task == "multiclass":
        return {"score": float(np.mean(np.argmax(pred, axis=1) == y))}
    y = np.asarray(y, float)
    return {"score": float(1 - np.mean((y - pred) ** 2) / np.var(y)), "rmse": float(np.sqrt(np.mean((y - pred) ** 2)))}


def load(name: str):
    ds = suite.load(name, max_rows=MAX_ROWS.get(name, DEFAULT_MAX_ROWS))
    return ds, *split(ds)


def xgboost_score(ds, tr, te) -> dict:
    import pandas as pd
    import xgboost as xgb

    def frame(d):
        cols = {}
        for j, f in enumerate(d.schema.features):
            cols[f.name] = (pd.Categorical(d.X[:, j].astype(int), categories=range(len(f.levels)))
                            if f.is_categorical else d.X[:, j])
        return pd.DataFrame(cols)

    task = ds.schema.task
    kw = dict(n_estimators=300, max_depth=6, learning_rate=0.1, tree_method="hist", enable_categorical=True,
              n_jobs=1)
    if task == "binary":
        m = xgb.XGBClassifier(**kw).fit(frame(tr), tr.y)
        return score(task, te.y, m.predict_proba(frame(te))[:, 1])
    if task == "multiclass":
        m = xgb.XGBClassifier(**kw).fit(frame(tr), tr.y.astype(int))
        return score(task, te.y.astype(int), m.predict_proba(frame(te)))
    m = xgb.XGBRegressor(**kw).fit(frame(tr), tr.y)
    return score(task, te.y, m.predict(frame(te)))


def run_one(tr, te, hp: Hyperparameters) -> dict:
    t0 = time.perf_counter()
    res = train(tr, hp)
    pred = res.model.predict(te.X)
    y = te.y.astype(int) if tr.schema.task == "multiclass" else te.y
    return {**score(tr.schema.task, y, pred), "seconds": round(time.perf_counter() - t0, 3)}


def done_keys(path: Path) -> set:
    if not path.exists():
        return set()
    return {(r["dataset"], r["epsilon"], r["setting"], r.get("rep", 0))
            for r in map(json.loads, path.read_text().splitlines()) if r}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--datasets", default=",".join(e.name for e in suite.ENTRIES))
    ap.add_argument("--settings", default=",".join(GRID),
                    help="grid keys (and 'auto' after the rule exists); 'focused' = the FOCUSED subset")
    ap.add_argument("--out", default=str(OUT))
    ap.add_argument("--l2-auto", action="store_true", help="λ matched to the leaf noise (auto.noise_matched_l2)")
    ap.add_argument("--rep", type=int, default=0, help="repetition (fresh noise and tree seed, same train/test split); 0 = the first")
    ap.add_argument("--no-xgboost", action="store_true", help="skip the XGBoost reference (already in another file)")
    a = ap.parse_args()
    out = Path(a.out)
    done = done_keys(out)
    keys = FOCUSED if a.settings == "focused" else tuple(a.settings.split(","))
    unknown = [k for k in keys if k not in GRID and k != "auto"]
    if unknown:
        ap.error(f"unknown settings {unknown} (grid keys: {', '.join(GRID)})")
    for name in a.datasets.split(","):
        ds, tr, te = load(name)
        meta = {"dataset": name, "task": ds.schema.task, "n_train": tr.n, **suite.describe(tr)}
        if (name, None, "xgboost", a.rep) not in done and a.rep == 0 and not a.no_xgboost:
            _write(out, {**meta, "epsilon": None, "setting": "xgboost", **xgboost_score(ds, tr, te)})
        for eps in EPSILONS:
            for key in keys:
                if (name, eps, key, a.rep) in done:
                    continue
                if key == "auto":  # the rule as shipped (n declared public): table, g*, λ
                    from fedsbdt.common.auto import resolve

                    kw = resolve({"epsilon": eps}, tr.schema, tr.n)[0]
                else:
                    kw = settings(key)
                hp = Hyperparameters.from_dict({"epsilon": eps, "seed": 1 + len(done) + 7919 * a.rep, **kw})
                if a.l2_auto and key != "auto":
                    from fedsbdt.common.auto import noise_matched_l2

                    kw = {**kw, "l2": noise_matched_l2(hp, tr.schema.task)}
                    hp = hp.replace(l2=kw["l2"])
                r = run_one(tr, te, hp)
                _write(out, {**meta, "epsilon": eps, "setting": key, "hp": kw, "rep": a.rep, **r})
                print(f"{name} ε={eps} {key}: {r['score']:.4f} ({r['seconds']:.1f}s)", file=sys.stderr, flush=True)


def _write(out: Path, row: dict) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("a") as f:
        f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
