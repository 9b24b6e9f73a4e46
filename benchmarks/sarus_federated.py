"""Federated Sarus DP-XGBoost in Sarus' Fig. 4 setting: 3 site processes, gRPC over loopback, distributed noise.

The setting of ``benchmarks/sarus.py`` (20 trees, λ = 0.1, η = 0.3, subsample 0.1, min_child_weight 50, g* = 1,
depth 6, 32 sketch candidates; ε = 1, 2, 4, 6, 8, 10; δ = 5e-8; the initial score at 10 % of ε) run as a real
federation (docs/sarus.md "Federation"): the training part is dealt round-robin to three ``fedsbdt client``
processes; per tree a sketch round, six level rounds and a leaf round through secure aggregation, every noise
share from ``SecureRandomness``.  Adult trains on ``adult.data`` (complete rows) and tests on ``adult.test``;
Abalone on the public 70/30 shuffle of ``benchmarks/sarus.py`` (run r: ``SPLIT_SEED + r``).

Writes ``benchmarks/results/sarus_federated.json``, adds the row ``sarus_federated`` to
``benchmarks/results/sarus.json`` (beside the paper's and the central rows) and plots every row of it to
``benchmarks/results/sarus.png``.

Run:  python benchmarks/sarus_federated.py [--runs 1]      (~10 min on 2 loaded cores with one run per cell)
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
from _util import RESULTS, ROOT, data_file, save, summary  # noqa: E402
from sarus import DELTA, EPSILONS, PAPER, SPLIT_SEED, score  # noqa: E402

from fedsbdt.common.modes.sarus import SARUS_DEFAULTS  # noqa: E402
from fedsbdt.common.data import load  # noqa: E402
from fedsbdt.common.schema import Schema  # noqa: E402
from greedy_federated import federation  # noqa: E402  (3 site processes + coordinator, as federated greedy)

SITES = 3  # greedy_federated.SITES
ROWS = {"paper": "paper, Fig. 4 (pure ε-DP)", "sarus_pure": "central Sarus, paper's accounting (pure ε-DP)",
        "sarus_rdp": "central Sarus, our RDP ledger ((ε, δ))", "sbdt": "central S-BDT, defaults ((ε, δ))",
        "sarus_federated": "federated Sarus, 3 sites ((ε, δ), Gaussian releases)"}


def train_test(name: str, run: int) -> tuple[list[str], object]:
    """The training lines (dealt to the sites) and the test set."""
    schema = Schema.load(ROOT / "examples" / name / "schema.toml")
    path = data_file(name)
    lines = [ln for ln in path.read_text().splitlines() if ln.strip() and "?" not in ln]
    ds = load(path, schema)
    assert len(lines) == ds.n, "the kept lines must be the rows load() keeps"
    if name == "adult":
        return lines, load(path.with_name("adult.test"), schema)
    perm = np.random.default_rng(SPLIT_SEED + run).permutation(ds.n)
    cut = int(round(0.7 * ds.n))
    return [lines[i] for i in np.sort(perm[:cut])], ds.subset(np.sort(perm[cut:]))


def plot(sarus: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    eps = sarus["epsilons"]
    for ax, name in zip(axes, ("adult", "abalone")):
        res = sarus["results"][name]
        ax.plot(eps, sarus["paper"][name], "k--o", label=ROWS["paper"])
        for mode in ("sarus_pure", "sarus_rdp", "sbdt", "sarus_federated"):
            if mode in res:
                m = [c["mean"] for c in res[mode]]
                se = [c.get("se", 0.0) or 0.0 for c in res[mode]]
                ax.errorbar([c["epsilon"] for c in res[mode]], m, yerr=se, marker="o", capsize=3, label=ROWS[mode])
        ax.set_xlabel("ε")
        ax.set_ylabel(res["metric"])
        ax.set_title(name.capitalize())
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=1, help="runs per (dataset, ε) cell")
    ap.add_argument("--datasets", default="adult,abalone")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    out = {"runs": args.runs, "epsilons": list(EPSILONS), "delta": DELTA, "sites": SITES, "paper": PAPER,
           "transport": "3 fedsbdt client processes + coordinator, gRPC/mTLS on loopback, distributed noise",
           "setting": SARUS_DEFAULTS, "results": {}}
    for name in args.datasets.split(","):
        metric = "test error %" if name == "adult" else "test RMSE"
        rows = []
        out["results"][name] = {"metric": metric, "sarus_federated": rows}
        for eps in EPSILONS:
            vals, secs, rounds, privacy = [], [], [], None
            for r in range(args.runs):
                lines, te = train_test(name, r)
                hp = {**SARUS_DEFAULTS, "tree_builder": "sarus", "epsilon": eps, "delta": DELTA, "seed": 1000 + r}
                model, events, s = federation(hp, lines, hp["seed"], name, ("sketch", "level", "tree"))
                vals.append(score(name, model, te))
                secs.append(s)
                rounds.append(len(events))
                privacy = model.privacy
            cell = summary(vals) | {"epsilon": eps, "values": vals, "federation_seconds": secs,
                                    "rounds_released": rounds, "released_epsilon": privacy["epsilon"],
                                    "released_delta": privacy["delta"], "sigma_leaf": privacy["sigma"],
                                    "sigma_level": privacy["sigma_select"], "sigma_sketch": privacy["sigma_sketch"]}
            rows.append(cell)
            print(f"{name:8s} federated ε={eps:<4g} {metric} {cell['mean']:.3f} (paper "
                  f"{PAPER[name][EPSILONS.index(eps)]}), {np.mean(secs):.0f} s per federation", file=sys.stderr,
                  flush=True)
    out["wall_seconds"] = time.perf_counter() - t0
    path = save("sarus_federated", out)
    sarus_path = RESULTS / "sarus.json"
    sarus = json.loads(sarus_path.read_text())
    for name, res in out["results"].items():
        sarus["results"][name]["sarus_federated"] = res["sarus_federated"]
    sarus_path.write_text(json.dumps(sarus, indent=2, allow_nan=True) + "\n")
    plot(sarus, RESULTS / "sarus.png")
    print(f"wrote {path}, added the federated row to {sarus_path}, plotted sarus.png "
          f"({out['wall_seconds']:.0f} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
