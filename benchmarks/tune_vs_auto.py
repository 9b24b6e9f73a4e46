"""``fedsbdt tune`` against ``auto`` on suite datasets (docs/auto.md "Private tuning"): same ε, same test split.

Both declare n public (no row count) and train on the same 80 % training split (auto_grid.split).  ``tune`` is
planned exactly as ``fedsbdt tune --rows n`` plans it (tuning.plan_for: the fallback below ε·n/K = 10³, else
probes of the short list and a final training on every training record); it keys its held-out part by the
suite's fixed row numbers (its ids never move).  Each row also carries, from the grid results of
benchmarks/auto_grid.py on the same split (mean over their repetitions), the best grid setting's score at
this ε ("grid_best", an oracle no private method reaches) and the grid's copy of the rule's table setting.
Rows are saved after each cell to results/tune_vs_auto_v2.json (a rerun skips the cells it holds).

    nice python benchmarks/tune_vs_auto.py [--cells adult:1,adult:4,...] [--seeds 6]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import auto_grid as ag  # noqa: E402

from fedsbdt.common.auto import resolve  # noqa: E402
from fedsbdt.common.config import Hyperparameters  # noqa: E402
from fedsbdt.common.randomness import SecureRandomness  # noqa: E402
from fedsbdt.common.tuning import fresh_split_key, plan_for, tune_on  # noqa: E402

OUT = ag.RESULTS / "tune_vs_auto_v2.json"
#: numeric sets (digits, hpc, cells, wine, breast_cancer), binary ones with categories (adult, default, also at
#: ε 2), a small set at ε 2 (penguins, 275 training rows), regression (abalone, cpssw8)
CELLS = ("digits:1,digits:4,hpc:1,hpc:4,cells:1,cells:4,wine:1,wine:4,breast_cancer:1,breast_cancer:4,"
         "adult:1,adult:2,adult:4,default:1,default:2,default:4,penguins:2,abalone:1,abalone:4,cpssw8:1,cpssw8:4")


def grid_scores() -> dict:
    """(dataset, ε) → {setting: mean score} over every auto_grid*.jsonl file of the results folder (λ-matched
    regression files only for regression sets, as the rule was fitted)."""
    acc = defaultdict(list)
    for f in sorted(ag.RESULTS.glob("auto_grid*.jsonl")):
        for line in f.read_text().splitlines():
            if not line.strip():
                continue
            r = json.loads(line)
            if r.get("epsilon") is None or r["setting"] in ("xgboost", "auto"):
                continue
            if (r["task"] == "regression") != ("l2" in f.name):
                continue
            acc[(r["dataset"], float(r["epsilon"]), r["setting"])].append(r["score"])
    out = defaultdict(dict)
    for (d, e, s), v in acc.items():
        out[(d, e)][s] = float(np.mean(v))
    return out


def grid_key(settings: dict) -> str | None:
    for k, v in ag.GRID.items():
        if ag.settings(k) == {key: settings[key] for key in ("trees", "depth", "subsample", "learning_rate",
                                                              "cyclical")}:
            return k
    return None


def summary(rows: list[dict]) -> dict:
    d = [r["tune"] - r["auto"] for r in rows]
    searched = [r["tune"] - r["auto"] for r in rows if r["searched"]]
    m0 = [r["tune_margin_0"] - r["auto"] for r in rows if "tune_margin_0" in r]
    return {"cells": len({(r["dataset"], r["epsilon"]) for r in rows}), "runs": len(rows),
            "mean_tune_minus_auto": float(np.mean(d)) if d else None,
            "tune_wins": sum(x > 0 for x in d), "tune_losses": sum(x < 0 for x in d),
            "searched_runs": len(searched),
            "mean_tune_minus_auto_where_searched": float(np.mean(searched)) if searched else None,
            "mean_tune_margin_0_minus_auto_where_searched": float(np.mean(m0)) if m0 else None,
            "fallback_runs_identical_setting": sum(1 for r in rows if not r["searched"]
                                                   and r["winner"] == r["centre"])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cells", default=CELLS, help="dataset:ε pairs, comma-separated")
    ap.add_argument("--seeds", type=int, default=6)
    ap.add_argument("--out", default=str(OUT))
    ap.add_argument("--margins", default="0", help="extra switch margins to run beside the shipped one (another "
                                                  "tune run each, same cell; 'tune_margin_<m>' in the row)")
    a = ap.parse_args()
    out = Path(a.out)
    doc = json.loads(out.read_text()) if out.exists() else {"rows": []}
    done = {(r["dataset"], r["epsilon"], r["seed"]) for r in doc["rows"]}
    grid = grid_scores()
    loaded = {}
    for cell in a.cells.split(","):
        name, eps = cell.split(":")
        eps = float(eps)
        for seed in range(a.seeds):
            if (name, eps, seed) in done:
                continue
            if name not in loaded:
                loaded = {name: ag.load(name)}
            ds, tr, te = loaded[name]
            t0 = time.perf_counter()
            keys, _ = resolve({"epsilon": eps}, tr.schema, tr.n)  # as fedsbdt train --rows n (λ included)
            auto = ag.run_one(tr, te, Hyperparameters.from_dict({**keys, "seed": 1000 + seed}))
            plan, choice = plan_for(tr.schema, eps, 5e-8, tr.n)
            res = tune_on(tr, plan, SecureRandomness(), fresh_split_key())
            y = te.y.astype(int) if tr.schema.task == "multiclass" else te.y
            tuned = ag.score(tr.schema.task, y, res.model.predict(te.X))["score"]
            extra = {}
            for m in (float(x) for x in a.margins.split(",") if x) if plan.searches else ():
                other = tune_on(tr, replace(plan, switch_margin=m), SecureRandomness(), fresh_split_key())
                extra[f"tune_margin_{m:g}"] = ag.score(tr.schema.task, y, other.model.predict(te.X))["score"]
                extra[f"winner_is_centre_margin_{m:g}"] = other.settings == dict(plan.candidates[0])
            g = grid.get((name, eps), {})
            centre = dict(plan.candidates[0])
            row = {"dataset": name, "task": tr.schema.task, "n_train": tr.n, "epsilon": eps, "seed": seed,
                   "budget_log10": choice.budget, "auto": auto["score"], "tune": tuned,
                   "searched": plan.searches, "probes": len(plan.candidates) if plan.searches else 0,
                   "epsilon_final": plan.epsilon_final, "epsilon_probe": plan.epsilon_probe,
                   "tuning_epsilon": plan.epsilon, "centre": centre, "winner": res.settings,
                   "winner_is_centre": res.settings == centre,
                   "switch_margin": plan.switch_margin, **extra,
                   "grid_best": max(g.values()) if g else None,
                   "grid_best_setting": max(g, key=g.get) if g else None,
                   "grid_auto_setting": g.get(grid_key(centre) or "", None),
                   "seconds": round(time.perf_counter() - t0, 1)}
            doc["rows"].append(row)
            doc["summary"] = summary(doc["rows"])
            doc["summary_searched_cells_only"] = summary([r for r in doc["rows"] if r["searched"]])
            doc["command"] = "python benchmarks/tune_vs_auto.py " + " ".join(sys.argv[1:])
            tmp = out.with_suffix(".tmp")
            tmp.write_text(json.dumps(doc, indent=1) + "\n")
            tmp.replace(out)
            print(f"{name} ε={eps:g} seed {seed}: b={choice.budget:.2f} auto {auto['score']:.4f} tune {tuned:.4f} "
                  f"({'searched ' + str(len(plan.candidates)) if plan.searches else 'fallback'}, winner "
                  f"{'centre' if row['winner_is_centre'] else res.settings}) {row['seconds']}s",
                  file=sys.stderr, flush=True)
    print(json.dumps(doc.get("summary"), indent=1))


if __name__ == "__main__":
    main()
