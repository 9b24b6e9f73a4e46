"""Where can a private check of auto's setting pay for itself?  An offline estimate from the grid results behind
the rule (benchmarks/auto_grid.py, results/auto_grid*.jsonl; no training), used to place ``tune``'s budget gate
(common/tuning.py MIN_BUDGET_LOG10; docs/auto.md "Private tuning").

For every (dataset, ε) of the grid, with auto's table setting as the centre (the rule's bands at b = log10(ε·n/K))
and two grid settings as the alternatives (g21, deep non-cyclical; g18, one level deeper and non-cyclical: the
shortlist's flip of g17), each setting's score at a lower budget is interpolated linearly in log ε between the
grid's ε ∈ {0.1, 1, 4, 10} (extrapolated below 0.1).  Two designs, both with a *noise-free* selection (an upper
bound on what a private selection achieves):

* ``random_trials``: the old ``tune`` — every candidate trained at 0.58·ε on 64 % of the rows (budget factor
  0.8·0.58·0.8/0.8 = 0.46 of ε·n), the best released;
* ``probes_then_final``: the new one — candidates ranked at 0.2·ε on 80 % of the rows, the best trained at 0.9·ε
  on every row.

Each row: the difference to auto's setting at the full ε, averaged over the (dataset, ε) cells with b ≥ a threshold.

    python benchmarks/tune_gate.py        # prints and writes results/tune_gate.json
"""
from __future__ import annotations

import json
import math
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import auto_grid as ag  # noqa: E402

from fedsbdt.common.auto import TABLES, budget_signal, task_group  # noqa: E402

EPS = (0.1, 1.0, 4.0, 10.0)
ALTERNATIVES = ("g21", "g18")
THRESHOLDS = (1.0, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5)


def grid_means() -> tuple[dict, dict]:
    """(dataset, ε, setting) → mean score over the grid files; dataset → (task, n_train, classes)."""
    acc, meta = defaultdict(list), {}
    for f in sorted(ag.RESULTS.glob("auto_grid*.jsonl")):
        for line in f.read_text().splitlines():
            if not line.strip():
                continue
            r = json.loads(line)
            if r.get("epsilon") is None or r["setting"] not in ag.GRID:
                continue
            if (r["task"] == "regression") != ("l2" in f.name):  # regression: the λ-matched grid, as the rule
                continue
            acc[(r["dataset"], float(r["epsilon"]), r["setting"])].append(r["score"])
            meta[r["dataset"]] = (r["task"], r["n_train"], r.get("classes", 0))
    return {k: float(np.mean(v)) for k, v in acc.items()}, meta


def table_key(task: str, b: float) -> str | None:
    """The grid key of the rule's table setting at budget signal ``b``."""
    for edge, row in TABLES[task_group(task)]:
        if b < edge:
            t = (row["trees"], row["depth"], row["subsample"], row["learning_rate"], row["cyclical"])
            return next((k for k, v in ag.GRID.items() if v == t), None)
    return None


def at(means: dict, d: str, eps: float, g: str) -> float | None:
    """Setting g's score at ``eps``, linear in log ε between the grid's budgets."""
    xs = [e for e in EPS if (d, e, g) in means]
    if not xs:
        return None
    lx, ys = [math.log(e) for e in xs], [means[(d, e, g)] for e in xs]
    le = math.log(eps)
    if le < lx[0] and len(xs) > 1:
        return ys[0] + (ys[1] - ys[0]) * (le - lx[0]) / (lx[1] - lx[0])
    return float(np.interp(le, lx, ys))


def main() -> None:
    means, meta = grid_means()
    cells = []
    for d, (task, n, k) in sorted(meta.items()):
        for eps in EPS:
            b = budget_signal(eps, n, k)
            c = table_key(task, b)
            if c is None or (d, eps, c) not in means:
                continue
            cands = [c] + [g for g in ALTERNATIVES if g != c and (d, eps, g) in means]
            auto = means[(d, eps, c)]
            old = max(v for g in cands if (v := at(means, d, eps * 0.46, g)) is not None)
            probes = [at(means, d, eps * 0.2 * 0.8, g) for g in cands]
            pick = cands[int(np.argmax([p if p is not None else -np.inf for p in probes]))]
            new = at(means, d, eps * 0.9, pick)
            cells.append({"dataset": d, "epsilon": eps, "budget_log10": b, "centre": c, "auto": auto,
                          "random_trials": old - auto, "probes_then_final": new - auto, "probe_pick": pick})
    summary = []
    for lo in THRESHOLDS:
        sel = [c for c in cells if c["budget_log10"] >= lo]
        summary.append({"b_at_least": lo, "cells": len(sel),
                        "random_trials_minus_auto": float(np.mean([c["random_trials"] for c in sel])),
                        "probes_then_final_minus_auto": float(np.mean([c["probes_then_final"] for c in sel]))})
        print(f"b ≥ {lo:g}: {len(sel)} cells, old tune − auto {summary[-1]['random_trials_minus_auto']:+.4f}, "
              f"probes then final − auto {summary[-1]['probes_then_final_minus_auto']:+.4f}")
    out = ag.RESULTS / "tune_gate.json"
    out.write_text(json.dumps({"summary": summary, "cells": cells,
                               "command": "python benchmarks/tune_gate.py"}, indent=1) + "\n")


if __name__ == "__main__":
    main()
