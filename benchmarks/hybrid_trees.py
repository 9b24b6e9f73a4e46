"""Issue 21 item 3, "hybrid trees (greedy top levels, random below)": a benchmark-only prototype against ``auto``.

A hybrid tree of depth d picks its top g levels greedily — the exponential mechanism on the exact gains of
the public candidate grid over every record, as :class:`fedsbdt.common.modes.greedy.builder.GreedyTrees` does, ε_sel
per level — and takes S-BDT's public random splits (all features) for the levels below; its leaves are
S-BDT's Gaussian release on a γ-Poisson subsample.  Per tree the privacy event is g bounded-range releases
(ε_sel) and one Poisson-subsampled Gaussian (σ), composed over T trees with the initial score (RDP):
ε_sel takes ``--selection-share`` f of the training ε alone (T·g releases), then σ the rest, by bisection.
The run is the engine's own loop (:func:`fedsbdt.common.engine.train`) with the calibration and the tree
builder replaced inside this process only (the product has no hybrid builder).

    nice python benchmarks/hybrid_trees.py [--datasets flights,weather] [--reps 1]
Appends to ``results/hybrid_trees.jsonl``; summary in ``results/hybrid_trees.json``.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import auto_grid as ag  # noqa: E402

from fedsbdt.common import engine  # noqa: E402
from fedsbdt.common.modes.greedy.builder import GreedyTrees  # noqa: E402
from fedsbdt.common.accountant import (ExponentialEvent, GaussianEvent, PoissonSampledEvent, compose,  # noqa: E402
                                       default_alpha_max, event_epsilon_rdp, init_score_events)
from fedsbdt.common.auto import noise_matched_l2, resolve  # noqa: E402
from fedsbdt.common.config import Hyperparameters  # noqa: E402
from fedsbdt.common.splits import Splits, random_splits  # noqa: E402

OUT = ag.RESULTS / "hybrid_trees.jsonl"
DATASETS = ("flights", "weather", "adult", "cells", "nasscds", "deliveries")
EPSILONS = (1.0, 4.0)


def _bisect(fits, lo: float, hi: float) -> float:
    """The largest x in [lo, hi] (geometric, 0.1 %) with fits(x) (fits increasing-then-false)."""
    while hi / lo > 1.001:
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def calibrate(hp: Hyperparameters, g: int, share: float):
    """(ε_sel, σ, the real random-tree calibration with σ replaced) for a hybrid of g greedy levels."""
    cal = engine.calibration_for(hp)
    T, amax = hp.accounted_rounds, default_alpha_max(hp.epsilon, hp.delta)
    train_eps = hp.epsilon * (1 - hp.init_share)
    init = init_score_events(cal.eps_init, cal.eps_ds) if hp.init_share > 0 else None

    def eps(ev) -> float:
        return event_epsilon_rdp(ev, hp.delta, amax)[0]

    eps_sel = _bisect(lambda e: eps(compose(ExponentialEvent(e), count=T * g)) <= share * train_eps, 1e-7, 10.0)

    def total(sigma: float) -> float:
        tree = compose(compose(ExponentialEvent(eps_sel), count=g),
                       PoissonSampledEvent(hp.subsample, GaussianEvent(sigma / math.sqrt(2))))
        return eps(compose(init, compose(tree, count=T)))

    inv = _bisect(lambda s: total(1 / s) <= hp.epsilon, 1e-6, 1e3)  # 1/σ: ε grows with it
    return eps_sel, 1 / inv, dataclasses.replace(cal, sigma=1 / inv, epsilon=total(1 / inv))


@dataclasses.dataclass
class HybridTrees:
    """Greedy top g levels (the exponential mechanism at ε_sel per level), public random splits below."""

    schema: object
    hp: Hyperparameters
    g: int
    eps_sel: float

    def __post_init__(self) -> None:
        self.greedy = GreedyTrees(self.schema, self.hp.replace(tree_builder="greedy", depth=self.g,
                                                                       subsample=1.0, cyclical=False), self.eps_sel)

    def splits(self, round_id: int, local, randomness):
        hp = self.hp
        rnd = random_splits(self.schema, hp.depth, hp.seed, round_id, False, hp.split_candidates)
        top = self.greedy.splits(round_id, local, randomness)
        k = 2**self.g - 1
        f, t = rnd.features.copy(), rnd.thresholds.copy()
        f[:k], t[:k] = top.features, top.thresholds
        return Splits(f, t, None)


def hybrid_train(tr, hp: Hyperparameters, g: int, share: float):
    """The engine's loop with the hybrid builder and calibration (this process only)."""
    eps_sel, sigma, cal = calibrate(hp, g, share)
    hp = hp.replace(l2=_matched_l2(hp, tr.schema.task, sigma))
    saved = engine.calibration_for, engine.tree_builder_for
    engine.calibration_for = lambda h: cal
    engine.tree_builder_for = lambda h, schema, c: HybridTrees(schema, h, g, eps_sel)
    try:
        return engine.train(tr, hp), eps_sel, sigma
    finally:
        engine.calibration_for, engine.tree_builder_for = saved


def _matched_l2(hp: Hyperparameters, task: str, sigma: float) -> float:
    """``auto``'s noise-matched λ for leaf noise σ (it scales linearly with σ)."""
    base = engine.calibration_for(hp).sigma
    return max(1.0, noise_matched_l2(hp, task) * sigma / base)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--datasets", default=",".join(DATASETS))
    ap.add_argument("--levels", default="1,2", help="greedy levels g to try")
    ap.add_argument("--selection-share", type=float, default=0.2)
    ap.add_argument("--reps", type=int, default=1)
    a = ap.parse_args()
    done = set()
    if OUT.exists():
        done = {(r["dataset"], r["epsilon"], r["variant"], r["rep"]) for r in map(json.loads, OUT.read_text().splitlines())}
    for name in a.datasets.split(","):
        ds, tr, te = ag.load(name)
        y = te.y.astype(int) if ds.schema.task == "multiclass" else te.y
        for eps in EPSILONS:
            auto = Hyperparameters.from_dict({**resolve({"epsilon": eps}, tr.schema, tr.n)[0], "epsilon": eps})
            for rep in range(a.reps):
                seed = 1 + rep
                variants = {"auto": None, "auto_all_features": None}
                variants.update({f"hybrid_g{g}_f{a.selection_share:g}": int(g) for g in a.levels.split(",")})
                for key, g in variants.items():
                    if (name, eps, key, rep) in done:
                        continue
                    hp = auto.replace(seed=seed)
                    extra = {}
                    if key == "auto_all_features":
                        hp = hp.replace(cyclical=False)
                    if g is None:
                        res = engine.train(tr, hp)
                    else:
                        hp = hp.replace(cyclical=False)
                        res, eps_sel, sigma = hybrid_train(tr, hp, g, a.selection_share)
                        extra = {"eps_sel": eps_sel, "sigma": sigma, "sigma_auto": engine.calibration_for(hp).sigma}
                    s = ag.score(ds.schema.task, y, res.model.predict(te.X))
                    row = {"dataset": name, "epsilon": eps, "variant": key, "rep": rep, "trees": hp.trees,
                           "depth": hp.depth, "score": s["score"], "seconds": round(res.seconds, 2), **extra}
                    ag._write(OUT, row)
                    print(f"{name} ε={eps} {key}: {s['score']:.4f} {extra}", file=sys.stderr, flush=True)
    rows = [json.loads(x) for x in OUT.read_text().splitlines()]
    cells: dict = {}
    for r in rows:
        cells.setdefault((r["dataset"], r["epsilon"], r["variant"]), []).append(r["score"])
    summary = {}
    for (d, e, v), xs in sorted(cells.items()):
        if v != "auto" and (d, e, "auto") in cells:
            summary.setdefault(v, []).append(round(float(np.mean(xs) - np.mean(cells[(d, e, "auto")])), 4))
    out = {v: {"mean_gain_over_auto": round(float(np.mean(g)), 4), "wins": int(np.sum(np.array(g) > 0)),
               "cells": len(g), "gains": g} for v, g in summary.items()}
    print(json.dumps(out, indent=1))
    (ag.RESULTS / "hybrid_trees.json").write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
