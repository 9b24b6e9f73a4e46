"""Scale: 1,000,000 synthetic rows × 50 numeric features, 100 trees of depth 6 — time and peak memory.

The schema is built in code (50 numeric features with the public range
[0, 1], binary task); features are uniform on [0, 1] (numpy, float64, C
order: 1e6 × 50 × 8 B = 400 MB) and the label is a logistic function of the
first ten features.  The records are wrapped in a ``Dataset`` directly (no
CSV/pandas validation, which would hold several copies of the table).

Each configuration runs in a fresh subprocess: ``generic`` (library defaults:
random feature per node, thresholds uniform over the public range, γ = 0.1 —
trees are walked on the float matrix) and ``candidates`` (same with
``split_candidates = 32`` — trees are walked on one-byte codes of the records,
built once).  Reported: data generation time, numba warm-up, training wall time
with ``SecureRandomness`` (exact OpenDP noise, AES-CTR subsample), the resident
size before training and the peak (``ru_maxrss``), and the AUC of the model on
100,000 fresh rows as a sanity check.

Run:  python benchmarks/scale.py [--rows 1000000] [--features 50] [--trees 100] [--quick]
Writes ``benchmarks/results/scale.json``.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

from _util import ROOT, save  # noqa: E402

CONFIGS = {
    "generic": dict(epsilon=1.0, depth=6, subsample=0.1, learning_rate=0.1, init_share=0.0),
    "candidates": dict(epsilon=1.0, depth=6, subsample=0.1, learning_rate=0.1, init_share=0.0, split_candidates=32),
}


def rss_now() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def make(n: int, m: int, seed: int):
    import numpy as np

    from fedsbdt.common.data import Dataset
    from fedsbdt.common.schema import Schema

    schema = Schema.from_dict({
        "name": f"synthetic-{n}x{m}", "task": "binary", "target": "y", "format": {"header": True},
        "features": [{"name": f"x{j}", "type": "numeric", "range": [0.0, 1.0]} for j in range(m)],
    })
    rng = np.random.default_rng(seed)
    X = rng.random((n, m))
    w = np.linspace(2.0, -2.0, min(10, m))
    logit = np.full(n, -0.1)
    for j in range(w.size):
        logit += w[j] * (X[:, j] - 0.5) * 3
    y = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(np.float64)
    return Dataset(X, y, np.arange(n, dtype=np.int64), schema, source="synthetic")


def child(spec: dict) -> dict:
    from fedsbdt.common.config import Hyperparameters
    from fedsbdt.common.engine import train
    from fedsbdt.common.metrics import auc

    rss_start = rss_now()
    t = time.perf_counter()
    ds = make(spec["rows"], spec["features"], 1)
    gen = time.perf_counter() - t
    hp = Hyperparameters(**CONFIGS[spec["config"]], trees=spec["trees"], seed=3)
    small = make(2000, spec["features"], 2)
    t = time.perf_counter()
    train(small, hp.replace(trees=2))  # warm-up on tiny data (kernel load/compile)
    warm = time.perf_counter() - t
    rss0 = rss_now()
    t = time.perf_counter()
    res = train(ds, hp)
    wall = time.perf_counter() - t
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    test = make(100_000, spec["features"], 99)
    return {"rows": ds.n, "features": spec["features"], "trees": spec["trees"], "data_bytes": int(ds.X.nbytes),
            "generate_seconds": gen, "warmup_seconds": warm, "seconds": wall, "rss_start": rss_start,
            "rss_before": rss0, "peak_rss": peak, "auc_fresh_rows": auc(test.y, res.model.predict_margin(test.X))}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--features", type=int, default=50)
    ap.add_argument("--trees", type=int, default=100)
    ap.add_argument("--configs", default="generic,candidates")
    ap.add_argument("--quick", action="store_true", help="smoke test: 100,000 rows")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return 0
    rows = 100_000 if args.quick else args.rows
    out = {"configs": CONFIGS, "results": {}}
    mb = 1 / 2**20
    for cfg in args.configs.split(","):
        spec = {"rows": rows, "features": args.features, "trees": args.trees, "config": cfg}
        print(f"{cfg} ...", file=sys.stderr)
        env = dict(os.environ, OMP_NUM_THREADS="2", NUMBA_NUM_THREADS="2")
        p = subprocess.run([sys.executable, __file__, "--child", json.dumps(spec)], capture_output=True, text=True,
                           env=env, cwd=ROOT)
        if p.returncode != 0:
            raise RuntimeError(p.stderr)
        out["results"][cfg] = json.loads(p.stdout.strip().splitlines()[-1])
    print(f"\nS-BDT at scale: {rows:,} rows × {args.features} numeric features, {args.trees} trees of depth 6 "
          f"(data {rows * args.features * 8 * mb:.0f} MB)\n")
    print(f"{'config':11} {'train s':>8} {'s/tree':>7} {'generate s':>10} {'warm-up s':>9} {'RSS before MB':>13} "
          f"{'peak MB':>8} {'peak/data':>9} {'AUC':>6}")
    for cfg, r in out["results"].items():
        print(f"{cfg:11} {r['seconds']:8.2f} {r['seconds'] / r['trees']:7.3f} {r['generate_seconds']:10.2f} "
              f"{r['warmup_seconds']:9.2f} {r['rss_before'] * mb:13.0f} {r['peak_rss'] * mb:8.0f} "
              f"{r['peak_rss'] / r['data_bytes']:9.2f} {r['auc_fresh_rows']:6.3f}")
    save("scale", out)
    print("saved benchmarks/results/scale.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
