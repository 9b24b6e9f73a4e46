"""Where should random trees' split candidates lie?  Equidistant vs DP quantiles vs log scale on the suite.

Variants (everything else: the ``auto`` settings for ε and the declared n, as ``fedsbdt train --rows n``):

* ``equidistant`` — the default: ``split_candidates`` equidistant thresholds on each public range;
* ``quantile`` — ``candidate_placement = "quantile"``, ``candidate_share = 0.1``: 10 % of ε on discrete-Laplace histograms (64 bins per
  numeric feature), candidates at the noisy quantiles (common/candidates.py);
* ``quantile05`` — the same with 5 % of ε (the default share);
* ``log`` — ``scale = "log"`` declared on every numeric feature whose public range is wider than 10 units (a
  rule on the public schema only; free).

Protocol: the suite's datasets (benchmarks/suite.py; ``auto_grid.load``: public-seed subsample, 80/20 split),
ε ∈ {1, 4}, ``--seeds`` split seeds (paired: every variant sees the same split seed; noise from
``SecureRandomness``).  Score: AUC (binary), accuracy (multiclass), R² (regression); higher is better.

Choice: leave-one-dataset-out.  For each dataset, the variant with the largest mean gain over ``equidistant`` on
the *other* datasets is "chosen", and its gain on the held-out dataset recorded; the default changes only if
these held-out gains are positive on average by at least 2 standard errors.

    nice python benchmarks/split_candidates.py [--datasets a,b] [--epsilons 1,4] [--seeds 2]

Writes ``benchmarks/results/split_candidates.json`` (after every dataset: a long run can be stopped).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import auto_grid as ag  # noqa: E402
import suite  # noqa: E402

from fedsbdt.common.auto import resolve  # noqa: E402
from fedsbdt.common.config import Hyperparameters  # noqa: E402
from fedsbdt.common.engine import train  # noqa: E402

OUT = ag.RESULTS / "split_candidates.json"
VARIANTS = ("equidistant", "quantile", "quantile05", "log")
#: ``log`` declares the log scale on numeric features with a public range wider than this
LOG_MIN_WIDTH = 10.0
#: a held-out mean gain counts when it is this many standard errors above zero
Z = 2.0


def with_log_scale(ds):
    """``ds`` with ``scale = "log"`` declared on every numeric feature whose range is wider than LOG_MIN_WIDTH."""
    s = ds.schema
    feats = tuple(replace(f, scale="log") if not f.is_categorical and f.hi - f.lo > LOG_MIN_WIDTH else f
                  for f in s.features)
    return replace(ds, schema=replace(s, features=feats))


def variant(name: str, tr, hp: Hyperparameters):
    """(training data, hyperparameters) of variant ``name``."""
    if name == "quantile":
        return tr, hp.replace(candidate_placement="quantile", candidate_share=0.1)
    if name == "quantile05":
        return tr, hp.replace(candidate_placement="quantile", candidate_share=0.05)
    if name == "log":
        return with_log_scale(tr), hp
    return tr, hp


def lodo(gains: dict[str, dict[str, float]]) -> dict:
    """Leave-one-dataset-out choice among the variants from per-dataset mean gains over ``equidistant``."""
    names = sorted(gains)
    held = {}
    for d in names:
        others = [o for o in names if o != d]
        if not others:
            continue
        mean_other = {v: float(np.mean([gains[o][v] for o in others])) for v in VARIANTS}
        pick = max(VARIANTS, key=lambda v: (mean_other[v], v == "equidistant"))
        held[d] = {"chosen": pick, "gain": gains[d][pick]}
    g = np.array([h["gain"] for h in held.values()]) if held else np.zeros(0)
    se = float(g.std(ddof=1) / np.sqrt(g.size)) if g.size > 1 else float("nan")
    mean = float(g.mean()) if g.size else 0.0
    overall = {v: float(np.mean([gains[d][v] for d in names])) for v in VARIANTS} if names else {}
    switch = bool(g.size > 1 and se > 0 and mean >= Z * se)
    chosen = [h["chosen"] for h in held.values()]
    winner = max(set(chosen), key=chosen.count) if chosen else "equidistant"
    return {"held_out": held, "mean_gain": mean, "se": se, "mean_gain_all": overall,
            "wins": int((g > 0).sum()), "losses": int((g < 0).sum()),
            "rule": f"change the default only if the held-out gains average >= {Z:g} SE above zero",
            "default": winner if switch else "equidistant"}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--datasets", default=",".join(e.name for e in suite.ENTRIES))
    ap.add_argument("--epsilons", default="1,4")
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--first-seed", type=int, default=0,
                    help="split seeds 1000 + first … (a later run with more seeds adds its scores to the cells)")
    a = ap.parse_args(argv)
    out = json.loads(OUT.read_text()) if OUT.exists() else {}
    out.update({"protocol": "auto settings (n declared), ε in {1, 4}, paired split seeds per cell (the scores lists), "
                            "SecureRandomness noise; scores: AUC / accuracy / R² on a fixed 20% test split",
                "variants": list(VARIANTS), "log_min_width": LOG_MIN_WIDTH})
    results = out.setdefault("results", {})
    for name in a.datasets.split(","):
        t0 = time.perf_counter()
        ds, tr, te = ag.load(name)
        y = te.y.astype(int) if tr.schema.task == "multiclass" else te.y
        cell = {"rows": tr.n, "numeric": sum(not f.is_categorical for f in tr.schema.features),
                "features": tr.schema.n_features, "task": tr.schema.task}
        for eps in map(float, a.epsilons.split(",")):
            keys, _ = resolve({"epsilon": eps}, tr.schema, tr.n)
            base = Hyperparameters.from_dict(keys)
            runs = {v: [] for v in VARIANTS}
            for seed in range(a.first_seed, a.first_seed + a.seeds):
                for v in VARIANTS:
                    data, hp = variant(v, tr, base.replace(seed=1000 + seed))
                    res = train(data, hp)
                    runs[v].append(ag.score(tr.schema.task, y, res.model.predict(te.X))["score"])
            old = results.get(name, {}).get(f"eps={eps:g}", {}) if a.first_seed > 0 else {}
            runs = {v: old.get(v, {}).get("scores", []) + s for v, s in runs.items()}
            cell[f"eps={eps:g}"] = {v: {"scores": s, "mean": float(np.mean(s))} for v, s in runs.items()}
            print(f"{name} ε={eps:g}: " + "  ".join(f"{v} {np.mean(s):.4f}" for v, s in runs.items()),
                  file=sys.stderr, flush=True)
        cell["seconds"] = round(time.perf_counter() - t0 + (results.get(name, {}).get("seconds", 0.0)
                                                            if a.first_seed > 0 else 0.0), 1)
        results[name] = cell
        OUT.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")

    gains = {}
    for name, cell in results.items():
        cells = [c for k, c in cell.items() if k.startswith("eps=")]
        gains[name] = {v: float(np.mean([c[v]["mean"] - c["equidistant"]["mean"] for c in cells])) for v in VARIANTS}
    out["gains"] = gains
    out["choice"] = lodo(gains)
    OUT.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    print(f"\nmean gain over equidistant (score points, averaged over ε and seeds):\n{'dataset':14} "
          + " ".join(f"{v:>11}" for v in VARIANTS))
    for name in sorted(gains):
        print(f"{name:14} " + " ".join(f"{gains[name][v]:+11.4f}" for v in VARIANTS))
    c = out["choice"]
    print(f"\nleave-one-dataset-out: held-out gain {c['mean_gain']:+.4f} ± {c['se']:.4f} "
          f"({c['wins']} wins, {c['losses']} losses); default: {c['default']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
