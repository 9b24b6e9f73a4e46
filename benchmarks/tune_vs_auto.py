"""``fedsbdt tune`` against ``auto`` on suite datasets (docs/auto.md "Private tuning"): same ε, same test split.

Both declare n public (no row count).  Tuning uses its own 80/20 train/held-out split of the training part
(the held-out records are not used for the final model), so it trains on fewer rows than ``auto``.  The suite's
records are keyed by their row in the fixed public table (its ids never move).  Like ``fedsbdt tune``, a run
records only the winner's settings (not the number of trials).

    nice python benchmarks/tune_vs_auto.py [--datasets a,b] [--epsilons 1,4]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import auto_grid as ag  # noqa: E402

from fedsbdt.common.auto import AutoInputs, auto_settings, resolve  # noqa: E402
from fedsbdt.common.config import Hyperparameters  # noqa: E402
from fedsbdt.common.randomness import SecureRandomness  # noqa: E402
from fedsbdt.common.tuning import candidates, fresh_split_key, plan_tuning, tune_on  # noqa: E402

OUT = ag.RESULTS / "tune_vs_auto.jsonl"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--datasets", default="adult,nasscds,default,cells,abalone,hpc,budgetfood,cpssw8")
    ap.add_argument("--epsilons", default="1,4")
    ap.add_argument("--trials-mean", type=int, default=4)
    a = ap.parse_args()
    for name in a.datasets.split(","):
        ds, tr, te = ag.load(name)
        for eps in map(float, a.epsilons.split(",")):
            keys, choice = resolve({"epsilon": eps}, tr.schema, tr.n)  # as fedsbdt train --rows n (λ included)
            auto = ag.run_one(tr, te, Hyperparameters.from_dict(keys))
            centre = auto_settings(AutoInputs.for_schema(tr.schema, eps / 2, 5e-8, int(0.8 * tr.n))).settings
            plan = plan_tuning(candidates(centre), eps, 5e-8, a.trials_mean)
            res, space = tune_on(tr, centre, plan, SecureRandomness(), fresh_split_key())
            pred = res.model.predict(te.X)
            y = te.y.astype(int) if tr.schema.task == "multiclass" else te.y
            tuned = ag.score(tr.schema.task, y, pred)
            row = {"dataset": name, "epsilon": eps, "auto": auto["score"], "tune": tuned["score"],
                   "epsilon_trial": plan.epsilon_trial, "tuning_epsilon": plan.epsilon,
                   "winner": res.settings, "auto_settings": keys}
            with OUT.open("a") as f:
                f.write(json.dumps(row) + "\n")
            print(f"{name} ε={eps}: auto {auto['score']:.4f} tune {tuned['score']:.4f}",
                  file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
