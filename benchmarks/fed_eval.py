"""Federated evaluation: how far the released (noisy) metric is from the pooled one, by ε_eval.

A model is trained centrally (ε = 1) on the training file; its held-out file is dealt round-robin to three
sites; each site computes its vector (common/fed_eval.py) and adds its full discrete-Gaussian share drawn
by the exact sampler (SecureRandomness); the metrics of the summed vector are compared with the exact pooled
metrics (same clipping) over repeated draws.  No gRPC here: secure aggregation sums exactly, so the released
aggregate equals this sum (tests/federation/test_fed_eval_*.py check the whole protocol).

    python benchmarks/fed_eval.py [--reps 200]        # ~1 min; writes benchmarks/results/fed_eval.json
"""
from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from _util import ROOT, save

sys.path.insert(0, str(ROOT))

from fedsbdt.common.config import Hyperparameters  # noqa: E402
from fedsbdt.common.data import load  # noqa: E402
from fedsbdt.common.engine import train  # noqa: E402
from fedsbdt.common.fed_eval import EvalSpec, exact_metrics  # noqa: E402
from fedsbdt.common.randomness import SecureRandomness  # noqa: E402
from fedsbdt.common.schema import Schema  # noqa: E402

EPSILONS = (0.05, 0.1, 0.3, 1.0, 3.0)
SITES = 3


def held_out(dataset: str):
    """(schema, training Dataset, held-out Dataset) from the bundled examples (Abalone: a fixed 80/20 split)."""
    folder = ROOT / "examples" / dataset
    schema = Schema.load(folder / "schema.toml")
    if dataset == "adult":
        return schema, load(folder / "adult.data", schema), load(folder / "adult.test", schema)
    full = load(folder / "abalone.data", schema)
    order = np.random.default_rng(0).permutation(full.n)
    test, tr = np.sort(order[: full.n // 5]), np.sort(order[full.n // 5:])
    return schema, full.subset(tr), full.subset(test)


def run(dataset: str, reps: int, rnd) -> dict:
    schema, tr, te = held_out(dataset)
    hp = Hyperparameters(epsilon=1.0, trees=50, depth=4, seed=1)
    model = train(tr, hp).model
    pred = model.predict(te.X)
    keys = ("auc", "accuracy", "logloss") if schema.task == "binary" else ("rmse", "mae")
    rows = []
    for eps in EPSILONS:
        spec = EvalSpec(schema.task, eps, hp.delta, 20, schema.label_range)
        clean = sum(spec.histogram(te.y[k::SITES], pred[k::SITES]) for k in range(SITES))
        exact = exact_metrics(spec, te.y, pred)
        hist = spec.metrics(clean)
        noise = rnd.discrete_gaussian(np.tile(spec.noise_scales(), SITES * reps)).reshape(reps, SITES, -1).sum(1)
        released = [spec.metrics(clean + z) for z in noise]
        row = {"epsilon_eval": eps, "sigma_eval": spec.sigma, "n": te.n,
               "n_noise_sd": float(np.std([r["n"] for r in released]))}
        for k in keys:
            err = np.array([abs(r[k] - exact[k]) for r in released if r[k] is not None])
            row[k] = {"exact": exact[k], "noiseless_histogram": hist[k], "mean_abs_error": float(err.mean()),
                      "p95_abs_error": float(np.quantile(err, 0.95))}
        rows.append(row)
        print(f"{dataset:8s} ε_eval={eps:<5g} σ={spec.sigma:7.3f} " + " ".join(
            f"{k}: exact {row[k]['exact']:.4f} |err| mean {row[k]['mean_abs_error']:.4f} "
            f"p95 {row[k]['p95_abs_error']:.4f}" for k in keys), flush=True)
    return {"task": schema.task, "held_out_records": te.n, "sites": SITES, "training_epsilon": 1.0,
            "bins": 20, "rows": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=200, help="noise draws per ε_eval (default: 200)")
    args = ap.parse_args()
    t0 = time.perf_counter()
    rnd = SecureRandomness()
    out = {name: run(name, args.reps, rnd) for name in ("adult", "abalone")}
    path = save("fed_eval", {"reps": args.reps, "results": out, "seconds": round(time.perf_counter() - t0, 1)})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
