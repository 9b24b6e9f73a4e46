"""The federated cells of the cross-mode table (benchmarks/modes.py) that no other benchmark measures.

``modes.py`` takes federated DPBoost at DPBoost's Fig. 2 from ``dpboost_federated.py`` and federated Sarus at
Sarus' Fig. 4 from ``sarus_federated.py``.  This script runs the rest, each as one real federation per run
(``greedy_federated.federation``: three ``fedsbdt client`` processes + a coordinator, gRPC/mTLS on loopback,
distributed noise, every noise share from ``SecureRandomness``):

* ``dpboost`` — federated DPBoost in Sarus' Fig. 4 setting (the keys of modes.py's central cross row
  ``fig4/dpboost``: 20 trees in one ensemble, δ = 5e-8);
* ``sarus`` — federated Sarus in DPBoost's Fig. 2 setting (the keys of the central cross row ``fig2/sarus_rdp``:
  50 trees, η = 0.1, δ = 1/n_train);
* ``sbdt`` — federated S-BDT (random trees, its defaults) in both settings, with the keys of the central S-BDT
  rows: ``sarus.MODES["sbdt"]`` (δ = 5e-8) at Fig. 4, ``dpboost.py``'s ``{ε, δ = 1/n_train}`` at Fig. 2.

Splits and test sets are those of the central rows: Fig. 4 as ``sarus.py`` (Adult: adult.data / adult.test;
Abalone: the public 70/30 shuffle ``SPLIT_SEED + run``), Fig. 2 as ``dpboost.py``; run r uses seed 1000 + r.
The training rows are dealt round-robin to the three sites.

Writes ``results/modes_federated.json`` after every cell (a partial run is usable; a rerun replaces only the
cells it measures), in the layout of ``modes_central.json``: ``settings → setting → dataset → row → cells``
with rows ``dpboost_federated``, ``sarus_federated``, ``sbdt_federated``.  Then ``python benchmarks/modes.py
--table`` fills those rows.

Run:  python benchmarks/modes_federated.py [--only sbdt,dpboost,sarus] [--datasets adult,abalone]
                                          [--eps 1 4 10] [--runs 1] [--out PATH]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
from _util import RESULTS, environment, summary  # noqa: E402  (puts the repo on sys.path)

import dpboost  # noqa: E402
import modes  # noqa: E402
import sarus  # noqa: E402
from fedsbdt.common.config import builder_defaults  # noqa: E402
from dpboost_federated import train_lines  # noqa: E402
from greedy_federated import SITES, federation  # noqa: E402
from sarus_federated import train_test  # noqa: E402

#: the missing cells: mode → (settings, the table row it fills, the coordinator events to count)
MODES = {
    "sbdt": (("fig4", "fig2"), "sbdt_federated", ("tree",)),
    "dpboost": (("fig4",), "dpboost_federated", ("level", "tree")),
    "sarus": (("fig2",), "sarus_federated", ("sketch", "level", "tree")),
}
DEFAULT_EPS = (1.0, 4.0, 10.0)


def split(setting: str, name: str, run: int) -> tuple[list[str], object]:
    """(training lines for the sites, test set) of run ``run``: the central rows' split of ``setting``."""
    if setting == "fig4":
        return train_test(name, run)  # sarus.py's split (sarus_federated.py)
    tr, te = dpboost.datasets(name, run)
    return train_lines(name, tr), te


def keys(mode: str, setting: str, epsilon: float, n_train: int, seed: int) -> dict:
    """Hyperparameters of one federated cell: those of the central row beside it in the table."""
    if mode == "dpboost":
        given = modes.cross_keys(setting, "dpboost", epsilon, n_train, seed)
    elif mode == "sarus":
        given = modes.cross_keys(setting, "sarus_rdp", epsilon, n_train, seed)
    elif setting == "fig4":
        given = {**sarus.MODES["sbdt"], "epsilon": epsilon, "seed": seed}
    else:
        given = {"epsilon": epsilon, "delta": 1.0 / n_train, "seed": seed}
    return builder_defaults(given)


def load_existing(path: Path) -> dict:
    if not path.exists():
        return {}
    try:
        return json.loads(path.read_text())
    except ValueError as e:
        sys.exit(f"modes_federated.py: error: {path}: not valid JSON ({e}); move it away first")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="sbdt,dpboost,sarus", help="modes to run (default sbdt,dpboost,sarus)")
    ap.add_argument("--datasets", default="adult,abalone", help="default adult,abalone")
    ap.add_argument("--eps", type=float, nargs="+", default=list(DEFAULT_EPS), help="ε values (default 1 4 10)")
    ap.add_argument("--runs", type=int, default=1, help="federations per cell (default 1)")
    ap.add_argument("--out", type=Path, default=RESULTS / "modes_federated.json",
                    help="results file (default benchmarks/results/modes_federated.json, which modes.py reads)")
    args = ap.parse_args(argv)
    only = [m for m in args.only.split(",") if m]
    names = [n for n in args.datasets.split(",") if n]
    if not only or any(m not in MODES for m in only):
        ap.error(f"--only: choose from {','.join(MODES)}")
    if not names or any(n not in modes.DATASETS for n in names):
        ap.error(f"--datasets: choose from {','.join(modes.DATASETS)}")
    if any(e not in modes.EPSILONS for e in args.eps):
        ap.error(f"--eps: the table's columns are {' '.join(f'{e:g}' for e in modes.EPSILONS)}")
    if args.runs < 1:
        ap.error("--runs must be ≥ 1")

    cells = [(m, s, n, e) for m in only for s in MODES[m][0] for n in names for e in args.eps]
    out = load_existing(args.out)
    out.setdefault("settings", {})
    out |= {"sites": SITES, "protocol": (
        "one 3-site federation per run (fedsbdt client processes + coordinator, gRPC/mTLS on loopback, distributed "
        "noise); hyperparameters, splits, δ and test sets of the central row beside each cell; seed 1000 + run")}
    t0 = time.perf_counter()
    for i, (mode, setting, name, eps) in enumerate(cells):
        vals, secs, rounds, privacy, hp = [], [], [], None, None
        for r in range(args.runs):
            lines, te = split(setting, name, r)
            hp = keys(mode, setting, eps, len(lines), 1000 + r)
            model, events, s = federation(hp, lines, hp["seed"], name, MODES[mode][2])
            vals.append(dpboost.error(model, te))
            secs.append(s)
            rounds.append(len(events))
            privacy = model.privacy
        cell = summary(vals) | {
            "epsilon": eps, "values": vals, "federation_seconds": secs, "rounds_released": rounds,
            "released_epsilon": privacy["epsilon"], "released_delta": privacy["delta"],
            "pure": privacy["delta"] == 0, "keys": {k: v for k, v in hp.items() if k != "seed"}}
        row = out["settings"].setdefault(setting, {}).setdefault(name, {}).setdefault(MODES[mode][1], [])
        row[:] = sorted([c for c in row if c["epsilon"] != eps] + [cell], key=lambda c: c["epsilon"])
        elapsed = time.perf_counter() - t0
        out |= {"environment": environment()}
        args.out.write_text(json.dumps(out, indent=2, allow_nan=True) + "\n")
        eta = elapsed / (i + 1) * (len(cells) - i - 1)
        print(f"[{i + 1}/{len(cells)}] {setting} {name:8s} {mode:8s} ε={eps:<4g} {cell['mean']:.3f} "
              f"({np.mean(secs):.0f} s per federation); elapsed {elapsed / 60:.1f} min, ETA {eta / 60:.1f} min",
              file=sys.stderr, flush=True)
    print(f"wrote {args.out}; now: python benchmarks/modes.py --table", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
