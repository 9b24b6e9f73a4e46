"""``greedy-shallow``: greedy trees whose last level is drawn from the plan's public seed (docs/plugins.md).

The first ``depth − 1`` levels select splits as greedy trees do (the exponential mechanism over the gain, or
noisy level histograms); the last level's splits are a public draw from the seed, so they cost no privacy and
a tree has ``depth − 1`` level releases.  Everything the mode is lives here: its schedule and budget (the
gate's side), its hyperparameter check, calibration (``depth − 1`` levels), central builder and site rounds.
"""
from __future__ import annotations

import numpy as np

from fedsbdt.common.federation.wire import Purpose
from fedsbdt.common.modes import register
from fedsbdt.common.modes.greedy import GreedyTrees
from fedsbdt.common.modes.greedy.builder import GreedyTrees as GreedyTreeBuilder
from fedsbdt.common.modes.greedy.site import GreedySite
from fedsbdt.common.splits import Splits


def public_draw(candidates: np.ndarray, seed: int, tree: int, nodes: int) -> np.ndarray:
    """The last level's candidates of tree ``tree``: ``nodes`` draws among ``candidates`` from the public seed."""
    return np.random.default_rng([seed, tree]).choice(candidates, nodes)


def last_level(plan, tree):
    """The grid candidates of tree ``tree``'s last level in a federation (the plan's greedy grid)."""
    grid, hp = plan.greedy_grid, plan.hyperparameters
    allowed = np.flatnonzero(np.isin(grid.candidates.feature, grid.features(tree)))
    return public_draw(allowed, hp.seed, tree, 2 ** (hp.depth - 1))


class ShallowBuilder:
    """Central trees: greedy selection of the first ``depth − 1`` levels, then the public draw."""

    def __init__(self, schema, hp, select: float, sigma_sketch: float) -> None:
        self.hp = hp
        self.top = GreedyTreeBuilder(schema, hp.replace(tree_builder=GreedyTrees.name, depth=hp.depth - 1), select,
                                     sigma_sketch)

    def splits(self, round_id, local, randomness) -> Splits:
        top, cand = self.top.splits(round_id, local, randomness), self.top.candidates
        allowed = np.arange(cand.feature.size)
        if self.hp.cyclical:
            allowed = np.flatnonzero(cand.feature == round_id % local.X.shape[1])
        last = public_draw(allowed, self.hp.seed, round_id, 2 ** (self.hp.depth - 1))
        default_left = None if top.default_left is None else np.concatenate([top.default_left,
                                                                            np.zeros(last.size, bool)])
        return Splits(np.concatenate([top.features, cand.feature[last]]).astype(np.int32),
                      np.concatenate([top.thresholds, cand.threshold[last]]).astype(np.float64), default_left)


class GreedyShallowSite(GreedySite):
    def check(self, rin):
        bad = super().check(rin)  # the tree, the level, the grid, the released splits
        ev = rin.request
        if bad is None and ev.purpose == Purpose.TREE:
            n = 2 ** (self.ctx.plan.hyperparameters.depth - 1)
            last = self.grid.candidate_index(ev.tree, ev.features[-n:], ev.thresholds[-n:])
            if not np.array_equal(last, last_level(self.ctx.plan, ev.tree)):
                return f"the last level of tree {ev.tree} is not the plan's public draw"
        return bad


class GreedyShallow(GreedyTrees):
    name = "greedy-shallow"
    summary = "greedy trees whose last level is a public random draw (one level release fewer per tree)"

    def check_hyperparameters(self, hp, bad) -> None:
        super().check_hyperparameters(hp, bad)
        if hp.depth < 2:
            raise bad("depth", "greedy-shallow trees select depth − 1 ≥ 1 levels: depth must be ≥ 2")

    def calibrate(self, hp):
        return super().calibrate(hp.replace(tree_builder=GreedyTrees.name, depth=hp.depth - 1))

    def central_builder(self, schema, hp, cal):
        return ShallowBuilder(schema, hp, cal.eps_select if hp.selection == "exponential" else cal.sigma_select,
                              cal.sigma_sketch)

    def epsilon_curve(self, privacy, points=40, depth=0):
        return super().epsilon_curve(privacy, points, depth - 1)

    def schedule_refusal(self, plan, purpose, tree, level):
        bad = super().schedule_refusal(plan, purpose, tree, level)
        if bad is None and purpose == Purpose.LEVEL and level == plan.hyperparameters.depth - 1:
            return "the last level of a greedy-shallow tree is drawn at random, not released"
        return bad

    def tree_budget(self, plan):
        n, d = self.rounds(plan), plan.hyperparameters.depth
        return {"level": n * (d - 1), "tree": n}

    def site_rounds(self, ctx):
        return GreedyShallowSite(ctx)


register(GreedyShallow())
