"""Issue 21 item 3, "averaging over public split seeds": M sub-ensembles of T/M trees on M public split seeds,
margins averaged, against one ensemble of T trees (the ``auto`` settings), at the same total privacy.

The M sub-ensembles read the same records, so they compose: each gets the largest ε_sub whose M-fold RDP
composition (its trees and its initial score, :func:`fedsbdt.common.tuning._train_curve`) stays within ε —
the leaf noise σ of a tree is then about that of the single ensemble (T trees either way).  λ is matched to
each sub-ensemble's noise as ``auto`` does.  Same 80/20 splits as benchmarks/auto_grid.py; fresh OS noise.

    nice python benchmarks/seed_average.py [--datasets adult,weather] [--reps 2]
Appends to ``results/seed_average.jsonl`` (a rerun skips what is there) and prints the summary
(mean gain of M = 2, 4 over M = 1 per ε), saved as ``results/seed_average.json``.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import auto_grid as ag  # noqa: E402

from fedsbdt.common.accountant import rdp_to_dp  # noqa: E402
from fedsbdt.common.auto import noise_matched_l2, resolve  # noqa: E402
from fedsbdt.common.config import Hyperparameters  # noqa: E402
from fedsbdt.common.engine import train  # noqa: E402
from fedsbdt.common.tuning import _train_curve, orders_for  # noqa: E402

DATASETS = ("adult", "weather", "cells", "nasscds", "flights", "rodents", "storms", "deliveries", "hotel_rates",
            "abalone")
EPSILONS = (1.0, 4.0)
SPLITS = (1, 2, 4)


def sub_epsilon(hp: Hyperparameters, m: int) -> float:
    """The largest ε_sub (to 0.2 %) whose m-fold composition of ``hp`` with ε_sub is ≤ hp.epsilon."""
    orders = orders_for(hp.epsilon, hp.delta)

    def total(e: float) -> float:
        rho, _ = _train_curve(hp.replace(epsilon=e), orders)
        return float(np.min(rdp_to_dp(orders, m * rho, hp.delta)))

    lo, hi = hp.epsilon / m, hp.epsilon
    while hi / lo > 1.002:
        mid = (lo * hi) ** 0.5
        lo, hi = (mid, hi) if total(mid) <= hp.epsilon else (lo, mid)
    return lo


def averaged(tr, te, hp: Hyperparameters, m: int, seed: int, eta_scale: bool = False) -> dict:
    """M sub-ensembles (T/M trees each, seeds seed·100 + j; with ``eta_scale`` η·M, at most 0.5, so each fits
    as far as the single ensemble), margins averaged, scored on ``te``."""
    t0 = time.perf_counter()
    sub = hp.replace(trees=max(1, hp.trees // m))
    if eta_scale:
        sub = sub.replace(learning_rate=min(0.5, hp.learning_rate * m))
    if m > 1:
        sub = sub.replace(epsilon=sub_epsilon(sub, m))
    sub = sub.replace(l2=noise_matched_l2(sub, tr.schema.task))
    models = [train(tr, sub.replace(seed=seed * 100 + j)).model for j in range(m)]
    pred = models[0].from_margin(np.mean([md.predict_margin(te.X) for md in models], axis=0))
    task = tr.schema.task
    y = te.y.astype(int) if task == "multiclass" else te.y
    return {**ag.score(task, y, pred), "epsilon_sub": sub.epsilon, "trees_sub": sub.trees, "l2_sub": sub.l2,
            "seconds": round(time.perf_counter() - t0, 3)}


def summary(rows: list[dict]) -> dict:
    cells: dict = {}
    for r in rows:
        cells.setdefault((r["dataset"], r["epsilon"], r["m"]), []).append(r["score"])
    out = {}
    for eps in EPSILONS:
        for m in SPLITS[1:]:
            gains = [np.mean(cells[(d, eps, m)]) - np.mean(cells[(d, eps, 1)]) for d in DATASETS
                     if (d, eps, m) in cells and (d, eps, 1) in cells]
            if gains:
                out[f"eps{eps:g}_m{m}"] = {"mean_gain": round(float(np.mean(gains)), 4),
                                           "wins": int(np.sum(np.array(gains) > 0)), "datasets": len(gains),
                                           "worst": round(float(np.min(gains)), 4), "best": round(float(np.max(gains)), 4)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--datasets", default=",".join(DATASETS))
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--eta-scale", action="store_true", help="η·M for the sub-ensembles (results/seed_average_eta.*)")
    a = ap.parse_args()
    tag = "_eta" if a.eta_scale else ""
    out = ag.RESULTS / f"seed_average{tag}.jsonl"
    done = set()
    if out.exists():
        done = {(r["dataset"], r["epsilon"], r["m"], r["rep"]) for r in map(json.loads, out.read_text().splitlines())}
    for name in a.datasets.split(","):
        ds, tr, te = ag.load(name)
        for eps in EPSILONS:
            hp = Hyperparameters.from_dict({**resolve({"epsilon": eps}, tr.schema, tr.n)[0], "epsilon": eps})
            for rep in range(a.reps):
                for m in SPLITS:
                    if (name, eps, m, rep) in done:
                        continue
                    r = averaged(tr, te, hp, m, seed=1 + rep + 10 * m, eta_scale=a.eta_scale)
                    ag._write(out, {"dataset": name, "task": ds.schema.task, "epsilon": eps, "m": m, "rep": rep,
                                    "trees": hp.trees, "eta_scale": a.eta_scale, **r})
                    print(f"{name} ε={eps} M={m} rep {rep}: {r['score']:.4f} (ε_sub {r['epsilon_sub']:.3g}, "
                          f"{r['seconds']:.1f}s)", file=sys.stderr, flush=True)
    s = summary([json.loads(x) for x in out.read_text().splitlines()])
    print(json.dumps(s, indent=1))
    (ag.RESULTS / f"seed_average{tag}.json").write_text(json.dumps(s, indent=1) + "\n")


if __name__ == "__main__":
    main()
