"""A federated tuning plan (``fedsbdt plan --tune-trials K``) against ``auto`` at the same ε, simulated centrally.

Federated = central (tests/federation/test_tuning_federation.py), so each trial is trained here by the
engine with the trial plan's own hyperparameters (the planner's ε_t, λ) on the training part of the
records, and scored as the coordinator scores it: the federated evaluation's histogram of the held-out part
(common/fed_eval.py, the trial plan's ε_e) plus the noise three sites add (one full discrete-Gaussian share
each; simulated with float Gaussians — a benchmark, not a release), then the released metric picks the
winner.  The held-out part is the fifth of the training records :func:`fedsbdt.common.tuning.holdout_mask`
selects; ``auto`` trains on all of them at the whole ε.  Both are scored on the suite's test split.

    nice python benchmarks/tune_federated.py [--datasets a,b] [--epsilons 1,4] [--trials 2] [--reps 2]
Appends to ``results/tune_federated.jsonl``; prints the mean (winner − auto) per ε.
"""
from __future__ import annotations

import argparse
import json
import secrets
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import auto_grid as ag  # noqa: E402

from fedsbdt.common.auto import resolve  # noqa: E402
from fedsbdt.common.config import Hyperparameters  # noqa: E402
from fedsbdt.common.engine import train  # noqa: E402
from fedsbdt.common.federation.plan import SiteEntry, make_plan  # noqa: E402
from fedsbdt.common.federation.tuning import pick_winner, plan_trials  # noqa: E402
from fedsbdt.common.tuning import holdout_mask  # noqa: E402

OUT = ag.RESULTS / "tune_federated.jsonl"
SITES = [SiteEntry(f"site-{i}", bytes([i + 1]) * 32) for i in range(3)]


def released_metrics(plan, model, held) -> dict:
    """The coordinator's view of one trial: the held-out histogram plus three sites' noise, then the metrics."""
    spec = plan.eval_spec
    y = held.y.astype(int) if held.schema.task == "multiclass" else held.y
    vec = spec.histogram(y, model.predict(held.X)).astype(np.float64)
    noise = np.random.default_rng(secrets.randbits(63)).normal(0.0, 1.0, vec.size) * spec.noise_scales() * np.sqrt(3)
    return spec.metrics(vec + noise)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--datasets", default="adult,nasscds,default,cells,abalone,hpc,budgetfood,cpssw8,weather,rodents")
    ap.add_argument("--epsilons", default="1,4")
    ap.add_argument("--trials", type=int, default=2)
    ap.add_argument("--eval-epsilon", type=float, default=0.1)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--out", default=str(OUT))
    a = ap.parse_args()
    out = Path(a.out)
    for name in a.datasets.split(","):
        ds, tr, te = ag.load(name)
        task = tr.schema.task
        y_te = te.y.astype(int) if task == "multiclass" else te.y
        mask = holdout_mask(tr.ids, 7)
        fit, held = tr.subset(~mask), tr.subset(mask)
        for eps in map(float, a.epsilons.split(",")):
            for rep in range(a.reps):
                seed = 100 * rep + 1
                keys, _ = resolve({"epsilon": eps, "seed": seed}, tr.schema, tr.n)  # fedsbdt train --rows n
                auto = ag.score(task, y_te, train(tr, Hyperparameters.from_dict(keys)).model.predict(te.X))["score"]
                centre = Hyperparameters.from_dict(resolve({"epsilon": eps, "seed": seed}, tr.schema, fit.n)[0])

                def make(h, suffix, eval_epsilon):
                    return make_plan(tr.schema, h, SITES, session_id="bench" + suffix, eval_epsilon=eval_epsilon,
                                     max_records_per_site=tr.n)

                tuning = plan_trials(make, centre, task, a.trials, eps, a.eval_epsilon, matched_l2=True)
                models = [train(fit, p.hyperparameters).model for p in tuning.trials]
                metrics = [released_metrics(p, m, held) for p, m in zip(tuning.trials, models)]
                win = pick_winner(task, metrics)
                released = win is not None
                win = 0 if win is None else win  # nothing released: the coordinator refuses; a user keeps the centre
                scores = [ag.score(task, y_te, m.predict(te.X))["score"] for m in models]
                row = {"dataset": name, "epsilon": eps, "rep": rep, "trials": a.trials, "eval_total": a.eval_epsilon,
                       "auto": auto,
                       "released": released, "winner": win + 1, "tuned": scores[win], "trial_scores": scores,
                       "epsilon_trial": tuning.trials[0].stated_epsilon,
                       "epsilon_eval_trial": tuning.trials[0].eval_epsilon,
                       "settings": [tuning.settings(i) for i in range(len(models))]}
                ag._write(out, row)
                print(f"{name} ε={eps} rep {rep}: auto {auto:.4f}, trials {[round(s, 4) for s in scores]} → "
                      f"winner {win + 1} {scores[win]:.4f}" + ("" if released else " (no metric released)"),
                      file=sys.stderr, flush=True)
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    for eps in sorted({r["epsilon"] for r in rows}):
        d = [r["tuned"] - r["auto"] for r in rows if r["epsilon"] == eps]
        best = [max(r["trial_scores"]) - r["auto"] for r in rows if r["epsilon"] == eps]
        print(json.dumps({"epsilon": eps, "cells": len(d), "mean_tuned_minus_auto": round(float(np.mean(d)), 4),
                          "wins": int(np.sum(np.array(d) > 0)),
                          "not_released": sum(not r["released"] for r in rows if r["epsilon"] == eps),
                          "mean_best_trial_minus_auto": round(float(np.mean(best)), 4)}))


if __name__ == "__main__":
    main()
