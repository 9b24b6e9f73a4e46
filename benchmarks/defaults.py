"""Which split settings should the CLI default to?  Candidate defaults on the bundled data.

Compares the two split knobs a user who has not read the papers gets from the
defaults — ``cyclical`` (one feature per tree, cycling) and ``split_candidates``
(thresholds on N equidistant public candidates instead of uniform over the
range) — on every bundled data set, in two regimes:

* ``cli``: every other hyperparameter at the ``fedsbdt train`` default
  (ε = 1, 100 trees, depth 3, γ = 0.1, …);
* ``cli-eps``: the same at the paper's small ε (Abalone 0.105, Adult 0.02) —
  ``fedsbdt train --epsilon 0.02`` as a user would type it;
* ``paper``: the paper's Fig. 4 ablation settings (Abalone ε = 0.105, Adult
  ε = 0.02; ``_util.SETTINGS``) with the two knobs varied.

plus a synthetic check of the known weakness of cyclical interactions: a binary
task whose label is the XOR of two features' signs (no additive model can learn
it), 10,000 rows, 2 informative + 6 noise features, ``cli`` regime.

Protocol: the repeated 5-fold CV of ``utility.py`` (public shuffles and split
seeds, ``SecureRandomness`` noise, paired runs: every candidate sees the same
folds and split seeds).  Default 10 repeats × 5 folds = 50 runs per cell (the
utility benchmark uses 200; this one must stay under ~10 CPU-minutes on a
loaded 2-core machine: ≈ 2–3 CPU-minutes).  Reported: mean ± SE, the paired difference to
``uniform`` (the defaults before this benchmark), and the choice: the old default stays unless a candidate is better by
≥ 2 paired standard errors somewhere on the bundled data and worse by as much nowhere.

Run:  python benchmarks/defaults.py [--repeats N] [--quick]
Writes ``benchmarks/results/defaults.json``.
"""
from __future__ import annotations

import argparse
import sys

import numpy as np
from _util import FOLDS, SETTINGS, fmt_pm, load_dataset, metric_of, run_cv, save, summary  # noqa: E402

from fedsbdt.common.config import Hyperparameters  # noqa: E402
from fedsbdt.common.data import Dataset  # noqa: E402
from fedsbdt.common.schema import Schema  # noqa: E402

#: the candidate defaults: (cyclical, split_candidates)
CANDIDATES = {
    "uniform": dict(cyclical=False, split_candidates=0),
    "cyclical": dict(cyclical=True, split_candidates=0),
    "candidates32": dict(cyclical=False, split_candidates=32),
    "cyclical+candidates32": dict(cyclical=True, split_candidates=32),
}


BUNDLED = ("abalone", "adult")
#: the hyperparameters other than the two knobs, per data set
REGIMES = {
    "cli": lambda name: Hyperparameters(),
    "cli-eps": lambda name: Hyperparameters(epsilon=SETTINGS[name]["epsilon"]),
    "paper": lambda name: Hyperparameters(**SETTINGS[name]),
}


def xor_dataset(n: int = 10_000, noise_features: int = 6, seed: int = 7) -> Dataset:
    """Synthetic interaction task: y = [sign(x0) == sign(x1)], features uniform on [−1, 1]."""
    rng = np.random.default_rng(seed)
    m = 2 + noise_features
    X = rng.uniform(-1, 1, size=(n, m))
    y = ((X[:, 0] > 0) == (X[:, 1] > 0)).astype(int)
    schema = Schema.from_dict({
        "name": "xor", "task": "binary", "target": "y",
        "features": [{"name": f"x{j}", "type": "numeric", "range": [-1.0, 1.0]} for j in range(m)]})
    return Dataset.from_arrays(X, y, schema, source="xor")


#: a paired difference counts when it is this many standard errors away from zero
Z = 2.0


def paired_z(cell: dict, cand: str, metric: str) -> float:
    """Paired difference of ``cand`` to ``uniform`` in standard errors, positive = better."""
    d = np.asarray(cell[cand]["values"]) - np.asarray(cell["uniform"]["values"])
    s = summary(d)
    if not s["se"] > 0:
        return 0.0
    return (-s["mean"] if metric == "rmse" else s["mean"]) / s["se"]


def choose(results: dict) -> dict:
    """Keep the old default (``uniform``) unless a candidate is better by ≥ Z paired standard errors in some
    cell of the bundled data and worse by ≥ Z in none; among those, the one with the most such wins (then the
    largest summed z).  The synthetic interaction task is reported, not scored: it shows when to switch
    ``cyclical`` off."""
    table = {}
    for cand in CANDIDATES:
        if cand == "uniform":
            continue
        zs = {f"{name}/{regime}": paired_z(cells[regime], cand, cells["metric"])
              for name, cells in results.items() if name in BUNDLED
              for regime in REGIMES if regime in cells}
        table[cand] = {"z": zs, "wins": sum(z >= Z for z in zs.values()), "losses": sum(z <= -Z for z in zs.values()),
                       "z_sum": sum(zs.values())}
    eligible = [c for c, t in table.items() if t["wins"] and not t["losses"]]
    chosen = max(eligible, key=lambda c: (table[c]["wins"], table[c]["z_sum"])) if eligible else "uniform"
    return {"rule": f"switch from 'uniform' only to a candidate better by >= {Z:g} paired SE in some bundled cell "
                    f"and worse by >= {Z:g} SE in none (most wins, then largest summed z)",
            "candidates": table, "chosen": chosen, "settings": CANDIDATES[chosen]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=10, help="CV repeats (× 5 folds) per cell (default 10 → 50 runs)")
    ap.add_argument("--quick", action="store_true", help="smoke test: 1 repeat (5 runs per cell)")
    ap.add_argument("--name", default="defaults", help="result file name (benchmarks/results/<name>.json)")
    args = ap.parse_args(argv)
    repeats = 1 if args.quick else args.repeats

    cells = [(name, regime) for name in BUNDLED for regime in REGIMES] + [("xor", "cli")]
    out = {"protocol": f"{repeats} repeats x {FOLDS}-fold CV = {repeats * FOLDS} runs per cell (paired: same "
                       "folds and split seeds for every candidate); mean ± SE; SecureRandomness noise",
           "candidates": CANDIDATES, "results": {}}
    data: dict[str, Dataset] = {}
    for name, regime in cells:
        if name not in data:
            data[name] = xor_dataset() if name == "xor" else load_dataset(name)
        ds = data[name]
        metric = "auc" if name == "xor" else metric_of(name)
        base = REGIMES[regime](name)
        cell = out["results"].setdefault(name, {"rows": ds.n, "dropped": ds.dropped, "metric": metric})
        cell[regime] = {"base": {k: v for k, v in base.to_dict().items() if k not in CANDIDATES["uniform"]}}
        for cand, knobs in CANDIDATES.items():
            print(f"{name} / {regime} / {cand}: {repeats * FOLDS} runs", file=sys.stderr)
            cell[regime][cand] = run_cv(ds, base.replace(**knobs), metric, repeats, progress=True)
        save(args.name, out)

    print(f"\nsplit-setting candidates, {repeats} x {FOLDS}-fold CV ({repeats * FOLDS} paired runs per cell), "
          "mean ± SE; Δ = paired mean difference to 'uniform' (the old default) ± SE\n")
    print(f"{'dataset':8} {'regime':7} {'metric':6} " + " ".join(f"{c:>24}" for c in CANDIDATES))
    for name, regime in cells:
        cell = out["results"][name][regime]
        ref = np.asarray(cell["uniform"]["values"])
        row = []
        for cand in CANDIDATES:
            v = np.asarray(cell[cand]["values"])
            d = summary(v - ref) if cand != "uniform" else None
            cell[cand]["paired_difference_to_uniform"] = d
            txt = fmt_pm(cell[cand]["mean"], cell[cand]["se"], 4)
            row.append(f"{txt:>24}" if d is None else f"{txt} (Δ{d['mean']:+.3f})".rjust(24))
        print(f"{name:8} {regime:7} {out['results'][name]['metric']:6} " + " ".join(row))
    out["choice"] = choose(out["results"])
    print(f"\npaired z against 'uniform' (positive = better; |z| >= {Z:g} counts):")
    for c, t in out["choice"]["candidates"].items():
        zs = "  ".join(f"{k} {v:+.1f}" for k, v in t["z"].items())
        print(f"  {c:22} wins {t['wins']} losses {t['losses']}:  {zs}")
    print(f"chosen default: {out['choice']['chosen']} {out['choice']['settings']}")
    save(args.name, out)
    print(f"\nsaved benchmarks/results/{args.name}.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
