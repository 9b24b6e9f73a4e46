"""Utility of S-BDT against ε (0.01 … 1, log-spaced) for Abalone and Adult, both accountants.

Same settings and protocol as ``utility.py`` (paper Fig. 4 settings, repeated
5-fold CV, SecureRandomness, public shuffle/split seeds, paired across
accountants) except ε, and fewer runs per point (``--runs``, default 50).
Writes ``benchmarks/results/epsilon_curve.json`` and ``epsilon_curve.png``.

Run:  python benchmarks/epsilon_curve.py [--runs N] [--points K] [--quick]
"""
from __future__ import annotations

import argparse
import math
import sys

import numpy as np

from _util import FOLDS, RESULTS, SETTINGS, load_dataset, metric_of, run_cv, save  # noqa: E402

from fedsbdt.common.config import Hyperparameters  # noqa: E402
from fedsbdt.common.engine import calibration_for  # noqa: E402


def plot(out: dict, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(out["results"])
    fig, axes = plt.subplots(1, len(names), figsize=(5.2 * len(names), 4), squeeze=False)
    for ax, name in zip(axes[0], names):
        res = out["results"][name]
        for acc, style in (("rdp", "o-"), ("pld", "s--")):
            pts = [p for p in res["points"] if acc in p]
            if not pts:
                continue
            eps = np.array([p["epsilon"] for p in pts])
            mean = np.array([p[acc]["mean"] for p in pts])
            se = np.array([p[acc]["se"] for p in pts])
            ax.plot(eps, mean, style, label=f"{acc.upper()} accountant", ms=4)
            ax.fill_between(eps, mean - se, mean + se, alpha=0.25)
        ax.set_xscale("log")
        ax.set_xlabel("ε (δ = 5e-8)")
        ax.set_ylabel("RMSE (rings)" if res["metric"] == "rmse" else "ROC AUC")
        ax.set_title(f"{name} ({res['rows']} rows, {res['runs_per_point']} runs/point, ±SE)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=50, help="runs per point (multiple of 5; default 50)")
    ap.add_argument("--points", type=int, default=8, help="number of log-spaced ε values in [0.01, 1]")
    ap.add_argument("--quick", action="store_true", help="smoke test: 5 runs, 3 points")
    ap.add_argument("--datasets", default="abalone,adult")
    ap.add_argument("--accountants", default="rdp,pld")
    args = ap.parse_args(argv)
    runs, points = (5, 3) if args.quick else (args.runs, args.points)
    repeats = max(1, math.ceil(runs / FOLDS))
    eps_grid = [float(f"{e:.4g}") for e in np.geomspace(0.01, 1.0, points)]

    out = {"protocol": f"{repeats} repeats x {FOLDS}-fold CV = {repeats * FOLDS} runs per point; mean ± SE",
           "epsilons": eps_grid, "results": {}}
    for name in args.datasets.split(","):
        ds = load_dataset(name)
        metric = metric_of(name)
        res = out["results"][name] = {"rows": ds.n, "metric": metric, "settings": SETTINGS[name],
                                      "runs_per_point": repeats * FOLDS, "points": []}
        for eps in eps_grid:
            point = {"epsilon": eps}
            for acc in args.accountants.split(","):
                hp = Hyperparameters(**(SETTINGS[name] | {"epsilon": eps}), accountant=acc)
                cal = calibration_for(hp)
                print(f"{name} ε={eps:g} {acc}: sigma = {cal.sigma:.3f}", file=sys.stderr)
                r = run_cv(ds, hp, metric, repeats, progress=True)
                r["sigma"] = cal.sigma
                point[acc] = r
            res["points"].append(point)
            save("epsilon_curve", out)

    png = RESULTS / "epsilon_curve.png"
    plot(out, png)
    accs = args.accountants.split(",")
    print(f"\nS-BDT utility vs ε ({repeats * FOLDS} runs per point, mean ± SE; δ = 5e-8)\n")
    for name, res in out["results"].items():
        print(f"{name} ({res['metric']}, {res['rows']} rows)")
        print(f"  {'epsilon':>8} " + " ".join(f"{acc + ' sigma':>10} {acc + ' ' + res['metric']:>17}" for acc in accs))
        for p in res["points"]:
            print(f"  {p['epsilon']:8.4g} " + " ".join(
                f"{p[acc]['sigma']:10.3f} {p[acc]['mean']:9.4f} ± {p[acc]['se']:.4f}" for acc in accs))
    print(f"\nsaved benchmarks/results/epsilon_curve.json and {png.relative_to(RESULTS.parent.parent)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
