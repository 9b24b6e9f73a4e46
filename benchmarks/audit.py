"""The one-run audit (docs/audit.md) at ε ∈ {1, 4, 10}, central, with its controls.

For each claimed ε: the real run, a planted noise-losing bug (leaf noise ÷ 10) and the negative control
(leaf noise removed), ``--runs`` times each, on one synthetic regression problem built for audit power
(20 000 rows, 16 uniform features in [0, 1], y = clip(sin(3·x0)·x1 + N(0, 0.1²), −1, 1)) with every record in
every tree (γ = 1), 100 random trees of depth 9 (fresh thresholds, any feature per node), m = 1000 canaries,
confidence 95%.  Then the same with the paper's subsampling γ = 0.1, to show what the secret subsample
costs the attack.  The noise switch is the test-only keyword of ``run_central_audit``.

With ``--sites N`` every cell is also run by a federation of N sites (``fedsbdt audit --sites N``:
fedsbdt.federated_audit, the canaries at one site, the other records dealt round-robin, distributed
noise, secure randomness), the noise switch reaching every site's share; rows carry ``mode`` ("central" or
"federated") and ``sites``.

Writes ``benchmarks/results/audit.json``.

Run:  python benchmarks/audit.py [--runs N] [--canaries M] [--sites 3]
"""
from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from _util import save  # noqa: E402

from fedsbdt.common.audit import guess_counts, max_auditable_epsilon, run_central_audit  # noqa: E402
from fedsbdt.federated_audit import run_federated_audit  # noqa: E402
from fedsbdt.common.config import Hyperparameters  # noqa: E402
from fedsbdt.common.data import Dataset  # noqa: E402
from fedsbdt.common.schema import Schema  # noqa: E402

FEATURES, ROWS = 16, 20_000
HP = dict(trees=100, depth=9, subsample=1.0, cyclical=False, split_candidates=0)
ARMS = {"real": 1.0, "bug_noise_div10": 0.1, "no_noise": 0.0}


def problem() -> Dataset:
    schema = Schema.from_dict({
        "name": "audit-synth", "task": "regression", "target": "y", "label_range": [-1, 1],
        "columns": [f"x{i}" for i in range(FEATURES)] + ["y"],
        "features": [{"name": f"x{i}", "type": "numeric", "range": [0.0, 1.0]} for i in range(FEATURES)]})
    rng = np.random.default_rng(1)  # the public synthetic data; canaries and coins come from the OS CSPRNG
    X = rng.random((ROWS, FEATURES))
    y = np.clip(np.sin(3 * X[:, 0]) * X[:, 1] + 0.1 * rng.normal(size=ROWS), -1, 1)
    return Dataset.from_arrays(X, y, schema)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--canaries", type=int, default=1000)
    ap.add_argument("--confidence", type=float, default=0.95)
    ap.add_argument("--sites", type=int, default=0, help="also audit a federation of this many sites (0: central only)")
    args = ap.parse_args()
    ds = problem()
    rows = []
    t0 = time.perf_counter()
    modes = [("central", 1)] + ([("federated", args.sites)] if args.sites else [])
    for subsample, arms in ((1.0, ARMS), (0.1, {"real": 1.0, "no_noise": 0.0})):
        for eps in (1.0, 4.0, 10.0):
            hp = Hyperparameters(epsilon=eps, **{**HP, "subsample": subsample})
            for arm, factor in arms.items():
                for mode, sites in modes:
                    runs = []
                    for _ in range(args.runs):
                        if mode == "central":
                            r, model = run_central_audit(ds, hp, args.canaries, args.confidence, _noise_factor=factor)
                        else:
                            r, model = run_federated_audit(ds, hp, sites, args.canaries, args.confidence,
                                                           _noise_factor=factor)
                        runs.append({"epsilon_lower": r.epsilon_lower, "guesses": r.guesses, "correct": r.correct,
                                     "seconds": r.seconds})
                    lows = [x["epsilon_lower"] for x in runs]
                    row = {"mode": mode, "sites": sites, "subsample": subsample, "epsilon": eps,
                           "epsilon_claimed": r.epsilon_claimed, "arm": arm, "noise_factor": factor,
                           "sigma": model.privacy["sigma"], "noise_mode": model.privacy["noise_mode"],
                           "epsilon_lower_min": min(lows), "epsilon_lower_mean": float(np.mean(lows)),
                           "epsilon_lower_max": max(lows), "above_claim": sum(x > r.epsilon_claimed for x in lows),
                           "runs": runs, "max_auditable": r.max_auditable}
                    rows.append(row)
                    print(f"{mode:9s} γ={subsample:g} ε={eps:g} {arm:16s} ε_lower {min(lows):.3f} … {max(lows):.3f} "
                          f"(mean {np.mean(lows):.3f}; most m={args.canaries} can show: {r.max_auditable:.2f})",
                          file=sys.stderr, flush=True)
    out = {
        "what": "one-run audit (Steinke, Nasr & Jagielski 2023), central S-BDT, docs/audit.md",
        "data": f"synthetic regression, {ROWS} rows, {FEATURES} uniform features, y = clip(sin(3 x0) x1 + N(0, 0.01))",
        "hyperparameters": HP, "canaries": args.canaries, "confidence": args.confidence, "runs": args.runs,
        "federated": ({"sites": args.sites, "canary_site": "site-1", "dealing": "round-robin",
                       "noise": "distributed (each site a discrete-Gaussian share)", "randomness": "secure"}
                      if args.sites else None),
        "delta": 5e-8, "guess_counts_bonferroni": True,
        "max_auditable_by_m": {m: max_auditable_epsilon(m, 5e-8, (1 - args.confidence) / len(guess_counts(m)))
                               for m in (1000, 10_000, 100_000)},
        "results": rows, "seconds": round(time.perf_counter() - t0, 1),
    }
    save("audit", out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
