"""Federated DPBoost beside central DPBoost and S-BDT: the DPBoost paper's Fig. 2 setting, 3 site processes.

Setting of ``benchmarks/dpboost.py``'s Fig. 2 table (50 trees in one ensemble, depth 6, λ = 0.1, g*_l = 1,
η = 0.1, δ = 1/n_train; Abalone: the first 70/30 shuffle, RMSE in years; Adult: adult.data / adult.test, test
error in %) at ε = 1, 4, 10.  Per cell one training each of: central DPBoost mode (exponential mechanism,
Laplace leaves), central S-BDT (our random-tree defaults) and **federated DPBoost**: the training rows dealt
round-robin to three ``fedsbdt client`` processes, a ``fedsbdt coordinator`` process, gRPC over loopback with
mutual TLS, distributed noise (docs/dpboost.md "Federation": noisy level histograms, Gaussian leaf sums and
counts, each site's own partition and GDF).  Datasets from ../shared/datasets (benchmarks only).

Run: ``python benchmarks/dpboost_federated.py`` → results/dpboost_federated.json
"""
from __future__ import annotations

import argparse
import json
import sys
import time

from _util import DATASETS, RESULTS, ROOT, save  # noqa: E402  (puts the repo on sys.path)
from fedsbdt.common.federation.plan import federated_calibration
from fedsbdt.common.config import Hyperparameters, builder_defaults
from dpboost import FIG2, datasets, error, fit  # noqa: E402
from greedy_federated import federation  # noqa: E402

EPSILONS = (1.0, 4.0, 10.0)


def train_lines(name: str, tr) -> list[str]:
    """The raw lines of the training rows ``tr`` (the rows ``load`` keeps, in file order, subset like ``tr``)."""
    import numpy as np

    from fedsbdt.common.data import load
    from fedsbdt.common.schema import Schema
    from _util import data_file

    path = data_file(name)
    lines = [ln for ln in path.read_text().splitlines() if ln.strip() and "?" not in ln]
    full = load(path, Schema.load(ROOT / "examples" / name / "schema.toml"))
    assert len(lines) == full.n, "the kept rows must be the rows load() keeps"
    if tr.n == full.n:
        return lines
    # Abalone: ``datasets`` subsets the rows by a public permutation; find them by their record ids (row order)
    idx = np.asarray(tr.ids, np.int64)
    return [lines[i] for i in idx]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--datasets", nargs="+", default=["abalone", "adult"])
    ap.add_argument("--eps", nargs="+", type=float, default=list(EPSILONS),
                    help="ε values to run (default 1 4 10); rows of other ε already in the results file are kept")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    old = RESULTS / "dpboost_federated.json"
    out = json.loads(old.read_text())["results"] if old.exists() else {}
    for name in args.datasets:
        tr, te = datasets(name, 0)
        lines = train_lines(name, tr)
        delta = 1.0 / tr.n
        rows = out.get(name, {}).get("rows", {})
        for e in args.eps:
            keys = {**FIG2, "epsilon": e, "delta": delta}
            c_err, c_s, c_priv = fit(tr, te, keys)
            s_err, s_s, s_priv = fit(tr, te, {"epsilon": e, "delta": delta})
            hp = Hyperparameters(**builder_defaults(dict(keys)))
            cal = federated_calibration(hp)
            model, events, f_s = federation(builder_defaults(dict(keys)), lines, seed=1000 + int(e), dataset=name)
            f_err = error(model, te)
            rows[str(e)] = {
                "central_dpboost": {"error": c_err, "seconds": c_s, "epsilon": c_priv["epsilon"],
                                    "eps_tree": c_priv["dpboost"]["eps_tree"], "pure": c_priv["dpboost"]["pure"]},
                "sbdt": {"error": s_err, "seconds": s_s, "epsilon": s_priv["epsilon"]},
                "federated_dpboost": {"error": f_err, "seconds": f_s, "epsilon": model.privacy["epsilon"],
                                      "sigma_level": cal.sigma_select, "sigma_leaf": cal.sigma,
                                      "epsilon_composed": cal.eps_composed, "rounds": len(events)},
            }
            print(f"{name} ε={e:<4}: central DPBoost {c_err:.3f} ({c_s:.0f}s), S-BDT {s_err:.3f}, federated "
                  f"DPBoost {f_err:.3f} ({f_s:.0f}s, σ_s {cal.sigma_select:.3g}, σ {cal.sigma:.3g})", flush=True)
        out[name] = {"metric": "rmse" if name == "abalone" else "test error %", "train_rows": tr.n,
                     "test_rows": te.n, "delta": delta, "rows": dict(sorted(rows.items(), key=lambda r: float(r[0])))}
    payload = {"protocol": ("DPBoost Fig. 2: 50 trees, one ensemble, depth 6, λ 0.1, g*_l 1, η 0.1; S-BDT defaults; "
                            "one training per cell; δ = 1/n_train; Abalone first 70/30 shuffle of benchmarks/"
                            "dpboost.py, Adult adult.data/adult.test; federated: 3 fedsbdt client processes + "
                            "coordinator process, gRPC/mTLS on loopback, distributed noise, SecureRandomness"),
               "datasets_from": str(DATASETS), "results": out, "wall_seconds": time.perf_counter() - t0}
    path = save("dpboost_federated", payload)
    for name, d in out.items():
        print(f"\n{name} ({d['metric']})\n  ε     central DPBoost   federated DPBoost   S-BDT")
        for e, r in d["rows"].items():
            print(f"  {e:<5} {r['central_dpboost']['error']:>10.3f}   {r['federated_dpboost']['error']:>14.3f}   "
                  f"{r['sbdt']['error']:>10.3f}")
    print(f"\nwrote {path} ({payload['wall_seconds']:.0f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
